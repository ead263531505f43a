"""A bounded load cannot break `serve`: 16 streaming clients (the real openai async client, the
load bench's own loop) against a real `phoenix-chat serve` subprocess, CPU backend, 2 slots and a
queue of 1, for 4 seconds. Every request ends — a complete answer, or a deliberate 429/503
carrying Retry-After — none hangs, the queue bound refuses what it cannot hold, the two slots
were batched, every complete answer is the greedy answer that prompt gets alone, and afterwards
the server answers /health with nothing active or waiting."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
import urllib.request

import openai

from bench import served
from bench.server_load import TOPICS, prompt_for, run_load

CLIENTS = 16
SECONDS = 4.0
MAX_TOKENS = 3
DEADLINE_S = 60.0  # a request not ended by then counts as hung (they take seconds)
PARALLEL, QUEUE = 2, 1


def _health(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=10) as reply:
        assert reply.status == 200
        return dict(json.loads(reply.read()))


def test_a_bounded_load_ends_every_request_and_leaves_the_server_serving():
    with served.phoenix("cpu", ctx=128, parallel=PARALLEL, max_queue=QUEUE) as server:
        health = _health(server.url)
        assert health["slots"] == PARALLEL and health["max_queue"] == QUEUE  # --parallel, --max-queue

        # on a thread of its own: the GUI tests' session-wide qasync loop counts as running in this
        # thread when the whole suite runs, and asyncio.run refuses to start inside a running loop
        load = run_load(server.url, server.model, CLIENTS, SECONDS, MAX_TOKENS, deadline=DEADLINE_S, server="phoenix")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            r = pool.submit(asyncio.run, load).result()

        assert r.hung == 0, r.error_samples
        assert r.errors == {}, r.error_samples  # a 429/503 without Retry-After would be counted here
        assert set(r.refused) <= {"429", "503"} and r.refused.get("429", 0) > 0  # the queue bound held
        assert r.sent == r.ok + sum(r.refused.values())  # every request accounted for: none lost
        assert r.ok >= PARALLEL and r.finish_reasons == {"length": r.ok}

        # the same prompt gave the same greedy text every time, batched with whoever shared its steps,
        # and it is what the prompt gets alone
        assert r.distinct_answers and set(r.distinct_answers.values()) == {1}
        topic = next(iter(r.answers))
        alone = openai.OpenAI(base_url=server.url, api_key="local", max_retries=0, timeout=DEADLINE_S)
        reply = alone.chat.completions.create(
            model=server.model,
            messages=prompt_for(TOPICS.index(topic)),  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            temperature=0.0,
        )
        assert reply.choices[0].message.content == r.answers[topic]

        deadline = time.monotonic() + 10
        while (h := _health(server.url))["active"] or h["waiting"]:
            assert time.monotonic() < deadline, h
            time.sleep(0.1)
        assert h["max_batch"] == PARALLEL  # the slots shared decode steps
        assert h["busy"] == r.refused.get("429", 0)  # the server's own count of its refusals
        assert h["requests"] == r.ok + 1  # every request the engine took ended complete (+ the one alone)
