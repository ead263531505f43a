"""Find and click links in the chat transcript the way a user does: with the mouse."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QTextCursor


def anchors(view) -> list[tuple[str, str]]:
    """(href, text) of every link in the transcript, in order."""
    found = []
    block = view.transcript.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.charFormat().isAnchor():
                found.append((frag.charFormat().anchorHref(), frag.text()))
            it += 1
        block = block.next()
    return found


def point_at_text(view, text: str, nth: int = 0) -> QPoint:
    """A viewport point on the middle of the first character of the nth `text` in the transcript."""
    doc = view.transcript.document()
    cursor = QTextCursor(doc)
    for _ in range(nth + 1):
        cursor = doc.find(text, cursor)
        assert not cursor.isNull(), f"{text!r} is not in the transcript"
    start = QTextCursor(doc)
    start.setPosition(cursor.selectionStart())
    view.transcript.setTextCursor(start)
    view.transcript.ensureCursorVisible()
    left = view.transcript.cursorRect(start)
    start.movePosition(QTextCursor.MoveOperation.NextCharacter)
    right = view.transcript.cursorRect(start)
    return QPoint((left.x() + right.x()) // 2, left.center().y())


def click_text(qtbot, view, text: str, nth: int = 0) -> str:
    """Click the nth occurrence of `text`; returns the link under the mouse there ("" for none)."""
    point = point_at_text(view, text, nth)
    href = view.transcript.anchorAt(point)
    qtbot.mouseClick(view.transcript.viewport(), Qt.MouseButton.LeftButton, pos=point)
    return href


def click_link(qtbot, view, label: str, nth: int = 0) -> str:
    """Click the nth chrome link whose text is `label` (e.g. "Edit", "Copy"); returns its href."""
    hrefs = [href for href, text in anchors(view) if text == label]
    assert len(hrefs) > nth, f"no link {label!r} #{nth} in {anchors(view)}"
    href = click_text(qtbot, view, label, _text_index_of_link(view, label, nth))
    assert href == hrefs[nth], f"the mouse was on {href!r}, not on {hrefs[nth]!r}"
    return href


def _text_index_of_link(view, label: str, nth: int) -> int:
    """Which occurrence of `label` in the plain text is the nth link with that label."""
    doc = view.transcript.document()
    cursor = QTextCursor(doc)
    seen_links = index = 0
    while True:
        cursor = doc.find(label, cursor)
        assert not cursor.isNull(), f"link {label!r} #{nth} not found"
        probe = QTextCursor(doc)
        probe.setPosition(cursor.selectionStart() + 1)
        if probe.charFormat().isAnchor():
            if seen_links == nth:
                return index
            seen_links += 1
        index += 1
