"""K/V rows in and out of the Vulkan KV cache, for plans that split a model's work between
devices (NPU prefill → iGPU decode, engine/backends/npu_hybrid.py).

Rows cross as f32 `[(layer, positions, k, v)]` with k/v `[rows, kv_heads, head_dim]`; on the
device a layer's cache is f16 `[kv_heads][slots][head_dim]` with position p in slot p % slots.
Only the touched slots move: one copy per head and contiguous run of slots, so a hand-off
costs the rows it carries, not the whole cache.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Buffer
    from phoenix_chat.engine.config import ModelConfig

# one layer's rows: (layer, positions, k, v), k and v f32 [rows, kv_heads, head_dim]
KVRows: TypeAlias = tuple[int, npt.NDArray[np.signedinteger[Any]], npt.NDArray[np.float32], npt.NDArray[np.float32]]


class _CacheLayer(Protocol):
    @property
    def slots(self) -> int: ...
    @property
    def k_cache(self) -> Buffer: ...
    @property
    def v_cache(self) -> Buffer: ...


class KVBackend(Protocol):
    """What the hand-off reads of a Vulkan backend: its config, device and per-layer caches."""

    @property
    def config(self) -> ModelConfig: ...
    @property
    def dev(self) -> Device: ...
    @property
    def layers(self) -> Sequence[_CacheLayer]: ...


def _runs(slots: npt.NDArray[np.signedinteger[Any]]) -> list[npt.NDArray[np.signedinteger[Any]]]:
    """Split ascending-by-position slots into runs contiguous in memory (a ring wraps once)."""
    breaks = np.nonzero(np.diff(slots) != 1)[0] + 1
    return np.split(np.arange(len(slots)), breaks)


def held_positions(backend: KVBackend, layer: int, lo: int, hi: int) -> npt.NDArray[np.signedinteger[Any]]:
    """The positions in [lo, hi) a layer's cache can still hold (a ring keeps the last `slots`)."""
    slots = backend.layers[layer].slots
    return np.arange(max(lo, hi - slots), hi)


def export_kv(backend: KVBackend, lo: int, hi: int) -> list[KVRows]:
    cfg, dev = backend.config, backend.dev
    dev.wait_idle()  # decode steps may still be in flight
    rows: list[KVRows] = []
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


def import_kv(backend: KVBackend, rows: Iterable[tuple[int, npt.ArrayLike, npt.ArrayLike, npt.ArrayLike]]) -> int:
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
