"""The numpy backend: the f32 reference forward pass behind the Backend contract.

A quantization choice is applied to the values, not the arithmetic: with `quant` every matrix
is rounded to that type at load (weights/requantized.py) and then computed in f32, so the
answers are those of a Q8_0/Q4_0/F16 model while memory and speed stay those of f32."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import psutil

from phoenix_chat.engine.backends.base import (
    PREFILL_CHUNK,
    Backend,
    CancelCheck,
    LiveStats,
    check_cancel,
    forward_in_chunks,
    image_chunks,
)
from phoenix_chat.engine.errors import OutOfMemoryError
from phoenix_chat.engine.models.gemma3 import Gemma3Model
from phoenix_chat.engine.models.kv_plan import layer_slots, ring_slots
from phoenix_chat.engine.quantization import WeightQuant
from phoenix_chat.engine.weights.base import WeightSource
from phoenix_chat.engine.weights.requantized import RequantizedWeights

if TYPE_CHECKING:
    from phoenix_chat.engine.vision.spans import ImageSpan


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
        quant: WeightQuant | None = None,
    ):
        super().__init__(weights.config, context_length)
        self.quant = quant
        if quant is not None:
            weights = RequantizedWeights(weights, quant)
            self.device_name = f"CPU (numpy, f32 reference, weights rounded to {quant.label})"
        self._types: dict[str, int] = {}
        for t in weights.tensors.values():
            self._types[t.qtype.name] = self._types.get(t.qtype.name, 0) + 1
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

    def forward(
        self,
        token_ids: Sequence[int],
        start_pos: int,
        *,
        all_logits: bool = False,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        self.wrote_kv(start_pos + len(token_ids))  # before: a forward cut short wrote part of it
        return forward_in_chunks(self.model.forward, list(token_ids), start_pos, all_logits, cancel=cancel)

    def forward_images(
        self,
        token_ids: Sequence[int],
        start_pos: int,
        images: Sequence[ImageSpan],
        *,
        all_logits: bool = False,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        ids = list(token_ids)
        self.wrote_kv(start_pos + len(ids))
        outs: list[npt.NDArray[np.float32]] = []
        for i, j in image_chunks(len(ids), start_pos, images, PREFILL_CHUNK):
            check_cancel(cancel)
            out = self.model.forward(ids[i:j], start_pos + i, all_logits=all_logits, cancel=cancel, images=images)
            if all_logits or j == len(ids):
                outs.append(out)
        return np.concatenate(outs) if all_logits else outs[-1]

    def weight_types(self) -> dict[str, int]:
        return dict(self._types)

    def live_stats(self) -> LiveStats:
        return LiveStats(device=self.device_name, kv_cache_bytes=self.model.cache.nbytes())

    def stats(self) -> dict[str, Any]:
        return {"kv_cache_bytes": self.model.cache.nbytes()}
