"""View details that need no model: Markdown + highlighted code with a copy link, themes,
conversation list operations, the base-model notice, chat settings."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from phoenix_chat.app.views.action_links import ActionLinks
from phoenix_chat.app.views.chat_view import ShownMessage
from phoenix_chat.app.views.markdown_render import render_message, split_fences
from tests.app.conftest import preset
from tests.app.transcript_links import click_link

pytestmark = pytest.mark.gui


def test_fences_split_including_an_unfinished_one():
    parts = split_fences("Intro\n```python\nprint('hi')\n```\nmiddle\n```js\nlet x")
    assert parts == [
        ("text", "Intro\n", None),
        ("code", "print('hi')", "python"),
        ("text", "middle\n", None),
        ("code", "let x", "js"),
    ]


def test_code_is_highlighted_and_copyable(qtbot, qloop, make_app):
    app = make_app(autoload=False)
    view = app.window.chat
    links = ActionLinks()
    body, codes = render_message("Use **this**:\n```python\ndef f():\n    return 1\n```\n", links)
    assert codes == ["def f():\n    return 1"]
    assert f'href="{links.href("copy", 0)}"' in body
    code_html = body[body.index("<pre") :]
    assert '<span style="color' in code_html  # pygments colours, inline for Qt
    view.set_messages(
        [
            ShownMessage(1, "user", "code please"),
            ShownMessage(2, "assistant", "Use **this**:\n```python\ndef f():\n    return 1\n```\n"),
        ]
    )
    text = view.transcript_text()
    assert "def f():" in text and "Copy" in text and "**" not in text
    click_link(qtbot, view, "Copy", 1)  # the code block's (#0 is the answer's, by its label)
    assert QGuiApplication.clipboard().text() == "def f():\n    return 1"
    click_link(qtbot, view, "Copy", 0)  # the whole answer, as Markdown
    assert QGuiApplication.clipboard().text().startswith("Use **this**:")


def test_dark_theme_persists(qtbot, qloop, make_app, home):
    app = make_app(autoload=False)
    app.window.theme_actions["dark"].trigger()
    assert app.settings.values.theme == "dark"
    assert app.window.palette().window().color().lightness() < 128
    app.shutdown()
    again = make_app(autoload=False)
    assert again.window.theme_actions["dark"].isChecked()


def test_conversations_new_rename_search_delete(qtbot, qloop, make_app, home):
    app = make_app(autoload=False)
    chat, lv = app.chat, app.window.conversations
    first = chat.conversation_id
    chat.rename_conversation(first, "Apples")
    second = chat.new_conversation()
    chat.rename_conversation(second, "Bananas")
    assert lv.list.count() == 2 and lv.current_id() == second
    lv.search.setText("appl")
    assert [lv.list.item(i).text() for i in range(lv.list.count())] == ["Apples"]
    lv.search.clear()
    chat.delete_conversation(second)
    assert chat.conversation_id == first and lv.list.count() == 1
    chat.set_chat_settings("You are terse.", {"temperature": 0.0, "max_tokens": 5})
    assert "You are terse." in app.window.chat.transcript_text()
    assert app.store.conversation(first).sampling["max_tokens"] == 5


def test_a_base_model_gets_completion_mode_and_one_line_instead_of_a_banner(qtbot, qloop, make_app):
    """Issue 24: the embedded base model defaults to completion mode, said in one line; the
    switch is per chat and saved with it; an instruction-tuned model keeps chat mode."""
    app = make_app(autoload=False)
    info = {
        "name": "Gemma 3 270m",
        "path": None,
        "is_instruction_tuned": False,
        "quant": "file",
        "backend": "cpu",
        "device": "CPU",
        "context_length": 4096,
    }
    chat, view = app.chat, app.window.chat
    app.models.load_id = "load-x"
    app.models._on_model("load-x", info)
    assert not view.notice.isVisible()
    assert view.completion_switch.isChecked() and view.mode_line.isVisible()
    assert view.mode_line.text().startswith("Completion mode: this base model")
    assert chat.chat_mode() == "completion" and "base model" in app.window.model_label.text()
    first = chat.conversation_id
    qtbot.mouseClick(view.completion_switch, Qt.LeftButton)  # this chat → chat mode, saved with it
    assert app.store.conversation(first).mode == "chat" and chat.chat_mode() == "chat"
    assert view.mode_line.text().startswith("Chat mode on a base model")
    second = chat.new_conversation()  # a new chat follows the model again
    assert view.completion_switch.isChecked() and chat.chat_mode() == "completion"
    chat.open_conversation(first)
    assert not view.completion_switch.isChecked()
    # an instruction-tuned model: chat mode, and no line to read
    app.models.load_id = "load-y"
    app.models._on_model("load-y", {**info, "is_instruction_tuned": True})
    assert chat.chat_mode(second) == "chat" and not view.mode_line.isVisible()
    chat.open_conversation(second)
    assert not view.completion_switch.isChecked()


def test_export_current_conversation(qtbot, qloop, make_app, home, tmp_path):
    import json

    app = make_app(autoload=False)
    conv = app.chat.conversation_id
    app.store.add_message(conv, "user", "Hi there")
    app.store.add_message(conv, "assistant", "Hello!")
    other = app.store.create_conversation("Not exported")
    app.store.add_message(other.id, "user", "elsewhere")
    app.chat.export_current("markdown", tmp_path / "c.md")
    app.chat.export_current("json", tmp_path / "c.json")
    md = (tmp_path / "c.md").read_text()
    assert "## User\n\nHi there" in md and "## Assistant\n\nHello!" in md and "elsewhere" not in md
    data = json.loads((tmp_path / "c.json").read_text())
    assert [m["content"] for m in data["conversations"][0]["messages"]] == ["Hi there", "Hello!"]
    assert len(data["conversations"]) == 1


def test_a_notice_is_dismissed_by_its_close_button(qtbot, qloop, make_app, home):
    """The notice's ✕: a settings file naming a remote server that is not saved says so in the
    notice (no engine is started in its place); ✕ hides it, and the chat stays without a model."""
    preset(home, engine="remote", remote_profile="gone-box")
    app = make_app()
    view = app.window.chat
    qtbot.waitUntil(lambda: view.notice_kind() == "error", timeout=10_000)
    assert "No remote server named “gone-box”" in view.notice.text() and view.notice_close.isVisible()
    qtbot.mouseClick(view.notice_close, Qt.LeftButton)
    assert view.notice_kind() is None and not view.notice_close.isVisible()
    assert app.models.info is None
