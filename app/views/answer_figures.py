"""The line of figures under an answer: tokens, tok/s, time to first token, prompt size.

Read from the GenerationStats saved with the message (`Message.stats`). A figure that was
not measured is left out rather than shown as 0 or as a near-zero time's huge rate: an
answer stopped while the prompt was read has no line at all."""

from __future__ import annotations

import math

MAX_PLAUSIBLE_TPS = 1e5  # beyond this a rate came from a near-zero time, not a measurement


def _measured(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def answer_figures(stats: dict) -> str:
    """ "42 tokens · 18.3 tok/s · TTFT 310 ms · prompt 120 tokens", or "" when nothing was generated."""
    tokens = _measured(stats.get("generation_tokens"))
    if tokens is None:
        return ""
    parts = [f"{int(tokens):,} token" + ("" if tokens == 1 else "s")]
    tps = _measured(stats.get("generation_tps"))
    if tps is not None and tps < MAX_PLAUSIBLE_TPS:
        parts.append(f"{tps:.1f} tok/s")
    ttft = _measured(stats.get("ttft_s"))
    if ttft is not None:
        parts.append(f"TTFT {ttft * 1000:.0f} ms" if ttft < 10 else f"TTFT {ttft:.1f} s")
    prompt = _measured(stats.get("prompt_tokens"))
    if prompt is not None:
        parts.append(f"prompt {int(prompt):,} tokens")
    return " · ".join(parts)
