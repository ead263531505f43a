"""The memory plan: what the model will take on the device (weights in their target types, KV
cache, scratch), checked against the heap before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from phoenix_chat.engine.backends.vulkan import ops_attention, ops_sample
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.matvec import q8_1_bytes
from phoenix_chat.engine.backends.vulkan.ops_table import EMBED_TYPES
from phoenix_chat.engine.errors import OutOfMemoryError
from phoenix_chat.engine.models.kv_plan import layer_slots
from phoenix_chat.engine.quantization import WeightQuant
from phoenix_chat.engine.weights.base import WeightSource

PREFILL_CHUNK = 512  # tokens per prefill submission (GEMM rows: more reuse of each dequantized weight tile)
# On a CPU Vulkan device (lavapipe) a 512-token submission of the 270M took 15-70 s on a 2-core box,
# and Stop is checked between submissions: smaller ones there (the buffers stay PREFILL_CHUNK-sized).
SOFTWARE_PREFILL_CHUNK = 128
LOGITS_CHUNK = 32  # tokens per submission when every position's logits come back


@dataclass(frozen=True)
class MemoryPlan:
    quant: WeightQuant | None
    tied: bool  # no lm_head tensor: the embedding is the output head
    slots: list[int]  # KV slots per layer (models/kv_plan.py, one prefill chunk of slack)
    n_splits: int  # decode attention's splits of the context
    weights: int  # bytes
    kv_cache: int
    scratch: int

    @property
    def budget(self) -> dict[str, int]:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "scratch": self.scratch}

    def target_type(self, qtype: QType) -> QType:
        """A matrix's type on the device: the file's, or the --quant type."""
        return qtype if self.quant is None else self.quant.qtype

    def embed_type(self, qtype: QType) -> QType:
        want = qtype if self.quant is None else self.quant.embedding_qtype
        return want if want.name in EMBED_TYPES else QType.Q8_0


def plan_memory(weights: WeightSource, context_length: int, dev: Device, quant: WeightQuant | None) -> MemoryPlan:
    """Bytes of weights + KV cache + scratch vs the device heap; raises OutOfMemoryError with
    the numbers (and what to change) when they do not fit."""
    cfg = weights.config
    probe = MemoryPlan(quant, "lm_head" not in weights.tensors, [], 0, 0, 0, 0)
    w_bytes = 0
    for name, t in weights.tensors.items():
        if t.is_norm:
            w_bytes += int(np.prod(t.shape)) * 4
            continue
        qt = probe.embed_type(t.qtype) if name == "embed_tokens" else probe.target_type(t.qtype)
        block, size = GGML_QUANT_SIZES[qt]
        w_bytes += int(np.prod(t.shape)) // block * size
    slots = layer_slots(cfg, context_length, PREFILL_CHUNK)
    kv_bytes = sum(slots) * cfg.kv_dim * 2 * 2
    T = PREFILL_CHUNK
    acts = (
        T * (3 * cfg.hidden_size + cfg.q_dim + 2 * cfg.kv_dim + cfg.q_dim + cfg.intermediate_size) + cfg.hidden_size
    ) * 4  # + x_alt
    n_splits = ops_attention.default_splits(context_length)
    scratch = (
        acts
        + LOGITS_CHUNK * cfg.vocab_size * 4
        + ops_sample.scratch_bytes(cfg.vocab_size)
        + ops_attention.partial_floats(cfg.num_heads, cfg.head_dim, n_splits) * 4
        + q8_1_bytes(T * max(cfg.intermediate_size, cfg.q_dim, cfg.hidden_size))
        + T * q8_1_bytes(cfg.hidden_size)
        + q8_1_bytes(cfg.q_dim)
        + (context_length + 2) * 4
        + Device.STAGING_BYTES
    )
    need = w_bytes + kv_bytes + scratch
    heap = dev.caps.device_local_bytes
    usable = int(heap * (0.8 if dev.caps.uma else 0.92))
    if need > usable:
        gib = 2**30
        raise OutOfMemoryError(
            f"{cfg.name} needs {need / gib:.2f} GiB on {dev.name} (weights {w_bytes / gib:.2f}, KV cache "
            f"{kv_bytes / gib:.2f} for {context_length} tokens, scratch {scratch / gib:.2f}) but "
            f"{usable / gib:.2f} GiB of its {heap / gib:.2f} GiB can be used: pick a smaller quant "
            f"(--quant q4_0) or a shorter context (--ctx)"
        )
    return MemoryPlan(quant, probe.tied, slots, n_splits, w_bytes, kv_bytes, scratch)
