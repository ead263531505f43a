"""One real server per module on the real embedded 270M (CPU backend), hosted the way `serve`
hosts it (start_server beside a Scheduler), plus raw-HTTP helpers for what the openai client
will not send (malformed JSON, a wrong Host, an Origin, a hang-up)."""

from __future__ import annotations

import http.client
import json
import time

import openai
import pytest

from phoenix_chat.app.server.config import ServerConfig
from phoenix_chat.app.server.running import RunningServer, start_server
from phoenix_chat.engine.loader import load
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler

GREEDY = SamplingParams(temperature=0)
CONTEXT = 128
MAX_QUEUE = 2
KEY = "test-key-0123456789"


@pytest.fixture(scope="package")  # freed when the package's tests end (the suite's memory)
def model(model_path):
    """Loaded once for tests/server; each module gets its own scheduler and server on it."""
    m = load(model_path, backend="cpu", context_length=CONTEXT)
    yield m
    m.close()


@pytest.fixture(scope="module")
def scheduler(model):
    s = Scheduler(model, max_queue=MAX_QUEUE)
    yield s
    s.close()


@pytest.fixture(scope="module")
def server(scheduler):
    with start_server(scheduler, ServerConfig(port=0)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused-on-loopback", max_retries=0, timeout=120)


def raw(
    server: RunningServer,
    method: str,
    path: str,
    body: bytes | dict | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 120,
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request exactly as given (no client-side checks); status, headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    conn.putrequest(method, path, skip_host="Host" in hdrs)
    for k, v in hdrs.items():
        conn.putheader(k, v)
    if data is not None:
        conn.putheader("Content-Length", str(len(data)))
    conn.endheaders(data)
    resp = conn.getresponse()
    out = resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    conn.close()
    return out


def error_of(body: bytes) -> dict:
    """The OpenAI error object of a refusal (asserting its shape)."""
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def wait_idle(scheduler: Scheduler, seconds: float = 10.0) -> float:
    """Seconds until no request runs or waits (fails after `seconds`)."""
    start = time.monotonic()
    while scheduler.active or scheduler.waiting:
        assert time.monotonic() - start < seconds, f"still busy: {scheduler.active} active, {scheduler.waiting} waiting"
        time.sleep(0.02)
    return time.monotonic() - start


def still_serves(client: openai.OpenAI, model_id: str) -> None:
    """A one-token answer: the server took the previous refusal in its stride."""
    r = client.completions.create(model=model_id, prompt="Hello", max_tokens=1, temperature=0)
    assert r.usage is not None and r.usage.completion_tokens == 1
