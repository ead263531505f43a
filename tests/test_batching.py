"""Continuous batching (engine/scheduler.py) over the CPU backend's K/V slots, on the real
embedded 270M: a sequence's tokens do not depend on who shares its decode steps (greedy and
seeded sampling, joining and leaving mid-run), prefix reuse per slot is exact across the
sliding-window boundary and after an edit, conversations keep their own slots, and the faults
(cancel, a full queue, a prompt too long, too many slots for the memory) end cleanly."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from phoenix_chat.engine.backends.base import SeqStep
from phoenix_chat.engine.errors import OutOfMemoryError
from phoenix_chat.engine.generate import prompt_ids_for
from phoenix_chat.engine.loader import load
from phoenix_chat.engine.requests import Delta, EngineBusy, PromptTooLong, Request
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler

GREEDY = SamplingParams(temperature=0)
SEEDED = SamplingParams(temperature=0.9, top_k=40, top_p=0.9, seed=11)
SEEDED_PENALTY = SamplingParams(temperature=1.2, top_k=0, top_p=1.0, min_p=0.05, repetition_penalty=1.3, seed=5)
SLOTS = 4


@pytest.fixture(scope="module")
def model(model_path):
    m = load(model_path, backend="cpu", context_length=1024, slots=SLOTS)
    yield m
    m.close()


def token_ids(deltas: list[Delta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


_alone: dict[str, list[int]] = {}


def alone(model, req: Request) -> list[int]:
    """The request's tokens served by itself, from an empty scheduler (no prefix reuse)."""
    key = repr((req.prompt, req.params, req.max_tokens, req.raw))
    if key not in _alone:
        s = Scheduler(model)
        try:
            _alone[key] = token_ids(list(s.submit(req)))
        finally:
            s.close()
    return _alone[key]


def notes(n: int) -> str:
    """A long user message (about 7 tokens an item)."""
    colours = ["red", "green", "blue", "amber", "violet", "white"]
    return " ".join(f"Item {i} is {colours[i % len(colours)]}." for i in range(n))


def test_batched_rows_are_the_same_bits_as_one_row(model):
    """The backend: a sequence's logits in a B-row decode step equal its logits decoded alone."""
    b = model.backend
    ids = prompt_ids_for(model, "Two plus two is", raw=True)
    other = prompt_ids_for(model, "Once upon a time there was", raw=True)
    for slot, prompt in ((1, ids), (2, other), (3, ids)):
        b.forward_slot(slot, prompt, 0)
    solo = b.decode_batch([SeqStep(1, 42, len(ids))])
    b.forward_slot(1, ids, 0)  # the same state again (the step above wrote position len(ids))
    both = b.decode_batch([SeqStep(2, 7, len(other)), SeqStep(1, 42, len(ids)), SeqStep(3, 42, len(ids))])
    assert solo.shape == (1, model.config.vocab_size) and both.shape == (3, model.config.vocab_size)
    assert np.array_equal(both[1], solo[0])
    assert np.array_equal(both[2], solo[0])  # another slot holding the same prompt
    assert not np.array_equal(both[0], solo[0])


def test_two_slots_decode_row_by_row_as_lone_forwards(model_path):
    """Two slots or fewer (backends/cpu.py ROW_BY_ROW_SLOTS): each row of a step is a lone
    forward, so a sequence's logits are a one-slot model's bits whoever shares its step, and no
    row pays the padded GEMM (measured: a lone row ~2x faster)."""
    from phoenix_chat.engine.backends import cpu

    assert cpu.ROW_BY_ROW_SLOTS == 2
    two = load(model_path, backend="cpu", context_length=64, slots=2)
    try:
        b, m = two.backend, two.backend.model
        ids = prompt_ids_for(two, "Two plus two is", raw=True)
        other = prompt_ids_for(two, "Once upon a time there was", raw=True)
        b.forward_slot(0, ids, 0)
        lone = b.forward([42], len(ids))  # slot 0 as a one-slot backend decodes it
        b.forward_slot(0, ids, 0)
        b.forward_slot(1, other, 0)
        both = b.decode_batch([SeqStep(1, 7, len(other)), SeqStep(0, 42, len(ids))])
        b.forward_slot(0, ids, 0)
        solo = b.decode_batch([SeqStep(0, 42, len(ids))])
        padded = m.decode_batch([42], [len(ids)], [0])  # what the GEMM over rows gives that row
    finally:
        two.close()
    assert np.array_equal(both[1], lone) and np.array_equal(solo[0], lone)
    # the GEMM's last bits differ from a lone row's: what makes the equalities above say which path ran
    assert not np.array_equal(padded[0], lone), "BLAS's two kernels agreed: the check cannot tell the paths apart"


