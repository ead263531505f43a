"""The "prefill on NPU" plan: prompt-chunk matmuls on the XDNA NPU, decode on the iGPU (Vulkan) or CPU.

Prefill (a chunk of ≥ `min_tokens` tokens) runs a prefill copy of the model whose `linear()` hook
sends the projections of the chosen layers to the NPU int8 GEMM (npu/gemm.py); attention, norms,
RoPE, the embedding and the output head stay on the host. Decode (one token) runs on the decoder
backend: the Vulkan GPU when `engine.load` finds a hardware one, else the CPU reference. Both
sides keep their own KV cache and the hand-off between them is an explicit, timed copy of the
rows written since the last hand-off:

  prefill → decode: after every prefill, the K/V rows of the prompt chunk;
  decode → prefill: before a prefill, the rows decode wrote since (multi-turn chats).

The decoder is any Backend. One with `export_kv(lo, hi) -> rows` and `import_kv(rows)` (rows:
[(layer, positions, k, v)] in f32, k/v [rows, kv_heads, head_dim]) takes part through those, e.g.
a Vulkan decoder uploading the rows; otherwise its reference model's cache (`.model.cache`, the
CPU backend) is read and written directly.
The activations crossing to the NPU per matmul — the hidden state's traffic — are counted by the
NPU device (`bytes_to_device` / `bytes_from_device`).

This is the engine's seam with npu/, which knows nothing of the engine: without a usable NPU the
constructor raises DeviceUnavailableError with npu_status()'s reason (or the npu.errors.NpuError
that stopped it), and a failed NPU run during a prefill becomes DeviceRunError; nothing falls back
silently. Tests pass `xrt=tests.npu.emulator.EmulatedXrt()` (its `emulated = True` lets it load
the emulator's stand-in kernels).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from phoenix_chat.engine.backends.base import (
    PREFILL_CHUNK,
    Backend,
    CancelCheck,
    KvRow,
    LiveStats,
    forward_in_chunks,
)
from phoenix_chat.engine.backends.cpu import CpuBackend
from phoenix_chat.engine.errors import DeviceRunError, DeviceUnavailableError
from phoenix_chat.engine.models.gemma3 import Gemma3Model, KVCache
from phoenix_chat.engine.paths import data_dir
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.weights.base import WeightSource
from phoenix_chat.npu.errors import NpuError, NpuRunError

if TYPE_CHECKING:
    from phoenix_chat.npu.gemm import NpuGemm

PROJECTIONS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


class KvExchange(Protocol):
    """A decoder that hands K/V rows over itself (the Vulkan backend: vulkan/kv_handoff.py)."""

    def export_kv(self, lo: int, hi: int) -> list[KvRow]: ...

    def import_kv(self, rows: list[KvRow]) -> int: ...


class ReferenceDecoder(Protocol):
    """A decoder whose reference model's cache is read and written directly (the CPU backend)."""

    model: Gemma3Model


def npu_kernel_dirs() -> list[Path]:
    """Where the engine looks for built NPU kernels: $PHOENIX_NPU_KERNELS, the user's data folder
    (`npu-kernels` under engine.paths.data_dir()), then npu/kernels/build."""
    from phoenix_chat.npu.runtime import kernel_search_dirs

    return kernel_search_dirs(user_dir=data_dir() / "npu-kernels")


class NpuPrefillModel(Gemma3Model):
    """The reference model sharing another's weights, with NPU matmuls for prompt chunks."""

    def __init__(self, base: Gemma3Model, gemm: NpuGemm, on_npu: set[str], min_tokens: int = 2) -> None:
        # No super().__init__: the f32 weights and RoPE tables are shared with `base`, not copied.
        self.__dict__.update({k: v for k, v in base.__dict__.items() if k != "cache"})
        self.cache = KVCache(base.config, base.context_length, base.cache.forward_tokens)
        self.gemm, self.on_npu, self.min_tokens = gemm, on_npu, min_tokens
        self.npu_calls = 0

    def linear(self, x: npt.NDArray[np.float32], name: str) -> npt.NDArray[np.float32]:
        if x.shape[0] >= self.min_tokens and name in self.on_npu:
            self.npu_calls += 1
            return self.gemm.matmul(x, name)
        return super().linear(x, name)


