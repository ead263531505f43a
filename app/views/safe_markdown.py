"""Message Markdown → a QTextDocument that shows text, never acts on it.

Messages come from users and from models, so the text is read as Markdown only:
- raw HTML (`<b>`, `<font>`, `<a href>`) stays literal text (Qt's `MarkdownNoHTML`);
- links other than http(s)/mailto — e.g. a forged `[Copy](copymsg:3)` or `<edit:1>` — lose
  their link and show as plain text, so only the view's own chrome makes action links;
- images become `[image: alt]` text, so a message cannot make the view load a local file;
- a single line break stays a line break (a poem, Shift+Enter lines), where plain Markdown
  would join the lines into one: a line that continues a paragraph is joined to the one
  before with U+2028, which the reader takes as text and Qt shows as a line break (a
  Markdown hard break would make Qt start a new paragraph instead).
"""

from __future__ import annotations

import re

from PySide6.QtCore import QUrl
from PySide6.QtGui import QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

WEB_SCHEMES = frozenset({"http", "https", "mailto"})
_FEATURES = QTextDocument.MarkdownFeature(
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value | QTextDocument.MarkdownFeature.MarkdownNoHTML.value
)
# Every kind of link or image has one of these: [text](url), [ref], <url>, bare URLs
# (scheme: or www.) and e-mail addresses. Text without any needs no link pass.
_MAY_LINK = re.compile(r"[\[<:@]|www\.")
_LINE_SEPARATOR = "\u2028"  # Qt's line break inside a paragraph (<br>)

# A line after which a break must not be forced (heading, rule, setext underline, link
# reference definition, table row) ...
_ENDS_BLOCK = re.compile(r"^ {0,3}(?:#{1,6}(?:\s|$)|([-*_])(?:[ \t]*\1){2,}[ \t]*$|=+[ \t]*$|-+[ \t]*$|\[[^\]]+\]:)|\|")
# ... and a line that starts a block of its own (list item, quote, heading, rule, fence,
# link reference definition, table row).
_STARTS_BLOCK = re.compile(
    r"^ {0,3}(?:[#>]|[-*+](?:\s|$)|\d{1,9}[.)](?:\s|$)|=+[ \t]*$|-+[ \t]*$"
    r"|([-*_])(?:[ \t]*\1){2,}[ \t]*$|`{3}|~{3}|\[[^\]]+\]:)|\|"
)


_QUOTE = re.compile(r"^ {0,3}> ?")
_INDENTED = re.compile(r"^(?: {4}|\t)")  # indented code keeps its lines as they are
# A bare URL ends at whitespace; U+2028 is not whitespace to the reader, so a space goes first.
_ENDS_WITH_URL = re.compile(r"(?:://|www\.|@)\S*$")


def _continuation(line: str, following: str) -> str | None:
    """`following` without its indent and quote markers when it continues the paragraph of
    `line` (a soft break in Markdown), else None."""
    if not line.strip() or not following.strip() or _INDENTED.match(line):
        return None
    quoted, quoted_following = _QUOTE.match(line), _QUOTE.match(following)
    if quoted and quoted_following:
        return _continuation(line[quoted.end() :], following[quoted_following.end() :])
    if quoted:
        line = line[quoted.end() :]
    if _ENDS_BLOCK.search(line) or _STARTS_BLOCK.search(following):
        return None
    return following.lstrip(" \t")


def keep_line_breaks(text: str) -> str:
    """Join each soft-broken line to the one before with a line separator, which Qt's reader
    keeps as a line break inside the paragraph (Markdown would make it a space)."""
    lines = text.split("\n")
    out = [lines[0]]
    for line, following in zip(lines, lines[1:], strict=False):
        rest = _continuation(line, following)
        if rest is None:
            out.append("\n" + following)
            continue
        last = out[-1].rstrip(" \t")
        if last.endswith("\\") and not last.endswith("\\\\"):
            last = last[:-1]  # an explicit hard break: the separator replaces it
        if _ENDS_WITH_URL.search(last):
            last += " "
        out[-1] = last
        out.append(_LINE_SEPARATOR + rest)
    return "".join(out)


def message_document(text: str) -> QTextDocument:
    """The safe document for one run of message Markdown (code fences are cut out before)."""
    doc = QTextDocument()
    doc.setUndoRedoEnabled(False)
    doc.setMarkdown(keep_line_breaks(text), _FEATURES)
    if _MAY_LINK.search(text):
        _neutralise_links_and_images(doc)
    return doc


def _neutralise_links_and_images(doc: QTextDocument) -> None:
    links, images = [], []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            fmt = frag.charFormat()
            if fmt.isImageFormat():
                image = fmt.toImageFormat()
                alt = str(image.property(QTextFormat.Property.ImageAltText) or "") or image.name()
                images.append((frag.position(), frag.length(), alt))
            elif fmt.isAnchor() and QUrl(fmt.anchorHref()).scheme().lower() not in WEB_SCHEMES:
                links.append((frag.position(), frag.length(), QTextCharFormat(fmt)))
            it += 1
        block = block.next()
    edits = QTextCursor(doc)
    edits.beginEditBlock()  # one relayout for all the edits, not one per edit
    for start, length, fmt in links:  # first: they keep positions; the images change them
        fmt.setAnchor(False)
        fmt.clearProperty(QTextFormat.Property.AnchorHref)
        fmt.clearForeground()
        fmt.setFontUnderline(False)
        _select(doc, start, length).setCharFormat(fmt)
    for start, length, alt in reversed(images):  # from the end, so earlier positions hold
        _select(doc, start, length).insertText(f"[image: {alt}]", QTextCharFormat())
    edits.endEditBlock()


def _select(doc: QTextDocument, start: int, length: int) -> QTextCursor:
    cursor = QTextCursor(doc)
    cursor.setPosition(start)
    cursor.setPosition(start + length, QTextCursor.MoveMode.KeepAnchor)
    return cursor
