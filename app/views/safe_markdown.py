"""Message Markdown → a QTextDocument that shows text, never acts on it.

Messages come from users and from models, so the text is read as Markdown only:
- raw HTML (`<b>`, `<font>`, `<a href>`) stays literal text (Qt's `MarkdownNoHTML`);
- links other than http(s)/mailto — e.g. a forged `[Copy](copymsg:3)` or `<edit:1>` — lose
  their link and show as plain text, so only the view's own chrome makes action links;
- images become `[image: alt]` text, so a message cannot make the view load a local file;
- a single line break stays a line break (a poem, Shift+Enter lines), where plain Markdown
  would join the lines into one: such lines get a hard break, and the extra block Qt makes
  for it is joined back into the paragraph with a line separator.
"""

from __future__ import annotations

import re

from PySide6.QtCore import QUrl
from PySide6.QtGui import QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

WEB_SCHEMES = frozenset({"http", "https", "mailto"})
_FEATURES = QTextDocument.MarkdownFeature(
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value | QTextDocument.MarkdownFeature.MarkdownNoHTML.value
)
_BREAK = "\ue000"  # private-use marker of a kept line break (stripped from the input first)
_LINE_SEPARATOR = "\u2028"  # Qt's line break inside a paragraph (<br>)

# A line after which a break must not be forced (its block ends there anyway) ...
_ENDS_BLOCK = re.compile(r"^ {0,3}(?:#{1,6}(?:\s|$)|([-*_])(?:[ \t]*\1){2,}[ \t]*$)|\|")
# ... and a line that starts a block of its own (list item, quote, heading, rule, fence, table).
_STARTS_BLOCK = re.compile(
    r"^ {0,3}(?:[#>]|[-*+](?:\s|$)|\d{1,9}[.)](?:\s|$)|=+[ \t]*$|-+[ \t]*$|([-*_])(?:[ \t]*\1){2,}[ \t]*$|`{3}|~{3})|\|"
)


_QUOTE = re.compile(r"^ {0,3}> ?")


def _soft_break_between(line: str, following: str) -> bool:
    """True when `following` continues the paragraph of `line` (inside quotes too)."""
    if not line.strip() or not following.strip():
        return False
    quoted, quoted_following = _QUOTE.match(line), _QUOTE.match(following)
    if quoted and quoted_following:
        return _soft_break_between(line[quoted.end() :], following[quoted_following.end() :])
    if quoted:
        line = line[quoted.end() :]
    return not (_ENDS_BLOCK.search(line) or _STARTS_BLOCK.search(following))


def keep_line_breaks(text: str) -> str:
    """Mark each soft line break inside a paragraph as a hard break (with `_BREAK` before it)."""
    lines = text.replace(_BREAK, "").split("\n")
    for i in range(len(lines) - 1):
        if not _soft_break_between(lines[i], lines[i + 1]):
            continue
        line = lines[i].rstrip(" \t")
        if line.endswith("\\") and not line.endswith("\\\\"):
            line = line[:-1]  # already a hard break: ours replaces it
        lines[i] = line + _BREAK + "  "
    return "\n".join(lines)


def message_document(text: str) -> QTextDocument:
    """The safe document for one run of message Markdown (code fences are cut out before)."""
    doc = QTextDocument()
    doc.setMarkdown(keep_line_breaks(text), _FEATURES)
    _make_foreign_links_inert(doc)
    _replace_images(doc)
    _join_kept_breaks(doc)
    return doc


def _fragments(doc: QTextDocument):
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            yield it.fragment()
            it += 1
        block = block.next()


def _select(doc: QTextDocument, start: int, length: int) -> QTextCursor:
    cursor = QTextCursor(doc)
    cursor.setPosition(start)
    cursor.setPosition(start + length, QTextCursor.MoveMode.KeepAnchor)
    return cursor


def _make_foreign_links_inert(doc: QTextDocument) -> None:
    found = []
    for frag in _fragments(doc):
        fmt = frag.charFormat()
        if fmt.isAnchor() and QUrl(fmt.anchorHref()).scheme().lower() not in WEB_SCHEMES:
            found.append((frag.position(), frag.length(), QTextCharFormat(fmt)))
    for start, length, fmt in found:
        fmt.setAnchor(False)
        fmt.clearProperty(QTextFormat.Property.AnchorHref)
        fmt.clearForeground()
        fmt.setFontUnderline(False)
        _select(doc, start, length).setCharFormat(fmt)


def _replace_images(doc: QTextDocument) -> None:
    found = []
    for frag in _fragments(doc):
        fmt = frag.charFormat()
        if fmt.isImageFormat():
            image = fmt.toImageFormat()
            alt = str(image.property(QTextFormat.Property.ImageAltText) or "") or image.name()
            found.append((frag.position(), frag.length(), alt))
    for start, length, alt in reversed(found):  # from the end, so earlier positions hold
        cursor = _select(doc, start, length)
        plain = QTextCharFormat()
        cursor.insertText(f"[image: {alt}]", plain)


def _join_kept_breaks(doc: QTextDocument) -> None:
    while True:
        cursor = doc.find(_BREAK)
        if cursor.isNull():
            return
        block = cursor.block()
        at_block_end = cursor.selectionEnd() == block.position() + block.length() - 1
        cursor.removeSelectedText()
        if at_block_end and block.next().isValid():
            cursor.deleteChar()  # the block separator Qt made for the hard break
            cursor.insertText(_LINE_SEPARATOR)
