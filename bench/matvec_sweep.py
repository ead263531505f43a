"""Matvec kernel sweep on one device: GB/s per (path, WG, ROWS) for Gemma-shaped Q4_0 matrices.

    python -m bench.matvec_sweep [--types q4_0,q8_0] [--copies 8] [--json OUT]
GPU timestamps, median of repeated dispatches separated by barriers (dependent, like decode),
every candidate of a shape recorded first and timed with the GPU kept busy (timing.time_many).
A wider grid than the load-time autotune (autotune.autotune_matvecs), which times a few of
these shapes on the model's own matrices with the same `timing.time_many`.
A matrix that fits the GPU's L2 (H100: 50 MB) partly stays there across repeated dispatches,
so its GB/s with one copy is above a decode step's (27B QKV: 2.58 TB/s, ~1.4 in a step);
--copies 8 times each repeat on its own copy, read from memory as in a step.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.matvec import WeightMatrix, q8_1_bytes, record_matvec, record_quantize
from phoenix_chat.engine.backends.vulkan.timing import time_many

SHAPES = [
    (21504, 5376),
    (5376, 21504),
    (8192, 5376),
    (5376, 4096),
    (10240, 2560),
    (2048, 640),
]  # 27B gate|up, down, qkv, o; 4B gate; 270M gate


def random_blocks(qtype, rows, cols, rng):
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    raw[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def spec_record(dev, ms, xb, xq, yb, spec, int_dot):
    """A recorder of one matvec; each call takes the next of the copies `ms` (timing.time_many
    records it once per repeat), so with enough copies no repeat finds its matrix in L2."""
    copies = itertools.cycle(ms)
    if int_dot:
        return lambda cl: record_matvec(cl, dev, [next(copies)], xq, yb, int_dot=True, spec=spec)
    return lambda cl: record_matvec(cl, dev, [next(copies)], xb, yb, spec=spec)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="q4_0,q8_0")
    ap.add_argument("--json")
    ap.add_argument(
        "--copies", type=int, default=1, help="distinct copies of each matrix, used in turn (8: none is read from L2)"
    )
    args = ap.parse_args(argv)
    dev = Device.open(allow_software=True)
    print(dev.caps.summary(), flush=True)
    rng = np.random.default_rng(0)
    out = []
    sg = dev.caps.subgroup_size
    specs = [dict(WG=w, ROWS=r, THREAD_ROWS=0, SUBGROUP_ROWS=0) for w in (32, 128, 256) for r in (2, 4, 8)]
    specs += [dict(WG=k * sg, ROWS=r, THREAD_ROWS=0, SUBGROUP_ROWS=k) for k in (1, 2, 4, 8) for r in (1, 2, 4)]
    for tname in args.types.split(","):
        qt = Q[tname.upper()]
        for rows, cols in SHAPES:
            blocks = random_blocks(qt, rows, cols, rng)
            ms = [WeightMatrix.upload(dev, blocks, qt, (rows, cols)) for _ in range(args.copies)]
            m = ms[0]
            xb = dev.buffer(cols * 4)
            dev.upload(xb, rng.standard_normal(cols).astype(np.float32))
            xq = dev.buffer(q8_1_bytes(cols))
            cl = dev.commands()
            record_quantize(cl, dev, xb, xq, cols)
            cl.submit()
            yb = dev.buffer(rows * 4)
            grid = [
                (int_dot, i) for int_dot in ((False, True) if dev.caps.int_dot else (False,)) for i in range(len(specs))
            ]
            times = time_many(dev, {(d, i): spec_record(dev, ms, xb, xq, yb, specs[i], d) for d, i in grid}, 20)
            for (int_dot, i), us in times.items():
                spec = specs[i]
                gbs = m.nbytes / us / 1e3
                out.append(
                    dict(type=tname, rows=rows, cols=cols, copies=args.copies, int_dot=int_dot, **spec, us=us, gb_s=gbs)
                )
                print(
                    f"{tname} {rows}x{cols} {'int8' if int_dot else 'f32 '} WG={spec['WG']:3d} "
                    f"ROWS={spec['ROWS']} SGR={spec['SUBGROUP_ROWS']}: {us:8.1f} us {gbs:8.1f} GB/s",
                    flush=True,
                )
            for c in ms:
                c.tensor.buffer.destroy()
            for b in (xb, xq, yb):
                b.destroy()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