class NpuHybridBackend(Backend):
    name = "npu-hybrid"

    def __init__(
        self,
        weights: WeightSource,
        context_length: int,
        progress: Callable[[float, str], None] | None = None,
        cancel: threading.Event | None = None,
        *,
        xrt: object | None = None,
        kernel_dirs: Iterable[Path] | None = None,
        npu_layers: Iterable[int] | None = None,
        projections: Iterable[str] = PROJECTIONS,
        min_tokens: int = 2,
        decoder: Backend | None = None,
        dtype: str = "i8",
    ) -> None:
        """npu_layers: layer indices whose projections prefill on the NPU (default: all).
        projections: which of each layer's projections (default: all seven).
        dtype: "i8" (W8A8, the default) or "bf16" GEMM kernels.
        xrt: the pyxrt module (default: the real one, after npu_status() says the NPU is ready).
        decoder: the backend that decodes (default: a new CpuBackend, whose f32 weights the prefill
        side shares); it needs export_kv/import_kv or a reference `.model` (module docstring).
        """
        from phoenix_chat.npu.detect import npu_status
        from phoenix_chat.npu.gemm import NpuGemm
        from phoenix_chat.npu.runtime import NpuDevice, find_kernels

        super().__init__(weights.config, context_length)
        emulated = getattr(xrt, "emulated", False) is True  # a test double says so itself
        dirs = list(kernel_dirs) if kernel_dirs is not None else npu_kernel_dirs()
        if xrt is None:
            status = npu_status(kernel_dirs=dirs)
            if not status.available:
                raise DeviceUnavailableError(f"NPU prefill is unavailable: {status.reason}")
        found, problems = find_kernels(dirs, allow_emulator=emulated)
        if not found:
            raise DeviceUnavailableError(
                "NPU prefill is unavailable: no built NPU kernels" + (f" ({'; '.join(problems)})" if problems else "")
            )
        self.decoder = decoder or CpuBackend(weights, context_length, progress=progress, cancel=cancel)
        # the decoder's re-quantization (the NPU quantizes its own copies whatever this is);
        # getattr: a decoder need only offer the KV hand-off, not the whole Backend
        self.quant = getattr(self.decoder, "quant", None)
        self.device_name = f"{getattr(self.decoder, 'device_name', type(self.decoder).__name__)} decode + " + (
            "emulated NPU prefill (tests only)" if emulated else "AMD XDNA NPU prefill (Phoenix, npu1)"
        )
        base = getattr(self.decoder, "model", None)
        if not (hasattr(self.decoder, "export_kv") and hasattr(self.decoder, "import_kv")):
            if not isinstance(base, Gemma3Model):
                raise ValueError(
                    f"decoder {type(self.decoder).__name__} offers no KV hand-off "
                    "(export_kv/import_kv, or a reference model's cache)"
                )
        if not isinstance(base, Gemma3Model):  # the prefill side needs f32 weights of its own
            base = Gemma3Model(weights, context_length, progress=progress, cancel=cancel, forward_tokens=PREFILL_CHUNK)
        cfg = self.config
        layers = range(cfg.num_layers) if npu_layers is None else sorted(set(npu_layers))
        on_npu = {f"layers.{i}.{p}" for i in layers for p in projections}

        t = time.perf_counter()
        try:
            self.npu = NpuDevice(xrt=xrt)  # xrt None: the real pyxrt, imported here
            self.gemm = NpuGemm(self.npu, found, dtype)
            for i, name in enumerate(sorted(on_npu)):
                self.gemm.add_weight(name, base.w[name])
                if progress:
                    progress((i + 1) / len(on_npu), f"quantizing {name} into NPU buffers")
        except NpuError as exc:
            raise DeviceUnavailableError(f"NPU prefill is unavailable: {exc}") from None
        self.upload_s = time.perf_counter() - t
        self.prefill_model = NpuPrefillModel(base, self.gemm, on_npu, min_tokens)
        self.min_tokens = min_tokens
        # positions come back exactly only where both sides' rings still hold them
        prefill_ring = min(len(held) for held in self.prefill_model.cache.positions)
        self.kv_ring_slots = min(prefill_ring, self.decoder.kv_ring_slots)
        self._prefill_valid = 0  # prefill cache agrees with the decoder below this position
        self.handoff: dict[str, float] = {
            "to_decoder_rows": 0,
            "to_prefill_rows": 0,
            "bytes": 0,
            "seconds": 0.0,
            "count": 0,
        }
        self.timing: dict[str, float] = {"prefill_s": 0.0, "prefill_tokens": 0, "decode_s": 0.0, "decode_tokens": 0}

    @property
    def kv_high_water(self) -> int:
        """Both sides' (the decoder writes on its own in `decode_tokens`)."""
        return max(self._kv_high_water, self.decoder.kv_high_water)

    @kv_high_water.setter
    def kv_high_water(self, pos: int) -> None:
        self._kv_high_water = self.decoder.kv_high_water = pos

    # ------------------------------------------------------------ forward
    def forward(
        self,
        token_ids: Sequence[int],
        start_pos: int,
        *,
        all_logits: bool = False,
        cancel: CancelCheck | None = None,
    ) -> npt.NDArray[np.float32]:
        ids = list(token_ids)
        self.wrote_kv(start_pos + len(ids))
        if len(ids) < self.min_tokens:
            t = time.perf_counter()
            logits = self.decoder.forward(ids, start_pos, all_logits=all_logits, cancel=cancel)
            self._prefill_valid = min(self._prefill_valid, start_pos)
            self.timing["decode_s"] += time.perf_counter() - t
            self.timing["decode_tokens"] += len(ids)
            return logits
        model = self.prefill_model
        if self._prefill_valid < start_pos:
            self._handoff(
                self._decoder_rows,
                lambda rows: _write_rows(model.cache, rows),
                self._prefill_valid,
                start_pos,
                "to_prefill_rows",
            )
        t = time.perf_counter()
        self._prefill_valid = start_pos  # rows from here on are rewritten (or, if cancelled, half-written)
        try:
            logits = forward_in_chunks(model.forward, ids, start_pos, all_logits, cancel=cancel)
        except NpuRunError as exc:
            raise DeviceRunError(f"NPU prefill failed: {exc}") from None
        self.timing["prefill_s"] += time.perf_counter() - t
        self.timing["prefill_tokens"] += len(ids)
        end = start_pos + len(ids)
        self._handoff(
            lambda lo, hi: _cache_rows(model.cache, lo, hi), self._decoder_import, start_pos, end, "to_decoder_rows"
        )
        self._prefill_valid = end
        return logits

    def decode_tokens(
        self, first_token: int, start_pos: int, params: SamplingParams, max_tokens: int
    ) -> Generator[int, None, None] | None:
        """The decoder's device-resident decode, when it has one (its cache holds the prompt)."""
        steps = self.decoder.decode_tokens(first_token, start_pos, params, max_tokens)
        if steps is not None:
            self._prefill_valid = min(self._prefill_valid, start_pos)
        return steps

    def _decoder_rows(self, lo: int, hi: int) -> list[KvRow]:
        if hasattr(self.decoder, "export_kv"):
            return cast(KvExchange, self.decoder).export_kv(lo, hi)
        return _cache_rows(cast(ReferenceDecoder, self.decoder).model.cache, lo, hi)

    def _decoder_import(self, rows: list[KvRow]) -> None:
        if hasattr(self.decoder, "import_kv"):
            cast(KvExchange, self.decoder).import_kv(rows)
        else:
            _write_rows(cast(ReferenceDecoder, self.decoder).model.cache, rows)

    def _handoff(
        self,
        export: Callable[[int, int], list[KvRow]],
        import_: Callable[[list[KvRow]], None],
        lo: int,
        hi: int,
        counter: str,
    ) -> None:
        """Move the K/V rows of positions [lo, hi) from one side to the other, timed."""
        t = time.perf_counter()
        rows = export(lo, hi)
        import_(rows)
        h = self.handoff
        h[counter] += sum(len(pos) for _, pos, _, _ in rows)
        h["bytes"] += sum(k.nbytes + v.nbytes for _, _, k, v in rows)
        h["seconds"] += time.perf_counter() - t
        h["count"] += 1

    # ------------------------------------------------------------ gauges
    def weight_types(self) -> dict[str, int]:
        """The decoder's (the NPU holds int8/bf16 copies of the projections besides)."""
        types = getattr(self.decoder, "weight_types", None)
        return types() if callable(types) else {}

    def live_stats(self) -> LiveStats:
        dec = self.decoder.live_stats()
        return LiveStats(
            device=self.device_name,
            gpu_busy=dec.gpu_busy,
            npu_busy=self.npu.busy_fraction(1.0),
            kv_cache_bytes=self.prefill_model.cache.nbytes() + dec.kv_cache_bytes,
        )

    def stats(self) -> dict[str, Any]:
        g, d = self.gemm.stats, self.npu.stats
        return {
            "npu_busy_fraction": self.npu.busy_fraction(1.0),
            "npu_runs": d["runs"],
            "npu_busy_s": d["busy_s"],
            "npu_sync_s": d["sync_s"],
            "npu_bytes_to_device": d["bytes_to_device"],
            "npu_bytes_from_device": d["bytes_from_device"],
            "npu_matmuls": g["matmuls"],
            "npu_macs": g["macs"],
            "npu_padded_macs": g["padded_macs"],
            "npu_host_s": g["host_s"],
            "npu_weight_bytes": g["weight_bytes"],
            "npu_upload_s": self.upload_s,
            "handoff": dict(self.handoff),
            **self.timing,
            "kv_cache_bytes": self.prefill_model.cache.nbytes(),
            "decoder": self.decoder.stats(),
        }

    def close(self) -> None:
        self.decoder.close()


def _cache_rows(cache: KVCache, lo: int, hi: int) -> list[KvRow]:
    """[(layer, positions, k, v)] for the rows of positions [lo, hi) a cache holds."""
    rows: list[KvRow] = []
    for layer, held in enumerate(cache.positions):
        sel = (held >= lo) & (held < hi)
        if sel.any():
            rows.append((layer, held[sel], cache.k[layer][sel], cache.v[layer][sel]))
    return rows


def _write_rows(cache: KVCache, rows: list[KvRow]) -> None:
    for layer, positions, k, v in rows:
        cache.write(layer, positions, k, v)
