"""Prefill GEMM sweep on one device: µs and TFLOP/s of y = x W^T for a chunk of tokens on
Gemma-shaped matrices, through every GEMM kernel the device has (ops_gemm.KERNELS: each
matrix-core tile, or the tiled / register-tiled kernels, and on a GPU with the int8 dot each
int8 tile, timed with the quantize of x it needs), and how far each kernel's y is from
the first kernel's (a quick check that a new tile computes the same thing; the tests compare
against numpy).

    python -m bench.gemm_sweep [--shape 27b|4b|tiny] [--types q4_0,q4_k,f16] [--tokens 512]
                               [--kernels coopmat_l,coopmat_w] [--json OUT]

GPU timestamps through timing.time_many (the load-time autotune's timer, which keeps the clocks
up between candidates). FLOPs count 2 per multiply-add (the GEGLU: both products).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.cols_sweep import SHAPES
from bench.matvec_sweep import random_blocks
from phoenix_chat.engine.backends.vulkan import ops_gemm
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.matvec import WeightMatrix, q8_1_bytes
from phoenix_chat.engine.backends.vulkan.timing import time_many


def weights(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw GGUF rows of one matrix: random blocks with a small scale (f16: small normals)."""
    if qtype == Q.F16:
        return (0.02 * rng.standard_normal((rows, cols))).astype(np.float16).view(np.uint8)
    return random_blocks(qtype, rows, cols, rng)


def kernels_of(dev: Device, wanted: str | None) -> list[str]:
    if wanted:
        return wanted.split(",")
    out = (
        [*ops_gemm.COOPMAT_KERNELS, *ops_gemm.CF_KERNELS, *ops_gemm.CF_PREFILL_KERNELS]
        if ops_gemm.coopmat_ok(dev)
        else [ops_gemm.kernel(dev)]
    )
    if dev.caps.int_dot and not dev.caps.is_software:
        out += list(ops_gemm.INT8_KERNELS)
    return out


def refusal(dev: Device, kn: str, wtype: str, m: int, rows: int, cols: int, geglu: bool) -> str | None:
    """Why tile `kn` does not run this product here (the int8 and few-token tiles refuse some)."""
    if kn in ops_gemm.INT8_KERNELS:
        return ops_gemm.int8_refusal(dev, wtype, cols, kn, geglu)
    if kn in ops_gemm.CF_KERNELS or kn in ops_gemm.CF_PREFILL_KERNELS:
        return ops_gemm.cf_refusal(dev, wtype, cols, kn, geglu, m, rows)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="27b", choices=sorted(SHAPES))
    ap.add_argument("--types", default="q4_0,q4_k,f16")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--kernels", help="comma-separated ops_gemm.KERNELS (default: every one the device has)")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = Device.open(allow_software=True)
    print(dev.caps.summary(), flush=True)
    rng = np.random.default_rng(0)
    m = args.tokens
    kernels = kernels_of(dev, args.kernels)
    out: list[dict[str, object]] = []
    for tname in args.types.split(","):
        qtype = Q[tname.upper()]
        for name, rows, cols, n_mats, epi in SHAPES[args.shape]:
            mats = [
                WeightMatrix.upload(dev, weights(qtype, rows, cols, rng), qtype, (rows, cols)) for _ in range(n_mats)
            ]
            x = rng.standard_normal((m, cols)).astype(np.float32)
            xb, yb, xq = dev.buffer(x.nbytes), dev.buffer(m * rows * 4), dev.buffer(q8_1_bytes(m * cols))
            dev.upload(xb, x)
            up = mats[1].tensor if epi == "geglu" else None

            def record(cl, kn: str) -> None:
                int8_x = ops_gemm.int8_input(cl, dev, kn, xb, xq, m * cols)  # timed with it, as in a forward
                ops_gemm.gemm(
                    cl,
                    dev,
                    xb,
                    mats[0].tensor,
                    yb,
                    wtype=qtype.name,
                    m=m,
                    n=rows,
                    k=cols,
                    w_up=up,
                    kernel_name=kn,
                    xq=int8_x,
                )

            geglu = epi == "geglu"
            refusals = {kn: refusal(dev, kn, qtype.name, m, rows, cols, geglu) for kn in kernels}
            for kn, why in refusals.items():
                if why is not None:
                    print(f"{qtype.name:6} {name:8} {kn:12} skipped: {why}", flush=True)
            runs = [kn for kn in kernels if refusals[kn] is None]
            us = time_many(dev, {kn: (lambda cl, kn=kn: record(cl, kn)) for kn in runs}, reps=args.reps)
            ys = {}
            for kn in runs:
                cl = dev.commands()
                record(cl, kn)
                cl.end()
                dev.submit(cl)
                cl.destroy()
                ys[kn] = dev.download(yb, np.float32, m * rows).copy()
            ref = ys[runs[0]]
            scale = float(np.abs(ref).max()) or 1.0
            flop = 2.0 * m * rows * cols * n_mats
            for kn in runs:
                diff = float(np.abs(ys[kn] - ref).max()) / scale
                row = {
                    "type": qtype.name,
                    "matrix": name,
                    "kernel": kn,
                    "us": round(us[kn], 1),
                    "tflops": flop / us[kn] / 1e6,
                    "max_rel_diff": diff,
                }
                out.append(row)
                print(
                    f"{qtype.name:6} {name:8} {kn:12} {us[kn]:9.1f} us  {row['tflops']:6.1f} TFLOP/s  diff {diff:.1e}",
                    flush=True,
                )
            for buf in [mat.tensor.buffer for mat in mats] + [xb, yb, xq]:
                buf.destroy()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
