"""Markdown → Qt rich-text HTML for chat messages.

Prose goes through Qt's own Markdown reader, made safe for text from users and models
(no raw HTML, no app links, line breaks kept: see safe_markdown); fenced code blocks are
cut out first and highlighted with pygments (inline styles, which Qt's HTML subset
understands), each with a "Copy" action link from the view's ActionLinks. An unterminated
fence — the usual state of an answer that is still streaming — is rendered as code up to
the end.
"""

from __future__ import annotations

import html
import re

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

from phoenix_chat.app.views.action_links import ActionLinks
from phoenix_chat.app.views.safe_markdown import message_document

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^\s`]*)[^\n]*$", re.M)
_BODY = re.compile(r"<body[^>]*>(.*)</body>", re.S)

CODE_STYLES = {"light": "friendly", "dark": "monokai"}
CODE_BG = {"light": "#f3f4f6", "dark": "#1e1f22"}
CODE_HEADER = {"light": "#e5e7eb", "dark": "#2b2d31"}


def split_fences(text: str) -> list[tuple[str, str, str | None]]:
    """[(kind, content, lang)] with kind "text" or "code", in order."""
    parts: list[tuple[str, str, str | None]] = []
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if m is None:
            parts.append(("text", text[pos:], None))
            break
        parts.append(("text", text[pos : m.start()], None))
        fence = m.group("fence")
        close = re.compile(r"^ {0,3}" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$", re.M)
        body_start = m.end() + 1
        c = close.search(text, body_start) if body_start <= len(text) else None
        if c is None:
            parts.append(("code", text[body_start:], m.group("lang") or None))
            break
        parts.append(("code", text[body_start : c.start()].rstrip("\n"), m.group("lang") or None))
        pos = c.end() + 1
    return [p for p in parts if p[0] == "code" or p[1].strip()]


def markdown_to_html(text: str) -> str:
    """Qt's Markdown reader on message text (made safe), body only (so pieces can be joined)."""
    m = _BODY.search(message_document(text).toHtml())
    return m.group(1) if m else html.escape(text)


def code_to_html(code: str, lang: str | None, copy_href: str, theme: str = "light") -> str:
    try:
        lexer = get_lexer_by_name(lang) if lang else guess_lexer(code) if len(code) > 40 else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    formatter = HtmlFormatter(noclasses=True, nowrap=True, style=CODE_STYLES.get(theme, "friendly"))
    body = highlight(code, lexer, formatter).rstrip("\n")
    label = html.escape(lang or lexer.name.lower())
    return (
        f'<table width="100%" cellspacing="0" cellpadding="6" style="margin-top:4px; margin-bottom:4px;">'
        f'<tr><td bgcolor="{CODE_HEADER.get(theme)}"><span style="font-size:small">{label}</span>'
        f'&nbsp;&nbsp;<a href="{html.escape(copy_href)}" style="font-size:small">Copy</a></td></tr>'
        f'<tr><td bgcolor="{CODE_BG.get(theme)}"><pre style="margin:0">{body}</pre></td></tr></table>'
    )


def render_message(
    text: str, links: ActionLinks, theme: str = "light", first_code_index: int = 0
) -> tuple[str, list[str]]:
    """HTML for one message and the raw text of its code blocks (for the copy links)."""
    out: list[str] = []
    codes: list[str] = []
    for kind, content, lang in split_fences(text):
        if kind == "code":
            copy_href = links.href("copy", first_code_index + len(codes))
            out.append(code_to_html(content, lang, copy_href, theme))
            codes.append(content)
        else:
            out.append(markdown_to_html(content))
    return "".join(out), codes
