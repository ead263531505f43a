"""Links that only the chat pane's own chrome can make (Edit, Copy, copy a code block).

Message text is Markdown written by a user or a model, and a model can write
`[Edit](edit:1)`. So every action link carries a random token made per view, which no
message can know, and `parse` accepts nothing else. (Message links with any scheme but
http(s)/mailto are also made inert before they reach the view: see safe_markdown.)
"""

from __future__ import annotations

import re
import secrets

ACTION_SCHEME = "phoenix-action"
# older/newer: an answer's versions (‹ ›); picture: a message's picture, full size (its saved id)
ACTIONS = ("edit", "copy", "copymsg", "older", "newer", "picture")


class ActionLinks:
    """Makes and recognises this view's action links: `phoenix-action:<token>/<action>/<n>`."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self._pattern = re.compile(
            re.escape(f"{ACTION_SCHEME}:{self.token}/") + r"(?P<action>" + "|".join(ACTIONS) + r")/(?P<arg>\d{1,12})"
        )

    def href(self, action: str, arg: int) -> str:
        if action not in ACTIONS:
            raise ValueError(f"unknown chat action {action!r}")
        return f"{ACTION_SCHEME}:{self.token}/{action}/{int(arg)}"

    def parse(self, url: str) -> tuple[str, int] | None:
        """(action, argument) for a link this view made, else None (forged or foreign)."""
        m = self._pattern.fullmatch(url)
        return (m.group("action"), int(m.group("arg"))) if m else None
