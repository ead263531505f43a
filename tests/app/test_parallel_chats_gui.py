"""Two chats answered at once in the real window (issue 19, scope item 5): the real worker process
and the embedded 270M on the CPU backend with two KV slots (Devices → Parallel answers → 2; the
default is 1), the real SQLite file. Each stored answer is checked against the engine's own greedy answer
for that conversation (an in-process 2-slot model and scheduler answering it alone: a sequence's
bits do not depend on who shares its steps, tests/test_batching.py); overlap is read from the
order of the worker's events (one pipe, in the order the worker sent them)."""

from __future__ import annotations

import json
import sqlite3

import pytest
from PySide6.QtCore import Qt

from phoenix_chat.app.store import db_path
from phoenix_chat.engine.generate import PromptIds
from phoenix_chat.engine.loader import load
from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler
from tests.app.conftest import ANSWER_TIMEOUT_MS, LOAD_TIMEOUT_MS, preset, wait_loaded

pytestmark = [pytest.mark.gui, pytest.mark.slow]

CONTEXT = 2048
STORY = "Tell me a long story about a phoenix."
DRAGON = "Write a long poem about a dragon and the sea."
HELLO = "Say hello to my friend."


@pytest.fixture(scope="module")
def reference():
    """The engine in this process, as the worker loads it for these tests (CPU, 2 slots)."""
    model = load(backend="cpu", context_length=CONTEXT, slots=2)
    scheduler = Scheduler(model)
    yield scheduler
    scheduler.close()
    model.close()
    _answers.clear()


# (prompt ids, sampling, max_tokens) -> the reference's answer: the tests ask only for greedy ones
# (expected() checks), so a request asked again (the story, in two tests) is answered once
_answers: dict[tuple[tuple[int, ...], str, int], str] = {}


def engine_answer(scheduler: Scheduler, ids: list[int], params: dict, max_tokens: int) -> str:
    """The engine's answer to exactly these prompt ids, alone in the scheduler."""
    key = (tuple(ids), json.dumps(params, sort_keys=True), max_tokens)
    if key not in _answers:
        request = Request(PromptIds(tuple(ids)), SamplingParams(**params), max_tokens)
        _answers[key] = scheduler.submit(request).text()
    return _answers[key]


class Events:
    """The worker's events per generation id, in arrival order, and what each answer was given."""

    def __init__(self, app):
        self.order: list[tuple[str, str]] = []
        self.started: dict[str, dict] = {}
        self.prompt_ids: dict[str, list[int]] = {}
        w = app.worker
        w.generation_started.connect(lambda gid, info: self.started.__setitem__(gid, info))
        w.prompt_ready.connect(lambda gid, _mode, ids: self.prompt_ids.__setitem__(gid, ids))
        w.tokens_changed.connect(lambda gid, _t: self.order.append(("tokens", gid)))
        w.generation_finished.connect(lambda gid, *_: self.order.append(("finished", gid)))

    def index(self, kind: str, gid: str) -> int:
        return self.order.index((kind, gid))

    def tokens_after(self, gid: str, at: int) -> int:
        return sum(1 for e in self.order[at + 1 :] if e == ("tokens", gid))

    def seen(self, kind: str, gid: str) -> bool:
        return (kind, gid) in self.order


def start_chat(qtbot, app, text: str, max_tokens: int) -> tuple[int, str]:
    """A new chat in chat mode with its own answer length; send `text`; (conversation, generation id)."""
    chat = app.chat
    conv = chat.new_conversation()
    chat.set_chat_mode("chat")  # completion mode (the base model's default) would end at a blank line
    chat.set_chat_settings("", {**app.settings.values.sampling_defaults(), "max_tokens": max_tokens})
    chat.send(text)
    qtbot.waitUntil(lambda: conv in chat.answers and chat.answers[conv].gen_id is not None, timeout=LOAD_TIMEOUT_MS)
    gen_id = chat.answers[conv].gen_id
    assert gen_id is not None
    return conv, gen_id


def stored(home) -> dict[int, tuple[str, int]]:
    """conversation id → (its answer's text, complete) in the SQLite file."""
    db = sqlite3.connect(db_path(home))
    rows = db.execute("SELECT conversation_id, content, complete FROM messages WHERE role='assistant'").fetchall()
    return {conv: (content, complete) for conv, content, complete in rows}


