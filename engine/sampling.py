"""Sampling parameters and the CPU sampler (mlx-lm style: built once, then applied per step)."""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0        # 0 → greedy
    top_k: int = 64                 # 0 → off
    top_p: float = 0.95             # 1 → off
    min_p: float = 0.0              # 0 → off
    repetition_penalty: float = 1.0 # 1 → off (llama.cpp-style: divide positive, multiply negative logits)
    repetition_window: int = 64     # how many recent tokens the penalty looks at
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def with_(self, **kw) -> "SamplingParams":
        return replace(self, **kw)
