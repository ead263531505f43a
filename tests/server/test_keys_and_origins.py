"""A second server on the same scheduler with a key and a CORS origin: the key is required
(401 otherwise, compared in constant time) but /health stays open; the configured origin gets
CORS headers, others are refused; the key never appears in the config's repr (its log line)."""

from __future__ import annotations

import openai
import pytest

from phoenix_chat.app.server.config import ServerConfig, ServerConfigError
from phoenix_chat.app.server.running import start_server
from phoenix_chat.app.server.security import key_matches

from .conftest import KEY, error_of, raw

ORIGIN = "http://localhost:5173"


@pytest.fixture(scope="module")
def keyed(scheduler):
    with start_server(scheduler, ServerConfig(port=0, api_key=KEY, cors_origins=(ORIGIN,))) as running:
        yield running


def test_bad_or_missing_key_is_401_and_the_right_key_works(keyed):
    wrong = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc:
        wrong.models.list()
    assert exc.value.status_code == 401 and exc.value.body["code"] == "invalid_api_key"
    status, _, body = raw(keyed, "GET", "/v1/models")
    assert status == 401 and error_of(body)["code"] == "invalid_api_key"
    status, _, _ = raw(keyed, "GET", "/v1/models", headers={"Authorization": f"Basic {KEY}"})
    assert status == 401
    right = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    r = right.completions.create(model=keyed.state.model_id, prompt="Hi", max_tokens=1, temperature=0)
    assert r.usage.completion_tokens == 1


def test_health_needs_no_key(keyed):
    assert raw(keyed, "GET", "/health")[0] == 200


def test_configured_origin_gets_cors_and_others_do_not(keyed):
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    status, headers, _ = raw(keyed, "OPTIONS", "/v1/chat/completions", headers=pre)
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    status, headers, _ = raw(keyed, "GET", "/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    status, _, body = raw(keyed, "GET", "/v1/models", headers={"Origin": "https://evil.example"})
    assert status == 403 and error_of(body)["code"] == "origin_not_allowed"


def test_key_match_is_exact():
    assert key_matches(f"Bearer {KEY}", KEY) and key_matches(f"bearer {KEY}", KEY)
    assert not key_matches(f"Bearer {KEY}x", KEY) and not key_matches(f"Bearer {KEY[:-1]}", KEY)
    assert not key_matches(None, KEY) and not key_matches(KEY, KEY)


def test_the_key_is_not_in_the_config_repr():
    assert KEY not in repr(ServerConfig(api_key=KEY)) and KEY not in str(ServerConfig(api_key=KEY))


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::"])
def test_a_non_loopback_bind_without_a_key_refuses_to_start(scheduler, host):
    with pytest.raises(ServerConfigError, match="API key"):
        start_server(scheduler, ServerConfig(host=host, port=0))


def test_a_wildcard_bind_with_a_key_serves_and_checks_the_key(scheduler):
    with start_server(scheduler, ServerConfig(host="0.0.0.0", port=0, api_key=KEY)) as running:
        assert raw(running, "GET", "/v1/models")[0] == 401
        assert raw(running, "GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})[0] == 200
