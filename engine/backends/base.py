"""The contract every compute backend (cpu, vulkan, npu-hybrid) fulfils.

A backend owns the weights on its device and the KV cache. The generation loop only sees:
`forward` (prefill a chunk or decode one token, returning logits) and, where the backend can
keep the whole token step on the device, `generate_tokens` (prefill ending in the device's
sampler: every id drawn there) and `decode_tokens` (sampling on the device, ids back). For
prefix reuse (engine/prompt_cache.py) it says how long its sliding-window rings are
(`kv_ring_slots`) and how far its writes reached (`kv_high_water`).

Many sequences at once (engine/scheduler.py): a backend built with `slots=N` holds N independent
K/V caches (each with its own positions, rings and global cache). `forward_slot` prefills one
slot; `decode_batch` advances B sequences one token each in one pass over the weights (logits
back), `decode_batch_sampled` does the same with each sequence's sampler on the device (ids
back). Slot 0 is the cache `forward`, `generate_tokens` and `decode_tokens` use.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

from phoenix_chat.engine.config import ModelConfig
from phoenix_chat.engine.errors import CancelledError, PhoenixError
from phoenix_chat.engine.models.kv_plan import ring_slots
from phoenix_chat.engine.quantization import WeightQuant
from phoenix_chat.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from phoenix_chat.engine.vision.encoder import VisionTower
    from phoenix_chat.engine.vision.spans import ImageSpan
    from phoenix_chat.engine.vision_config import VisionConfig

# tokens per numpy forward (cpu, npu-hybrid prefill): bounds a long prompt's activations and how
# long Stop waits, since cancel is checked between chunks (docs/PERFORMANCE.md "Stop during prefill")
PREFILL_CHUNK = 128

# "should this work stop now?" — e.g. `threading.Event().is_set`; checked between prefill chunks
CancelCheck: TypeAlias = Callable[[], bool]


# K/V rows handed between backends (npu_hybrid.py, vulkan/kv_handoff.py): (layer, positions, k, v),
# k and v f32 [rows, kv_heads, head_dim]
KvRow: TypeAlias = tuple[int, npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.float32]]


class ForwardFn(Protocol):
    """A model's forward (models/gemma3.py `Gemma3Model.forward`): logits of the last or every
    position; `cancel` asked inside the pass (between layers)."""

    def __call__(
        self, token_ids: Sequence[int], start_pos: int, /, *, all_logits: bool, cancel: CancelCheck | None
    ) -> npt.NDArray[np.float32]: ...


def check_cancel(cancel: CancelCheck | None) -> None:
    """Raise CancelledError if `cancel` says stop (the one place a backend asks)."""
    if cancel is not None and cancel():
        raise CancelledError("stopped")


def forward_in_chunks(
    forward: ForwardFn,
    ids: list[int],
    start_pos: int,
    all_logits: bool,
    chunk: int = PREFILL_CHUNK,
    cancel: CancelCheck | None = None,
) -> npt.NDArray[np.float32]:
    """`forward(ids, pos, all_logits=...)` over `ids` a chunk at a time, positions start_pos..:
    the logits of every position with all_logits, else of the last one. `cancel` is asked
    before each chunk and handed to `forward` (which asks between layers), so Stop interrupts
    a long prefill within one layer of one chunk (CancelledError)."""
    outs: list[npt.NDArray[np.float32]] = []
    for i in range(0, len(ids), chunk):
        check_cancel(cancel)
        out = forward(ids[i : i + chunk], start_pos + i, all_logits=all_logits, cancel=cancel)
        if all_logits or i + chunk >= len(ids):
            outs.append(out)
    return np.concatenate(outs) if all_logits else outs[-1]


def image_chunks(n: int, start_pos: int, images: Sequence[ImageSpan], chunk: int) -> list[tuple[int, int]]:
    """Prefill chunks [i, j) over n ids at start_pos.., at most `chunk` long unless a picture's
    span is longer, and never cutting a span (its tokens attend to each other both ways)."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < n:
        j = min(i + chunk, n)
        for span in images:
            a, b = span.start - start_pos, span.end - start_pos
            if a < j < b:
                j = a if a > i else b
        out.append((i, j))
        i = j
    return out


class NoImageBackend(PhoenixError):
    """This backend cannot run a prompt with pictures yet."""

    def __init__(self, backend: str) -> None:
        super().__init__(f"the {backend} backend does not take images yet: use --backend cpu")


