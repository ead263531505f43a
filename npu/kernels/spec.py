"""What a compiled GEMM kernel computes and how its buffers are laid out.

One source of truth for three users: the IRON designs (which compile it), the host GEMM driver
(which packs weights and activations into it) and the emulator (which executes it in numpy).
Only numpy is imported here, so the IRON designs can use it inside the mlir-aie environment.

A kernel computes one *call*: C[M, N] = A[M, K] @ B[K, N] on the 4×4 compute tiles of `npu1`.
M = 4m and N = 4·n·tn: core (row i, column j) owns rows i*m.. of the n-wide column blocks
j*tn .. j*tn+tn-1, one after the other, and for each loops over K in steps of k. A call covers a
whole weight's width when tn is large enough, which keeps the number of calls (each with its
submit/wait overhead) small. The host packs every buffer so that each DMA moves one contiguous
run of bytes and each core finds its tiles already split into the MAC unit's (r×s)·(s×t)
sub-blocks; the shim and memory-tile DMAs then need no strided access patterns:

  A  [M/m][K/k][m/r][k/s][r][s]    row block i = core row i, its K tiles in order
  B  [N/n][K/k][k/s][n/t][s][t]    core column j reads blocks j*tn.. (one run), K tiles in order
  C  [N/n][M/m][m/r][n/t][r][t]    column j's memory tile joins its four rows' tiles, block by block
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

# AIE-ML (XDNA1) MAC shapes (r, s, t) per input type: DESIGN.md "NPU facts".
MAC_SHAPES = {"i8": (4, 8, 8), "bf16": (4, 8, 4)}
ITEMSIZE = {"i8": 1, "bf16": 2, "i32": 4, "f32": 4}
NUMPY_DTYPE = {"i8": np.int8, "bf16": np.uint16, "i32": np.int32, "f32": np.float32}
CORE_ROWS = CORE_COLS = 4  # npu1_4col: 4 columns × 4 compute rows
L1_BYTES = 64 * 1024  # data memory of one AIE-ML compute tile


@dataclass(frozen=True)
class GemmSpec:
    """One compiled GEMM: its call shape (M, K, N), per-core tile (m, k, n) and types."""

    name: str
    dtype_in: str  # "i8" | "bf16" (bf16 held as uint16 bit patterns on the host)
    dtype_out: str  # "i32" | "f32"
    M: int
    K: int
    N: int
    m: int
    k: int
    n: int

    def __post_init__(self):
        if self.dtype_in not in MAC_SHAPES:
            raise ValueError(f"{self.name}: input type {self.dtype_in} has no AIE-ML MAC shape")
        want_out = "i32" if self.dtype_in == "i8" else "f32"
        if self.dtype_out != want_out:
            raise ValueError(f"{self.name}: {self.dtype_in} inputs accumulate into {want_out}, not {self.dtype_out}")
        r, s, t = self.mac
        problems = []
        if self.M != CORE_ROWS * self.m:
            problems.append(f"M={self.M} must be {CORE_ROWS}*m")
        if self.N % (CORE_COLS * self.n):
            problems.append(f"N={self.N} must be a multiple of {CORE_COLS}*n")
        if self.K % self.k:
            problems.append(f"K={self.K} must be a multiple of k={self.k}")
        if self.m % r or self.k % s or self.n % t:
            problems.append(f"tile {self.m}x{self.k}x{self.n} must be a multiple of the MAC shape {r}x{s}x{t}")
        if self.l1_bytes() > L1_BYTES - 8 * 1024:  # leave room for the stack and the program's data
            problems.append(f"double-buffered L1 tiles need {self.l1_bytes()} bytes, more than a core has")
        if problems:
            raise ValueError(f"{self.name}: " + "; ".join(problems))

    @property
    def tn(self) -> int:
        """Output column blocks each core computes per call."""
        return self.N // (CORE_COLS * self.n)

    @property
    def mac(self) -> tuple[int, int, int]:
        return MAC_SHAPES[self.dtype_in]

    @property
    def in_dtype(self):
        return NUMPY_DTYPE[self.dtype_in]

    @property
    def out_dtype(self):
        return NUMPY_DTYPE[self.dtype_out]

    def l1_bytes(self) -> int:
        """L1 used by one core: A, B and C tiles, each double-buffered (object FIFO depth 2)."""
        i, o = ITEMSIZE[self.dtype_in], ITEMSIZE[self.dtype_out]
        return 2 * (self.m * self.k * i + self.k * self.n * i + self.m * self.n * o)

    @property
    def a_bytes(self) -> int:
        return self.M * self.K * ITEMSIZE[self.dtype_in]

    @property
    def b_bytes(self) -> int:
        return self.K * self.N * ITEMSIZE[self.dtype_in]

    @property
    def c_bytes(self) -> int:
        return self.M * self.N * ITEMSIZE[self.dtype_out]

    def macs(self) -> int:
        return self.M * self.K * self.N

    # --- host-side packing (see the module docstring for the layouts) ---
    def pack_a(self, a: np.ndarray) -> np.ndarray:
        """A [M, K] → the flat buffer the kernel reads."""
        (M, K), (m, k), (r, s, _) = a.shape, (self.m, self.k), self.mac
        self._check(a, (self.M, self.K), "A")
        return np.ascontiguousarray(
            a.reshape(M // m, m // r, r, K // k, k // s, s).transpose(0, 3, 1, 4, 2, 5)
        ).reshape(-1)

    def unpack_a(self, flat: np.ndarray) -> np.ndarray:
        M, K, m, k, (r, s, _) = self.M, self.K, self.m, self.k, self.mac
        return flat.reshape(M // m, K // k, m // r, k // s, r, s).transpose(0, 2, 4, 1, 3, 5).reshape(M, K)

    def pack_b(self, b: np.ndarray) -> np.ndarray:
        """B [K, N] → the flat buffer the kernel reads."""
        K, N, k, n, (_, s, t) = self.K, self.N, self.k, self.n, self.mac
        self._check(b, (K, N), "B")
        return np.ascontiguousarray(
            b.reshape(K // k, k // s, s, N // n, n // t, t).transpose(3, 0, 1, 4, 2, 5)
        ).reshape(-1)

    def unpack_b(self, flat: np.ndarray) -> np.ndarray:
        K, N, k, n, (_, s, t) = self.K, self.N, self.k, self.n, self.mac
        return flat.reshape(N // n, K // k, k // s, n // t, s, t).transpose(1, 2, 4, 0, 3, 5).reshape(K, N)

    def pack_c(self, c: np.ndarray) -> np.ndarray:
        M, N, m, n, (r, _, t) = self.M, self.N, self.m, self.n, self.mac
        self._check(c, (M, N), "C")
        return np.ascontiguousarray(
            c.reshape(M // m, m // r, r, N // n, n // t, t).transpose(3, 0, 1, 4, 2, 5)
        ).reshape(-1)

    def unpack_c(self, flat: np.ndarray) -> np.ndarray:
        """The kernel's flat output → C [M, N]."""
        M, N, m, n, (r, _, t) = self.M, self.N, self.m, self.n, self.mac
        return flat.reshape(N // n, M // m, m // r, n // t, r, t).transpose(1, 2, 4, 0, 3, 5).reshape(M, N)

    @staticmethod
    def _check(x, shape, what):
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"{what} has shape {tuple(x.shape)}, the kernel takes {tuple(shape)}")

    # --- manifest (written by kernels/build.py next to the .xclbin) ---
    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> GemmSpec:
        fields = {f: data[f] for f in cls.__dataclass_fields__}
        return cls(**fields)


# The kernels build.py compiles by default. M = 256 tokens per call matches a prefill chunk;
# several (K, N) call shapes let the driver trade padding against the number of calls per weight.
DEFAULT_SPECS = (
    GemmSpec("gemm_i8_256x256x256", "i8", "i32", 256, 256, 256, 64, 64, 64),
    GemmSpec("gemm_i8_256x512x1024", "i8", "i32", 256, 512, 1024, 64, 64, 64),
    GemmSpec("gemm_i8_256x1024x2048", "i8", "i32", 256, 1024, 2048, 64, 64, 64),
    GemmSpec("gemm_bf16_128x256x256", "bf16", "f32", 128, 256, 256, 32, 64, 64),
    GemmSpec("gemm_bf16_128x512x1024", "bf16", "f32", 128, 512, 1024, 32, 64, 64),
)


def dumps(spec: GemmSpec, **extra) -> str:
    return json.dumps({**spec.to_json(), **extra}, indent=2, sort_keys=True)
