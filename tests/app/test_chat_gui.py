"""The window on the real worker process and the real embedded model.

Answers are kept to a few tokens (greedy) so each test is a model load plus a few steps.
Everything waits on signals or conditions; nothing sleeps.
"""

from __future__ import annotations

import sqlite3

import pytest
from PySide6.QtCore import Qt

from phoenix_chat.app.store import db_path
from tests.app.conftest import ANSWER_TIMEOUT_MS, preset, wait_loaded
from tests.app.transcript_links import click_link

pytestmark = [pytest.mark.gui, pytest.mark.slow]


def db_messages(home):
    db = sqlite3.connect(db_path(home))
    return db.execute("SELECT role, content, complete FROM messages ORDER BY conversation_id, position").fetchall()


def finish(qtbot, app, action):
    """Run `action` (which starts an answer) and wait for the answer to finish."""
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as blocker:
        action()
    return blocker.args  # (assistant message id, finish reason)


def test_send_streams_tokens_into_the_view_and_saves_the_answer(qtbot, make_app, home):
    preset(home, max_tokens=6, temperature=0.0)
    app = make_app()
    w = app.window
    assert w.windowTitle().startswith("Phoenix Chat")
    # The message box has the keyboard focus at start, so a user can type at once.
    qtbot.waitUntil(lambda: w.focusWidget() is w.chat.input, timeout=5_000)
    info = wait_loaded(qtbot, app)
    assert info["is_instruction_tuned"] is False
    assert w.chat.notice.isVisible() and "base model" in w.chat.notice.text()
    deltas = []
    app.worker.tokens_changed.connect(lambda _id, text: deltas.append(text))
    qtbot.keyClicks(w.chat.input, "The capital of France is")
    with qtbot.waitSignal(app.worker.tokens_changed, timeout=ANSWER_TIMEOUT_MS):
        qtbot.keyClick(w.chat.input, Qt.Key_Return)
    # The first delta is on screen while the answer is still being written.
    qtbot.waitUntil(lambda: deltas[0].strip() in w.chat.transcript_text(), timeout=5_000)
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        pass
    answer = "".join(deltas)
    assert answer.strip()
    assert done.args[1] in ("length", "stop")
    app.store.flush()
    assert db_messages(home) == [("user", "The capital of France is", 1), ("assistant", answer, 1)]
    assert answer.strip().splitlines()[0] in w.chat.transcript_text()
    assert w.chat.input.toPlainText() == ""
    assert "tok/s" in w.tps_label.text() and w.ttft_label.text().startswith("TTFT")
    used, limit = w.context_label.text().split()[1].split("/")
    assert int(used.replace(",", "")) > 0 and int(limit.replace(",", "")) == info["context_length"]
    # The conversation got a title from the first message.
    assert w.conversations.list.currentItem().text() == "The capital of France is"


def test_shift_enter_is_a_newline_not_a_send(qtbot, make_app, home):
    app = make_app(autoload=False)
    box = app.window.chat.input
    sent = []
    app.window.chat.send_requested.connect(sent.append)
    qtbot.keyClicks(box, "line one")
    qtbot.keyClick(box, Qt.Key_Return, Qt.ShiftModifier)
    qtbot.keyClicks(box, "line two")
    assert box.toPlainText() == "line one\nline two" and sent == []


def test_stop_mid_answer_keeps_the_partial_answer(qtbot, make_app, home):
    preset(home, max_tokens=400, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    with qtbot.waitSignal(app.worker.tokens_changed, timeout=ANSWER_TIMEOUT_MS):
        app.chat.send("Tell me a long story about a dragon.")
    assert app.window.chat.stop_button.isEnabled()
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        qtbot.mouseClick(app.window.chat.stop_button, Qt.LeftButton)
    assert done.args[1] == "cancelled"
    app.store.flush()
    (_, _, _), (role, content, complete) = db_messages(home)
    assert role == "assistant" and content.strip() and complete == 1
    assert "Stopped." in app.window.chat.transcript_text()
    assert app.window.chat.send_button.isEnabled() and not app.window.chat.stop_button.isEnabled()


def test_regenerate_writes_a_new_version_of_the_last_answer(qtbot, make_app, home):
    preset(home, max_tokens=4, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    first_id, _ = finish(qtbot, app, lambda: app.chat.send("Once upon a time"))
    second_id, _ = finish(qtbot, app, lambda: qtbot.mouseClick(app.window.chat.regenerate_button, Qt.LeftButton))
    assert second_id == first_id  # the old text is kept as version 1 (test_answer_versions_gui.py)
    app.store.flush()
    rows = db_messages(home)
    assert [r[0] for r in rows] == ["user", "assistant"]
    assert [(m.id, m.version, m.versions) for m in app.chat.messages][1] == (second_id, 2, 2)


def test_edit_an_earlier_message_and_resend(qtbot, make_app, home):
    preset(home, max_tokens=3, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    finish(qtbot, app, lambda: app.chat.send("First question"))
    finish(qtbot, app, lambda: app.chat.send("Second question"))
    first_user = app.chat.messages[0]
    assert [m.role for m in app.chat.messages] == ["user", "assistant", "user", "assistant"]
    assert click_link(qtbot, app.window.chat, "Edit", 0).endswith(f"/edit/{first_user.id}")
    assert app.window.chat.edit_banner.isVisible()
    assert app.window.chat.input.toPlainText() == "First question"
    app.window.chat.input.setPlainText("An edited question")
    finish(qtbot, app, lambda: qtbot.keyClick(app.window.chat.input, Qt.Key_Return))
    app.store.flush()
    rows = db_messages(home)
    assert [(r[0], r[1]) for r in rows][0] == ("user", "An edited question")
    assert [r[0] for r in rows] == ["user", "assistant"]
    assert not app.window.chat.edit_banner.isVisible()
