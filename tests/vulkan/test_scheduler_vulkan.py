"""The continuous-batching scheduler on Vulkan (lavapipe): requests sharing decode steps through
`decode_batch_sampled` (several slots) get exactly the ids each gets alone on the same backend,
greedy and seeded sampling. The real embedded 270M, a few tokens each (lavapipe is slow)."""

from __future__ import annotations

import threading

import pytest

from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler

SLOTS = 3


@pytest.fixture(scope="module")
def tiny_model(model_path, vk_device):
    from phoenix_chat.engine.loader import load

    model = load(model_path, backend="vulkan", context_length=128, slots=SLOTS)
    yield model
    model.close()


def _requests() -> list[Request]:
    prompts = ["The capital of France is", "Once upon a time, in a small village by the sea, there", "1, 2, 3,"]
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.3, top_k=0, top_p=1.0, seed=11),
        SamplingParams(temperature=0.9, top_k=20, seed=5),
    ]
    return [Request(p, s, max_tokens=5, raw=True) for p, s in zip(prompts, params, strict=True)]


def _ids(stream) -> tuple[list[int], str | None]:
    ids: list[int] = []
    reason = None
    for d in stream:
        ids.extend(d.token_ids)
        reason = d.finish_reason or reason
    return ids, reason


def test_batched_requests_get_what_each_gets_alone(tiny_model):
    reqs = _requests()
    sched = Scheduler(tiny_model)
    try:
        assert tiny_model.backend.n_slots == SLOTS
        alone = [_ids(sched.submit(r))[0] for r in reqs]
        streams = [sched.submit(Request(r.prompt, r.params, r.max_tokens, raw=True)) for r in reqs]
        solo = sched.solo_tokens
        together = [_ids(s) for s in streams]
        shared = sched.max_batch
        runs = sched.run_steps
    finally:
        sched.close()
    assert [t[0] for t in together] == alone
    assert all(alone), alone
    assert shared >= 2, "the requests never shared a decode step"
    # once all three were decoding, with nothing else to do, they ran pipelined steps
    assert runs > 0, "the batch never took a pipelined run"
    # alone, each decoded on the device-resident path (steps queued ahead), not in batches of one
    assert solo == sum(len(a) for a in alone) - len(alone)  # every token but the prefill's


def _hold_solo_runs(backend, before: int, reached: threading.Event, gate: threading.Event, monkeypatch) -> None:
    """Instrument the real backend: each device-resident run sets `reached` and waits for `gate`
    before it hands the scheduler its `before`-th id, so a test can submit while a lone run is
    surely under way. Not a double: the ids are the backend's own. Without it the join raced the
    submissions in flight, and on a loaded CI machine the whole run could end first."""
    real = backend.decode_slot_tokens

    def held(*args, **kwargs):
        tokens = real(*args, **kwargs)
        if tokens is None:
            return None

        def run():
            try:
                for i, token in enumerate(tokens):
                    if i == before:
                        reached.set()
                        assert gate.wait(120), "the test never opened the gate"
                    yield token
            finally:
                tokens.close()

        return run()

    monkeypatch.setattr(backend, "decode_slot_tokens", held)


