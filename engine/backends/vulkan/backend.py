"""The Vulkan backend: Gemma 3 on any Vulkan 1.2+ GPU (lavapipe in CI). This file is the
facade: construction, forward, the decode loop and the cache of recorded command lists.

Loading: the memory plan is checked against the heap (plan.py), weights are uploaded once in
their file types and dequantized inside the kernels, the buffers allocated (resident.py), and
on GPUs the kernel paths chosen by timing (autotune.py). Every forward pass is a command list
recorded once per (token count, output kind) by the model's graph (gemma3_graph.py) and
replayed; the per-step values live in the step buffer (ops_common.STEP), the token ids in the
`tokens` buffer. The decode step samples on the GPU, writes the id into `tokens` and advances
the position itself, so a decode token costs the host one submit, one fence wait and one
4-byte read. Small models record several token steps per command buffer (`steps_per_submit`)
and keep three submissions queued, so the GPU never waits for the host. What the backend
measures about itself (busy gauge, host time, per-op profile, stats) is in profiling.py.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

from phoenix_chat.engine.backends.base import (
    Backend,
    CancelCheck,
    KvRow,
    LiveStats,
    SeqStep,
    SlotsUnsupported,
    check_cancel,
    image_chunks,
)
from phoenix_chat.engine.backends.vulkan import (
    autotune,
    batch_tuning,
    gemm_tuning,
    kv_handoff,
    ops_sample,
    profiling,
    resident,
    step_tiles,
    tuning_record,
)
from phoenix_chat.engine.backends.vulkan.autotune import Tuning
from phoenix_chat.engine.backends.vulkan.batch import BatchMode, SamplerSet, fastest_bucket, record_batch, sampler_set
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.gemma3_graph import ForwardMode, Gemma3Graph
from phoenix_chat.engine.backends.vulkan.image_prefill import ImageRows
from phoenix_chat.engine.backends.vulkan.matvec import MAX_COLUMNS
from phoenix_chat.engine.backends.vulkan.ops_common import STEP_BYTES, pack_step, write_step
from phoenix_chat.engine.backends.vulkan.options import VulkanOptions, chosen
from phoenix_chat.engine.backends.vulkan.plan import (
    LOGITS_CHUNK,
    PREFILL_CHUNK,
    SOFTWARE_PREFILL_CHUNK,
    batch_logits_stride,
    plan_memory,
    prefill_bucket,
)
from phoenix_chat.engine.backends.vulkan.recorder import CommandList
from phoenix_chat.engine.backends.vulkan.resident import allocate_buffers, upload_weights
from phoenix_chat.engine.errors import CancelledError, OutOfMemoryError
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.weights.base import WeightSource

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.siglip_graph import SiglipGraph
    from phoenix_chat.engine.models.gemma3 import F32
    from phoenix_chat.engine.vision.spans import ImageSpan
    from phoenix_chat.engine.vision_config import VisionConfig

log = logging.getLogger(__name__)

__all__ = ["VulkanBackend", "VulkanOptions"]  # VulkanOptions: the facade's constructor argument

CHAT_PRERECORD_SAMPLERS: tuple[ops_sample.SamplerKind, ...] = ("topk", "argmax")  # the default and greedy
CHAT_PRERECORD_TOKENS = 128  # a chat's first turns up to this long find their prefill recorded at load
MAX_RECORDINGS = 24  # a chat's prefill buckets (plan.prefill_bucket) with its sampler, and the full chunk
MAX_BATCH_RECORDINGS = 48  # batched steps: one per (bucket, samplers, penalty) seen lately, two where run pipelined
# the samplers a batched step is recorded with at load for every bucket: greedy requests, default
# (top-k) ones, and both in one batch (a server with greedy and sampled clients)
PRERECORD_SAMPLER_SETS: tuple[SamplerSet, ...] = (("argmax",), ("topk",), ("argmax", "topk"))
IN_FLIGHT = 3  # decode steps queued ahead: hides submit-to-start latency on the GPU
# a recorded batched step: (bucket, mode, the samplers its rows draw with, penalty, copy: 0, or 1
# for the second of the two identical recordings `decode_batch_tokens` keeps in flight)
BatchKey: TypeAlias = tuple[int, BatchMode, SamplerSet, bool, int]


class VulkanBackend(Backend):
    name = "vulkan"
    takes_images = True  # forward_images / forward_slot_images: soft tokens in place, pictures bidirectional

    def __init__(
        self,
        weights: WeightSource,
        context_length: int,
        options: VulkanOptions = VulkanOptions(),
        *,
        progress: Callable[[float, str], None] | None = None,
        device: Device | None = None,
        slots: int = 1,
        cancel: threading.Event | None = None,
    ):
        """device: an open Device to share (tests, several backends on one GPU); else one is
        opened from options and closed with the backend. slots: sequences whose K/V it holds
        at once (each a whole context; the memory plan counts them all). cancel: set to stop the
        load between uploaded tensors and between timing stages (CancelledError; what it had
        allocated is released), so a long first load on a GPU can be given up."""
        super().__init__(weights.config, context_length)
        self._load_cancel = cancel
        self.n_slots = slots
        self.options = options
        self.quant = options.quant
        self.weights_source = weights
        self._own_device = device is None
        self.dev = dev = device or Device.open(options.device_index, allow_software=options.allow_software)
        self.device_name = dev.name
        caps = dev.caps
        # int8 activations only where the dot instruction is real hardware (unless forced); and why
        self.int_dot, self.int_dot_why = caps.int8_activations(options.int_dot)
        # forwards of 2..MAX_COLUMNS tokens (speculative verify, short prompts) through matvecs
        # that read each weight once for all of them, or through the GEMMs, which dequantize a
        # whole weight tile for a handful of rows (H100, 27B shape: a 2-token GEMM pass cost 14
        # decode tokens, the matvecs 4; on the 270M shape the GEMMs win at some counts). None:
        # timed both ways at load on GPUs; CPU devices keep their register-tiled GEMM.
        self.tuning = Tuning(
            few_token_matvec=frozenset(range(2, MAX_COLUMNS + 1)) if options.few_token_matvec else frozenset(),
            few_token_int8=frozenset(range(2, autotune.FEW_TOKENS + 1)) if options.few_token_int8 else frozenset(),
        )
        self._recordings: OrderedDict[tuple[int, ForwardMode, ops_sample.SamplerKind, bool, bool], CommandList] = (
            OrderedDict()
        )
        self._image_rows: ImageRows | None = None  # a prompt's pictures, per prefill chunk (first use)
        self._vision_towers: list[SiglipGraph] = []
        self.vision_note = ""  # why pictures are not encoded on this device, when they are not
        self._decode_lists: dict[tuple[ops_sample.SamplerKind, bool, int], list[CommandList]] = {}
        self._batch_lists: OrderedDict[BatchKey, CommandList] = OrderedDict()
        self.sampled: dict[ops_sample.SamplerKind, int] = {"argmax": 0, "topk": 0, "full": 0}  # tokens per GPU sampler
        try:
            if options.few_token_int8 and not self.int_dot:
                raise ValueError(f"few_token_int8 needs int8 activations, which {dev.name} does not run (int_dot)")
            self.plan = plan_memory(weights, context_length, dev, options.quant, slots)
            with dev.owning(self):  # freed by close() on a shared device too
                self.device_weights = upload_weights(dev, weights, self.plan, self._cancellable(progress))
                weights.release_pages()  # the file's pages are a second copy of the weights in RAM now
                self.buffers = allocate_buffers(dev, self.config, self.plan, context_length, self.device_weights.layers)
        except BaseException:
            self.close()
            raise
        self.budget = self.plan.budget
        self.layers = self.device_weights.layers
        self.kv_ring_slots = min(self.plan.slots)  # the local layers' rings (global: the whole context)
        with dev.owning(self):
            self.graph = Gemma3Graph(
                self.config,
                dev,
                self.device_weights,
                self.buffers,
                context_length=context_length,
                n_splits=self.plan.n_splits,
                int_dot=self.int_dot,
                tuning=self.tuning,
            )
        # tokens per prefill submission; Stop is asked between them
        self.prefill_chunk = SOFTWARE_PREFILL_CHUNK if caps.is_software else PREFILL_CHUNK
        gpu = not caps.is_software
        self.prefill_buckets = chosen(options.prefill_buckets, "PHOENIX_VULKAN_PREFILL_BUCKETS", gpu)
        self.prefill_recordings = 0  # forwards recorded for prefill chunks since load (at load too)
        self.batch_recordings = 0  # batched steps recorded since load, prerecorded ones too (not clones, not timing)
        self.busy = profiling.BusyGauge(bool(caps.timestamp_bits))
        self.host_time = profiling.HostTime()
        # GPU µs of a whole batched step per bucket (fastest_bucket runs a batch in a bigger bucket
        # where that timed faster), or why none was timed
        self.batch_step_us: dict[int, float] = {}
        self.batch_step_ways: dict[int, dict[str, float]] = {}
        self.batch_step_tiles: dict[int, step_tiles.Trials | str] = {}  # each bucket's tile search
        self.batch_step_note = ""
        self.prerecord_seconds = 0.0
        self.chat_prerecord_seconds = 0.0
        try:  # a cancelled or failed load releases what it allocated
            self.tuning_source = self._tune_or_read(options, progress)  # timed, or read from a record
            self._check_load_cancel()
            if self.plan.batch_rows >= 2 and chosen(options.prerecord_batches, "PHOENIX_VULKAN_PRERECORD", gpu):
                self.prerecord_batch_steps()
            self._check_load_cancel()
            if chosen(options.prerecord_chat, "PHOENIX_VULKAN_PRERECORD", gpu and self.prefill_buckets):
                self.prerecord_chat()
        except BaseException:
            self.close()
            raise
        self._load_cancel = None  # loaded: nothing asks it again

    def _check_load_cancel(self) -> None:
        if self._load_cancel is not None and self._load_cancel.is_set():
            raise CancelledError("loading cancelled")

    def _cancellable(self, progress: Callable[[float, str], None] | None) -> Callable[[float, str], None] | None:
        """`progress` that first raises CancelledError where the load was cancelled (upload_weights
        calls it after each tensor)."""
        if self._load_cancel is None:
            return progress

        def report(fraction: float, message: str) -> None:
            self._check_load_cancel()
            if progress is not None:
                progress(fraction, message)

        return report

    def _tune(self, options: VulkanOptions) -> None:
        """The load-time timing: every choice autotune.py, gemm_tuning.py and batch_tuning.py make."""
        caps = self.dev.caps
        context_length = self.context_length
        autotune.tune(
            self.graph, time_matvecs=options.autotune if options.autotune is not None else not caps.is_software
        )
        self._check_load_cancel()
        if not caps.is_software:
            chunk = min(PREFILL_CHUNK, context_length - 1)
            self.tuning.gemm_kernels_note = gemm_tuning.choose_gemm_kernels(self.graph, chunk) or ""
            # the tile of shapes not timed (the LM head of an all-logits forward): the most
            # common per-shape choice, or, where no shape was timed, a whole forward's timing
            self.tuning.gemm_kernel = gemm_tuning.most_chosen(self.tuning) or autotune.choose_gemm_tile(self, chunk)
            few = min(autotune.FEW_TOKENS, context_length - 1)
            for count in autotune.few_tile_counts(few):
                self._check_load_cancel()
                gemm_tuning.choose_gemm_kernels(self.graph, count, few=True)
            self.tuning.gemm_kernel_few = autotune.choose_gemm_tile(self, few, few=True)
        self._check_load_cancel()
        if not caps.is_software and options.autotune is not False:
            autotune.choose_cols_specs(self.graph)  # before the path choice, which times with them
        self._check_load_cancel()
        if options.few_token_matvec is None and options.few_token_int8 is None and not caps.is_software:
            autotune.choose_few_token_path(self)
        self._check_load_cancel()
        self.batch_step_note = self._time_batch_steps(options)

    def _tune_or_read(self, options: VulkanOptions, progress: Callable[[float, str], None] | None) -> dict[str, Any]:
        """Run the load-time timing (`_tune`), or put the results of an earlier load's in place
        where a record of them matches this load (tuning_record.py); what happened, for stats()."""
        times = not self.dev.caps.is_software or options.autotune is True
        how = tuning_record.mode(options) if times else "off"
        fields = tuning_record.key_fields(self, options) if how != "off" else {}
        path = tuning_record.path_for(fields) if how != "off" else None
        info: dict[str, Any] = {"mode": how}
        if path is not None and how == "use" and path.exists():
            try:
                record = tuning_record.read(path, fields)
            except tuning_record.RecordError as exc:
                info["not_read"] = f"{path}: {exc}; timed again"
                log.warning("tuning record %s", info["not_read"])
            else:
                tuning_record.apply(self, record)
                tuning_record.used(path)
                if progress is not None:
                    progress(1.0, f"kernel choices timed on this GPU on {record.saved}")
                return {**info, "source": "record", "path": str(path), "saved": record.saved, "timed_s": record.seconds}
        if times and progress is not None:
            progress(1.0, "timing the kernels on this GPU" + (" (once: kept for later loads)" if path else ""))
        t0 = time.perf_counter()
        self.dev.timing_interrupt = self._check_load_cancel if self._load_cancel is not None else None
        try:
            self._tune(options)
        finally:
            self.dev.timing_interrupt = None  # a shared device: the next user's timing is not ours
        seconds = time.perf_counter() - t0
        info.update(source="timed" if times else "defaults", timed_s=round(seconds, 3))
        if path is not None:
            try:
                tuning_record.write(path, fields, tuning_record.of(self, seconds))
                info["path"] = str(path)
            except OSError as exc:
                info["not_written"] = f"{path}: {exc}"
                log.warning("tuning record not written: %s", info["not_written"])
        return info

    # ---- running ---------------------------------------------------------------------------

    def forward(
        self,
        token_ids: Sequence[int],
        start_pos: int,
        *,
        all_logits: bool = False,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        """A prompt runs in submissions of `prefill_chunk` tokens; `cancel` is asked before each
        (so Stop lands within one chunk's GPU time)."""
        return self.forward_slot(0, token_ids, start_pos, all_logits=all_logits, cancel=cancel)

    def forward_slot(
        self,
        slot: int,
        token_ids: Sequence[int],
        start_pos: int,
        *,
        all_logits: bool = False,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        """`forward` into `slot`'s cache: the same recordings, the slot in the step buffer."""
        outs = self._prefill([int(t) for t in token_ids], start_pos, all_logits, cancel=cancel, slot=slot)
        return np.concatenate(outs) if all_logits else outs[-1]

    def _prefill(
        self,
        ids: list[int],
        start_pos: int,
        all_logits: bool,
        sampling: tuple[SamplingParams, int] | None = None,
        cancel: CancelCheck | None = None,
        slot: int = 0,
    ) -> list[npt.NDArray[np.float32]]:
        """`ids` at positions start_pos.. of `slot` in chunks of recorded forwards: the logits of
        every chunk (all_logits) or of the last position; with `sampling` (params, seed) the last
        chunk ends in the decode step's sampler instead (the id lands in the slot's
        tokens[start_pos + n])."""
        where = self._checked_span(slot, len(ids), start_pos)
        base = where["tok_base"]
        n = len(ids)
        V = self.config.vocab_size
        chunk = LOGITS_CHUNK if all_logits else self.prefill_chunk
        if slot == 0:
            self.wrote_kv(start_pos + n)
        outs: list[npt.NDArray[np.float32]] = []
        for s in range(0, n, chunk):
            check_cancel(cancel)
            part = ids[s : s + chunk]
            m = len(part)
            last = s + chunk >= n
            self.buffers.tokens_view[base + start_pos + s : base + start_pos + s + m] = part
            mode: ForwardMode = "all" if all_logits else ("last" if last else "none")
            T = self._recorded_count(m, chunk)
            if last and sampling is not None:
                params, seed = sampling
                kind = ops_sample.sampler_for(params)
                mode = "sample"
                cl = self._recording(T, mode, kind, params.repetition_penalty != 1.0)
                write_step(self.buffers.step, pos=start_pos + s, n_tokens=m, **where, **_sampling_fields(params, seed))
                self.sampled[kind] += 1
            else:
                cl = self._recording(T, mode)
                write_step(self.buffers.step, pos=start_pos + s, n_tokens=m, **where)
            cl.submit(wait=True)
            self.busy.account(cl)
            if mode == "all":
                outs.append(self.dev.download(self.buffers.logits, np.float32, (m, V)))
            elif mode == "last":
                outs.append(self.dev.download(self.buffers.logits, np.float32, (V,)))
        return outs

    def _recorded_count(self, m: int, chunk: int) -> int:
        """Tokens of the recording a chunk of m runs in: its bucket, or m itself without buckets
        or where m outgrows the chunk (a chunk holding a picture longer than `chunk`)."""
        return prefill_bucket(m, max(chunk, m)) if self.prefill_buckets else m

    def _checked_span(self, slot: int, n: int, start_pos: int) -> dict[str, int]:
        """The slot's step fields, once `n` ids at `start_pos` fit it (one check for every prefill)."""
        self._check_slot(slot)
        if n == 0:
            raise ValueError("forward needs at least one token")
        if start_pos < 0 or start_pos + n > self.context_length:
            raise ValueError(f"positions {start_pos}..{start_pos + n - 1} exceed the context of {self.context_length}")
        return self._slot_fields(slot)

    def forward_images(
        self,
        token_ids: Sequence[int],
        start_pos: int,
        images: Sequence[ImageSpan],
        *,
        all_logits: bool = False,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        """`forward` for a prompt with pictures: chunks that never cut a picture (one grows
        past `prefill_chunk` only for a longer picture); a chunk holding one runs the recording
        with the image inputs (image_prefill.py), the others the usual one."""
        outs = self._prefill_images(0, [int(t) for t in token_ids], start_pos, images, all_logits, cancel)
        return np.concatenate(outs) if all_logits else outs[-1]

    def forward_slot_images(
        self,
        slot: int,
        token_ids: Sequence[int],
        start_pos: int,
        images: Sequence[ImageSpan],
        *,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        return self._prefill_images(slot, [int(t) for t in token_ids], start_pos, images, False, cancel)[-1]

    def _prefill_images(
        self,
        slot: int,
        ids: list[int],
        start_pos: int,
        images: Sequence[ImageSpan],
        all_logits: bool,
        cancel: CancelCheck | None,
    ) -> list[npt.NDArray[np.float32]]:
        where = self._checked_span(slot, len(ids), start_pos)
        base = where["tok_base"]
        n = len(ids)
        if self._image_rows is None:
            self._image_rows = ImageRows(self.dev, PREFILL_CHUNK, self.config.hidden_size)
        rows = self._image_rows
        V = self.config.vocab_size
        chunk = LOGITS_CHUNK if all_logits else self.prefill_chunk
        if slot == 0:
            self.wrote_kv(start_pos + n)
        outs: list[npt.NDArray[np.float32]] = []
        for i, j in image_chunks(n, start_pos, images, chunk):
            check_cancel(cancel)
            m = j - i
            if all_logits and m > LOGITS_CHUNK:
                raise ValueError(
                    f"every position's logits come back {LOGITS_CHUNK} at a time: a picture of {m} tokens "
                    "needs one forward (ask for the last position's logits)"
                )
            T = self._recorded_count(m, chunk)
            pictured = rows.write(start_pos + i, m, images, recorded=T)
            self.buffers.tokens_view[base + start_pos + i : base + start_pos + j] = ids[i:j]
            mode: ForwardMode = "all" if all_logits else ("last" if j == n else "none")
            cl = self._recording(T, mode, images=pictured)
            write_step(self.buffers.step, pos=start_pos + i, n_tokens=m, **where)
            cl.submit(wait=True)
            self.busy.account(cl)
            if mode == "all":
                outs.append(self.dev.download(self.buffers.logits, np.float32, (m, V)))
            elif mode == "last":
                outs.append(self.dev.download(self.buffers.logits, np.float32, (V,)))
        return outs

    def vision_tower(self, cfg: VisionConfig, tensor: Callable[[str], F32]) -> SiglipGraph | None:
        """The SigLIP tower + projector on this device (siglip_graph.py, F16 matrices), recorded
        once for the model's image size; closed with the backend. Its weights and activations
        are not in the memory plan: where the device has no room left for them, None (pictures
        are then encoded by the numpy reference), logged and kept in `vision_note` / stats()."""
        from phoenix_chat.engine.backends.vulkan.siglip_graph import SiglipGraph

        try:
            tower = SiglipGraph(self.dev, cfg, tensor)
        except OutOfMemoryError as exc:
            self.vision_note = f"the vision tower does not fit beside the text model on {self.dev.name} ({exc})"
            log.warning("%s: pictures are encoded on the CPU", self.vision_note)
            return None
        self._vision_towers.append(tower)
        return tower

    def generate_tokens(
        self,
        prompt_ids: Sequence[int],
        start_pos: int,
        params: SamplingParams,
        max_tokens: int,
        cancel: CancelCheck | None = None,
    ) -> Generator[int, None, None]:
        """Prefill and every token on the GPU: the prefill's last chunk ends in the decode step's
        sampler (same kernels, same Philox counter: the drawn token's position), so the first
        token is drawn on the device too and the decode loop starts from the state it leaves."""
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little")
        n = len(prompt_ids)
        if max_tokens <= 0 or start_pos + n >= self.context_length:
            raise ValueError(f"generate_tokens: no room for a token after {start_pos + n} positions")
        self._prefill([int(t) for t in prompt_ids], start_pos, False, (params, seed), cancel=cancel)
        first = int(self.buffers.tokens_view[start_pos + n])
        yield first
        if max_tokens > 1:
            yield from self._decode(first, start_pos + n, params, max_tokens - 1, seed)

    def decode_tokens(
        self, first_token: int, start_pos: int, params: SamplingParams, max_tokens: int
    ) -> Generator[int, None, None]:
        """Every sampling setting runs on the GPU (ops_sample.sampler_for): never None."""
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little")
        return self._decode(int(first_token), int(start_pos), params, int(max_tokens), seed)

    def decode_slot_tokens(
        self,
        slot: int,
        first_token: int,
        start_pos: int,
        params: SamplingParams,
        seed: int,
        max_tokens: int,
        wrote: Callable[[int], None] | None = None,
    ) -> Generator[int, None, None]:
        """`decode_tokens` in `slot` with the sequence's own seed: the single-sequence decode
        recordings, several submissions queued ahead of the ids read (`wrote(end)` is told how far
        each one writes K/V before it is submitted; closing the generator waits for them)."""
        self._check_slot(slot)
        return self._decode(int(first_token), int(start_pos), params, int(max_tokens), seed, slot, wrote)

    @property
    def steps_per_submit(self) -> int:
        """Token steps per submission: small models are launch-bound (a submission costs ~0.3 ms
        between steps on an H100), large ones stream so long that one step per submit is free."""
        w = self.budget["weights"]
        return 4 if w < (1 << 30) else (2 if w < (4 << 30) else 1)

    def _decode(
        self,
        first_token: int,
        start_pos: int,
        params: SamplingParams,
        max_tokens: int,
        seed: int,
        slot: int = 0,
        wrote: Callable[[int], None] | None = None,
    ) -> Generator[int, None, None]:
        limit = min(max_tokens, self.context_length - start_pos - 1)
        if limit <= 0:
            return
        kind = ops_sample.sampler_for(params)
        K = self.steps_per_submit
        if start_pos + -(-limit // K) * K >= self.context_length:
            K = 1  # the GPU must not step past the context
        lists = self._decode_lists_for(kind, params.repetition_penalty != 1.0, K)
        where = self._slot_fields(slot)
        base = where["tok_base"]
        tokens = self.buffers.tokens_view
        tokens[base + start_pos] = first_token
        write_step(self.buffers.step, pos=start_pos, n_tokens=1, **where, **_sampling_fields(params, seed))
        inflight: deque[tuple[CommandList, int]] = deque()  # (list, position of its first id)
        submitted = 0
        n_sub = -(-limit // K)
        done = 0
        try:
            for _ in range(n_sub):
                t0 = time.perf_counter()
                while len(inflight) < IN_FLIGHT and submitted < n_sub:
                    cl = lists[submitted % IN_FLIGHT]
                    end = start_pos + (submitted + 1) * K  # its K steps write K/V up to there
                    if slot == 0:
                        self.wrote_kv(end)
                    if wrote is not None:
                        wrote(end)
                    cl.submit(wait=False)
                    inflight.append((cl, start_pos + submitted * K + 1))
                    submitted += 1
                cl, pos = inflight.popleft()
                t1 = time.perf_counter()
                cl.wait()
                t2 = time.perf_counter()
                self.busy.account(cl)
                ids = [int(t) for t in tokens[base + pos : base + pos + K]]
                self.host_time.add((t1 - t0) + (time.perf_counter() - t2), K)
                for tid in ids:
                    if done == limit:
                        break
                    done += 1
                    self.sampled[kind] += 1
                    yield tid
        finally:
            for cl, _ in inflight:
                cl.wait()

    # ---- many sequences: KV slots and the batched decode step (batch.py) ------------------------

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.n_slots:
            raise SlotsUnsupported(f"slot {slot} is not one of this backend's {self.n_slots} KV slots")

    def _slot_fields(self, slot: int) -> dict[str, int]:
        """The step buffer's fields that place a sequence: its caches and its ids in `tokens`."""
        return {"slot": slot, "tok_base": slot * self.buffers.tok_stride}

    def prefill_sampled(
        self,
        slot: int,
        token_ids: Sequence[int],
        start_pos: int,
        params: SamplingParams,
        seed: int,
        cancel: CancelCheck | None = None,
    ) -> int:
        """The prefill's last chunk ends in the device sampler (as `generate_tokens` for slot 0)."""
        n = len(token_ids)
        if start_pos + n >= self.context_length:
            raise ValueError(f"prefill_sampled: no room for a token after {start_pos + n} positions")
        self._prefill([int(t) for t in token_ids], start_pos, False, (params, seed), cancel=cancel, slot=slot)
        return int(self.buffers.tokens_view[self._slot_fields(slot)["tok_base"] + start_pos + n])

    def decode_batch(self, steps: Sequence[SeqStep]) -> npt.NDArray[np.float32]:
        """One step of every sequence in `steps`: logits (B, vocab). One sequence runs the
        single-sequence decode recording; more run a recorded batched step (batch.py)."""
        self._check_steps(steps, room=0)
        if len(steps) == 1:
            st = steps[0]
            return self.forward_slot(st.slot, [st.token], st.pos)[None, :]
        B = self._write_rows(steps)
        cl = self._batch_recording(B, "logits", (), False)
        self._run_batch(cl, steps)
        V = self.config.vocab_size
        logits = self.dev.download(self.buffers.logits, np.float32, (B, batch_logits_stride(V)))
        return np.ascontiguousarray(logits[: len(steps), :V])  # row r is steps[r]

    @property
    def max_batch_rows(self) -> int:
        """min(slots, plan.MAX_BATCH): the recorded batched steps hold at most 32 rows."""
        return max(1, self.plan.batch_rows)

    def decode_batch_sampled(self, steps: Sequence[SeqStep]) -> list[int]:
        """`decode_batch` with every row's sampler on the GPU (its params, its seed, the Philox
        counter of the drawn token's position): the ids, in the order of `steps`."""
        self._check_steps(steps, room=1)
        if len(steps) == 1:
            st = steps[0]
            return [self.prefill_sampled(st.slot, [st.token], st.pos, st.params, st.seed)]
        B, samplers, penalty = self.write_sampled_rows(steps)
        cl = self._batch_recording(B, "sample", samplers, penalty)
        self._run_batch(cl, steps)
        for st in steps:
            self.sampled[ops_sample.sampler_for(st.params)] += 1
        tokens = self.buffers.tokens_view
        return [int(tokens[self._slot_fields(st.slot)["tok_base"] + st.pos + 1]) for st in steps]

    def decode_batch_tokens(
        self, steps: Sequence[SeqStep], max_steps: int, submitted: Callable[[int], None] | None = None
    ) -> Generator[list[int], None, None]:
        """Up to `max_steps` sampled batched steps of the same 2+ sequences, pipelined: each
        step's sampler writes its ids where the next step's embedding reads them and advances its
        rows' Steps (shaders/sample.comp), so the host writes the rows once and then only
        replays — two identical recordings, one running while the host reads the other's ids,
        so the GPU does not wait for the host between steps (a 4B 32-row step on an H100 ran
        ~0.3 ms longer on the host's clock than on the GPU's when each step waited).
        Yields each step's ids in the order of `steps` (the same as `decode_batch_sampled`
        step by step: a draw depends on the row's seed and position only). `submitted(n)` is
        told before the n-th step is submitted (each row then writes K/V up to its pos + n).
        Closing the generator early waits for the step in flight: its K/V writes past the last
        id read are at positions the caller was told of, its draw is dropped."""
        self._check_steps(steps, room=max_steps)
        if len(steps) < 2:
            raise ValueError("decode_batch_tokens runs 2+ sequences (one: decode_slot_tokens)")
        return self._batch_run(list(steps), max_steps, submitted)

    def _batch_run(
        self, steps: list[SeqStep], max_steps: int, submitted: Callable[[int], None] | None
    ) -> Generator[list[int], None, None]:
        if max_steps < 1:
            return
        B, samplers, penalty = self.write_sampled_rows(steps)
        lists = [self._batch_recording(B, "sample", samplers, penalty, copy) for copy in (0, 1)]
        kinds = [ops_sample.sampler_for(st.params) for st in steps]
        where = [self._slot_fields(st.slot)["tok_base"] + st.pos + 1 for st in steps]
        slot0 = next((st.pos for st in steps if st.slot == 0), None)
        tokens = self.buffers.tokens_view
        inflight: deque[CommandList] = deque()
        sent = 0
        try:
            for done in range(max_steps):
                while len(inflight) < len(lists) and sent < max_steps:
                    sent += 1
                    if slot0 is not None:
                        self.wrote_kv(slot0 + sent)
                    if submitted is not None:
                        submitted(sent)
                    cl = lists[sent % len(lists)]
                    cl.submit(wait=False)
                    inflight.append(cl)
                cl = inflight.popleft()
                cl.wait()
                self.busy.account(cl)
                for kind in kinds:
                    self.sampled[kind] += 1
                yield [int(tokens[w + done]) for w in where]
        finally:
            for cl in inflight:
                cl.wait()

    def profile_batch(self, steps: Sequence[SeqStep]) -> dict[str, float]:
        """GPU time by op kind (us) of one sampled batched step of `steps` (2+ sequences), from a
        recording with a timestamp at every barrier, run three times (the last one counts): for
        bench.batched_decode --profile. Writes the same KV positions and draws as the step would."""
        self._check_steps(steps, room=1)
        if len(steps) < 2:
            raise ValueError("profile_batch profiles a batched step of 2+ sequences (profile_step: one)")
        B, samplers, penalty = self.write_sampled_rows(steps)
        rows = self.buffers.rows
        assert rows is not None
        cl = record_batch(self.graph, rows, B, "sample", samplers, penalty, profile=True)
        for _ in range(3):  # the first runs warm clocks and caches
            cl.submit(wait=True)
        return profiling.per_op(cl)

    def write_sampled_rows(self, steps: Sequence[SeqStep]) -> tuple[int, SamplerSet, bool]:
        """Write a sampled step's rows: its bucket, the samplers its rows draw with and whether
        any row applies a repetition penalty. The recording depends on those only, not on how
        many rows are active or how they split between the samplers (each row draws in the one
        its Step selects): recorded per split, a batch whose greedy and sampled rows came and
        went recorded inside the scheduler's step again and again (~0.1-0.3 s each on an H100)."""
        B = self._write_rows(steps)
        penalty = any(st.params.repetition_penalty != 1.0 for st in steps)
        return B, sampler_set([ops_sample.sampler_for(st.params) for st in steps]), penalty

    def _time_batch_steps(self, options: VulkanOptions) -> str:
        """Each bucket's batched step timed (both ways where it runs both: batch_tuning.py) into
        batch_step_us and batch_step_ways; returns why nothing was timed, or ""."""
        if self.plan.batch_rows < 2:
            return "one KV slot: no batched step"
        if os.environ.get("PHOENIX_VULKAN_BATCH_PROMOTE") == "0":
            return "PHOENIX_VULKAN_BATCH_PROMOTE=0: each batch runs in its own bucket, on the forward timing's path"
        if self.dev.caps.is_software or options.autotune is False:
            return "not timed on CPU devices or with autotune off: each batch runs in its own bucket"
        if not self.dev.caps.timestamp_bits:
            return f"{self.dev.name} has no timestamps"
        # a path forced by the options (tests, benches) is timed as it is, never replaced
        forced = options.few_token_matvec is not None or options.few_token_int8 is not None
        self.time_batch_steps(both_ways=not forced)
        return ""

    def prerecord_batch_steps(self) -> None:
        """Record now every bucket a batch can run in (`batch_bucket`), for the sampler sets of
        PRERECORD_SAMPLER_SETS (greedy and top-k, SamplingParams' default), both copies a pipelined run
        keeps in flight: recorded on first use, they fell inside users' requests
        (~0.15 s a recording on an H100's host, plus the samplers' pipelines compiled: p99 gaps of
        88-331 ms between tokens through the scheduler at 2-32 streams). A batch with rows on the
        full sampler or a repetition penalty still records on its first step."""
        t0 = time.perf_counter()
        for B in sorted(set(self.batch_bucket().values())):
            for samplers in PRERECORD_SAMPLER_SETS:
                for copy in (0, 1):
                    self._batch_recording(B, "sample", samplers, False, copy)
        self.prerecord_seconds += time.perf_counter() - t0

    def prerecord_chat(self) -> None:
        """Record now what a chat's first turn would: the prefill's last chunk in each bucket up to
        CHAT_PRERECORD_TOKENS, ending in the top-k sampler (SamplingParams' default, the app's) or
        the greedy one, without a penalty, and those samplers' decode steps. Recorded on first use
        they made the first turn's TTFT 5-10x a later one's (4B on an H100: 102-248 ms against
        ~20). Penalized or full-vocabulary sampling, and longer turns, still record on first use."""
        t0 = time.perf_counter()
        chunk = self.prefill_chunk
        top = min(CHAT_PRERECORD_TOKENS, chunk, self.context_length - 1)
        for kind in CHAT_PRERECORD_SAMPLERS:
            for T in sorted({prefill_bucket(n, chunk) for n in range(2, top + 1)}):
                self._recording(T, "sample", kind, False)
            self._decode_lists_for(kind, False, self.steps_per_submit)
        self.chat_prerecord_seconds = time.perf_counter() - t0

    def batch_bucket(self) -> dict[int, int]:
        """The recorded bucket each batch size (2..batch_rows sequences) runs in."""
        rows = self.plan.batch_rows
        return {n: fastest_bucket(n, rows, self.batch_step_us) for n in range(2, rows + 1)}

    def time_batch_steps(self, both_ways: bool = True, tiles: bool | None = None) -> None:
        """batch_tuning.time_batch_steps: every bucket's step timed, with both_ways its faster
        way kept (GPU µs by bucket and way in batch_step_ways, the kept way's in batch_step_us),
        and with `tiles` (None: unless PHOENIX_VULKAN_STEP_TILES=0) a GEMM step's tiles searched
        in the whole step (step_tiles.py; what was tried in batch_step_tiles). Every recording
        made before is dropped first: the ways and tiles this may change are also those of a
        forward of as many tokens."""
        search = chosen(tiles, "PHOENIX_VULKAN_STEP_TILES", True)
        self.drop_recordings()
        ways, self.batch_step_tiles = batch_tuning.time_batch_steps(self, both_ways=both_ways, tiles=search)
        self.keep_batch_step_ways(ways)

    def keep_batch_step_ways(self, ways: dict[int, dict[str, float]]) -> None:
        """Each bucket's timed ways (GPU µs), and the way its tuning kept as `batch_step_us` (what
        batch_bucket promotes by): after the timing, or read from a record of it."""
        self.batch_step_ways = ways
        self.batch_step_us = {B: w[batch_tuning.way_of(self.tuning, B)] for B, w in ways.items()}

    def adopt_batch_recording(self, B: int, samplers: SamplerSet, penalty: bool, cl: CommandList) -> None:
        """Cache `cl` as the sampled step of bucket B (batch_tuning recorded and timed it)."""
        self._keep_batch_list((B, "sample", samplers, penalty, 0), cl)

    def drop_batch_recordings(self) -> None:
        """Forget the recorded batched steps (each is recorded again on its next use), so that a
        record-time setting such as PHOENIX_VULKAN_BATCH_ATTN_SPLITS can be compared on one load."""
        while self._batch_lists:
            _, cl = self._batch_lists.popitem()
            cl.destroy()

    def _check_steps(self, steps: Sequence[SeqStep], room: int) -> None:
        """Distinct slots of this backend, positions inside the context (room: positions after the
        fed one that must exist too: the drawn token's)."""
        if not steps:
            raise ValueError("a decode step needs at least one sequence")
        if len({st.slot for st in steps}) != len(steps):
            raise ValueError(f"a decode step advances distinct slots, not {[st.slot for st in steps]}")
        if len(steps) > 1 and self.buffers.rows is None:
            raise SlotsUnsupported("this backend was built with one KV slot: no batched decode step")
        for st in steps:
            self._check_slot(st.slot)
            if not 0 <= st.pos < self.context_length - room:
                raise ValueError(f"slot {st.slot}: position {st.pos} is past the context of {self.context_length}")

    def _write_rows(self, steps: Sequence[SeqStep]) -> int:
        """Row r's Step for steps[r] (and its token), then the bucket's pad rows (n_tokens 0, which
        every kernel of the step skips); returns the bucket, the rows written."""
        rows = self.buffers.rows
        assert rows is not None
        B = fastest_bucket(len(steps), self.plan.batch_rows, self.batch_step_us)
        pad = pack_step(n_tokens=0, tok_base=self.n_slots * self.buffers.tok_stride)  # the scratch row of tokens
        mapped = rows.steps.mapped
        assert mapped is not None
        for r in range(B):
            if r >= len(steps):
                data = pad
            else:
                st = steps[r]
                where = self._slot_fields(st.slot)
                self.buffers.tokens_view[where["tok_base"] + st.pos] = st.token
                data = pack_step(pos=st.pos, n_tokens=1, **where, **_sampling_fields(st.params, st.seed))
            mapped[r * rows.step_stride : r * rows.step_stride + STEP_BYTES] = np.frombuffer(data, np.uint8)
        return B

    def _run_batch(self, cl: CommandList, steps: Sequence[SeqStep]) -> None:
        for st in steps:
            if st.slot == 0:
                self.wrote_kv(st.pos + 1)
        cl.submit(wait=True)
        self.busy.account(cl)

    def _batch_recording(
        self, B: int, mode: BatchMode, samplers: SamplerSet, penalty: bool, copy: int = 0
    ) -> CommandList:
        rows = self.buffers.rows
        assert rows is not None
        key: BatchKey = (B, mode, samplers, penalty, copy)
        cl = self._batch_lists.get(key)
        if cl is None:
            # a pipelined run's other copy: the same commands, cloned (no graph walk)
            twin = self._batch_lists.get((B, mode, samplers, penalty, 1 - copy))
            if twin is not None:
                cl = twin.clone()
            else:
                self.batch_recordings += 1
                cl = record_batch(self.graph, rows, B, mode, samplers, penalty)
            self._keep_batch_list(key, cl)
        else:
            self._batch_lists.move_to_end(key)
        return cl

    def _keep_batch_list(self, key: BatchKey, cl: CommandList) -> None:
        """Cache `cl` under `key` (replacing any list there), the least recently used past
        MAX_BATCH_RECORDINGS destroyed."""
        old = self._batch_lists.pop(key, None)
        if old is not None:
            old.destroy()
        self._batch_lists[key] = cl
        while len(self._batch_lists) > MAX_BATCH_RECORDINGS:
            _, old = self._batch_lists.popitem(last=False)
            old.destroy()

    # ---- recorded command lists ---------------------------------------------------------------

    def _recording(
        self,
        T: int,
        mode: ForwardMode,
        sampler: ops_sample.SamplerKind = "argmax",
        penalty: bool = False,
        images: bool = False,
    ) -> CommandList:
        """images: the chunk holds a picture (the recording reads `_image_rows`)."""
        key = (T, mode, sampler, penalty, images)
        cl = self._recordings.get(key)
        if cl is None:
            self.prefill_recordings += 1
            cl = self._recordings[key] = self.graph.record(
                T,
                mode,
                sampler == "argmax",
                penalty,
                full_sampler=sampler == "full",
                images=self._image_rows if images else None,
            )
            while len(self._recordings) > MAX_RECORDINGS:
                _, old = self._recordings.popitem(last=False)
                old.destroy()
        else:
            self._recordings.move_to_end(key)
        return cl

    def _decode_lists_for(self, sampler: ops_sample.SamplerKind, penalty: bool, steps: int) -> list[CommandList]:
        key = (sampler, penalty, steps)
        if key not in self._decode_lists:
            # identical recordings: the GPU runs the queued ones while the host reads ids
            first = self.graph.record(
                1, "sample", sampler == "argmax", penalty, steps=steps, full_sampler=sampler == "full"
            )
            self._decode_lists[key] = [first, *(first.clone() for _ in range(IN_FLIGHT - 1))]
        return self._decode_lists[key]

    def drop_recordings(self) -> None:
        """Forget every recorded command list (after `tuning` changed: the next forward records anew)."""
        for cl in self._recordings.values():
            cl.destroy()
        for lists in self._decode_lists.values():
            for cl in lists:
                cl.destroy()
        for cl in self._batch_lists.values():
            cl.destroy()
        self._recordings = OrderedDict()
        self._decode_lists = {}
        self._batch_lists = OrderedDict()

    # ---- hand-off and reporting -----------------------------------------------------------------

    def export_kv(self, lo: int, hi: int) -> list[KvRow]:
        """K/V rows of positions [lo, hi) as f32 (hand-off to another device; kv_handoff.py)."""
        return kv_handoff.export_kv(self, lo, hi)

    def import_kv(self, rows: list[KvRow]) -> int:
        """Write K/V rows computed elsewhere (e.g. an NPU prefill) into this cache."""
        return kv_handoff.import_kv(self, rows)

    def busy_fraction(self, window_s: float = 1.0) -> float | None:
        """Share of the last `window_s` seconds the GPU spent on this engine's work (None: the
        device has no timestamps; profiling.BusyGauge)."""
        return self.busy.fraction(window_s)

    def weight_types(self) -> dict[str, int]:
        """The types the matrices were uploaded in (after any re-quantization); norms are f32."""
        w = self.device_weights
        types = [w.embed_type] + ([] if self.plan.tied else [w.lm_head.qtype])
        for layer in w.layers:
            types += [m.qtype for m in (*layer.qkv, layer.o, layer.gate, layer.up, layer.down)]
        counts: dict[str, int] = {}
        for t in types:
            counts[t.name] = counts.get(t.name, 0) + 1
        counts["F32"] = counts.get("F32", 0) + 1 + len(w.layers) * len(resident.NORMS)
        return counts

    def live_stats(self) -> LiveStats:
        return LiveStats(device=self.dev.name, gpu_busy=self.busy.fraction(), kv_cache_bytes=self.budget["kv_cache"])

    def stats(self) -> dict[str, Any]:
        """Details for the bench and diagnostics (profiling.stats): memory, the load-time
        choices (`tuning`) and their timings, python_ms_per_token, gpu_busy_fraction, and how
        many tokens each GPU sampler drew (`gpu_sampled`: argmax, topk, full), and the KV slots."""
        out = {**profiling.stats(self), "gpu_sampled": dict(self.sampled), "kv_slots": self.n_slots}
        # prefill chunks run in their bucket's recording (plan.prefill_bucket) or their own length's
        out["prefill_buckets"] = self.prefill_buckets
        out["tuning_record"] = dict(self.tuning_source)  # timed at this load or read (tuning_record.py)
        out["prefill_recordings"] = self.prefill_recordings
        out["batch_recordings"] = self.batch_recordings
        out["chat_prerecord_s"] = round(self.chat_prerecord_seconds, 3)  # 0.0: nothing recorded at load
        if self.plan.batch_rows >= 2:  # each bucket's timed step, and the bucket each batch size runs in
            out["batch_step_us"] = dict(self.batch_step_us)
            out["batch_step_ways"] = dict(self.batch_step_ways)
            out["batch_step_note"] = self.batch_step_note
            out["batch_step_tiles"] = {
                B: t if isinstance(t, str) else t.stats() for B, t in self.batch_step_tiles.items()
            }
            out["batch_bucket"] = self.batch_bucket()
            out["batch_prerecord_s"] = round(self.prerecord_seconds, 3)  # 0.0: nothing recorded at load
        if self.vision_note:
            out["vision_tower"] = {"on_device": False, "why": self.vision_note}
        if self._vision_towers:
            t = self._vision_towers[0]
            out["vision_tower"] = {
                "on_device": True,
                "matrix_type": t.matrix_type,
                "gemm": t.gemm_kernel,
                "weight_bytes": t.weight_bytes(),
                "scratch_bytes": t.scratch_bytes(),
            }
        return out

    def close(self) -> None:
        dev = getattr(self, "dev", None)
        if dev is None:
            return
        self.drop_recordings()
        for tower in self._vision_towers:
            tower.close()
        self._vision_towers = []
        if self._image_rows is not None:
            self._image_rows.destroy()
            self._image_rows = None
        if self._own_device:
            dev.close()
        else:  # a shared device: give back what this backend made on it
            dev.free_owned(self)
        del self.dev  # closed: a second close() finds none


def _sampling_fields(params: SamplingParams, seed: int) -> dict[str, Any]:
    """The step buffer's sampling values for `params` (write_step's keywords)."""
    return dict(
        seed=seed,
        top_k=max(0, params.top_k),
        temperature=params.temperature,
        top_p=params.top_p,
        min_p=params.min_p,
        rep_penalty=params.repetition_penalty,
        rep_window=params.repetition_window,
    )
