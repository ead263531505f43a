"""Sampling parameters and the CPU sampler (mlx-lm style: built once, then applied per step)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 → greedy
    top_k: int = 64  # 0 → off
    top_p: float = 0.95  # 1 → off
    min_p: float = 0.0  # 0 → off
    repetition_penalty: float = 1.0  # 1 → off (llama.cpp-style: divide positive, multiply negative logits)
    repetition_window: int = 64  # how many recent tokens the penalty looks at
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Sampler:
    """CPU sampler built once per generation: penalties, then temperature, top-k, top-p, min-p.

    Seeded with numpy's PCG64, so the same seed and the same logits give the same tokens.
    """

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: npt.NDArray[np.float32], history: Sequence[int] = ()) -> int:
        ids, probs = candidates(logits, history, self.params)
        return int(ids[0]) if self.params.greedy else int(self._draw(ids, probs))

    def _draw(self, ids: npt.NDArray[np.intp], probs: npt.NDArray[np.float64]) -> int:
        return int(ids[self.rng.choice(len(ids), p=probs)])


def candidates(
    logits: npt.NDArray[np.float32], history: Sequence[int], p: SamplingParams
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """The distribution a step draws from: penalty, then greedy (the argmax, probability 1) or
    temperature / top-k / top-p / min-p. (The sampler and speculative decoding's p and q.)"""
    logits = np.asarray(logits, dtype=np.float32)
    if p.repetition_penalty != 1.0 and len(history):
        logits = apply_repetition_penalty(logits, history[-p.repetition_window :], p.repetition_penalty)
    if p.greedy:
        return np.array([int(np.argmax(logits))]), np.ones(1)
    return filter_candidates(logits, p)


def apply_repetition_penalty(
    logits: npt.NDArray[np.float32], recent: Sequence[int], penalty: float
) -> npt.NDArray[np.float32]:
    """llama.cpp/CTRL style: positive logits of seen tokens divided, negative multiplied."""
    out = logits.copy()
    seen = np.unique(np.asarray(recent, dtype=np.int64))
    vals = out[seen]
    out[seen] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def filter_candidates(
    logits: npt.NDArray[np.float32], p: SamplingParams
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """The surviving token ids and their renormalised probabilities."""
    scaled = logits / np.float32(p.temperature)
    k = p.top_k if 0 < p.top_k < len(scaled) else len(scaled)
    ids = np.argpartition(-scaled, k - 1)[:k] if k < len(scaled) else np.arange(len(scaled))
    ids = ids[np.argsort(-scaled[ids], kind="stable")]
    vals = scaled[ids].astype(np.float64)
    probs = np.exp(vals - vals[0])
    probs /= probs.sum()
    keep = len(ids)
    if p.top_p < 1.0:
        # smallest prefix whose mass reaches top_p (always at least one token)
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p) + 1))
    if p.min_p > 0.0:
        keep = min(keep, max(1, int(np.sum(probs >= p.min_p * probs[0]))))
    ids, probs = ids[:keep], probs[:keep]
    return ids, probs / probs.sum()