def test_a_request_joins_a_lone_one_mid_run_and_both_keep_their_ids(tiny_model, monkeypatch):
    """A lone request decodes on the device-resident path; a second one submitted while it runs
    stops that run at once (the submissions in flight finish), both then share batched steps,
    and each gets exactly the ids it gets alone. A cancel during a lone run ends it there."""
    first = Request(
        "Once upon a time, in a small village by the sea, there",
        SamplingParams(temperature=0.8, top_k=30, seed=3),
        max_tokens=12,  # lavapipe: ~1 s a decode token of the 270M, most of it the output head
        raw=True,
    )
    second = Request("The capital of France is", SamplingParams(temperature=0.0), max_tokens=5, raw=True)
    sched = Scheduler(tiny_model)
    reached, gate = threading.Event(), threading.Event()
    try:
        alone = [_ids(sched.submit(r))[0] for r in (first, second)]
        _hold_solo_runs(tiny_model.backend, 2, reached, gate, monkeypatch)
        a = sched.submit(Request(first.prompt, first.params, first.max_tokens, raw=True))
        assert reached.wait(300), "the lone request never took the device-resident path"
        b = sched.submit(Request(second.prompt, second.params, second.max_tokens, raw=True))
        gate.set()  # the lone run had handed out two ids: it is under way
        got_a = _ids(a)[0]
        got_b = _ids(b)[0]
        shared = sched.max_batch
        # a cancel while a lone request runs: it ends "cancelled" and the slot serves the next one
        c = sched.submit(Request(first.prompt, first.params, 60, raw=True))
        it = iter(c)
        got_c = list(next(it).token_ids)
        sched.cancel(c.id)
        last = None
        for d in it:
            got_c.extend(d.token_ids)
            last = d
        again = _ids(sched.submit(Request(second.prompt, second.params, second.max_tokens, raw=True)))[0]
    finally:
        gate.set()
        sched.close()
    assert got_a == alone[0] and got_b == alone[1]
    assert shared >= 2, "the second request never joined the first in a batched step"
    assert last is not None and last.finish_reason == "cancelled" and len(got_c) < 60
    assert got_c == alone[0][: len(got_c)]  # what it produced before the cancel is the same answer
    assert again == alone[1]


def test_batched_step_rows_are_capped_at_the_recorded_buckets(vk_device, tmp_path):
    """33 slots, 32 rows per batched step at most (the largest recorded bucket; the scheduler
    takes the rest in turns)."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.plan import MAX_BATCH
    from phoenix_chat.engine.weights import open_weights
    from tools.make_synthetic_gguf import write

    w = open_weights(write(tmp_path / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=3))
    try:
        be = VulkanBackend(w, 32, device=vk_device, slots=MAX_BATCH + 1)
        try:
            assert be.n_slots == MAX_BATCH + 1 and be.max_batch_rows == MAX_BATCH == 32
        finally:
            be.close()
    finally:
        w.close()


def test_a_pipelined_batch_is_broken_off_by_a_newcomer_and_a_cancel_and_nobody_loses_an_id(tiny_model):
    """Two requests decode in a pipelined run; a third arrives mid-run (the run stops at once,
    the newcomer is prefilled, then all three batch), then the second is cancelled mid-run. The
    first and third get exactly their ids alone; the second's ids before the cancel are its own."""
    reqs = [
        Request(
            "Once upon a time, in a small village by the sea, there",
            SamplingParams(temperature=0.8, top_k=30, seed=3),
            max_tokens=12,
            raw=True,
        ),
        Request("The capital of France is", SamplingParams(temperature=0.0), max_tokens=14, raw=True),
        Request("1, 2, 3,", SamplingParams(temperature=1.1, top_k=0, top_p=0.9, seed=9), max_tokens=4, raw=True),
    ]
    sched = Scheduler(tiny_model)
    try:
        alone = [_ids(sched.submit(r))[0] for r in reqs]
        fresh = [Request(r.prompt, r.params, r.max_tokens, raw=True) for r in reqs]
        a, b = sched.submit(fresh[0]), sched.submit(fresh[1])
        got_a, got_b = [], []
        ia, ib = iter(a), iter(b)
        while sched.run_steps == 0:  # until both decode in a pipelined run (the policy times turns first)
            d = next(ib)
            got_b.extend(d.token_ids)
            assert d.finish_reason is None, "the second request ended before any pipelined run"
        c = sched.submit(fresh[2])
        got_c = _ids(c)[0]
        while len(got_b) < 8:
            d = next(ib)
            got_b.extend(d.token_ids)
            assert d.finish_reason is None
        sched.cancel(b.id)
        last = None
        for d in ib:
            got_b.extend(d.token_ids)
            last = d
        for d in ia:
            got_a.extend(d.token_ids)
    finally:
        sched.close()
    assert got_a == alone[0] and got_c == alone[2]
    assert last is not None and last.finish_reason == "cancelled" and len(got_b) < 14
    assert got_b == alone[1][: len(got_b)]
