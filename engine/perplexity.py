"""llama.cpp-style perplexity: non-overlapping windows of n_ctx tokens, second half scored.

Same method as llama.cpp's `perplexity` tool, so numbers compare directly: the text is
tokenized once with <bos>, cut into windows of n_ctx, each window's first token replaced by
<bos>, and in each window the logits at positions n_ctx/2 … n_ctx-2 predict the next token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, TypedDict

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.base import Backend
    from phoenix_chat.engine.config import ModelConfig
    from phoenix_chat.engine.tokenizer import Tokenizer

# progress(windows done, windows in all, running perplexity)
Progress: TypeAlias = Callable[[int, int, float], None]


class ScoredModel(Protocol):
    """What `perplexity` needs of a model: a LoadedModel, or the parts of one."""

    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def config(self) -> ModelConfig: ...
    @property
    def backend(self) -> Backend: ...


class PerplexityResult(TypedDict):
    ppl: float
    windows: int
    scored_tokens: int
    n_ctx: int
    running: list[float]  # the perplexity after each window


def log_softmax_at(logits: npt.NDArray[np.floating], targets: npt.NDArray[np.integer]) -> npt.NDArray[np.float64]:
    logits = logits.astype(np.float64)
    m = logits.max(axis=-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=-1))
    scored: npt.NDArray[np.float64] = logits[np.arange(len(targets)), targets] - lse
    return scored


def perplexity(model: ScoredModel, text: str, n_ctx: int = 512, progress: Progress | None = None) -> PerplexityResult:
    tokens = model.tokenizer.encode(text, add_bos=True, parse_special=False)
    return perplexity_of_ids(model.backend, tokens, n_ctx, model.config.bos_token_id, progress=progress)


def perplexity_of_ids(
    backend: Backend,
    tokens: Sequence[int] | npt.NDArray[np.integer],
    n_ctx: int,
    bos_id: int,
    max_windows: int | None = None,
    progress: Progress | None = None,
) -> PerplexityResult:
    """The windowed method on token ids already made (tests and benchmarks reuse it)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    n_windows = len(tokens) // n_ctx
    if n_windows == 0:
        raise ValueError(f"text has {len(tokens)} tokens, fewer than one window of {n_ctx}")
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    first = n_ctx // 2
    nll, count, running = 0.0, 0, []
    for w in range(n_windows):
        window = tokens[w * n_ctx : (w + 1) * n_ctx].copy()
        window[0] = bos_id
        # Only positions first .. n_ctx - 2 are scored, so the first half just fills the KV cache
        # and logits come back for the second half: the 262k-row output head is most of a small
        # Gemma's work, and this halves it (same values as one pass, up to float rounding).
        if first:
            backend.forward(window[:first].tolist(), 0)
        logits = backend.forward(window[first:].tolist(), first, all_logits=True)
        scored = log_softmax_at(logits[: n_ctx - 1 - first], window[first + 1 : n_ctx])
        nll -= float(scored.sum())
        count += len(scored)
        running.append(math.exp(nll / count))
        if progress:
            progress(w + 1, n_windows, running[-1])
    return {
        "ppl": math.exp(nll / count),
        "windows": n_windows,
        "scored_tokens": count,
        "n_ctx": n_ctx,
        "running": running,
    }
