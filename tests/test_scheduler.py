"""The scheduler (engine/scheduler.py) on the real embedded 270M, CPU backend: the one API every
client uses — submit a Request, read Deltas; stop strings, cancel, the queue bound, a prompt that
cannot fit, async clients, and a conversation's next turn reusing its prefix."""

from __future__ import annotations

import asyncio
import threading

import pytest

from phoenix_chat.engine.generate import generate, prompt_ids_for
from phoenix_chat.engine.loader import load
from phoenix_chat.engine.requests import EngineBusy, PromptTooLong, Request
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler
from phoenix_chat.engine.stop_strings import StopMatcher

GREEDY = SamplingParams(temperature=0)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model(model_path):
    m = load(model_path, backend="cpu", context_length=1024)
    yield m
    m.close()


@pytest.fixture
def scheduler(model):
    s = Scheduler(model, max_queue=2)
    yield s
    s.close()


def test_greedy_answer_equals_generate(model, scheduler):
    want = generate(model, PROMPT, GREEDY, max_tokens=12, raw=True)
    deltas = list(scheduler.submit(Request(PROMPT, GREEDY, max_tokens=12, raw=True)))
    assert "".join(d.text for d in deltas) == want
    final = deltas[-1]
    assert final.finish_reason == "length"
    assert final.usage is not None and final.usage.completion_tokens == 12
    assert final.usage.prompt_tokens == len(prompt_ids_for(model, PROMPT, raw=True))
    assert all(d.finish_reason is None for d in deltas[:-1])


def test_stop_string_ends_the_answer_before_it(model, scheduler):
    full = generate(model, PROMPT, GREEDY, max_tokens=16, raw=True)
    word = full.split()[2]
    stop = full[full.index(word) : full.index(word) + len(word)]
    deltas = list(scheduler.submit(Request(PROMPT, GREEDY, max_tokens=16, raw=True, stop=(stop,))))
    text = "".join(d.text for d in deltas)
    assert text == full[: full.index(stop)]
    assert deltas[-1].finish_reason == "stop"


def test_stop_matcher_holds_back_a_partial_stop():
    m = StopMatcher(["</end>"])
    assert m.feed("hello </e") == "hello "
    assert m.feed("nd> more") == ""
    assert m.stopped
    m2 = StopMatcher(["</end>"])
    assert m2.feed("a </e") == "a "
    assert m2.feed("x") == "</ex"
    assert m2.flush() == ""


def test_prompt_that_cannot_fit_is_refused_at_submit(scheduler):
    with pytest.raises(PromptTooLong, match="context holds 1024"):
        scheduler.submit(Request("word " * 1200, GREEDY, raw=True))
    assert scheduler.waiting == 0


def test_a_request_for_no_tokens_is_refused_when_made():
    from phoenix_chat.engine.errors import PhoenixError

    with pytest.raises(PhoenixError, match="max_tokens must be at least 1, not 0"):  # one token came out before
        Request("word", GREEDY, max_tokens=0)


def test_cancel_ends_a_running_request_and_the_engine_goes_on(scheduler):
    stream = scheduler.submit(Request(PROMPT, GREEDY, max_tokens=400, raw=True))
    got = []
    for d in stream:
        got.append(d)
        if len(got) == 3:
            stream.cancel()
    assert got[-1].finish_reason == "cancelled"
    assert len(got) < 40
    assert scheduler.submit(Request(PROMPT, GREEDY, max_tokens=3, raw=True)).text()


def test_full_queue_is_refused_with_engine_busy(scheduler):
    started = threading.Event()
    first = scheduler.submit(Request(PROMPT, GREEDY, max_tokens=300, raw=True))
    it = iter(first)
    next(it)
    started.set()
    waiting = [scheduler.submit(Request(PROMPT, GREEDY, max_tokens=2, raw=True)) for _ in range(2)]
    with pytest.raises(EngineBusy, match="waiting"):
        scheduler.submit(Request(PROMPT, GREEDY, max_tokens=2, raw=True))
    first.cancel()
    list(it)
    assert all(w.text() for w in waiting)


def test_async_client_reads_the_same_answer(model, scheduler):
    want = generate(model, PROMPT, GREEDY, max_tokens=8, raw=True)

    async def ask() -> str:
        stream = scheduler.submit(Request(PROMPT, GREEDY, max_tokens=8, raw=True), loop=asyncio.get_running_loop())
        return "".join([d.text async for d in stream])

    # on a thread of its own: the GUI tests' session-wide qasync loop counts as running in this
    # thread, and asyncio.run refuses to start inside a running loop
    got: list[str] = []
    t = threading.Thread(target=lambda: got.append(asyncio.run(ask())))
    t.start()
    t.join(timeout=300)
    assert got == [want]


def test_next_turn_reuses_the_conversation_prefix(scheduler):
    chat = [{"role": "user", "content": "Name a colour."}]
    first = list(scheduler.submit(Request(chat, GREEDY, max_tokens=6)))
    answer = "".join(d.text for d in first)
    chat2 = chat + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Another one."}]
    second = list(scheduler.submit(Request(chat2, GREEDY, max_tokens=6)))
    usage = second[-1].usage
    assert usage is not None and usage.prompt_reused > 10
    assert usage.prompt_reused < usage.prompt_tokens


