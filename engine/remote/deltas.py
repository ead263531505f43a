"""What a remote answer streams: text pieces, notices, and one final delta with its usage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RemoteFinish = Literal["stop", "length", "cancelled", "cut", "error"]


@dataclass(frozen=True)
class RemoteUsage:
    """The answer's figures: token counts are the server's when it sent usage (else counted
    here, one per content chunk; prompt 0 when unknown); times are measured on this side."""

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None  # request sent → first text, retries and the server's queue included
    generation_tps: float  # answer tokens per second after the first
    counted_by_server: bool = False


@dataclass(frozen=True)
class RemoteDelta:
    """A piece of a remote answer. The last one has `finish_reason` and `usage`; "cut" and
    "error" carry `error` (one line). A `notice` (a retry, a dropped field) is shown, not fatal."""

    text: str = ""
    tokens: int = 0  # content chunks in this delta (~tokens); the final usage has the real count
    finish_reason: RemoteFinish | None = None
    notice: str | None = None
    error: str | None = None
    usage: RemoteUsage | None = None
