"""K/V rows in and out of the Vulkan KV cache, for plans that split a model's work between
devices (NPU prefill → iGPU decode, engine/backends/npu_hybrid.py).

Rows cross as f32 `[(layer, positions, k, v)]` with k/v `[rows, kv_heads, head_dim]`; on the
device a layer's cache is f16 `[kv_heads][slots][head_dim]` with position p in slot p % slots.
Only the touched slots move: one copy per head and contiguous run of slots, so a hand-off
costs the rows it carries, not the whole cache.
"""

from __future__ import annotations

import numpy as np


def _runs(slots: np.ndarray):
    """Split ascending-by-position slots into runs contiguous in memory (a ring wraps once)."""
    breaks = np.nonzero(np.diff(slots) != 1)[0] + 1
    return np.split(np.arange(len(slots)), breaks)


def held_positions(backend, layer: int, lo: int, hi: int) -> np.ndarray:
    """The positions in [lo, hi) a layer's cache can still hold (a ring keeps the last `slots`)."""
    slots = backend.layers[layer].slots
    return np.arange(max(lo, hi - slots), hi)


def export_kv(backend, lo: int, hi: int) -> list:
    cfg, dev = backend.config, backend.dev
    dev.wait_idle()  # decode steps may still be in flight
    rows = []
    for i, L in enumerate(backend.layers):
        pos = held_positions(backend, i, lo, hi)
        if not len(pos):
            continue
        slots = pos % L.slots
        k = np.empty((len(pos), cfg.num_kv_heads, cfg.head_dim), np.float32)
        v = np.empty_like(k)
        for h in range(cfg.num_kv_heads):
            for run in _runs(slots):
                offset = (h * L.slots + int(slots[run[0]])) * cfg.head_dim * 2
                shape = (len(run), cfg.head_dim)
                k[run, h] = dev.download(L.k_cache, np.float16, shape, offset)
                v[run, h] = dev.download(L.v_cache, np.float16, shape, offset)
        rows.append((i, pos, k, v))
    return rows


def import_kv(backend, rows) -> int:
    """Write the rows into the device cache; returns the bytes moved."""
    cfg, dev = backend.config, backend.dev
    dev.wait_idle()
    moved = 0
    for layer, positions, k, v in rows:
        L = backend.layers[layer]
        positions = np.asarray(positions)
        keep = positions > positions.max() - L.slots  # what the ring can hold
        positions, k, v = positions[keep], np.asarray(k)[keep], np.asarray(v)[keep]
        order = np.argsort(positions)
        positions, k, v = positions[order], k[order], v[order]
        slots = positions % L.slots
        for h in range(cfg.num_kv_heads):
            for run in _runs(slots):
                offset = (h * L.slots + int(slots[run[0]])) * cfg.head_dim * 2
                kh = np.ascontiguousarray(k[run, h], dtype=np.float16)
                vh = np.ascontiguousarray(v[run, h], dtype=np.float16)
                dev.upload(L.k_cache, kh, offset)
                dev.upload(L.v_cache, vh, offset)
                moved += kh.nbytes + vh.nbytes
    return moved