def expected(reference, events: Events, gid: str, conv_text: str, max_tokens: int) -> str:
    """The engine's greedy answer for the conversation `gid` answered: the worker's prompt ids are
    the chat template's encoding of that chat (checked), answered with the sampling it reported."""
    ids, _ = reference.encode([{"role": "user", "content": conv_text}])
    assert events.prompt_ids[gid] == ids
    started = events.started[gid]
    assert started["params"]["temperature"] == 0.0 and started["max_tokens"] == max_tokens
    return engine_answer(reference, ids, started["params"], max_tokens)


def test_two_chats_stream_at_once_each_into_its_own_conversation(qtbot, make_app, home, reference):
    preset(home, backend="cpu", context_length=CONTEXT, temperature=0.0)
    app = make_app()
    assert wait_loaded(qtbot, app)["slots"] == 1  # by default one chat answers at a time
    # Devices → Parallel answers → 2: the model reloads with two KV slots
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        app.window.parallel_actions[2].trigger()
    info = ready.args[0]
    assert info["slots"] == 2 and info["slots_note"] == ""  # the worker's backend holds two KV slots
    assert app.window.parallel_actions[2].isChecked() and app.chat.capacity() == 2
    assert "2 answers at once" in app.window.model_label.text()
    events = Events(app)
    view = app.window.chat

    a, a_gen = start_chat(qtbot, app, STORY, 120)
    qtbot.waitUntil(lambda: events.seen("tokens", a_gen), timeout=ANSWER_TIMEOUT_MS)
    b = app.chat.new_conversation()
    assert "answered at the same time" in view.hint.text() and view.send_button.isEnabled()
    app.chat.set_chat_mode("chat")
    app.chat.set_chat_settings("", {**app.settings.values.sampling_defaults(), "max_tokens": 24})
    app.chat.send(HELLO)
    assert app.chat.queue == [] and set(app.chat.answers) == {a, b}  # B did not wait for A
    qtbot.waitUntil(lambda: app.chat.answers[b].gen_id is not None, timeout=ANSWER_TIMEOUT_MS)
    b_gen = app.chat.answers[b].gen_id
    titles = [app.window.conversations.list.item(i).text() for i in range(app.window.conversations.list.count())]
    assert sum(t.startswith("●") for t in titles) == 2  # both marked as writing

    qtbot.waitUntil(lambda: events.seen("tokens", b_gen), timeout=ANSWER_TIMEOUT_MS)
    # the device panel's tokens/s is the engine's: both answers' rates summed while both write
    tps = app.window.devices.tps_value
    qtbot.waitUntil(lambda: "(2 answers)" in tps.text(), timeout=10_000)
    # each chat shows its own live text (what the view holds for its last bubble), A's then B's
    assert a in app.chat.answers  # 120 tokens: A is still writing
    app.chat.open_conversation(a)
    assert view._messages[-1].content == app.chat.answers[a].text and view.stop_button.isEnabled()
    assert STORY in view.transcript_text() and HELLO not in view.transcript_text()
    app.chat.open_conversation(b)
    if b in app.chat.answers:
        assert view._messages[-1].content == app.chat.answers[b].text
    assert HELLO in view.transcript_text() and STORY not in view.transcript_text()

    qtbot.waitUntil(lambda: not app.chat.answers, timeout=ANSWER_TIMEOUT_MS)

    # overlap: B's first text came before A finished, and A went on streaming after it
    b_first = events.index("tokens", b_gen)
    assert b_first < events.index("finished", a_gen)
    assert events.tokens_after(a_gen, b_first) > 0, events.order

    app.store.flush()
    rows = stored(home)
    assert rows[a] == (expected(reference, events, a_gen, STORY, 120), 1)
    assert rows[b] == (expected(reference, events, b_gen, HELLO, 24), 1)
    assert rows[a][0].strip() and rows[b][0].strip()
    assert "writing" not in view.hint.text() and not app.chat.queue


