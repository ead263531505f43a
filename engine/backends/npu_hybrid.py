"""The "prefill on NPU" plan: prompt-chunk matmuls on the XDNA NPU, everything else on the CPU backend.

Prefill (a chunk of ≥ `min_tokens` tokens) runs a prefill copy of the model whose `linear()` hook
sends the projections of the chosen layers to the NPU int8 GEMM (npu/gemm.py); attention, norms,
RoPE, the embedding and the output head stay on the host. Decode (one token) runs on the normal
backend, here the CPU reference. Both sides keep their own KV cache and the hand-off between them
is an explicit, timed copy of the rows written since the last hand-off:

  prefill → decode: after every prefill, the K/V rows of the prompt chunk;
  decode → prefill: before a prefill, the rows decode wrote since (multi-turn chats).

(A Vulkan decoder would take the same rows through an upload; the CPU one takes them by copy.)
The activations crossing to the NPU per matmul — the hidden state's traffic — are counted by the
NPU device (`bytes_to_device` / `bytes_from_device`).

Without a usable NPU the constructor raises DeviceUnavailableError with npu_status()'s reason:
nothing falls back silently. Tests pass `xrt=npu.emulator.EmulatedXrt()`.
"""
from __future__ import annotations

import re
import time

import numpy as np

from engine.backends.base import Backend
from engine.backends.cpu import CpuBackend
from engine.errors import DeviceUnavailableError
from engine.models.gemma3 import Gemma3Model, KVCache
from engine.weights.base import WeightSource

PREFILL_CHUNK = 256
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")


class NpuPrefillModel(Gemma3Model):
    """The reference model sharing another's weights, with NPU matmuls for prompt chunks."""

    def __init__(self, base: Gemma3Model, gemm, on_npu: set[str], min_tokens: int = 2):
        # No super().__init__: the f32 weights and RoPE tables are shared with `base`, not copied.
        self.__dict__.update({k: v for k, v in base.__dict__.items() if k != "cache"})
        self.cache = KVCache(base.config, base.context_length)
        self.gemm, self.on_npu, self.min_tokens = gemm, on_npu, min_tokens
        self.npu_calls = 0

    def linear(self, x: np.ndarray, name: str) -> np.ndarray:
        if x.shape[0] >= self.min_tokens and name in self.on_npu:
            self.npu_calls += 1
            return self.gemm.matmul(x, name)
        return super().linear(x, name)


