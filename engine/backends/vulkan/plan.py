"""The memory plan: what the model will take on the device (weights in their target types, KV
cache, scratch), checked against the heap before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as QType

from phoenix_chat.engine.backends.vulkan import ops_attention, ops_gemm, ops_sample
from phoenix_chat.engine.backends.vulkan.codebooks import grid_prefix
from phoenix_chat.engine.backends.vulkan.device import Capabilities, Device
from phoenix_chat.engine.backends.vulkan.matvec import q8_1_bytes
from phoenix_chat.engine.backends.vulkan.ops_common import STEP_BYTES
from phoenix_chat.engine.backends.vulkan.ops_table import EMBED_TYPES
from phoenix_chat.engine.config import ModelConfig
from phoenix_chat.engine.errors import OutOfMemoryError
from phoenix_chat.engine.models.kv_plan import layer_slots
from phoenix_chat.engine.quantization import WeightQuant
from phoenix_chat.engine.weights.base import WeightSource

PREFILL_CHUNK = 512  # tokens per prefill submission (GEMM rows: more reuse of each dequantized weight tile)
# On a CPU Vulkan device (lavapipe) a 512-token submission of the 270M took 15-70 s on a 2-core box,
# and Stop is checked between submissions: smaller ones there (the buffers stay PREFILL_CHUNK-sized).
SOFTWARE_PREFILL_CHUNK = 128
LOGITS_CHUNK = 32  # tokens per submission when every position's logits come back
MAX_BATCH = LOGITS_CHUNK  # sequences one batched decode step advances (their logits share `logits`)
# A prefill chunk runs in the recording of the smallest bucket holding it: powers of two up to
# one GEMM token tile (64), then whole tiles, so rows past the prompt cost little GEMM work (a tile
# computes them anyway) and a chat whose turns differ in length records a handful of forwards
# instead of one per length (~0.1 s each on an H100's host for the 4B, inside the turn's TTFT).
PREFILL_BUCKET_TILE = 64


def prefill_bucket(n: int, chunk: int) -> int:
    """Tokens recorded for a chunk of n (1 <= n <= chunk): one token keeps the decode graph."""
    if not 1 <= n <= chunk:
        raise ValueError(f"prefill_bucket: a chunk of {n} tokens is outside 1..{chunk}")
    if n <= PREFILL_BUCKET_TILE:
        bucket = 1 << (n - 1).bit_length()
    else:
        bucket = -(-n // PREFILL_BUCKET_TILE) * PREFILL_BUCKET_TILE
    return min(bucket, chunk)


BATCH_BUCKETS = (2, 4, 8, 16, 32)  # rows of the recorded batched steps (one sequence takes the decode path)


def batch_buckets(max_rows: int) -> list[int]:
    """The batch sizes recorded for a backend of `max_rows` rows: the buckets up to it, and
    max_rows itself where the slots are fewer than the next bucket (its per-row scratch ends there)."""
    return sorted({min(b, max_rows) for b in BATCH_BUCKETS if min(b, max_rows) >= 2})


ROW_ALIGN = 256  # per-row scratch (step, counters, partials, candidates) starts at this alignment


def row_stride(nbytes: int) -> int:
    """Bytes between two rows of per-row scratch of `nbytes` each: any storage-offset alignment
    a device may ask (the spec caps it at 256) divides it."""
    return -(-nbytes // ROW_ALIGN) * ROW_ALIGN


def batch_logits_stride(vocab: int) -> int:
    """Floats between two rows' logits in a batched step: each row's sampler binds its own row,
    at an offset every device accepts (a vocabulary that is no multiple of 64 gets a gap)."""
    return row_stride(vocab * 4) // 4


def batch_scratch_bytes(cfg: ModelConfig, n_splits: int, rows: int) -> int:
    """Per-row scratch of a batched decode step (batch.py): each row's step, attention partials and
    arrival counters, and sampler candidates, so rows never share scratch within a step."""
    per_row = (
        row_stride(STEP_BYTES)
        + row_stride(ops_attention.partial_floats(cfg.num_heads, cfg.head_dim, n_splits) * 4)
        + row_stride(4 * ops_attention.counter_words(cfg.num_kv_heads))
        + row_stride(ops_sample.scratch_bytes(cfg.vocab_size))
    )
    extra_logits = max(0, rows * batch_logits_stride(cfg.vocab_size) - LOGITS_CHUNK * cfg.vocab_size) * 4
    return rows * per_row + extra_logits


@dataclass(frozen=True)
class MemoryPlan:
    quant: WeightQuant | None
    tied: bool  # no lm_head tensor: the embedding is the output head
    slots: list[int]  # KV positions per layer and sequence (models/kv_plan.py, one prefill chunk of slack)
    n_splits: int  # decode attention's splits of the context
    weights: int  # bytes
    kv_cache: int
    scratch: int
    weights_heap: int | None = None  # memory heap of the weights; None: with everything else
    weights_where: str = "device-local"  # ... in words, for stats and the doctor
    n_slots: int = 1  # sequences whose K/V the caches hold (each layer's cache is n_slots x slots[i])
    # how the plan sized the heap holding the weights (usable_rule): VK_EXT_memory_budget's budget,
    # or a fraction of the heap's size where the device lacks the extension
    budget_source: str = ""

    @property
    def batch_rows(self) -> int:
        """Sequences one batched decode step advances at most (0: one slot, no batched step)."""
        return min(self.n_slots, MAX_BATCH) if self.n_slots > 1 else 0

    @property
    def budget(self) -> dict[str, int]:
        return {"weights": self.weights, "kv_cache": self.kv_cache, "scratch": self.scratch}

    def target_type(self, qtype: QType) -> QType:
        """A matrix's type on the device: the file's, or the --quant type."""
        return qtype if self.quant is None else self.quant.qtype

    def embed_type(self, qtype: QType) -> QType:
        want = qtype if self.quant is None else self.quant.embedding_qtype
        return want if want.name in EMBED_TYPES else QType.Q8_0


def plan_memory(
    weights: WeightSource, context_length: int, dev: Device, quant: WeightQuant | None, n_slots: int = 1
) -> MemoryPlan:
    """Bytes of weights + n_slots x KV cache + scratch vs the device heap; raises
    OutOfMemoryError with the numbers (and what to change) when they do not fit."""
    if n_slots < 1:
        raise ValueError(f"n_slots must be >= 1, not {n_slots}")
    cfg = weights.config
    probe = MemoryPlan(quant, "lm_head" not in weights.tensors, [], 0, 0, 0, 0)
    w_bytes = 0
    for name, t in weights.tensors.items():
        if t.is_norm:
            w_bytes += int(np.prod(t.shape)) * 4
            continue
        qt = probe.embed_type(t.qtype) if name == "embed_tokens" else probe.target_type(t.qtype)
        block, size = GGML_QUANT_SIZES[qt]
        w_bytes += int(np.prod(t.shape)) // block * size + (0 if name == "embed_tokens" else len(grid_prefix(qt)))
    slots = layer_slots(cfg, context_length, PREFILL_CHUNK)
    kv_bytes = n_slots * sum(slots) * cfg.kv_dim * 2 * 2
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
        + (n_slots + 1) * (context_length + 2) * 4  # every slot's ids and a pad row's
        + Device.STAGING_BYTES
        + ops_gemm.cf_scratch_bytes(dev)  # the split-K few-token GEMMs' partial sums
        + ops_attention.split_scratch_bytes(dev, cfg.head_dim)  # the split prefill attention's records
    )
    if n_slots > 1:
        scratch += batch_scratch_bytes(cfg, n_splits, min(n_slots, MAX_BATCH))
    heaps = device_heaps(dev.caps, dev.heap_budgets())
    try:
        placement = place_weights(heaps, dev.caps.uma, w_bytes, kv_bytes + scratch)
    except OutOfMemoryError as e:
        gib = 2**30
        raise OutOfMemoryError(
            f"{cfg.name} needs {(w_bytes + kv_bytes + scratch) / gib:.2f} GiB on {dev.name} (weights "
            f"{w_bytes / gib:.2f}, KV cache {kv_bytes / gib:.2f} for {n_slots} x {context_length} tokens, "
            f"scratch {scratch / gib:.2f}) but {e}: pick a smaller quant (--quant q4_0), a shorter context "
            f"(--ctx){' or fewer slots' if n_slots > 1 else ''}"
        ) from None
    held = placement[0] if placement[0] is not None else _local_heap(heaps)
    assert held is not None  # place_weights refuses a device without a device-local heap
    return MemoryPlan(
        quant,
        probe.tied,
        slots,
        n_splits,
        w_bytes,
        kv_bytes,
        scratch,
        *placement,
        n_slots=n_slots,
        budget_source=usable_rule(heaps[held], dev.caps.uma),
    )


@dataclass(frozen=True)
class Heap:
    """One Vulkan memory heap as the plan sees it."""

    size: int
    device_local: bool
    host_visible: bool  # some memory type on it can be mapped
    # VK_EXT_memory_budget where the device has it: what this process may allocate from the heap
    # (its own allocations included) and what it has allocated; None: no extension
    budget: int | None = None
    usage: int = 0


def device_heaps(caps: Capabilities, budgets: tuple[tuple[int, int], ...] | None) -> list[Heap]:
    """The device's heaps for the plan, each with its VK_EXT_memory_budget (budget, usage)
    where `budgets` has one (Device.heap_budgets(), or caps.heap_budgets from the probe)."""
    budgets = budgets or ()
    return [
        Heap(size, local, i in caps.host_visible_heaps, *(budgets[i] if i < len(budgets) else (None, 0)))
        for i, (size, local) in enumerate(caps.heaps)
    ]


def _fraction(heap: Heap, uma: bool) -> float:
    """Shared system memory keeps a fifth free for the OS and the app, a discrete card's own
    memory 8% (the desktop, the driver)."""
    return 0.8 if uma or not heap.device_local else 0.92


def usable_bytes(heap: Heap, uma: bool) -> int:
    """What the plan lets itself take of a heap: a fixed fraction of its size (_fraction: the
    driver, the compositor and other programs need the rest), and where VK_EXT_memory_budget
    gives a budget, no more than that budget less what this process already uses there (other
    programs' allocations shrink it). The smaller of the two: a budget near the whole heap
    (an idle discrete card reports ~99%) must not remove the headroom."""
    return _usable(heap, uma)[0]


def usable_rule(heap: Heap, uma: bool) -> str:
    """Which rule usable_bytes took for `heap`, in words (stats, the doctor, refusals)."""
    return _usable(heap, uma)[1]


def _usable(heap: Heap, uma: bool) -> tuple[int, str]:
    """usable_bytes and usable_rule from one comparison."""
    gib = 2**30
    by_size = int(heap.size * _fraction(heap, uma))
    pct = f"{round(100 * _fraction(heap, uma))}% of heap size"
    if heap.budget is None:
        return by_size, f"{pct}: no memory budget extension"
    budget = f"VK_EXT_memory_budget: {heap.budget / gib:.2f} GiB, {heap.usage / gib:.2f} GiB in use"
    if heap.budget - heap.usage < by_size:
        return max(0, heap.budget - heap.usage), f"budget from {budget}"
    return by_size, f"{pct} (within the budget from {budget})"


def _local_heap(heaps: list[Heap]) -> int | None:
    """The largest device-local heap: where everything goes unless the plan moves the weights."""
    return max((i for i, h in enumerate(heaps) if h.device_local), key=lambda i: heaps[i].size, default=None)


def place_weights(heaps: list[Heap], uma: bool, weights: int, rest: int) -> tuple[int | None, str]:
    """Where the weights go: (heap index or None for the usual device-local heap, in words).

    Everything in the largest device-local heap when it fits. On an integrated GPU (uma) whose
    device-local heap is only the BIOS carve-out (a Radeon 780M: often 512 MB-4 GB, the rest
    of RAM reachable as GTT), the weights go to the largest host-visible heap that is not
    device-local, while the KV cache and scratch stay in the carve-out: the GPU reads GTT at
    the same DDR bandwidth. A discrete card never streams weights over PCIe: it refuses.
    Raises OutOfMemoryError naming the heaps' usable sizes."""
    gib = 2**30
    local = _local_heap(heaps)
    if local is None:
        raise OutOfMemoryError("it reports no device-local memory heap")
    local_ok = usable_bytes(heaps[local], uma)
    if weights + rest <= local_ok:
        return None, "device-local"
    where = (
        f"{local_ok / gib:.2f} GiB of its {heaps[local].size / gib:.2f} GiB device-local heap can be used "
        f"({usable_rule(heaps[local], uma)})"
    )
    if not uma:
        raise OutOfMemoryError(where)
    gtt = [i for i, h in enumerate(heaps) if h.host_visible and not h.device_local]
    if not gtt:
        raise OutOfMemoryError(where)
    big = max(gtt, key=lambda i: heaps[i].size)
    big_ok = usable_bytes(heaps[big], uma)
    if rest <= local_ok and weights <= big_ok:
        return big, f"host-visible heap {big} (GTT, {heaps[big].size / gib:.1f} GiB)"
    raise OutOfMemoryError(
        f"{where}, and {big_ok / gib:.2f} GiB of its {heaps[big].size / gib:.2f} GiB GTT heap "
        f"({usable_rule(heaps[big], uma)})"
    )
