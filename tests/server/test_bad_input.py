"""Each bad request gets its status and an OpenAI error object, and the server keeps serving."""

from __future__ import annotations

import openai
import pytest

from .conftest import CONTEXT, error_of, raw, still_serves

CHAT_PATH = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello"}]


def test_malformed_json_is_400(server, client):
    status, _, body = raw(server, "POST", CHAT_PATH, b'{"messages": [')
    assert status == 400 and error_of(body)["code"] == "invalid_json"
    still_serves(client, server.state.model_id)


def test_a_json_array_body_is_400(server, client):
    status, _, body = raw(server, "POST", CHAT_PATH, b"[1, 2]")
    assert status == 400 and error_of(body)["code"] == "invalid_json"
    still_serves(client, server.state.model_id)


@pytest.mark.parametrize(
    "field, value, param",
    [
        ("temperature", "hot", "temperature"),
        ("temperature", 5, "temperature"),
        ("max_tokens", 1.5, "max_tokens"),
        ("max_tokens", 0, "max_tokens"),
        ("top_k", -1, "top_k"),
        ("stream", "yes", "stream"),
        ("stop", [1], "stop"),
        ("messages", "Hello", "messages"),
        ("messages", [{"role": "wizard", "content": "hi"}], "messages[0].role"),
        ("messages", [{"role": "user", "content": 7}], "messages[0].content"),
        (
            "messages",
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "messages[0].content[0].image_url.url",
        ),
        ("model", 3, "model"),
    ],
)
def test_wrong_types_and_ranges_are_400_naming_the_field(server, client, scheduler, field, value, param):
    body = {"messages": HELLO, "max_tokens": 1, field: value}
    status, _, out = raw(server, "POST", CHAT_PATH, body)
    err = error_of(out)
    assert status == 400 and err["type"] == "invalid_request_error" and err["param"] == param
    assert scheduler.active == 0 and scheduler.waiting == 0  # refused before it reached the engine
    still_serves(client, server.state.model_id)


def test_empty_messages_is_400(server, client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=server.state.model_id, messages=[], max_tokens=1)
    assert exc.value.status_code == 400 and exc.value.body["param"] == "messages"
    still_serves(client, server.state.model_id)


def test_unknown_model_is_404_model_not_found(server, client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=1)
    assert exc.value.body["code"] == "model_not_found" and exc.value.body["param"] == "model"
    still_serves(client, server.state.model_id)


def test_n_other_than_1_is_refused_clearly(server, client):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=server.state.model_id, messages=HELLO, max_tokens=1, n=2)
    assert exc.value.body["param"] == "n" and "must be 1" in exc.value.body["message"]
    still_serves(client, server.state.model_id)


TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(
    "endpoint, extra, param",
    [
        ("chat", {"tools": [TOOL]}, "tools"),
        ("chat", {"functions": [TOOL["function"]]}, "functions"),
        ("chat", {"logprobs": True, "top_logprobs": 2}, "logprobs"),
        ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
        ("text", {"logprobs": 2}, "logprobs"),
        ("text", {"echo": True}, "echo"),
        ("text", {"suffix": " end"}, "suffix"),
        ("text", {"best_of": 2}, "best_of"),
    ],
)
def test_features_it_cannot_honour_are_400_through_the_client(server, client, scheduler, endpoint, extra, param):
    """The real client's own fields, sent over HTTP: refused naming the field, before the engine."""
    with pytest.raises(openai.BadRequestError) as exc:
        if endpoint == "chat":
            client.chat.completions.create(model=server.state.model_id, messages=HELLO, max_tokens=1, **extra)
        else:
            client.completions.create(model=server.state.model_id, prompt="Hello", max_tokens=1, **extra)
    assert exc.value.status_code == 400 and exc.value.body["param"] == param
    assert scheduler.active == 0 and scheduler.waiting == 0
    still_serves(client, server.state.model_id)


def test_context_overflow_is_400_context_length_exceeded(server, client, scheduler):
    long = [{"role": "user", "content": "word " * (CONTEXT * 2)}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as exc:
            client.chat.completions.create(model=server.state.model_id, messages=long, max_tokens=1, stream=stream)
        assert exc.value.body["code"] == "context_length_exceeded"
        assert str(CONTEXT) in exc.value.body["message"]
    assert scheduler.active == 0 and scheduler.waiting == 0  # refused before it took a slot
    still_serves(client, server.state.model_id)


def test_oversize_body_is_413_declared_or_chunked(server, client):
    limit = server.state.config.max_body_bytes
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * limit + b'"}]}'
    status, _, body = raw(server, "POST", CHAT_PATH, big)
    assert status == 413 and error_of(body)["code"] == "request_too_large"
    # a chunked body declares no length: the guard counts what arrives
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request(
        "POST",
        CHAT_PATH,
        body=iter([big[i : i + 65536] for i in range(0, len(big), 65536)]),
        headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        encode_chunked=True,
    )
    resp = conn.getresponse()
    assert resp.status == 413 and error_of(resp.read())["code"] == "request_too_large"
    conn.close()
    still_serves(client, server.state.model_id)


def test_wrong_host_header_is_403(server, client):
    """DNS rebinding: a page at evil.example whose name now resolves to 127.0.0.1."""
    status, _, body = raw(server, "GET", "/v1/models", headers={"Host": f"evil.example:{server.port}"})
    assert status == 403 and error_of(body)["code"] == "host_not_allowed"
    for ok in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "localhost"):
        assert raw(server, "GET", "/v1/models", headers={"Host": ok})[0] == 200
    still_serves(client, server.state.model_id)


def test_browser_origin_is_403_without_configured_cors(server, client):
    status, headers, body = raw(
        server, "POST", CHAT_PATH, {"messages": HELLO}, headers={"Origin": "https://evil.example"}
    )
    assert status == 403 and error_of(body)["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in headers
    still_serves(client, server.state.model_id)


def test_unknown_path_and_method_are_openai_errors(server, client):
    status, _, body = raw(server, "GET", "/v1/nothing")
    assert status == 404 and error_of(body)["code"] == "not_found"
    status, _, body = raw(server, "GET", CHAT_PATH)
    assert status == 405 and error_of(body)["code"] == "method_not_allowed"
    still_serves(client, server.state.model_id)
