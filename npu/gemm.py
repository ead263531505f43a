"""The GEMM driver: any x[n, K] @ W[N, K].T on the NPU's fixed-shape kernels.

At load (`add_weight`), once per weight: quantize per output channel (int8) or round to bf16,
transpose to B [K, N], zero-pad K and N up to the kernel's call shape, cut into (K-chunk,
N-block) blocks, pack each into the kernel's layout and leave it resident in its own BO.
Per call (`matmul`): quantize each token (int8) or round (bf16), pad the rows to the call's M,
pack each K chunk of A once, then run every (N-block, K-chunk) pair and sum the K-chunk partial
results on the host — int32 partial sums add exactly, so K-splitting costs no precision in the
int8 path. The per-token and per-channel scales are applied to the summed int32 result in f32.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from phoenix_chat.npu.errors import NpuUnavailableError
from phoenix_chat.npu.kernels.spec import GemmSpec
from phoenix_chat.npu.quant import (
    bf16_bits_to_f32,
    dequantize_output,
    f32_to_bf16_bits,
    quantize_activation_per_token,
    quantize_weight_per_channel,
)
from phoenix_chat.npu.runtime import KernelArtifact, NpuBuffer, NpuDevice, NpuKernel

# Rough figures for choosing between kernel variants (not measured on hardware: see docs/NPU.md).
PEAK_MACS_PER_S = {"i8": 6.76e12 / 2, "bf16": 3.14e12 / 2}  # best published XDNA GEMM results
CALL_OVERHEAD_S = 50e-6  # assumed per-run submit + wait cost


@dataclass
class PlacedWeight:
    name: str
    out_features: int
    in_features: int
    kernel: NpuKernel
    blocks: list[list[NpuBuffer]]  # [k_chunk][n_block], resident on the device
    scale: np.ndarray | None  # f32 per output channel (int8 path)

    @property
    def spec(self) -> GemmSpec:
        return self.kernel.spec

    @property
    def k_chunks(self) -> int:
        return len(self.blocks)

    @property
    def n_blocks(self) -> int:
        return len(self.blocks[0])


def plan_cost(spec: GemmSpec, in_features: int, out_features: int, n_tokens: int | None = None) -> float:
    """Estimated seconds for one matmul of `n_tokens` rows (default: one call's M) with `spec`."""
    rows = n_tokens or spec.M
    m_chunks = math.ceil(rows / spec.M)
    calls = m_chunks * math.ceil(in_features / spec.K) * math.ceil(out_features / spec.N)
    return calls * (spec.macs() / PEAK_MACS_PER_S[spec.dtype_in] + CALL_OVERHEAD_S)


class NpuGemm:
    """Weights resident on the NPU and `matmul(x, name)` through the compiled kernels."""

    def __init__(self, device: NpuDevice, artifacts: dict[str, KernelArtifact], dtype: str = "i8"):
        self.device, self.dtype = device, dtype
        self.artifacts = {n: a for n, a in artifacts.items() if a.spec.dtype_in == dtype}
        if not self.artifacts:
            raise NpuUnavailableError(f"no {dtype} GEMM kernel among {sorted(artifacts) or 'none'}")
        self.kernels: dict[str, NpuKernel] = {}
        self.weights: dict[str, PlacedWeight] = {}
        self._a_bufs: dict[tuple[str, int], NpuBuffer] = {}
        self._c_bufs: dict[str, NpuBuffer] = {}
        self.stats = {
            "matmuls": 0,
            "runs": 0,
            "npu_s": 0.0,
            "host_s": 0.0,
            "macs": 0,
            "padded_macs": 0,
            "weight_bytes": 0,
        }

    def _kernel(self, name: str) -> NpuKernel:
        if name not in self.kernels:
            self.kernels[name] = self.device.load(self.artifacts[name])
        return self.kernels[name]

    def choose(self, in_features: int, out_features: int) -> KernelArtifact:
        return min(self.artifacts.values(), key=lambda a: (plan_cost(a.spec, in_features, out_features), a.spec.name))

    def add_weight(self, name: str, w: np.ndarray) -> PlacedWeight:
        """Quantize, pad, pack and upload W [out, in] once; it stays resident under `name`."""
        out_f, in_f = w.shape
        kernel = self._kernel(self.choose(in_f, out_f).spec.name)
        spec = kernel.spec
        if self.dtype == "i8":
            q, scale = quantize_weight_per_channel(w)
        else:
            q, scale = f32_to_bf16_bits(w), None
        kp, np_ = math.ceil(in_f / spec.K) * spec.K, math.ceil(out_f / spec.N) * spec.N
        b = np.zeros((kp, np_), dtype=spec.in_dtype)
        b[:in_f, :out_f] = q.T
        blocks = []
        for kc in range(kp // spec.K):
            row = []
            for nb in range(np_ // spec.N):
                buf = kernel.buffer(1, spec.b_bytes)
                buf.write(spec.pack_b(b[kc * spec.K : (kc + 1) * spec.K, nb * spec.N : (nb + 1) * spec.N]))
                row.append(buf)
            blocks.append(row)
        self.stats["weight_bytes"] += b.nbytes
        placed = PlacedWeight(name, out_f, in_f, kernel, blocks, scale)
        self.weights[name] = placed
        return placed

    def _buffers(self, spec: GemmSpec, kernel: NpuKernel, k_chunks: int):
        a = []
        for kc in range(k_chunks):
            key = (spec.name, kc)
            if key not in self._a_bufs:
                self._a_bufs[key] = kernel.buffer(0, spec.a_bytes)
            a.append(self._a_bufs[key])
        if spec.name not in self._c_bufs:
            self._c_bufs[spec.name] = kernel.buffer(2, spec.c_bytes)
        return a, self._c_bufs[spec.name]

    def matmul(self, x: np.ndarray, name: str) -> np.ndarray:
        """x [n, in] (f32) @ W[name].T → [n, out] (f32)."""
        pw = self.weights[name]
        spec, kernel = pw.spec, pw.kernel
        n, in_f = x.shape
        if in_f != pw.in_features:
            raise ValueError(f"{name}: x has {in_f} features, the weight takes {pw.in_features}")
        t0 = time.perf_counter()
        npu_s = 0.0
        if self.dtype == "i8":
            qx, sx = quantize_activation_per_token(x)
        else:
            qx, sx = f32_to_bf16_bits(x), None
        a_bufs, c_buf = self._buffers(spec, kernel, pw.k_chunks)
        acc_dtype = np.int64 if self.dtype == "i8" else np.float32
        out = np.empty((n, pw.out_features), np.float32)
        for m0 in range(0, n, spec.M):
            rows = min(spec.M, n - m0)
            a = np.zeros((spec.M, pw.k_chunks * spec.K), spec.in_dtype)
            a[:rows, :in_f] = qx[m0 : m0 + rows]
            for kc, buf in enumerate(a_bufs):
                buf.write(spec.pack_a(a[:, kc * spec.K : (kc + 1) * spec.K]))
            acc = np.zeros((spec.M, pw.n_blocks * spec.N), acc_dtype)
            for nb in range(pw.n_blocks):
                cols = slice(nb * spec.N, (nb + 1) * spec.N)
                for kc in range(pw.k_chunks):
                    npu_s += kernel.run(a_bufs[kc], pw.blocks[kc][nb], c_buf)
                    acc[:, cols] += spec.unpack_c(c_buf.read(spec.out_dtype))
            part = acc[:rows, : pw.out_features]
            if self.dtype == "i8":
                assert sx is not None and pw.scale is not None  # the i8 path has both scales
                out[m0 : m0 + rows] = dequantize_output(part, sx[m0 : m0 + rows], pw.scale)
            else:
                out[m0 : m0 + rows] = part
        runs = math.ceil(n / spec.M) * pw.k_chunks * pw.n_blocks
        st = self.stats
        st["matmuls"] += 1
        st["runs"] += runs
        st["npu_s"] += npu_s
        st["host_s"] += time.perf_counter() - t0 - npu_s
        st["macs"] += n * in_f * pw.out_features
        st["padded_macs"] += runs * spec.macs()
        return out


def reference_matmul(x: np.ndarray, w: np.ndarray, dtype: str = "i8") -> np.ndarray:
    """What `NpuGemm.matmul` must return for x [n, in] and W [out, in], computed directly on the
    host from the same quantized operands, with no tiling, padding or packing."""
    if dtype == "i8":
        qw, sw = quantize_weight_per_channel(w)
        qx, sx = quantize_activation_per_token(x)
        # int8·int8 sums in f64 are exact integers (|sum| ≤ 2**14·K < 2**53) and BLAS-fast
        acc = (qx.astype(np.float64) @ qw.T.astype(np.float64)).astype(np.int64)
        return dequantize_output(acc, sx, sw)
    return bf16_bits_to_f32(f32_to_bf16_bits(x)) @ bf16_bits_to_f32(f32_to_bf16_bits(w)).T
