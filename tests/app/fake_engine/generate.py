from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Record:
    text: str
    token: int
    prompt_tokens: int
    generation_tokens: int
    prompt_tps: float
    generation_tps: float
    ttft_s: float
    finish_reason: str | None


def stream_generate(model, messages, params=None, max_tokens=256, raw=False):
    words = ("word " * max_tokens).split(" ")[:max_tokens]
    for i, w in enumerate(words):
        time.sleep(0.01)
        last = i == len(words) - 1
        yield Record(w + " ", i, 10, i + 1, 100.0, 50.0, 0.01, "length" if last else None)
