"""Many clients at once through the scheduler: each gets exactly its greedy answer alone; a full
queue answers 429 with Retry-After; a client that hangs up cancels its request and frees the
engine (scheduler.active back to 0), streamed or not."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .conftest import MAX_QUEUE, error_of, still_serves, wait_idle

PROMPTS = ["The capital of France is", "Water boils at", "My favourite fruit is", "One, two, three,"]
N = 4


def test_parallel_clients_each_get_their_greedy_answer_alone(client, server, scheduler):
    mid = server.state.model_id

    def ask(prompt):
        r = client.completions.create(model=mid, prompt=prompt, max_tokens=N, temperature=0)
        return r.choices[0].text

    alone = [ask(p) for p in PROMPTS[: MAX_QUEUE + 1]]
    with ThreadPoolExecutor(len(alone)) as pool:
        together = list(pool.map(ask, PROMPTS[: len(alone)]))
    assert together == alone
    assert len(set(alone)) > 1  # different prompts, different answers: no cross-talk hidden by sameness


def _open_stream(port: int, max_tokens: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {"prompt": "Tell me a long story.", "max_tokens": max_tokens, "temperature": 0, "stream": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def _hang_up(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def test_a_full_queue_is_429_with_retry_after_and_then_recovers(client, server, scheduler):
    opened, refused = [], None
    try:
        for _ in range(MAX_QUEUE + 8):  # running slots + the queue, then one more
            conn, resp = _open_stream(server.port, 10_000)
            if resp.status == 429:
                refused = resp
                break
            assert resp.status == 200
            opened.append(conn)
            time.sleep(0.05)
        assert refused is not None, f"{len(opened)} streams open and none refused"
        assert int(refused.getheader("Retry-After")) >= 1
        assert error_of(refused.read())["code"] == "server_busy"
        assert scheduler.waiting == MAX_QUEUE
    finally:
        for conn in opened:
            _hang_up(conn)
    wait_idle(scheduler)
    still_serves(client, server.state.model_id)


def test_disconnect_mid_stream_cancels_the_request(client, server, scheduler):
    before = server.state.counters.cancelled_on_disconnect
    conn, resp = _open_stream(server.port, 10_000)
    assert resp.status == 200
    first = resp.readline()  # the first event: generation is under way
    assert first.startswith(b"data: ")
    assert scheduler.active == 1
    _hang_up(conn)
    freed_after = wait_idle(scheduler)
    assert freed_after < 5
    assert server.state.counters.cancelled_on_disconnect == before + 1
    still_serves(client, server.state.model_id)


def test_disconnect_while_waiting_for_a_whole_answer_cancels_it(client, server, scheduler):
    before = server.state.counters.cancelled_on_disconnect
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    body = {"prompt": "Tell me a long story.", "max_tokens": 10_000, "temperature": 0}
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    deadline = time.monotonic() + 30
    while scheduler.active == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    threading.Event().wait(0.3)
    _hang_up(conn)
    wait_idle(scheduler)
    assert server.state.counters.cancelled_on_disconnect == before + 1
    still_serves(client, server.state.model_id)


def test_stopping_the_server_mid_stream_cancels_its_request(scheduler):
    """The GUI or CLI stops the server while a client streams: the server ends within its grace
    period and the engine is freed (the model stays loaded for whoever hosts it)."""
    from phoenix_chat.app.server.config import ServerConfig
    from phoenix_chat.app.server.running import GRACEFUL_SHUTDOWN_S, start_server

    running = start_server(scheduler, ServerConfig(port=0))
    conn, resp = _open_stream(running.port, 10_000)
    assert resp.status == 200 and resp.readline().startswith(b"data: ")
    started = time.monotonic()
    running.stop()
    assert time.monotonic() - started < GRACEFUL_SHUTDOWN_S + 5
    wait_idle(scheduler)
    conn.close()
