"""Esc in the message box, pressed as a user does: it stops the open chat's answer (the engine
ends it as cancelled, long before its token limit), and otherwise leaves edit mode."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.app.conftest import ANSWER_TIMEOUT_MS, LOAD_TIMEOUT_MS, preset, wait_loaded
from tests.app.transcript_links import click_link

pytestmark = pytest.mark.gui


def test_escape_during_an_answer_stops_it_at_the_engine(qtbot, make_app, home):
    preset(home, backend="cpu", context_length=2048, max_tokens=400, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    tokens = []
    app.worker.tokens_changed.connect(lambda _id, t: tokens.append(t))
    app.chat.send("Once upon a time, in a land far away,")
    qtbot.waitUntil(lambda: len(tokens) >= 2, timeout=LOAD_TIMEOUT_MS)  # it is writing now
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS) as done:
        qtbot.keyClick(app.window.chat.input, Qt.Key.Key_Escape)
    assert done.args[1] == "cancelled"
    stats = app.store.messages(app.chat.conversation_id)[-1].stats
    assert stats["generation_tokens"] < 400, stats  # the engine stopped, not the token limit
    assert "Stopped." in app.window.chat.transcript_text()


def test_escape_while_editing_a_message_leaves_edit_mode(qtbot, qloop, make_app):
    app = make_app(autoload=False)
    conv = app.store.create_conversation("Edit")
    app.store.add_message(conv.id, "user", "What can you do?")
    app.store.add_message(conv.id, "assistant", "Many things.")
    app.chat.open_conversation(conv.id)
    view = app.window.chat
    click_link(qtbot, view, "Edit")
    assert app.chat.editing_id is not None and view.edit_banner.isVisible()
    qtbot.keyClick(view.input, Qt.Key.Key_Escape)
    assert app.chat.editing_id is None and not view.edit_banner.isVisible()
