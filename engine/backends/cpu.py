"""The numpy backend: the f32 reference forward pass behind the Backend contract.

With `slots=N` it holds N independent K/V caches (engine/scheduler.py serves one sequence per
slot) and `decode_batch` advances B of them in one pass over the weights: one GEMM over B rows
per matrix, attention per sequence over its own cache (models/gemma3.py `decode_batch`). With
two slots or fewer each row decodes as a lone forward instead (`ROW_BY_ROW_SLOTS`).

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
    SeqStep,
    SlotsUnsupported,
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


# Slots up to which `decode_batch` runs each row as a lone forward (matrix-vector products), not
# one GEMM over the rows: the GEMM must pad a lone row to two to keep its bits independent of who
# shares the step, and BLAS's matrix-matrix kernel packs every weight first. On the 270M (2-core
# host, docs/PERFORMANCE.md): a lone row 148 ms by itself against 340 padded, two rows 308 against
# 314, three 445 against 365. Row by row each row's bits are a lone forward's whoever shares it.
ROW_BY_ROW_SLOTS = 2


def f32_kv_bytes(weights: WeightSource, context_length: int) -> int:
    """Bytes of one sequence's f32 K and V cache (whole context on global layers, rings elsewhere)."""
    cfg = weights.config
    return sum(layer_slots(cfg, context_length, PREFILL_CHUNK)) * cfg.kv_dim * 4 * 2


def f32_footprint(weights: WeightSource, context_length: int, slots: int = 1) -> int:
    """Bytes the reference needs: every weight in f32 plus `slots` f32 KV caches."""
    params = sum(int(np.prod(t.shape)) for t in weights.tensors.values())
    return params * 4 + slots * f32_kv_bytes(weights, context_length)


class CpuBackend(Backend):
    name = "cpu"
    device_name = "CPU (numpy, f32 reference)"
    takes_images = True

    def __init__(
        self,
        weights: WeightSource,
        context_length: int,
        progress: Callable[[float, str], None] | None = None,
        cancel: threading.Event | None = None,
        quant: WeightQuant | None = None,
        slots: int = 1,
    ):
        super().__init__(weights.config, context_length)
        if slots < 1:
            raise ValueError(f"slots must be at least 1, not {slots}")
        self.n_slots = slots
        self.quant = quant
        if quant is not None:
            weights = RequantizedWeights(weights, quant)
            self.device_name = f"CPU (numpy, f32 reference, weights rounded to {quant.label})"
        self._types: dict[str, int] = {}
        for t in weights.tensors.values():
            self._types[t.qtype.name] = self._types.get(t.qtype.name, 0) + 1
        need = f32_footprint(weights, context_length, slots)
        have = psutil.virtual_memory().available
        if need > have * 0.9:
            kv = slots * f32_kv_bytes(weights, context_length)
            many = f"{slots} sequence slots x " if slots > 1 else ""
            raise OutOfMemoryError(
                f"the CPU backend needs {need / 2**30:.1f} GiB for f32 weights and cache "
                f"(KV {kv / 2**30:.1f} GiB: {many}{context_length} tokens), "
                f"{have / 2**30:.1f} GiB is available: use --backend vulkan, a shorter --ctx"
                + (" or fewer --slots" if slots > 1 else "")
            )
        self.model = Gemma3Model(
            weights, context_length, progress=progress, cancel=cancel, forward_tokens=PREFILL_CHUNK, slots=slots
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
        self.wrote_kv(start_pos + len(token_ids))
        return self._forward_images(0, token_ids, start_pos, images, all_logits, cancel)

    def forward_slot_images(
        self,
        slot: int,
        token_ids: Sequence[int],
        start_pos: int,
        images: Sequence[ImageSpan],
        *,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        self._check_slot(slot)
        if slot == 0:
            self.wrote_kv(start_pos + len(token_ids))
        return self._forward_images(slot, token_ids, start_pos, images, False, cancel)

    def _forward_images(
        self,
        slot: int,
        token_ids: Sequence[int],
        start_pos: int,
        images: Sequence[ImageSpan],
        all_logits: bool,
        cancel: CancelCheck | None,
    ) -> npt.NDArray[np.float32]:
        ids = list(token_ids)
        outs: list[npt.NDArray[np.float32]] = []
        for i, j in image_chunks(len(ids), start_pos, images, PREFILL_CHUNK):
            check_cancel(cancel)
            out = self.model.forward(
                ids[i:j], start_pos + i, all_logits=all_logits, cancel=cancel, images=images, slot=slot
            )
            if all_logits or j == len(ids):
                outs.append(out)
        return np.concatenate(outs) if all_logits else outs[-1]

    def forward_slot(
        self,
        slot: int,
        token_ids: Sequence[int],
        start_pos: int,
        *,
        all_logits: bool = False,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        self._check_slot(slot)
        if slot == 0:
            return self.forward(token_ids, start_pos, all_logits=all_logits, cancel=cancel)

        def fwd(
            ids: Sequence[int], pos: int, /, *, all_logits: bool, cancel: CancelCheck | None
        ) -> npt.NDArray[np.float32]:
            return self.model.forward(ids, pos, all_logits=all_logits, cancel=cancel, slot=slot)

        return forward_in_chunks(fwd, list(token_ids), start_pos, all_logits, cancel=cancel)

    def decode_batch(self, steps: Sequence[SeqStep]) -> npt.NDArray[np.float32]:
        for s in steps:
            self._check_slot(s.slot)
            if s.slot == 0:
                self.wrote_kv(s.pos + 1)
        if self.n_slots <= ROW_BY_ROW_SLOTS:  # each row as a lone forward: the same bits as one
            return np.stack([self.model.forward([s.token], s.pos, slot=s.slot) for s in steps])
        return self.model.decode_batch([s.token for s in steps], [s.pos for s in steps], [s.slot for s in steps])

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise SlotsUnsupported(f"the cpu backend holds {self.n_slots} slot(s), not slot {slot}")

    def weight_types(self) -> dict[str, int]:
        return dict(self._types)

    def live_stats(self) -> LiveStats:
        return LiveStats(device=self.device_name, kv_cache_bytes=self._kv_bytes())

    def stats(self) -> dict[str, Any]:
        return {"kv_cache_bytes": self._kv_bytes(), "slots": self.n_slots}

    def _kv_bytes(self) -> int:
        return sum(c.nbytes() for c in self.model.caches)