@dataclass(frozen=True)
class SeqStep:
    """One sequence's part of a batched decode step: feed `token` at `pos` in `slot`'s cache.
    `params` and `seed` are its own sampler (device sampling draws with a counter of the
    drawn token's position, so a sequence's tokens do not depend on who shares the batch)."""

    slot: int
    token: int
    pos: int
    params: SamplingParams = SamplingParams(temperature=0.0)
    seed: int = 0


class SlotsUnsupported(ValueError):
    """This backend holds one sequence (or fewer slots than asked); the scheduler runs it serially."""


@dataclass(frozen=True)
class LiveStats:
    """What the gauges show while an engine works: the same record from every backend, so the
    worker never guesses among key names. None: this backend cannot measure it."""

    device: str
    gpu_busy: float | None = None  # share of the last second a GPU worked for this engine
    npu_busy: float | None = None  # likewise for the NPU
    kv_cache_bytes: int = 0


class Backend(ABC):
    name: str = "?"
    device_name: str = "?"
    quant: WeightQuant | None = None  # the re-quantization applied at load; None: the file's types
    n_slots: int = 1  # sequences whose K/V this backend holds at once (engine/scheduler.py)
    takes_images: bool = False  # `forward_images` / `forward_slot_images` exist (cpu, vulkan)

    @property
    def max_batch_rows(self) -> int:
        """The most sequences one `decode_batch` step advances; the scheduler moves more than that
        in turns. Every slot here; a backend whose batched step has fewer rows says so."""
        return self.n_slots

    def __init__(self, config: ModelConfig, context_length: int):
        self.config = config
        self.context_length = context_length
        # Slots of the sliding-window layers' K/V rings; each backend sets its own (the window
        # plus the most positions one forward writes). This default, the window alone, promises
        # no slack: prefix reuse (engine/prompt_cache.py) then resumes only where nothing was rolled back.
        self.kv_ring_slots = ring_slots(config, context_length, 0)
        self._kv_high_water = 0

    @property
    def kv_high_water(self) -> int:
        """One past the highest position whose K/V a forward or decode step wrote since a caller
        last set this (engine/prompt_cache.py: how far the sliding-window rings moved)."""
        return self._kv_high_water

    @kv_high_water.setter
    def kv_high_water(self, pos: int) -> None:
        self._kv_high_water = pos

    def wrote_kv(self, end: int) -> None:
        """Note that a forward or decode step writes K/V up to position `end` (exclusive); called
        before the work, so a step cut short still counts."""
        self._kv_high_water = max(self._kv_high_water, end)

    @abstractmethod
    def forward(
        self,
        token_ids: Sequence[int],
        start_pos: int,
        *,
        all_logits: bool = False,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        """Run `token_ids` at positions start_pos.. (filling the KV cache there).

        Returns float32 logits: shape (vocab,) for the last token, or (n, vocab) with all_logits.
        Positions ≥ start_pos + n are forgotten, so rolling back is just a smaller start_pos.
        `cancel` is asked between chunks of a long prompt; when it says stop, CancelledError is
        raised and the positions from start_pos on hold nothing valid.
        """

    def forward_images(
        self,
        token_ids: Sequence[int],
        start_pos: int,
        images: Sequence[ImageSpan],
        *,
        all_logits: bool = False,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        """`forward` for a prompt with pictures: each span's soft tokens replace its placeholders
        and attend to each other both ways (cpu, vulkan)."""
        raise NoImageBackend(self.name)

    def vision_tower(self, cfg: VisionConfig, tensor: Callable[[str], npt.NDArray[np.float32]]) -> VisionTower | None:
        """The vision tower + projector on this backend's device (vulkan: siglip_graph.py), built
        from `tensor` (WeightSource.vision_tensor); None: pictures are encoded by the numpy
        reference (engine/vision/encoder.py). The backend closes it with itself."""
        return None

    def generate_tokens(
        self,
        prompt_ids: Sequence[int],
        start_pos: int,
        params: SamplingParams,
        max_tokens: int,
        cancel: CancelCheck | None = None,
    ) -> Generator[int, None, None] | None:
        """Prefill `prompt_ids` at start_pos.. and yield up to max_tokens ids, every one sampled
        on the device, the first by the prefill itself (the Vulkan backend).

        None: this backend's prefill leaves logits on the host (cpu, npu-hybrid), so the caller
        samples the first token from `forward`'s logits, then goes on with `decode_tokens`.
        """
        return None

    def decode_tokens(
        self, first_token: int, start_pos: int, params: SamplingParams, max_tokens: int
    ) -> Generator[int, None, None] | None:
        """Device-resident decode: feed `first_token` at `start_pos`, sample on the device, yield ids.

        Returns None when this backend has no device-resident decode (the CPU reference: the
        caller samples on the CPU from `forward` logits); a backend that has one serves every
        sampling setting or raises. The consumer stops by closing the generator.
        """
        return None

    # ---- many sequences (engine/scheduler.py) ---------------------------------------------------

    def decode_slot_tokens(
        self,
        slot: int,
        first_token: int,
        start_pos: int,
        params: SamplingParams,
        seed: int,
        max_tokens: int,
        wrote: Callable[[int], None] | None = None,
    ) -> Generator[int, None, None] | None:
        """`decode_tokens` for one sequence of many, in `slot` with its own seed (the scheduler's
        lone decoding sequence: steps queued ahead on the device, no host round trip per token).
        `wrote(end)`: told before each submission how far it writes K/V. None: this backend has
        no device-resident decode (the scheduler steps the sequence through `decode_batch`)."""
        return None

    def forward_slot(
        self,
        slot: int,
        token_ids: Sequence[int],
        start_pos: int,
        *,
        all_logits: bool = False,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        """`forward` into `slot`'s cache (a prefill chunk of one sequence among many)."""
        if slot != 0:
            raise SlotsUnsupported(f"the {self.name} backend holds one sequence (slot 0), not slot {slot}")
        return self.forward(token_ids, start_pos, all_logits=all_logits, cancel=cancel)

    def forward_slot_images(
        self,
        slot: int,
        token_ids: Sequence[int],
        start_pos: int,
        images: Sequence[ImageSpan],
        *,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        """`forward_images` into `slot`'s cache (the last position's logits): a prefill chunk of
        one sequence among many whose prompt holds pictures (engine/scheduler.py)."""
        if slot != 0:
            raise NoImageBackend(self.name)
        return self.forward_images(token_ids, start_pos, images, cancel=cancel)

    def prefill_sampled(
        self,
        slot: int,
        token_ids: Sequence[int],
        start_pos: int,
        params: SamplingParams,
        seed: int,
        cancel: CancelCheck | None = None,
    ) -> int | None:
        """Prefill `token_ids` into `slot` at start_pos.. and draw the next id with the device's
        sampler (Vulkan). None: this backend samples on the host (use `forward_slot`'s logits)."""
        return None

    def decode_batch(self, steps: Sequence[SeqStep]) -> npt.NDArray[np.float32]:
        """One decode step for every sequence in `steps` (distinct slots), one pass over the
        weights: logits (B, vocab) in the order of `steps`."""
        if len(steps) != 1 or steps[0].slot != 0:
            raise SlotsUnsupported(f"the {self.name} backend decodes one sequence per step")
        return self.forward([steps[0].token], steps[0].pos)[None, :]

    def decode_batch_sampled(self, steps: Sequence[SeqStep]) -> list[int] | None:
        """`decode_batch` with each sequence's sampler on the device: the drawn ids in the order
        of `steps`. None: this backend samples on the host (use `decode_batch`)."""
        return None

    def decode_batch_tokens(
        self, steps: Sequence[SeqStep], max_steps: int, submitted: Callable[[int], None] | None = None
    ) -> Generator[list[int], None, None] | None:
        """Up to `max_steps` `decode_batch_sampled` steps of the same sequences, each step's ids
        fed to the next on the device (the scheduler's batch with nothing else to do): each
        step's ids in the order of `steps`, the same as step by step. `submitted(n)`: told before
        the n-th step is queued (each row then writes K/V up to its pos + n); closing the
        generator waits for what is queued. None: this backend has no such run."""
        return None

    def live_stats(self) -> LiveStats:
        """The gauges' record (cheap: called a few times a second while generating)."""
        return LiveStats(device=self.device_name)

    def weight_types(self) -> dict[str, int]:
        """How many weight tensors this backend holds in each type (GGML names), as loaded:
        the proof that a quantization choice was applied, for model info and the GUI."""
        return {}

    def stats(self) -> dict[str, Any]:
        """Backend-specific details (tuning choices, memory plan, timings) for benchmarks and
        diagnostics, JSON-serialisable; gauges read `live_stats()` instead."""
        return {}

    def close(self) -> None:  # noqa: B027 (optional: only backends holding device resources release them)
        pass
