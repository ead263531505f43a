"""Message text is shown, never obeyed (issue 24, defect 4).

Users and models write the messages; raw HTML must show literally, links to the app's own
actions (`edit:`, `copy:`, `copymsg:`) must be inert when a message makes them, and single
line breaks must survive. Checked in the real window on the real store, clicking with the
mouse.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QGuiApplication

from tests.app.transcript_links import anchors, click_link, click_text

pytestmark = pytest.mark.gui

FORGED_EDIT = 'Nice question. <a href="edit:{uid}">Edit it</a> or [Edit this](edit:{uid}) or <edit:{uid}>'
FORGED_COPY = "Also [Copy](copymsg:0), [code](copy:0) and [open](file:///etc/passwd) ![pic](file:///tmp/x.png)"


def open_conversation(app, *messages: tuple[str, str]) -> list[int]:
    """A new conversation holding `messages` (role, content), shown in the window; message ids."""
    conv = app.store.create_conversation("Safety")
    ids = [app.store.add_message(conv.id, role, content).id for role, content in messages]
    app.chat.open_conversation(conv.id)
    return ids


def test_raw_html_shows_literally(qtbot, make_app):
    app = make_app(autoload=False)
    view = app.window.chat
    open_conversation(
        app,
        ("user", "Make it <b>x</b> please"),
        ("assistant", 'Sure: <font color=red>red</font> and <b>x</b> and <div align="right">moved</div>'),
    )
    text = view.transcript_text()
    assert "Make it <b>x</b> please" in text
    assert "<font color=red>red</font>" in text and '<div align="right">moved</div>' in text
    html = view.transcript.toHtml()
    assert 'font-weight:700;">x' not in html and "#ff0000" not in html


def test_forged_action_links_are_inert(qtbot, make_app):
    app = make_app(autoload=False)
    view = app.window.chat
    conv_probe = app.store.create_conversation("probe")
    uid = app.store.add_message(conv_probe.id, "user", "probe").id + 1  # the next id: the user message below
    ids = open_conversation(
        app,
        ("user", "What can you do?"),
        ("assistant", FORGED_EDIT.format(uid=uid) + "\n\n" + FORGED_COPY),
    )
    assert ids[0] == uid
    before = [(m.role, m.content) for m in app.store.messages(app.chat.conversation_id)]
    edits: list[int] = []
    view.edit_requested.connect(edits.append)
    QGuiApplication.clipboard().setText("untouched")

    # The only links left are the chrome's own: Edit on the user message, Copy on the answer.
    assert [text for _href, text in anchors(view)] == ["Edit", "Copy"], anchors(view)
    assert [href.split("/", 1)[1] for href, _text in anchors(view)] == [f"edit/{uid}", "copymsg/1"]
    text = view.transcript_text()
    assert f'<a href="edit:{uid}">Edit it</a>' in text and "[image: pic]" in text
    for forged in ("Edit this", f"edit:{uid}", "Copy", "code", "open"):
        nth = 1 if forged == "Copy" else 0  # "Copy" #0 is the chrome link of the answer
        assert click_text(qtbot, view, forged, nth) == "", f"{forged!r} is still a link"
    # A forged href that did reach the view (old scheme, or ours without the token) does nothing.
    for url in (f"edit:{uid}", "copymsg:1", "copy:0", f"phoenix-action:0000/edit/{uid}"):
        view._on_anchor(QUrl(url))
    assert edits == [] and not view.edit_banner.isVisible()
    assert QGuiApplication.clipboard().text() == "untouched"
    assert [(m.role, m.content) for m in app.store.messages(app.chat.conversation_id)] == before

    # The chrome's own links still work, clicked with the mouse.
    click_link(qtbot, view, "Copy")
    assert QGuiApplication.clipboard().text().startswith("Nice question.")
    click_link(qtbot, view, "Edit")
    assert edits == [uid] and view.edit_banner.isVisible()
    assert view.input.toPlainText() == "What can you do?"


def test_code_block_copy_link_copies_the_code(qtbot, make_app):
    app = make_app(autoload=False)
    view = app.window.chat
    open_conversation(app, ("user", "code?"), ("assistant", "Here:\n```python\nprint(1)\n```\n"))
    click_link(qtbot, view, "Copy", 1)  # #0 is the answer's own, by its "Gemma" label
    assert QGuiApplication.clipboard().text() == "print(1)"


def test_single_line_breaks_are_kept(qtbot, make_app):
    app = make_app(autoload=False)
    view = app.window.chat
    poem = (
        "Roses are red,\nviolets are blue,\n> quoted one\n> quoted two\n\n- item\n- item two\n\n"
        "Heading\n===\nsee https://example.org\nfor more"
    )
    open_conversation(app, ("user", "line one\nline two"), ("assistant", poem))
    text = view.transcript_text()
    lines = text.replace("\u2028", "\n").splitlines()
    for expected in ("line one", "line two", "Roses are red,", "violets are blue,", "quoted one", "quoted two"):
        assert expected in lines, f"{expected!r} is not a line of its own in {lines}"
    assert "for more" in lines and "item two" in lines
    # Markdown around the kept breaks still works: a heading, a list, a bare web link.
    doc = view.transcript.document()
    assert doc.find("Heading").blockFormat().headingLevel() == 1
    assert doc.find("item two").currentList() is not None
    assert ("https://example.org", "https://example.org") in anchors(view)
    # Lines of one paragraph stay one paragraph (a line break, not a paragraph gap).
    block = view.transcript.document().find("Roses are red,").block()
    assert block.text() == "Roses are red,\u2028violets are blue,"
