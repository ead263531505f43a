"""The numpy backend: the f32 reference forward pass behind the Backend contract."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil

from phoenix_chat.engine.backends.base import PREFILL_CHUNK, Backend, LiveStats, forward_in_chunks
from phoenix_chat.engine.errors import OutOfMemoryError
from phoenix_chat.engine.models.gemma3 import Gemma3Model
from phoenix_chat.engine.models.kv_plan import layer_slots, ring_slots
from phoenix_chat.engine.weights.base import WeightSource


def f32_footprint(weights: WeightSource, context_length: int) -> int:
    """Bytes the reference needs: every weight in f32 plus an f32 KV cache."""
    cfg = weights.config
    params = sum(int(np.prod(t.shape)) for t in weights.tensors.values())
    kv_slots = sum(layer_slots(cfg, context_length, PREFILL_CHUNK))
    return params * 4 + kv_slots * cfg.kv_dim * 4 * 2


class CpuBackend(Backend):
    name = "cpu"
    device_name = "CPU (numpy, f32 reference)"

    def __init__(
        self,
        weights: WeightSource,
        context_length: int,
        progress: Callable[[float, str], None] | None = None,
        cancel: threading.Event | None = None,
    ):
        super().__init__(weights.config, context_length)
        need = f32_footprint(weights, context_length)
        have = psutil.virtual_memory().available
        if need > have * 0.9:
            raise OutOfMemoryError(
                f"the CPU backend needs {need / 2**30:.1f} GiB for f32 weights and cache, "
                f"{have / 2**30:.1f} GiB is available: use --backend vulkan or a shorter --ctx"
            )
        self.model = Gemma3Model(
            weights, context_length, progress=progress, cancel=cancel, forward_tokens=PREFILL_CHUNK
        )
        self.kv_ring_slots = ring_slots(self.config, context_length, PREFILL_CHUNK)

    def forward(self, token_ids: Sequence[int], start_pos: int, *, all_logits: bool = False) -> npt.NDArray[np.float32]:
        self.wrote_kv(start_pos + len(token_ids))  # before: a forward cut short wrote part of it
        return forward_in_chunks(self.model.forward, list(token_ids), start_pos, all_logits)

    def live_stats(self) -> LiveStats:
        return LiveStats(device=self.device_name, kv_cache_bytes=self.model.cache.nbytes())

    def stats(self) -> dict[str, Any]:
        return {"kv_cache_bytes": self.model.cache.nbytes()}
