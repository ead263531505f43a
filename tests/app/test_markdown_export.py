"""A Markdown export where each message is self-contained (issue 24, defect 9).

A user message with an unclosed code fence used to turn the rest of the export into one
code block. The export is read back with a real CommonMark reader (Qt's, the one the chat
view uses) and its structure checked: every role heading is still a heading.
"""

from __future__ import annotations

import pytest
from PySide6.QtGui import QTextDocument

from phoenix_chat.app.markdown_fences import open_fence
from phoenix_chat.app.store import Store

MESSAGES = [
    ("user", "Why does this fail?\n```python\nprint('hi')"),  # never closed
    ("assistant", "Because the **string** is fine; try `print`."),
    ("user", "- a list item with code:\n\n  ~~~~\n  inside the item"),  # closed in the item
    ("assistant", "````md\n```\nnested\n```"),  # a longer fence, still open
    ("user", "Thanks"),
]


def headings(markdown: str) -> list[tuple[int, str]]:
    doc = QTextDocument()
    doc.setMarkdown(markdown)
    found = []
    block = doc.begin()
    while block.isValid():
        level = block.blockFormat().headingLevel()
        if level:
            found.append((level, block.text()))
        block = block.next()
    return found


@pytest.mark.gui
def test_an_unclosed_fence_does_not_swallow_the_rest_of_the_export(qapp, tmp_path):
    store = Store(tmp_path / "history.db")
    try:
        conv = store.create_conversation("First", "Be brief.\n```")  # even the system prompt
        for role, content in MESSAGES:
            store.add_message(conv.id, role, content)
        other = store.create_conversation("Second")
        store.add_message(other.id, "user", "Still here?")
        md = store.export("markdown")
    finally:
        store.close()
    expected = [(1, "First")] + [(2, role.capitalize()) for role, _ in MESSAGES] + [(1, "Second"), (2, "User")]
    assert headings(md) == expected, md
    doc = QTextDocument()
    doc.setMarkdown(md)
    assert doc.find("string").charFormat().fontWeight() > 400  # Markdown after the open fence
    # Each message's own code is still code, ending where the message ends.
    assert "print('hi')\n```\n" in md and "nested\n```\n````\n" in md


def test_open_fence_follows_commonmark():
    assert open_fence("no code") is None
    assert open_fence("```\nclosed\n```") is None
    assert open_fence("```py\nopen") == "```"
    assert open_fence("  ~~~~\nx\n~~~") == "  ~~~~"  # a shorter closer does not close
    assert open_fence("``` not `a` fence\ntext") is None  # backticks in the info string
    assert open_fence("    ```\nindented code, not a fence") is None
    assert open_fence("```\n~~~\n") == "```"  # the other character does not close