def test_stop_in_one_chat_leaves_the_other_answering_to_its_end(qtbot, make_app, home, reference):
    preset(home, backend="cpu", context_length=CONTEXT, temperature=0.0, parallel_answers=2)
    app = make_app()
    assert wait_loaded(qtbot, app)["slots"] == 2
    events = Events(app)
    view = app.window.chat
    a, a_gen = start_chat(qtbot, app, STORY, 120)
    b, b_gen = start_chat(qtbot, app, DRAGON, 120)
    qtbot.waitUntil(lambda: events.seen("tokens", b_gen) and events.seen("tokens", a_gen), timeout=ANSWER_TIMEOUT_MS)
    assert a in app.chat.answers  # 120 tokens take seconds here: A is still writing
    assert app.chat.conversation_id == b and view.stop_button.isEnabled()
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as stopped:
        qtbot.mouseClick(view.stop_button, Qt.LeftButton)  # B's Stop
        assert "stopping…" in view.transcript_text()
    assert stopped.args[1] == "cancelled"
    assert events.seen("finished", b_gen) and not events.seen("finished", a_gen)  # A goes on
    assert "Stopped." in view.transcript_text() and view.send_button.isEnabled()
    assert "is writing an answer" in view.hint.text()  # A, in the other chat
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as finished:
        pass
    assert finished.args[1] == "length"  # A wrote its whole 120 tokens

    app.store.flush()
    rows = stored(home)
    assert rows[a] == (expected(reference, events, a_gen, STORY, 120), 1)
    b_text, b_complete = rows[b]
    full_b = expected(reference, events, b_gen, DRAGON, 120)
    assert b_complete == 1 and b_text and full_b.startswith(b_text) and len(b_text) < len(full_b)


def test_one_parallel_answer_queues_the_second_chat_and_says_so(qtbot, make_app, home):
    preset(home, backend="cpu", context_length=CONTEXT, temperature=0.0, parallel_answers=2)
    app = make_app()
    assert wait_loaded(qtbot, app)["slots"] == 2
    # Devices → Parallel answers → 1: the model reloads with one KV slot
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        app.window.parallel_actions[1].trigger()
    assert ready.args[0]["slots"] == 1 and app.settings.values.parallel_answers == 1
    assert app.chat.capacity() == 1 and "answers at once" not in app.window.model_label.text()
    events = Events(app)
    view = app.window.chat

    a, a_gen = start_chat(qtbot, app, STORY, 40)  # B is sent at A's first text: A is still writing
    qtbot.waitUntil(lambda: events.seen("tokens", a_gen), timeout=ANSWER_TIMEOUT_MS)
    b = app.chat.new_conversation()
    assert "waits for it" in view.hint.text() and "Parallel answers" in view.hint.text()
    app.chat.set_chat_mode("chat")
    app.chat.set_chat_settings("", {**app.settings.values.sampling_defaults(), "max_tokens": 16})
    app.chat.send(HELLO)
    assert app.chat.queue == [b] and b not in app.chat.answers
    assert "Waiting" in view.hint.text() and "Parallel answers" in view.hint.text()
    titles = [app.window.conversations.list.item(i).text() for i in range(app.window.conversations.list.count())]
    assert f"◌ {HELLO}" in titles
    qtbot.waitUntil(lambda: b in app.chat.answers and app.chat.answers[b].gen_id is not None, timeout=ANSWER_TIMEOUT_MS)
    b_gen = app.chat.answers[b].gen_id
    qtbot.waitUntil(lambda: not app.chat.answers and not app.chat.queue, timeout=ANSWER_TIMEOUT_MS)
    # B was asked for only when A had finished, so none of its text came before A's end
    assert events.index("finished", a_gen) < events.index("tokens", b_gen)
    app.store.flush()
    rows = stored(home)
    assert rows[a][1] == 1 and rows[b][1] == 1 and rows[a][0] and rows[b][0]


def test_four_parallel_answers_reload_the_model_with_four_kv_slots(qtbot, make_app, home):
    preset(home, backend="cpu", context_length=CONTEXT, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    with qtbot.waitSignal(app.models.model_ready, timeout=LOAD_TIMEOUT_MS) as ready:
        app.window.parallel_actions[4].trigger()  # Devices → Parallel answers → 4
    assert ready.args[0]["slots"] == 4 and ready.args[0]["context_length"] == CONTEXT
    assert app.chat.capacity() == 4 and app.settings.values.parallel_answers == 4
