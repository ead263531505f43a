"""Close a code fence a message left open, so the Markdown after it stays Markdown.

A user message that opens a ``` fence and never closes it would turn everything after it
in a Markdown export (the next headings, every later message) into one code block. Each
message is made self-contained by closing such a fence, with the opener's own characters,
length and indentation (so a fence opened inside a list item is closed inside it).
Fences inside block quotes, or indented 4+ spaces, end with their container and need
nothing.
"""

from __future__ import annotations

import re

_OPENER = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_CLOSER = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*$")


def open_fence(text: str) -> str | None:
    """The line that closes the fence `text` leaves open (CommonMark rules), or None."""
    opener: re.Match[str] | None = None
    for line in text.split("\n"):
        if opener is None:
            m = _OPENER.match(line)
            if m and not (m.group("fence")[0] == "`" and "`" in m.group("info")):
                opener = m
        else:
            m = _CLOSER.match(line)
            fence = opener.group("fence")
            if m and m.group("fence")[0] == fence[0] and len(m.group("fence")) >= len(fence):
                opener = None
    return None if opener is None else opener.group("indent") + opener.group("fence")


def self_contained(text: str) -> str:
    """`text` with a fence it leaves open closed."""
    closer = open_fence(text)
    if closer is None:
        return text
    return text + ("" if text.endswith("\n") else "\n") + closer
