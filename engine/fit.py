"""Will this model fit this machine? One line, from the file's header alone, before loading.

A 16 GB laptop shares its memory between the OS, the CPU and the iGPU: Gemma 3 27B at Q4_0
does not fit it, at Q3_K or Q2_K it does. The line says what the model needs with its KV cache
at the chosen context (the GPU layout: f16 cache, weights as stored), what the machine has, and,
when it does not fit, the best weight type that would — instead of a driver error mid-load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import psutil
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from phoenix_chat.engine.models.kv_plan import layer_slots
from phoenix_chat.engine.weights.base import WeightSource

# weight types to suggest, best quality first (the ones popular GGUF releases ship)
CANDIDATES = (
    QType.Q8_0,
    QType.Q6_K,
    QType.Q5_K,
    QType.Q4_K,
    QType.Q4_0,
    QType.IQ4_XS,
    QType.Q3_K,
    QType.IQ3_XXS,
    QType.Q2_K,
    QType.IQ2_XS,
)
FORWARD_TOKENS = 512  # prefill chunk of the GPU backend: activations are sized by it
USABLE = 0.9  # of the available memory: the rest is the app, the driver, the page cache
GIB = 2**30


@dataclass(frozen=True)
class FitAdvice:
    name: str
    context_length: int
    weights: int  # bytes, as stored in the file
    kv_cache: int
    working: int  # activations and logits of one prefill chunk
    available: int  # bytes the machine has free now
    total: int  # bytes the machine has
    suggestion: QType | None  # the best type that would fit, when the file's does not
    suggestion_bytes: int = 0

    @property
    def need(self) -> int:
        return self.weights + self.kv_cache + self.working

    @property
    def fits(self) -> bool:
        return self.need <= self.available * USABLE

    def line(self) -> str:
        head = (
            f"{self.name} needs ≈{self.need / GIB:.1f} GiB with its KV cache at {self.context_length} tokens "
            f"(weights {self.weights / GIB:.1f}, KV {self.kv_cache / GIB:.1f}); this machine has "
            f"{self.available / GIB:.1f} GiB free of {self.total / GIB:.1f}"
        )
        if self.fits:
            return head + ": it fits."
        if self.suggestion is not None:
            return (
                head
                + f": it does not fit; at {self.suggestion.name} (≈{self.suggestion_bytes / GIB:.1f} GiB) it would."
            )
        return head + ": it does not fit at any weight type; try a shorter context or a smaller model."


def weight_bytes(weights: WeightSource, qtype: QType | None = None) -> int:
    """Bytes of the weights as stored, or with every matrix at `qtype` (norms stay f32; a
    matrix whose rows are no whole blocks of `qtype` keeps its own type, as llama.cpp does)."""
    total = 0
    for t in weights.tensors.values():
        if qtype is None or t.is_norm or len(t.shape) != 2:
            total += t.nbytes
            continue
        block, size = GGML_QUANT_SIZES[qtype]
        if t.shape[-1] % block:
            total += t.nbytes
            continue
        total += int(np.prod(t.shape)) // block * size
    return total


def kv_cache_bytes(weights: WeightSource, context_length: int) -> int:
    """The GPU's f16 K and V cache: whole context on global layers, the window's ring elsewhere."""
    cfg = weights.config
    return sum(layer_slots(cfg, context_length, FORWARD_TOKENS)) * cfg.kv_dim * 2 * 2


def working_bytes(weights: WeightSource) -> int:
    cfg = weights.config
    row = 3 * cfg.hidden_size + 2 * cfg.q_dim + 2 * cfg.kv_dim + cfg.intermediate_size
    return FORWARD_TOKENS * row * 4 + 32 * cfg.vocab_size * 4


def fit_advice(
    weights: WeightSource, context_length: int, available: int | None = None, total: int | None = None
) -> FitAdvice:
    """The advice for this file at this context; `available` / `total` default to this machine's
    memory (psutil)."""
    if available is None or total is None:
        vm = psutil.virtual_memory()
        available = vm.available if available is None else available
        total = vm.total if total is None else total
    kv, working = kv_cache_bytes(weights, context_length), working_bytes(weights)
    own = weight_bytes(weights)
    suggestion, suggestion_bytes = None, 0
    if own + kv + working > available * USABLE:
        for q in CANDIDATES:
            need = weight_bytes(weights, q) + kv + working
            if need < own + kv + working and need <= available * USABLE:
                suggestion, suggestion_bytes = q, need
                break
    return FitAdvice(
        weights.config.name, context_length, own, kv, working, available, total, suggestion, suggestion_bytes
    )
