"""The conversation list's buttons, File → Export, File → Quit, View → Device panel and the
Chat settings… button, clicked or triggered as a user would, with their effect checked where it
lands: the real SQLite store, the exported file, the saved settings. No model is loaded (these
controls never reach the engine; what the chat settings do there is tested where answers run)."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from phoenix_chat.app.views.dialogs import ChatSettingsDialog

pytestmark = pytest.mark.gui


def titles(app) -> list[str]:
    return sorted(c.title for c in app.store.list_conversations())


def test_new_rename_and_delete_buttons_change_the_store(qtbot, qloop, make_app, monkeypatch):
    app = make_app(autoload=False)
    lv = app.window.conversations
    first = app.chat.conversation_id
    qtbot.mouseClick(lv.new_button, Qt.MouseButton.LeftButton)
    second = app.chat.conversation_id
    assert second != first and lv.current_id() == second and len(app.store.list_conversations()) == 2

    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Plums", True))
    qtbot.mouseClick(lv.rename_button, Qt.MouseButton.LeftButton)
    assert app.store.conversation(second).title == "Plums"
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Not this", False))  # Cancel
    qtbot.mouseClick(lv.rename_button, Qt.MouseButton.LeftButton)
    assert app.store.conversation(second).title == "Plums"

    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.No)
    qtbot.mouseClick(lv.delete_button, Qt.MouseButton.LeftButton)
    assert app.store.conversation(second) is not None
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(lv.delete_button, Qt.MouseButton.LeftButton)
    assert app.store.conversation(second) is None and app.chat.conversation_id == first
    assert lv.list.count() == 1


@pytest.mark.parametrize("fmt", ["markdown", "json"])
def test_export_menu_writes_the_open_conversation(qtbot, qloop, make_app, monkeypatch, tmp_path, fmt):
    app = make_app(autoload=False)
    conv = app.chat.conversation_id
    app.chat.rename_conversation(conv, "Rivers")
    app.store.add_message(conv, "user", "Name a long river.")
    app.store.add_message(conv, "assistant", "The Nile.")
    other = app.chat.new_conversation()
    app.store.add_message(other, "user", "not this one")
    app.chat.open_conversation(conv)
    target = tmp_path / f"out.{fmt}"
    asked = {}

    def save_as(parent, caption, suggested, filters):
        asked.update(suggested=suggested, filters=filters)
        return str(target), filters

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_as)
    action = app.window.export_markdown_action if fmt == "markdown" else app.window.export_json_action
    action.trigger()
    assert asked["suggested"].endswith("Rivers.md" if fmt == "markdown" else "Rivers.json")
    text = target.read_text(encoding="utf-8")
    assert "The Nile." in text and "not this one" not in text
    if fmt == "json":
        exported = json.loads(text)["conversations"]
        assert [c["title"] for c in exported] == ["Rivers"]
        assert [m["content"] for m in exported[0]["messages"]] == ["Name a long river.", "The Nile."]
    else:
        assert text.lstrip().startswith("# Rivers")
    assert str(target) in app.window.statusBar().currentMessage()


def test_device_panel_toggles_and_the_choice_survives_a_restart(qtbot, qloop, make_app):
    app = make_app(autoload=False)
    assert app.window.device_dock.isVisible()
    app.window.device_panel_action.trigger()
    assert not app.window.device_dock.isVisible() and app.settings.values.show_device_panel is False
    app.shutdown()
    again = make_app(autoload=False)
    assert not again.window.device_dock.isVisible() and not again.window.device_panel_action.isChecked()


def test_chat_settings_button_opens_the_chats_settings_and_saves_what_is_accepted(qtbot, qloop, make_app, monkeypatch):
    app = make_app(autoload=False)
    conv = app.chat.conversation_id
    app.chat.set_chat_settings("Be kind.", {**app.settings.values.sampling_defaults(), "temperature": 0.4})
    shown = {}

    def accept(dialog):  # what a user does in the dialog: read it, change two fields, press OK
        shown.update(prompt=dialog.system_prompt.toPlainText(), temperature=dialog.temperature.value())
        dialog.system_prompt.setPlainText("Answer in one word.")
        dialog.max_tokens.setValue(7)
        return True

    monkeypatch.setattr(ChatSettingsDialog, "exec", accept)
    qtbot.mouseClick(app.window.chat.settings_button, Qt.MouseButton.LeftButton)
    assert shown == {"prompt": "Be kind.", "temperature": pytest.approx(0.4)}  # the chat's own, not defaults
    saved = app.store.conversation(conv)
    assert saved.system_prompt == "Answer in one word." and saved.sampling["max_tokens"] == 7
    assert saved.sampling["temperature"] == pytest.approx(0.4)
    monkeypatch.setattr(ChatSettingsDialog, "exec", lambda dialog: False)  # Cancel keeps them
    qtbot.mouseClick(app.window.chat.settings_button, Qt.MouseButton.LeftButton)
    assert app.store.conversation(conv).system_prompt == "Answer in one word."


def test_quit_closes_the_window_and_shuts_the_app_down(qtbot, qloop, make_app):
    app = make_app(autoload=False)
    app.window.quit_action.trigger()
    assert not app.window.isVisible() and app._closed
    assert app.worker.process is None or not app.worker.process.is_alive()
