"""IRON design of the Phoenix Chat GEMM for `npu1` (Phoenix/Hawk Point: 4 usable columns × 4 cores).

    python -m npu.kernels.gemm_design --spec gemm_i8_256x512x256 > aie.mlir

Needs the mlir-aie Python package (`aie.iron`); written for the IRON API of mlir-aie 1.x
(`aie.iron` Kernel/ObjectFifo/Worker/Runtime/Program, `aie.iron.device.NPU1Col4` and `Tile`,
`aie.iron.controlflow.range_`, `aie.helpers.taplib.TensorAccessPattern`). NOT compiled or run on
hardware by this project yet: see docs/NPU.md.

Data flow for one call, C[M, N] = A[M, K] @ B[K, N], with M = 4m and N = 4·n·tn:
  * core (row i, column j) at Tile(j, 2 + i) computes the C tiles (i, j*tn + t) for t < tn; for
    each it zeroes the tile, then for each of the K/k steps takes one A tile (m×k) and one B tile
    (k×n) and accumulates `matmul`;
  * A row block i enters through the shim of column i (sent tn times, once per output block),
    its memory tile forwards each tile to all four cores of row i (a broadcast across columns);
  * B column blocks j*tn.. enter through the shim of column j, its memory tile broadcasts each
    tile to the four cores of column j;
  * the memory tile of column j joins the four C tiles of each block and sends them to the shim.
Because the host already packed A, B and C into the layouts of npu/kernels/spec.py, every
transfer is one contiguous run and no DMA needs a strided or transposing access pattern.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from phoenix_chat.npu.kernels.spec import CORE_COLS, CORE_ROWS, DEFAULT_SPECS, GemmSpec

FIFO_DEPTH = 2  # double buffering in L1 and L2 (GemmSpec.l1_bytes assumes it)
ROW_BYTES = 1024  # innermost DMA dimension: 256 32-bit words, under a BD's 1023-word limit
MAX_DIM = 1023


def object_name(spec: GemmSpec) -> str:
    """The compiled AIE kernel object this design links (built by build.py from gemm_aie.cc)."""
    return f"gemm_{spec.dtype_in}_{spec.m}x{spec.k}x{spec.n}.o"


def kernel_symbols(spec: GemmSpec) -> tuple[str, str]:
    return f"zero_{spec.dtype_out}", f"matmul_{spec.dtype_in}_{spec.dtype_out}"


def linear_tap_shape(length: int, itemsize: int, repeat: int = 1):
    """(sizes, strides) moving `length` contiguous elements `repeat` times, short innermost rows."""
    inner = ROW_BYTES // itemsize
    rows = length // inner
    if length % inner or rows > MAX_DIM or repeat > 64:
        raise ValueError(f"a run of {length} elements x{repeat} does not fit one buffer descriptor")
    return [repeat, 1, rows, inner], [0, 0, inner, 1]  # stride 0 outermost: a repeat


def _linear(total: int, offset: int, length: int, itemsize: int, repeat: int = 1):
    from aie.helpers.taplib import TensorAccessPattern

    sizes, strides = linear_tap_shape(length, itemsize, repeat)
    return TensorAccessPattern((1, total), offset, sizes, strides)


def _buffer_type(count: int, dtype: type) -> Any:
    """IRON's type of a flat buffer: `np.ndarray[(count,), np.dtype[dtype]]`, built at run time."""
    # a value for IRON, not a static type: mypy rejects a variable dtype inside [...]
    return np.ndarray[(count,), np.dtype[dtype]]  # type: ignore[misc, valid-type]


