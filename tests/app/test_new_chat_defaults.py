"""Settings → Defaults for new chats… on the real window, worker process and embedded model:
what the dialog sets is what the engine gets for a new chat (the worker reports the sampling
it applied and the prompt it read), and a chat made before keeps its own settings."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from tests.app.conftest import ANSWER_TIMEOUT_MS, preset, wait_loaded

pytestmark = [pytest.mark.gui, pytest.mark.slow]

NEW_DEFAULTS = {"temperature": 0.7, "top_k": 12, "top_p": 0.8, "min_p": 0.05, "repetition_penalty": 1.15}


def send_and_wait(qtbot, app, text: str) -> dict:
    """Type `text`, press Enter, wait for the answer; returns what the worker says the engine got."""
    started: list[dict] = []
    app.worker.generation_started.connect(lambda _id, info: started.append(info))
    qtbot.keyClicks(app.window.chat.input, text)
    with qtbot.waitSignal(app.chat.answer_finished, timeout=ANSWER_TIMEOUT_MS):
        qtbot.keyClick(app.window.chat.input, Qt.Key_Return)
    assert len(started) == 1
    return started[0]


def test_defaults_dialog_sets_what_a_new_chat_sends_and_old_chats_keep_theirs(qtbot, make_app, home):
    preset(home, max_tokens=3, temperature=0.0)
    app = make_app()
    wait_loaded(qtbot, app)
    old_chat = app.chat.conversation_id

    app.window.defaults_action.trigger()  # Settings → Defaults for new chats…
    dialog = app.defaults.dialog
    assert dialog is not None and dialog.isVisible() and dialog.windowTitle() == "Defaults for new chats"
    assert dialog.values() == ("", {**app.settings.values.sampling_defaults()})
    dialog.system_prompt.setPlainText("Answer like a pirate.")
    for name, value in NEW_DEFAULTS.items():
        getattr(dialog, name).setValue(value)
    dialog.max_tokens.setValue(5)
    ok = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok)
    qtbot.mouseClick(ok, Qt.LeftButton)
    assert app.defaults.dialog is None
    saved = json.loads((home / "settings.json").read_text())
    assert saved["system_prompt"] == "Answer like a pirate." and saved["max_tokens"] == 5
    assert {k: saved[k] for k in NEW_DEFAULTS} == pytest.approx(NEW_DEFAULTS)

    app.window.new_chat_action.trigger()  # File → New chat
    assert app.chat.conversation_id != old_chat
    got = send_and_wait(qtbot, app, "Hello")
    assert {k: got["params"][k] for k in NEW_DEFAULTS} == pytest.approx(NEW_DEFAULTS)
    assert got["max_tokens"] == 5
    assert got["prompt"].index("Answer like a pirate.") < got["prompt"].index("Hello")
    assert "Answer like a pirate." in app.window.chat.transcript_text()

    # the chat made before the change keeps its greedy sampling, its 3 tokens and no system prompt
    app.chat.open_conversation(old_chat)
    got = send_and_wait(qtbot, app, "Hello again")
    assert got["params"]["temperature"] == 0.0 and got["max_tokens"] == 3
    assert "pirate" not in got["prompt"]


def test_cancelling_the_defaults_dialog_changes_nothing(qtbot, make_app, home):
    app = make_app(autoload=False)
    before = app.settings.values.sampling_defaults()
    app.window.defaults_action.trigger()
    dialog = app.defaults.dialog
    dialog.temperature.setValue(1.5)
    dialog.system_prompt.setPlainText("ignored")
    cancel = dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Cancel)
    qtbot.mouseClick(cancel, Qt.LeftButton)
    assert app.settings.values.sampling_defaults() == before and app.settings.values.system_prompt == ""
