"""Multi-column matvec sweep on one device: µs and weight GB/s of Y = W X for B vectors on
Gemma-shaped matrices, through the int8 multi-column matvec (matvec_cols.comp) in each
workgroup shape (rows per subgroup x column tile), the f32 multi-column matvec (matvec.comp
NCOLS, B <= 8) and, as the baseline, B single-vector int8 matvecs.

    python -m bench.cols_sweep [--shape 27b|4b] [--batches 1,2,4,8,16,32] [--copies 4] [--json OUT]

GPU timestamps through timing.time_many (the load-time autotune's timer); each repeat takes the
next of `copies` copies of the matrix, so few repeats find it in L2 (as in a decode step).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

from bench.matvec_sweep import random_blocks
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.matvec import (
    WeightMatrix,
    q8_1_bytes,
    record_matvec,
    record_quantize,
    subgroup_rows_spec,
)
from phoenix_chat.engine.backends.vulkan.matvec_cols import COLS_TILES, cols_spec, record_matvec_cols
from phoenix_chat.engine.backends.vulkan.timing import time_many

# (name, rows, cols, matrices, epilogue): one layer's products and the LM head (Q8_0, as the
# synthetic files' tied embedding)
SHAPES = {
    "27b": [
        ("qkv", 8192, 5376, 1, None),
        ("o", 5376, 4096, 1, None),
        ("gate_up", 21504, 5376, 2, "geglu"),
        ("down", 5376, 21504, 1, None),
    ],
    "27b_parts": [  # the products the 27B's prefill runs apart (q, k, v) and a gate without its GEGLU pair
        ("q", 4096, 5376, 1, None),
        ("kv", 2048, 5376, 1, None),
        ("gate", 21504, 5376, 1, None),
    ],
    "heads": [  # the LM heads (262,144 rows: Gemma 3's vocabulary), Q8_0 in Gemma 3's Q4_0 files
        ("lm_head_27b", 262144, 5376, 1, None),
        ("lm_head_4b", 262144, 2560, 1, None),
    ],
    "tiny": [("qkv", 96, 640, 1, None), ("gate_up", 128, 640, 2, "geglu")],  # a smoke run (lavapipe)
    "4b": [
        ("qkv", 4096, 2560, 1, None),
        ("o", 2560, 2048, 1, None),
        ("gate_up", 10240, 2560, 2, "geglu"),
        ("down", 2560, 10240, 1, None),
    ],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="27b", choices=sorted(SHAPES))
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--rows", default="1,2,4", help="rows per subgroup of the int8 multi-column shapes")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    dev = Device.open(allow_software=True)
    rng = np.random.default_rng(0)
    out: list[dict[str, object]] = []
    maxb = max(batches)
    for name, rows, cols, n_mats, epi in SHAPES[args.shape]:
        copies = [
            [
                WeightMatrix.upload(dev, random_blocks(Q.Q4_0, rows, cols, rng), Q.Q4_0, (rows, cols))
                for _ in range(n_mats)
            ]
            for _ in range(args.copies)
        ]
        nbytes = sum(m.nbytes for m in copies[0])
        x = rng.standard_normal(maxb * cols).astype(np.float32)
        xb, xq = dev.buffer(x.nbytes), dev.buffer(q8_1_bytes(x.size))
        yb = dev.buffer(maxb * rows * 4)
        dev.upload(xb, x)
        cl = dev.commands()
        record_quantize(cl, dev, xb, xq, x.size)
        cl.submit()
        cl.destroy()
        records = {}
        for B in batches:

            def single(cl, it=itertools.cycle(copies), B=B):
                ms = next(it)
                spec = subgroup_rows_spec(dev, 2)
                for t in range(B):
                    record_matvec(
                        cl, dev, ms, xq, yb, epilogue=epi, int_dot=True, x_off=t * cols // 32, y_off=t * rows, spec=spec
                    )

            records[(B, "int8 x B")] = single
            for r in (int(v) for v in args.rows.split(",")):
                for tile in COLS_TILES:
                    if tile > 2 * B and tile != COLS_TILES[0]:
                        continue  # a tile far wider than B only idles its registers

                    def cols_rec(cl, it=itertools.cycle(copies), B=B, spec=cols_spec(dev, B, rows=r, tile=tile)):
                        record_matvec_cols(
                            cl,
                            dev,
                            next(it),
                            xq,
                            yb,
                            n_vecs=B,
                            x_stride=cols // 32,
                            y_stride=rows,
                            epilogue=epi,
                            spec=spec,
                        )

                    records[(B, f"cols r{r} t{tile}")] = cols_rec
            if 2 <= B <= 8:

                def f32_rec(cl, it=itertools.cycle(copies), B=B):
                    record_matvec(cl, dev, next(it), xb, yb, epilogue=epi, x_stride=cols, y_stride=rows, columns=B)

                records[(B, "f32 cols")] = f32_rec
        times = time_many(dev, records, reps=8)
        for (B, kind), us in sorted(times.items()):
            out.append({"shape": args.shape, "matrix": name, "B": B, "kind": kind, "us": round(us, 1)})
        for B in batches:
            row = {k: us for (b, k), us in times.items() if b == B}
            best = min(row, key=row.__getitem__)
            print(
                f"{args.shape} {name:8s} B={B:2d}: "
                + "  ".join(f"{k} {us:.0f}" for k, us in sorted(row.items(), key=lambda kv: kv[1])[:5])
                + f"   | best {best}: {nbytes / row[best] / 1e3:.0f} GB/s, {row['int8 x B'] / row[best]:.2f}x int8 x B"
            )
        for ms in copies:
            for m in ms:
                m.tensor.buffer.destroy()
        for b in (xb, xq, yb):
            b.destroy()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    dev.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