def test_every_sequence_in_a_mixed_batch_equals_itself_alone(model):
    chat = [{"role": "user", "content": notes(20) + " Which item is blue?"}]  # > one prefill chunk
    reqs = [
        Request("The capital of France is", GREEDY, max_tokens=8, raw=True),
        Request(chat, SEEDED, max_tokens=6),
        Request("Once upon a time", SEEDED_PENALTY, max_tokens=10, raw=True),
    ]
    assert len(prompt_ids_for(model, chat)) > 128
    want = [alone(model, r) for r in reqs]
    s = Scheduler(model)
    try:
        streams = [s.submit(r) for r in reqs]
        got = [list(st) for st in streams]
    finally:
        s.close()
    assert [token_ids(g) for g in got] == want
    assert s.max_batch == 3  # they did share decode steps
    assert all(g[-1].finish_reason == "length" for g in got)


def _hold_lone_steps(backend, after: int, reached: threading.Event, gate: threading.Event, monkeypatch) -> None:
    """Instrument the real backend: after `after` decode steps of one row, the next one sets
    `reached` and waits for `gate`, so a test submits while a lone request is surely mid-run
    (not a double: the logits are the backend's own; untimed, the newcomer could lose the race
    against the lone request's last step on a loaded machine)."""
    real = backend.decode_batch
    lone = [0]

    def held(steps):
        if len(steps) == 1:
            if lone[0] == after:
                reached.set()
                assert gate.wait(120), "the test never opened the gate"
            lone[0] += 1
        return real(steps)

    monkeypatch.setattr(backend, "decode_batch", held)


def test_joining_and_leaving_mid_run_changes_nothing_for_the_others(model, monkeypatch):
    a = Request("The three primary colours are", SEEDED, max_tokens=14, raw=True)
    b = Request([{"role": "user", "content": notes(30) + " Count the items."}], GREEDY, max_tokens=3)
    c = Request("Water boils at", SEEDED_PENALTY, max_tokens=4, raw=True)
    want = [alone(model, r) for r in (a, b, c)]
    s = Scheduler(model)
    reached, gate = threading.Event(), threading.Event()
    _hold_lone_steps(model.backend, 2, reached, gate, monkeypatch)
    try:
        sa = s.submit(a)
        it = iter(sa)
        got_a: list[Delta] = []
        assert reached.wait(300), "the lone request never reached its third decode step"
        sb = s.submit(b)  # joins while a decodes; its long prompt is read a chunk per step
        gate.set()
        got_b = list(sb)  # ... and leaves
        sc = s.submit(c)
        got_c = list(sc)
        got_a.extend(it)
    finally:
        gate.set()
        s.close()
    assert token_ids(got_a) == want[0]
    assert token_ids(got_b) == want[1]
    assert token_ids(got_c) == want[2]
    assert s.max_batch >= 2


def test_prefix_reuse_is_exact_past_the_sliding_window_and_after_an_edit(model):
    """A conversation longer than the 270M's 512-token window and its 640-slot rings: the next
    turn and an edited last message resume in the slot and equal a full re-prefill."""
    s = Scheduler(model)
    try:
        chat = [{"role": "user", "content": notes(96) + " Which items are red?"}]
        n1 = len(prompt_ids_for(model, chat))
        assert n1 > 640  # the rings have wrapped
        first = list(s.submit(Request(chat, GREEDY, max_tokens=6)))
        answer = "".join(d.text for d in first)
        turn2 = chat + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And which are blue?"}]
        second = list(s.submit(Request(turn2, GREEDY, max_tokens=6)))
        edited = turn2[:-1] + [{"role": "user", "content": "Name one green item."}]
        third = list(s.submit(Request(edited, GREEDY, max_tokens=6)))
    finally:
        s.close()
    u2, u3 = second[-1].usage, third[-1].usage
    assert u2 is not None and u3 is not None
    assert u2.prompt_reused >= n1 > 512
    assert u3.prompt_reused > 512 and u3.prompt_reused < u3.prompt_tokens
    assert token_ids(second) == alone(model, Request(turn2, GREEDY, max_tokens=6))
    assert token_ids(third) == alone(model, Request(edited, GREEDY, max_tokens=6))


