"""How long to wait before asking a busy server (429) again: its Retry-After, else doubling."""

from __future__ import annotations

import email.utils
import time

MAX_WAIT_S = 60.0  # a server that asks for longer is not waited for: the user is told instead


def retry_after_s(header: str | None) -> float | None:
    """Retry-After as seconds (a number, or an HTTP date); None when absent or unreadable."""
    if not header:
        return None
    header = header.strip()
    try:
        return max(float(header), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def wait_s(retry_after: float | None, retry: int, backoff_s: float) -> float:
    """The wait before retry number `retry` (1, 2, …): exponential backoff from `backoff_s`,
    never shorter than what the server asked for."""
    backoff: float = backoff_s * 2.0 ** (retry - 1)
    return max(backoff, retry_after or 0.0)
