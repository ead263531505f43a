"""The API key: 401 from our real `serve --api-key` without it or with a wrong one, answers with
the right one — and the key in no exception text, notice, error line, repr, log record (every
logger at DEBUG, the openai client's and its HTTP library's included) or CLI output, also when a
server quotes it back."""

from __future__ import annotations

import logging

import pytest

from phoenix_chat.engine.remote.engine import RemoteEngine, RemoteError, RemoteTarget

from .conftest import GREEDY, KEY, cli
from .misbehaving_server import MisbehavingServer

WRONG = "sk-wrong-key-9d2e7a41c6"  # as distinctive as KEY: the engine must hide any key it holds


@pytest.fixture()
def debug_logs(caplog):
    caplog.set_level(logging.DEBUG)
    for name in ("openai", "httpx", "httpx2", "httpcore", "httpcore2"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


def texts_of(caplog) -> str:
    parts = []
    for r in caplog.records:
        parts.append(r.getMessage())
        if r.exc_info and r.exc_info[1] is not None:
            parts.append(repr(r.exc_info[1]))
    return "\n".join(parts)


def everything(engine: RemoteEngine, stream) -> str:
    """All a user or a log could see of one answer: its deltas (text, notices, errors)."""
    deltas = list(stream)
    return "\n".join(repr(d) for d in deltas) + "\n" + repr(engine) + repr(engine.target)


def test_401_from_our_server_and_the_key_nowhere(keyed_phoenix_server, debug_logs):
    url = keyed_phoenix_server.url
    seen = []
    no_key = RemoteEngine(RemoteTarget(url), timeout_s=120)
    with pytest.raises(RemoteError) as err:
        no_key.check()
    assert err.value.kind == "auth"
    assert str(err.value) == (
        f"127.0.0.1:{keyed_phoenix_server.port} said 401 (no API key was sent): "
        "missing or wrong API key (send Authorization: Bearer KEY)"
    )
    wrong = RemoteEngine(RemoteTarget(url, api_key=WRONG), timeout_s=120)
    with pytest.raises(RemoteError) as err:
        wrong.check()
    assert err.value.kind == "auth" and "said 401 (it refused the API key)" in str(err.value)
    seen += [str(err.value), repr(err.value), repr(wrong), repr(wrong.target)]
    right = RemoteEngine(RemoteTarget(url, api_key=KEY), timeout_s=120)
    assert right.check().startswith(f"OK: 127.0.0.1:{keyed_phoenix_server.port} serves ")
    deltas = list(right.stream_completion("The capital of France is", GREEDY, 3))
    assert deltas[-1].finish_reason == "length" and "".join(d.text for d in deltas)
    seen += [repr(d) for d in deltas] + [repr(right), repr(right.target), str(right.target)]
    everything_seen = "\n".join(seen) + texts_of(debug_logs)
    assert debug_logs.records  # the client did log at DEBUG: there was something to search
    assert KEY not in everything_seen and WRONG not in everything_seen


def test_a_server_quoting_the_key_back(debug_logs):
    with MisbehavingServer() as double:
        e = RemoteEngine(RemoteTarget(double.url("echokey"), api_key=WRONG), timeout_s=10)
        # the double's /v1/models answers; the answer's 401 quotes the key
        out = everything(e, e.stream_chat([{"role": "user", "content": "hi"}], GREEDY, 4))
        assert double.seen[-1].headers["authorization"] == f"Bearer {WRONG}"  # the key was sent...
    assert "said 401 (it refused the API key): Incorrect API key provided: [API key]" in out  # ...and hidden
    assert WRONG not in out and WRONG not in texts_of(debug_logs)


def test_cli_key_from_the_environment_only(keyed_phoenix_server):
    url = keyed_phoenix_server.url
    ok = cli("-v", "run", "--remote", url, "--raw", "Hello", "--max-tokens", "2", env={"PHOENIX_CHAT_API_KEY": KEY})
    assert ok.returncode == 0, ok.stderr
    assert "generated 2 tok" in ok.stderr
    named = cli(
        "-v", "run", "--remote", url, "--api-key-env", "MY_KEY", "--raw", "Hi", "--max-tokens", "1", env={"MY_KEY": KEY}
    )
    assert named.returncode == 0, named.stderr
    wrong = cli("-v", "run", "--remote", url, "--raw", "Hi", env={"PHOENIX_CHAT_API_KEY": WRONG})
    assert wrong.returncode == 2 and "said 401 (it refused the API key)" in wrong.stderr
    unset = cli("run", "--remote", url, "--api-key-env", "NOT_SET_ANYWHERE", "Hi")
    assert unset.returncode == 2
    assert unset.stderr == (
        "phoenix-chat: error: --api-key-env NOT_SET_ANYWHERE: the environment variable NOT_SET_ANYWHERE is not set\n"
    )
    flag = cli("run", "--remote", url, "--api-key", KEY, "Hi")  # refused, not read as --api-key-env's name
    assert flag.returncode == 2 and flag.stderr.startswith("phoenix-chat: error: --api-key: the key is not taken as a")
    as_name = cli("run", "--remote", url, "--api-key-env", KEY, "Hi")  # the key where its variable's name goes
    assert as_name.returncode == 2 and "takes the name of an environment variable" in as_name.stderr
    for proc in (ok, named, wrong, unset, flag, as_name):
        assert KEY not in proc.stdout + proc.stderr and WRONG not in proc.stdout + proc.stderr


def test_plain_http_to_another_machine_warns_once():
    """The warning comes before anything is sent (the address is a documentation one: nothing
    answers; the timeout makes that quick)."""
    target = RemoteTarget("http://192.0.2.10:8000", api_key=KEY)
    assert target.insecure_warning() == (
        "warning: plain http:// to 192.0.2.10:8000: prompts, answers and the API key travel unencrypted (use https://)"
    )
    for safe in ("https://192.0.2.10", "http://localhost:8080", "http://127.0.0.1:1", "http://[::1]:8080"):
        assert RemoteTarget(safe).insecure_warning() is None, safe
