"""`load()`: from a path (or the embedded model) to a ready `LoadedModel` on a chosen backend."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from phoenix_chat.engine.config import ModelConfig
from phoenix_chat.engine.errors import DeviceUnavailableError, OutOfMemoryError, PhoenixError
from phoenix_chat.engine.fit import fit_advice
from phoenix_chat.engine.quantization import WeightQuant, quant_name
from phoenix_chat.engine.weights import embedded_model_path, open_weights
from phoenix_chat.engine.weights.base import WeightSource
from phoenix_chat.engine.weights.mmproj import AUTO

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.base import Backend
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.chat import ChatFormat
    from phoenix_chat.engine.tokenizer import Tokenizer
    from phoenix_chat.engine.vision.encoder import ImageEncoder

log = logging.getLogger("phoenix.engine")

AUTO_CONTEXT_FLOOR = 2048  # "auto" context: halved from the model's limit until it fits, not below this
BACKENDS = ("auto", "cpu", "vulkan", "npu-hybrid")


class ModelDescription(TypedDict):
    """`LoadedModel.describe()`: for `phoenix-chat info`, logs and the GUI."""

    path: str
    name: str
    architecture: str
    parameters: int
    layers: int
    context_length: int
    max_context_length: int
    tensor_types: dict[str, int]  # as stored in the file
    quant: str  # the re-quantization applied at load (a WeightQuant value), or "file"
    weight_types: dict[str, int]  # as the backend holds them after loading
    file_size: int
    backend: str
    device: str
    backend_note: str
    is_instruction_tuned: bool
    load_s: float
    fit: str
    mmproj: str  # the vision tower's own GGUF paired with a text GGUF ("" when none)
    mmproj_note: str  # how it was paired (--mmproj, beside the model), or why one beside it was not


@dataclass
class LoadedModel:
    path: Path
    weights: WeightSource
    config: ModelConfig
    tokenizer: Tokenizer
    chat: ChatFormat
    backend: Backend
    is_instruction_tuned: bool
    backend_note: str = ""  # why `auto` picked what it picked (shown in logs and the UI)
    load_seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    fit: str = ""  # engine/fit.py's line: memory needed at this context vs the machine's
    vision: ImageEncoder | None = None  # the picture encoder (CPU, f32); None: a text-only model

    def describe(self) -> ModelDescription:
        """What was loaded, where, and how (plain values: the GUI's "About this model")."""
        cfg = self.config
        return {
            "path": str(self.path),
            "name": cfg.name,
            "architecture": cfg.architecture,
            "parameters": cfg.parameter_count(),
            "layers": cfg.num_layers,
            "context_length": self.backend.context_length,
            "max_context_length": cfg.context_length,
            "tensor_types": self.weights.tensor_types(),
            "quant": quant_name(self.backend.quant),
            "weight_types": self.backend.weight_types(),
            "file_size": self.weights.file_size,
            "backend": self.backend.name,
            "device": self.backend.device_name,
            "backend_note": self.backend_note,
            "is_instruction_tuned": self.is_instruction_tuned,
            "load_s": self.load_seconds,
            "fit": self.fit,
            "mmproj": str(self.weights.mmproj.path) if self.weights.mmproj is not None else "",
            "mmproj_note": self.weights.mmproj_note,
        }

    def close(self) -> None:
        self.backend.close()


def check_loadable(
    path: str | os.PathLike[str] | None = None,
    backend: str = "auto",
    quant: WeightQuant | str | None = None,
    mmproj: str | os.PathLike[str] | None = None,
) -> None:
    """Raise the PhoenixError `load` would raise for a bad choice or a missing, corrupt or
    unsupported file (the mmproj too), in a moment and without loading weights: the worker calls
    it before it drops the model it has, so a file that cannot be opened never costs the working model."""
    _check_choices(backend, quant)
    open_weights(Path(path).expanduser() if path else embedded_model_path(), mmproj=mmproj or AUTO).close()


def _check_choices(backend: str, quant: WeightQuant | str | None) -> WeightQuant | None:
    if backend not in BACKENDS:
        raise PhoenixError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
    return WeightQuant.parse(quant)  # a bad spelling fails here, the same on every backend


def load(
    path: str | os.PathLike[str] | None = None,
    backend: str = "auto",
    context_length: int | None = None,
    quant: WeightQuant | str | None = None,
    device: int | None = None,
    progress: Callable[[float, str], None] | None = None,
    cancel: threading.Event | None = None,
    slots: int = 1,
    mmproj: str | os.PathLike[str] | None = None,
) -> LoadedModel:
    """Open a GGUF file or Hugging Face folder (default: the embedded 270M) on a backend.

    backend: "auto" (a hardware Vulkan GPU if there is one, else the CPU — the choice and its
    reason are logged and kept in `backend_note`), "cpu", "vulkan" (any Vulkan device, software
    ones such as lavapipe included), "npu-hybrid" (prompt prefill on the NPU).
    quant: re-quantize every matrix on load (`WeightQuant`, or its value in any case; None or
    "file": the file's own types); every backend applies it (the CPU one to the values it
    computes with in f32), and `describe()` reports what was applied.
    context_length None ("auto"): the largest the model and the backend's memory budget allow.
    progress(fraction, message) is called during long work; cancel is an Event-like object.
    slots: sequences the backend holds K/V for at once (engine/scheduler.py batches their decode
    steps); each takes a whole context of KV memory, refused with OutOfMemoryError when they do
    not fit. npu-hybrid holds one.
    mmproj: a text GGUF's vision tower in its own GGUF (llama.cpp's split form); None: the one
    `mmproj*.gguf` beside the model if there is exactly one (`describe()` says which, or why none).
    """
    from phoenix_chat.engine.chat import ChatFormat

    wanted = _check_choices(backend, quant)
    if slots < 1:
        raise PhoenixError(f"slots must be at least 1, not {slots}")
    if context_length is not None and context_length < 1:
        raise PhoenixError(f"the context length must be at least 1 token, not {context_length} (None: auto)")
    if slots > 1 and backend == "npu-hybrid":
        raise PhoenixError("the npu-hybrid backend holds one sequence: use --backend cpu or vulkan for several slots")
    started = time.perf_counter()
    timings: dict[str, float] = {}
    report = progress or (lambda fraction, message: None)
    report(0.0, "opening model file")
    path = Path(path).expanduser() if path else embedded_model_path()
    weights = open_weights(path, mmproj=mmproj or AUTO)
    timings["open_s"] = time.perf_counter() - started
    if weights.mmproj_note:
        log.info("vision tower %s: %s", weights.mmproj.path if weights.mmproj else "-", weights.mmproj_note)
    cfg = weights.config
    ctx = min(context_length, cfg.context_length) if context_length else None
    # what it needs vs what the machine has, before any allocation ("auto": at the smallest it may pick)
    fit = fit_advice(weights, ctx if ctx is not None else min(AUTO_CONTEXT_FLOOR, cfg.context_length))
    log.info("%s", fit.line())
    report(0.02, fit.line())
    t = time.perf_counter()
    tokenizer = weights.tokenizer()
    timings["tokenizer_s"] = time.perf_counter() - t
    chat = ChatFormat(
        weights.chat_template or tokenizer.chat_template,
        bos_token=tokenizer.bos_token or "",
        eos_token=tokenizer.eos_token or "",
        tokenizer=tokenizer,
    )

    t = time.perf_counter()
    report(0.1, "loading weights")
    scaled = (lambda fraction, message: report(0.1 + 0.9 * fraction, message)) if progress else None
    try:
        engine_backend, note = _make_backend(backend, weights, ctx, wanted, device, scaled, cancel, slots)
    except OutOfMemoryError as exc:
        if fit.suggestion is None:
            raise
        raise OutOfMemoryError(f"{exc}; at {fit.suggestion.name} weights it would fit the machine") from None
    timings["backend_s"] = time.perf_counter() - t
    vision = None
    if weights.vision_config is not None:
        from phoenix_chat.engine.vision.encoder import ImageEncoder

        t = time.perf_counter()
        report(0.99, "loading the vision tower")
        cfg_v = weights.vision_config
        # on the backend's device where it has the tower there (vulkan), else the numpy reference
        try:
            vision = ImageEncoder(weights, cfg_v, tower=engine_backend.vision_tower(cfg_v, weights.vision_tensor))
        except BaseException:
            engine_backend.close()  # the text model's device memory too, not only the tower's
            raise
        timings["vision_s"] = time.perf_counter() - t
    report(1.0, "ready")
    log.info("loaded %s on %s (%s)", path, engine_backend.device_name, note or backend)
    return LoadedModel(
        path=path,
        weights=weights,
        config=cfg,
        tokenizer=tokenizer,
        chat=chat,
        backend=engine_backend,
        is_instruction_tuned=_looks_instruction_tuned(weights, path),
        backend_note=note,
        load_seconds=time.perf_counter() - started,
        timings=timings,
        fit=fit.line(),
        vision=vision,
    )


B = TypeVar("B")


def _sized(make: Callable[[int], B], ctx: int | None, model_max: int) -> B:
    """`make(ctx)`; with ctx None ("auto") the largest context whose memory plan fits: the
    model's own limit, halved while the backend's budget check raises OutOfMemoryError."""
    if ctx is not None:
        return make(ctx)
    n = model_max
    while True:
        try:
            return make(n)
        except OutOfMemoryError:
            if n <= AUTO_CONTEXT_FLOOR:
                raise
            n = max(AUTO_CONTEXT_FLOOR, n // 2)


def _make_backend(
    kind: str,
    weights: WeightSource,
    ctx: int | None,
    quant: WeightQuant | None,
    device: int | None,
    progress: Callable[[float, str], None] | None,
    cancel: threading.Event | None,
    slots: int = 1,
) -> tuple[Backend, str]:
    model_max = weights.config.context_length
    # `slots=` only when asked for: a Vulkan backend without slot support keeps working for one
    many: dict[str, Any] = {"slots": slots} if slots > 1 else {}
    if kind == "auto":
        try:
            from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

            options = VulkanOptions(device_index=device, quant=quant)
            backend = _sized(
                lambda n: VulkanBackend(weights, n, options, progress=progress, cancel=cancel, **many), ctx, model_max
            )
            return backend, "auto: hardware Vulkan GPU"
        except DeviceUnavailableError as exc:
            note = f"auto: CPU backend, because {exc}"
            log.warning(note)
        except ImportError as exc:
            note = f"auto: CPU backend, because the Vulkan backend is not built ({exc})"
            log.warning(note)
        return _sized(lambda n: _cpu(weights, n, quant, progress, cancel, slots), ctx, model_max), note
    if kind == "cpu":
        return _sized(lambda n: _cpu(weights, n, quant, progress, cancel, slots), ctx, model_max), ""
    if kind == "vulkan":
        from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

        options = VulkanOptions(device_index=device, allow_software=True, quant=quant)
        return _sized(
            lambda n: VulkanBackend(weights, n, options, progress=progress, cancel=cancel, **many), ctx, model_max
        ), ""
    return _sized(lambda n: _npu_hybrid(weights, n, quant, device, progress, cancel), ctx, model_max)


def _npu_hybrid(
    weights: WeightSource,
    ctx: int,
    quant: WeightQuant | None,
    device: int | None,
    progress: Callable[[float, str], None] | None,
    cancel: threading.Event | None,
) -> tuple[Backend, str]:
    """NPU prefill; decode on a hardware Vulkan GPU when there is one, else on the CPU (said so)."""
    from phoenix_chat.engine.backends.npu_hybrid import NpuHybridBackend, npu_kernel_dirs
    from phoenix_chat.npu.detect import npu_status

    status = npu_status(kernel_dirs=npu_kernel_dirs())
    if not status.available:  # say why before loading anything
        raise DeviceUnavailableError(f"NPU prefill is unavailable: {status.reason}")
    decoder: Backend
    try:
        from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

        decoder = VulkanBackend(
            weights, ctx, VulkanOptions(device_index=device, quant=quant), progress=progress, cancel=cancel
        )
        note = "NPU prefill, Vulkan decode"
    except DeviceUnavailableError as exc:
        decoder, note = _cpu(weights, ctx, quant, progress, cancel), f"NPU prefill, CPU decode, because {exc}"
        log.warning(note)
    return NpuHybridBackend(weights, ctx, progress=progress, cancel=cancel, decoder=decoder), note


def _cpu(
    weights: WeightSource,
    ctx: int,
    quant: WeightQuant | None,
    progress: Callable[[float, str], None] | None,
    cancel: threading.Event | None,
    slots: int = 1,
) -> CpuBackend:
    from phoenix_chat.engine.backends.cpu import CpuBackend

    return CpuBackend(weights, ctx, progress=progress, cancel=cancel, quant=quant, slots=slots)


def _looks_instruction_tuned(weights: WeightSource, path: Path) -> bool:
    meta = getattr(weights, "metadata", {})
    names = " ".join(str(x) for x in (path.name, weights.config.name, meta.get("general.finetune", ""))).lower()
    if any(tag in names for tag in ("-it", " it", "instruct", "chat")):
        return True
    return bool(weights.chat_template) and not any(tag in names for tag in ("-pt", "base"))