def test_two_conversations_alternating_turns_keep_their_prefixes(model):
    s = Scheduler(model)
    chats = {
        "a": [{"role": "user", "content": "Name a fruit."}],
        "b": [{"role": "user", "content": "Name a city in Italy, please."}],
    }
    reused: dict[str, list[int]] = {"a": [], "b": []}
    prompts: dict[str, list[int]] = {"a": [], "b": []}
    try:
        for turn in range(3):
            for name in ("a", "b"):
                deltas = list(s.submit(Request(chats[name], GREEDY, max_tokens=4)))
                usage = deltas[-1].usage
                assert usage is not None
                reused[name].append(usage.prompt_reused)
                prompts[name].append(usage.prompt_tokens)
                answer = "".join(d.text for d in deltas)
                chats[name] += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"One more ({turn})."},
                ]
    finally:
        s.close()
    for name in ("a", "b"):
        # every later turn kept all of its conversation's previous prompt, though the other
        # conversation ran in between
        assert all(reused[name][t] >= prompts[name][t - 1] for t in (1, 2)), (name, reused, prompts)
        assert reused[name][0] < reused[name][1] < reused[name][2]


def test_cancel_mid_run_frees_the_slot_and_spares_the_others(model):
    keep = Request("The capital of France is", GREEDY, max_tokens=8, raw=True)
    want = alone(model, keep)
    s = Scheduler(model)
    try:
        victim = s.submit(Request("Once upon a time", GREEDY, max_tokens=300, raw=True))
        kept = s.submit(keep)
        got_v: list[Delta] = []
        for d in victim:
            got_v.append(d)
            if len(got_v) == 2:
                victim.cancel()
        assert got_v[-1].finish_reason == "cancelled"
        assert got_v[-1].usage is not None and got_v[-1].usage.completion_tokens < 8
        assert token_ids(list(kept)) == want
        # cancelled before its first token (waiting, or reading its prompt): none comes, the slot is freed
        long_prompt = s.submit(Request([{"role": "user", "content": notes(40)}], GREEDY, max_tokens=5))
        long_prompt.cancel()
        end = list(long_prompt)[-1]
        assert end.finish_reason == "cancelled" and end.usage is not None and end.usage.completion_tokens == 0
        assert s.active == 0 and all(slot.seq is None for slot in s.slots)
    finally:
        s.close()


def test_queue_bound_counts_requests_waiting_for_a_slot(model):
    s = Scheduler(model, max_queue=1)
    try:
        running = [s.submit(Request(f"Story number {i}:", GREEDY, max_tokens=300, raw=True)) for i in range(SLOTS)]
        deadline = time.monotonic() + 60
        while s.active < SLOTS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.active == SLOTS
        waiting = s.submit(Request("Hello", GREEDY, max_tokens=2, raw=True))
        with pytest.raises(EngineBusy, match="waiting"):
            s.submit(Request("Hello", GREEDY, max_tokens=2, raw=True))
        waiting.cancel()  # leaves the queue within a step though no slot is free
        deadline = time.monotonic() + 30
        while s.waiting and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.waiting == 0 and list(waiting)[-1].finish_reason == "cancelled"
        after = s.submit(Request("Hello", GREEDY, max_tokens=2, raw=True))  # room again
        for r in running:
            r.cancel()
        assert all(list(r)[-1].finish_reason == "cancelled" for r in running)
        assert after.text()  # it got a slot once they left
    finally:
        s.close()


def test_too_long_prompt_is_refused_before_it_takes_a_slot(model):
    s = Scheduler(model)
    try:
        with pytest.raises(PromptTooLong, match="context holds 1024"):
            s.submit(Request("word " * 1100, GREEDY, raw=True))
        assert s.waiting == 0 and s.active == 0
        assert all(slot.prefix.tokens == [] for slot in s.slots)
    finally:
        s.close()


def test_slots_that_do_not_fit_the_memory_are_refused(model_path):
    with pytest.raises(OutOfMemoryError, match="200000 sequence slots x 1024 tokens"):
        load(model_path, backend="cpu", context_length=1024, slots=200_000)