def test_exclusive_waits_for_running_requests_and_holds_new_ones(model, scheduler):
    """The GUI worker's speculative answers run outside the scheduler under exclusive(): it
    enters only when nothing runs, a request submitted meanwhile waits (a cancelled one still
    ends at once), and afterwards the scheduler serves again with its prefixes forgotten."""
    running = scheduler.submit(Request(PROMPT, GREEDY, max_tokens=40, raw=True))
    first = next(iter(running))
    assert first.finish_reason is None
    entered = threading.Event()
    release = threading.Event()
    log: list[str] = []

    def hold() -> None:
        with scheduler.exclusive():
            log.append("entered")
            entered.set()
            release.wait(30)
            log.append("leaving")

    holder = threading.Thread(target=hold)
    holder.start()
    rest = list(running)  # the running request is not stopped by the holder
    assert rest[-1].finish_reason == "length"
    assert entered.wait(30)
    waiting = scheduler.submit(Request(PROMPT, GREEDY, max_tokens=4, raw=True))
    dropped = scheduler.submit(Request(PROMPT, GREEDY, max_tokens=4, raw=True))
    dropped.cancel()
    assert [d.finish_reason for d in dropped] == ["cancelled"]  # dropped while the model is held
    assert scheduler.active == 0 and scheduler.waiting == 1  # not admitted while held
    log.append("released")
    release.set()
    holder.join()
    assert waiting.text() == generate(model, PROMPT, GREEDY, max_tokens=4, raw=True)
    assert log == ["entered", "released", "leaving"]


@pytest.fixture(scope="module")
def model_2_slots(model_path):
    m = load(model_path, backend="cpu", context_length=256, slots=2)
    yield m
    m.close()


@pytest.mark.parametrize("slots", [1, 2])
def test_cancel_frees_the_slot_by_the_next_step(request, slots):
    """Counted in the scheduler's own steps, not in seconds: a cancel that arrives while step k
    runs (the worst moment: just after the step's start checked for cancels) lets step k finish —
    at most one more token — and by the start of step k+1 the request holds no slot and the
    request waiting for one has it. With 2 slots the other running request goes on untouched."""
    model = request.getfixturevalue("model" if slots == 1 else "model_2_slots")
    scheduler = Scheduler(model, max_queue=2)
    steps: list[dict[int, str | None]] = []  # per step, as it starts: slot -> the request id in it
    seen: dict[str, int] = {}  # at the cancel: the step, the slot, the tokens produced so far
    victim = Request(PROMPT, GREEDY, max_tokens=400, raw=True)
    run_step = scheduler._step

    def watched_step() -> None:  # on the scheduler's thread
        steps.append({s.index: s.seq.stream.id if s.seq else None for s in scheduler.slots})
        seq = next((s for s in scheduler._running if s.stream.id == victim.id), None)
        if not seen and seq is not None and seq.count >= 3:
            seen.update(step=len(steps) - 1, slot=seq.slot.index, count=seq.count)
            seq.stream.cancel()  # the client's call, made as this step starts
        run_step()

    scheduler._step = watched_step  # type: ignore[method-assign]
    try:
        stream = scheduler.submit(victim)
        beside = Request("Water boils at", GREEDY, max_tokens=30, raw=True)
        others = [scheduler.submit(beside)] if slots == 2 else []
        late = scheduler.submit(Request("My favourite fruit is", GREEDY, max_tokens=4, raw=True))
        deltas = list(stream)
        answers = [s.text() for s in [*others, late]]
    finally:
        scheduler.close()
    assert seen, "the request never reached 3 tokens"
    final = deltas[-1]
    assert final.finish_reason == "cancelled" and final.usage is not None
    assert final.usage.completion_tokens <= seen["count"] + 1  # at most the step in flight's token
    k = seen["step"]
    assert steps[k][seen["slot"]] == victim.id
    assert victim.id not in steps[k + 1].values()  # free by the next step …
    assert steps[k + 1][seen["slot"]] == late.request.id  # … and already given to the waiting request
    want = [generate(model, "Water boils at", GREEDY, max_tokens=30, raw=True)] * (slots - 1)
    want.append(generate(model, "My favourite fruit is", GREEDY, max_tokens=4, raw=True))
    assert answers == want


def test_more_running_than_the_batched_step_holds_take_turns(model_path, monkeypatch):
    """A backend whose batched step holds fewer rows than are running (Vulkan: 32, however many
    slots) gets steps of at most that many; every request still gets its solo greedy answer.
    Before, 33 running sequences on a 33-slot Vulkan backend failed every step."""
    from phoenix_chat.engine.backends.cpu import CpuBackend

    m = load(model_path, backend="cpu", context_length=64, slots=3)
    try:
        assert m.backend.max_batch_rows == 3  # the CPU's batched step holds every slot
        monkeypatch.setattr(CpuBackend, "max_batch_rows", property(lambda self: 2))
        prompts = ["The capital of France is", "1, 2, 3,", "Once upon a time"]
        want = [generate(m, p, GREEDY, max_tokens=4, raw=True) for p in prompts]
        s = Scheduler(m)
        try:
            streams = [s.submit(Request(p, GREEDY, max_tokens=4, raw=True)) for p in prompts]
            got = ["".join(d.text for d in st) for st in streams]
            assert s.max_batch == 2  # never more rows than the step holds
        finally:
            s.close()
        assert got == want
    finally:
        m.close()