class NpuHybridBackend(Backend):
    name = "npu-hybrid"

    def __init__(self, weights: WeightSource, context_length: int, progress=None, cancel=None, *,
                 xrt=None, kernel_dirs=None, npu_layers=None, projections=PROJECTIONS,
                 min_tokens: int = 2, decoder: CpuBackend | None = None):
        """npu_layers: layer indices whose projections prefill on the NPU (default: all).
        xrt: the pyxrt module (default: the real one, after npu_status() says the NPU is ready).
        decoder: an existing CpuBackend to decode on and share weights with (default: a new one).
        """
        from npu.detect import npu_status
        from npu.gemm import NpuGemm
        from npu.runtime import NpuDevice, find_kernels, kernel_search_dirs

        super().__init__(weights.config, context_length)
        emulated = xrt is not None and type(xrt).__module__ == "npu.emulator"
        if xrt is None:
            status = npu_status(kernel_dirs=kernel_dirs)
            if not status.available:
                raise DeviceUnavailableError(f"NPU prefill is unavailable: {status.reason}")
            from npu.runtime import import_pyxrt
            xrt = import_pyxrt()
        found, problems = find_kernels(kernel_dirs if kernel_dirs is not None else kernel_search_dirs(),
                                       allow_emulator=emulated)
        if not found:
            raise DeviceUnavailableError("NPU prefill is unavailable: no built NPU kernels"
                                         + (f" ({'; '.join(problems)})" if problems else ""))
        self.device_name = ("CPU + emulated NPU (tests only)" if emulated
                            else "CPU decode + AMD XDNA NPU prefill (Phoenix, npu1)")
        self.decoder = decoder or CpuBackend(weights, context_length, progress=progress, cancel=cancel)
        cfg = self.config
        layers = range(cfg.num_layers) if npu_layers is None else sorted(set(npu_layers))
        on_npu = {f"layers.{i}.{p}" for i in layers for p in projections}

        t = time.perf_counter()
        self.npu = NpuDevice(xrt=xrt)
        self.gemm = NpuGemm(self.npu, found, "i8")
        base = self.decoder.model
        for i, name in enumerate(sorted(on_npu)):
            self.gemm.add_weight(name, base.w[name])
            if progress:
                progress((i + 1) / len(on_npu), f"quantizing {name} into NPU buffers")
        self.upload_s = time.perf_counter() - t
        self.prefill_model = NpuPrefillModel(base, self.gemm, on_npu, min_tokens)
        self.min_tokens = min_tokens
        self._prefill_valid = 0         # prefill cache agrees with the decoder below this position
        self.handoff = {"to_decoder_rows": 0, "to_prefill_rows": 0, "bytes": 0, "seconds": 0.0, "count": 0}
        self.timing = {"prefill_s": 0.0, "prefill_tokens": 0, "decode_s": 0.0, "decode_tokens": 0}

    # ------------------------------------------------------------ forward
    def forward(self, token_ids, start_pos, *, all_logits=False):
        ids = list(token_ids)
        if len(ids) < self.min_tokens:
            t = time.perf_counter()
            logits = self.decoder.forward(ids, start_pos, all_logits=all_logits)
            self._prefill_valid = min(self._prefill_valid, start_pos)
            self.timing["decode_s"] += time.perf_counter() - t
            self.timing["decode_tokens"] += len(ids)
            return logits
        model = self.prefill_model
        if self._prefill_valid < start_pos:
            self._handoff(self.decoder.model.cache, model.cache, self._prefill_valid, start_pos, "to_prefill_rows")
        t = time.perf_counter()
        outs = []
        for i in range(0, len(ids), PREFILL_CHUNK):
            chunk = ids[i:i + PREFILL_CHUNK]
            last = i + PREFILL_CHUNK >= len(ids)
            if all_logits or last:
                outs.append(model.forward(chunk, start_pos + i, all_logits=all_logits))
            else:
                model.forward(chunk, start_pos + i, all_logits=False)
        self.timing["prefill_s"] += time.perf_counter() - t
        self.timing["prefill_tokens"] += len(ids)
        end = start_pos + len(ids)
        self._handoff(model.cache, self.decoder.model.cache, start_pos, end, "to_decoder_rows")
        self._prefill_valid = end
        return np.concatenate(outs) if all_logits else outs[-1]

    def _handoff(self, src: KVCache, dst: KVCache, lo: int, hi: int, counter: str):
        """Copy the K/V rows of positions [lo, hi) from one cache to the other, timed."""
        t = time.perf_counter()
        rows = nbytes = 0
        for layer in range(self.config.num_layers):
            held = src.positions[layer]
            sel = (held >= lo) & (held < hi)
            if sel.any():
                k, v = src.k[layer][sel], src.v[layer][sel]
                dst.write(layer, held[sel], k, v)
                rows += int(sel.sum())
                nbytes += k.nbytes + v.nbytes
        h = self.handoff
        h[counter] += rows
        h["bytes"] += nbytes
        h["seconds"] += time.perf_counter() - t
        h["count"] += 1

    # ------------------------------------------------------------ gauges
    def stats(self):
        g, d = self.gemm.stats, self.npu.stats
        return {
            "npu_busy_fraction": self.npu.busy_fraction(1.0),
            "npu_runs": d["runs"], "npu_busy_s": d["busy_s"], "npu_sync_s": d["sync_s"],
            "npu_bytes_to_device": d["bytes_to_device"], "npu_bytes_from_device": d["bytes_from_device"],
            "npu_matmuls": g["matmuls"], "npu_macs": g["macs"], "npu_padded_macs": g["padded_macs"],
            "npu_host_s": g["host_s"], "npu_weight_bytes": g["weight_bytes"], "npu_upload_s": self.upload_s,
            "handoff": dict(self.handoff), **self.timing,
            "kv_cache_bytes": self.decoder.model.cache.nbytes() + self.prefill_model.cache.nbytes(),
        }

    def close(self):
        self.decoder.close()
