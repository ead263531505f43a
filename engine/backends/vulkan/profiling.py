"""What the backend measures about itself: the GPU busy gauge (`BusyGauge`), the host's share
of a decode token (`HostTime`), per-op GPU time of one step (`profile_step`, for the bench and
bench/profile.py) and the details `stats()` reports.

Per-op timing needs no second graph: the graph calls `mark` at every barrier, which also writes
a timestamp labelled with the op it closes when the command list was recorded for profiling.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from phoenix_chat.engine.backends.vulkan import ops_attention, ops_gemm
from phoenix_chat.engine.backends.vulkan.ops_common import write_step
from phoenix_chat.engine.backends.vulkan.plan import PREFILL_CHUNK, batch_buckets
from phoenix_chat.engine.backends.vulkan.recorder import CommandList

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.gemma3_graph import ForwardMode


def mark(cl: CommandList, label: str) -> None:
    """A barrier; when profiling, also a timestamp that closes the op named `label`."""
    cl.barrier()
    prof = cl.profile_labels
    if prof is not None and len(prof) + 1 < cl.n_timestamps:
        prof.append(label)
        cl.timestamp(len(prof))


class BusyGauge:
    """Share of recent wall time the GPU spent on this engine's command lists, from the two
    timestamps bracketing each (an engine-side figure, so NVIDIA, Intel and lavapipe have one)."""

    def __init__(self, has_timestamps: bool):
        self.has_timestamps = has_timestamps
        self._busy: deque[tuple[float, float]] = deque()  # (host time at completion, GPU seconds) per command list

    def account(self, cl: CommandList) -> None:
        """After a wait: remember how long the GPU worked on `cl`."""
        if cl.busy_timed:
            gpu_s = float(cl.timestamps_ns(2)[1]) * 1e-9
            self._busy.append((time.perf_counter(), gpu_s))

    def fraction(self, window_s: float = 1.0) -> float | None:
        """Busy share of the last `window_s` seconds (None: the device has no timestamps)."""
        if not self.has_timestamps:
            return None
        now = time.perf_counter()
        while self._busy and self._busy[0][0] < now - window_s:
            self._busy.popleft()
        return min(1.0, sum(gpu for _, gpu in self._busy) / window_s)


@dataclass
class HostTime:
    """Host seconds the decode loop spent outside fence waits (submitting, reading ids), per
    token: what Python costs a token. The bench resets it after its warm-up."""

    seconds: float = 0.0
    tokens: int = 0

    def add(self, seconds: float, tokens: int) -> None:
        self.seconds += seconds
        self.tokens += tokens

    def reset(self) -> None:
        self.seconds, self.tokens = 0.0, 0

    @property
    def ms_per_token(self) -> float | None:
        return 1000 * self.seconds / self.tokens if self.tokens else None


def profile_step(backend: VulkanBackend, tokens: int = 1) -> dict[str, float]:
    """GPU time by op kind (us) of one decode step (tokens = 1) or one prefill chunk of
    `tokens` (<= PREFILL_CHUNK, last-position logits) on a VulkanBackend, from timestamps
    after every barrier; also the dispatch and barrier counts. Overwrites the cache's first
    `tokens` positions."""
    if not 1 <= tokens <= PREFILL_CHUNK:
        raise ValueError(f"profile_step: 1 <= tokens <= {PREFILL_CHUNK}")
    mode: ForwardMode = "sample" if tokens == 1 else "last"
    cl = backend.graph.record(tokens, mode, greedy=True, penalty=False, profile=True)
    backend.buffers.tokens_view[:tokens] = backend.config.bos_token_id
    for _ in range(3):  # the first runs warm clocks and caches
        write_step(backend.buffers.step, pos=0, n_tokens=tokens)
        cl.submit()
    return per_op(cl)


def per_op(cl: CommandList) -> dict[str, float]:
    """A submitted profiling list's GPU time by op label (us), its total and its dispatch and
    barrier counts; destroys the list."""
    labels = cl.profile_labels
    assert labels is not None  # recorded with profile=True
    ts = np.diff(cl.timestamps_ns(len(labels) + 1)) / 1e3
    out: dict[str, float] = {}
    for label, us in zip(labels, ts):
        out[label] = out.get(label, 0.0) + float(us)
    out["total"] = float(sum(ts))
    out["dispatches"] = cl.dispatches
    out["barriers"] = cl.barriers
    cl.destroy()
    return out


def stats(backend: VulkanBackend) -> dict[str, Any]:
    """A VulkanBackend's details as a JSON-serialisable dict (bench, diagnostics): memory, the
    load-time choices and their timings, `python_ms_per_token` once it has decoded,
    `gpu_busy_fraction` where the device has timestamps."""
    dev, budget, tuning, cfg = backend.dev, backend.budget, backend.tuning, backend.config
    out: dict[str, Any] = {
        "device": dev.name,
        "weights_bytes": budget["weights"],
        "kv_cache_bytes": budget["kv_cache"],
        "scratch_bytes": budget["scratch"],
        "weights_heap": backend.plan.weights_where,
        "memory_budget": backend.plan.budget_source,  # VK_EXT_memory_budget's, or a fraction of the heap
        "allocated_bytes": dev.allocated_bytes,
        "int_dot": backend.int_dot,
        "int_dot_why": backend.int_dot_why,
        "prefill_gemm": ops_gemm.path(dev),
        "prefill_attention": ops_attention.prefill_path(
            dev,
            cfg.head_dim,
            ops_attention.prefill_splits(backend.prefill_chunk, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
        ),
        **tuning.stats(),
        # the decode attention's splits of the context in each batched step's bucket (rows: splits)
        "batch_attention_splits": {
            B: ops_attention.batch_splits(backend.graph.n_splits, B, cfg.num_kv_heads)
            for B in batch_buckets(backend.plan.batch_rows)
        },
        # the path each matrix of a recorded forward of T > 1 tokens or batched step of T rows took
        "few_token_paths": {T: dict(paths) for T, paths in sorted(backend.graph.few_token_paths.items())},
    }
    if backend.host_time.ms_per_token is not None:
        out["python_ms_per_token"] = backend.host_time.ms_per_token
    busy = backend.busy.fraction()
    if busy is not None:
        out["gpu_busy_fraction"] = busy
    return out