def build_module(spec: GemmSpec):
    from aie.iron import Kernel, ObjectFifo, Program, Runtime, Worker
    from aie.iron.controlflow import range_
    from aie.iron.device import NPU1Col4, Tile
    from aie.iron.placers import SequentialPlacer

    if spec.dtype_in == "bf16":
        from ml_dtypes import bfloat16

        t_in = bfloat16
    else:
        t_in = np.int8
    t_out = np.int32 if spec.dtype_out == "i32" else np.float32
    M, K, N, m, k, n = spec.M, spec.K, spec.N, spec.m, spec.k, spec.n
    k_steps, tn = K // k, spec.tn
    isz_in, isz_out = (2 if spec.dtype_in == "bf16" else 1), 4

    A_ty = _buffer_type(M * K, t_in)
    B_ty = _buffer_type(K * N, t_in)
    C_ty = _buffer_type(M * N, t_out)
    a_ty = _buffer_type(m * k, t_in)
    b_ty = _buffer_type(k * n, t_in)
    c_ty = _buffer_type(m * n, t_out)
    c_col_ty = _buffer_type(CORE_ROWS * m * n, t_out)

    zero_sym, mm_sym = kernel_symbols(spec)
    zero = Kernel(zero_sym, object_name(spec), [c_ty])
    matmul = Kernel(mm_sym, object_name(spec), [a_ty, b_ty, c_ty])

    a_in = [ObjectFifo(a_ty, name=f"A{i}_shim", default_depth=FIFO_DEPTH) for i in range(CORE_ROWS)]
    a_row = [a_in[i].cons().forward(obj_type=a_ty, name=f"A{i}_row", placement=Tile(i, 1)) for i in range(CORE_ROWS)]
    b_in = [ObjectFifo(b_ty, name=f"B{j}_shim", default_depth=FIFO_DEPTH) for j in range(CORE_COLS)]
    b_col = [b_in[j].cons().forward(obj_type=b_ty, name=f"B{j}_col", placement=Tile(j, 1)) for j in range(CORE_COLS)]
    c_out = [ObjectFifo(c_col_ty, name=f"C{j}_shim", default_depth=FIFO_DEPTH) for j in range(CORE_COLS)]
    c_tiles = [
        c_out[j]
        .prod()
        .join(
            [i * m * n for i in range(CORE_ROWS)],
            obj_types=[c_ty] * CORE_ROWS,
            names=[f"C{j}_{i}" for i in range(CORE_ROWS)],
            depths=[FIFO_DEPTH] * CORE_ROWS,
            placement=Tile(j, 1),
        )
        for j in range(CORE_COLS)
    ]

    def core(a, b, c, zero_fn, matmul_fn):
        for _ in range_(tn) if tn > 1 else range(1):
            tile = c.acquire(1)
            zero_fn(tile)
            for _ in range_(k_steps) if k_steps > 1 else range(1):
                ta, tb = a.acquire(1), b.acquire(1)
                matmul_fn(ta, tb, tile)
                a.release(1)
                b.release(1)
            c.release(1)

    workers = [
        Worker(core, [a_row[i].cons(), b_col[j].cons(), c_tiles[j][i].prod(), zero, matmul], placement=Tile(j, 2 + i))
        for i in range(CORE_ROWS)
        for j in range(CORE_COLS)
    ]

    rt = Runtime()
    with rt.sequence(A_ty, B_ty, C_ty) as (A, B, C):
        rt.start(*workers)
        tg = rt.task_group()
        for i in range(CORE_ROWS):  # A packed [M/m][K/k][tile]: row block i is one run, sent tn times
            rt.fill(
                a_in[i].prod(),
                A,
                tap=_linear(M * K, i * m * K, m * K, isz_in, repeat=tn),
                task_group=tg,
                placement=Tile(i, 0),
            )
        for j in range(CORE_COLS):  # B packed [N/n][K/k][tile]: blocks j*tn.. are one run
            rt.fill(
                b_in[j].prod(),
                B,
                tap=_linear(K * N, j * tn * K * n, tn * K * n, isz_in),
                task_group=tg,
                placement=Tile(j, 0),
            )
        for j in range(CORE_COLS):  # C packed [N/n][M/m][tile]: column j's blocks are one run
            rt.drain(
                c_out[j].cons(),
                C,
                tap=_linear(M * N, j * tn * M * n, tn * M * n, isz_out),
                wait=True,
                task_group=tg,
                placement=Tile(j, 0),
            )
        rt.finish_task_group(tg)
    return Program(NPU1Col4(), rt).resolve_program(SequentialPlacer())


def main(argv=None):
    specs = {s.name: s for s in DEFAULT_SPECS}
    ap = argparse.ArgumentParser(description="emit the MLIR of one Phoenix Chat GEMM kernel")
    ap.add_argument("--spec", choices=sorted(specs), required=True)
    args = ap.parse_args(argv)
    print(build_module(specs[args.spec]))


if __name__ == "__main__":
    main()
