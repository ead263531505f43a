"""Decode attention alone: GPU microseconds of one attention_decode dispatch behind a barrier, by
model shape and split count, each repeat on its own KV cache (read from memory, as in a step).

    python -m bench.attention_sweep [--positions 648] [--json OUT]
Where a decode step's attention time goes: the split-K work against the last workgroup's combine
of the splits (n_splits = 1 has no combine to speak of but walks every position in one
workgroup per kv head), beside a tiny dispatch's cost on the same device.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from phoenix_chat.engine.backends.vulkan import ops_attention
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.ops_common import pack_step
from phoenix_chat.engine.backends.vulkan.timing import time_us

SHAPES = {  # head_dim, query heads, kv heads
    "270m": (256, 4, 1),
    "4b": (256, 8, 4),
    "27b": (128, 32, 16),
}
CACHES = 16
CHAIN = 16


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=648)
    ap.add_argument("--splits", default="1,8,21,41,64")
    ap.add_argument("--wg", type=int, default=128, help="workgroup size")
    ap.add_argument("--software", action="store_true", help="allow a CPU Vulkan device (smoke test)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = Device.open(allow_software=args.software)
    n = args.positions
    out: dict = {"device": dev.name, "positions": n}
    step = dev.buffer(64, host=True)
    step.write(np.frombuffer(pack_step(pos=n - 1).ljust(64, b"\0"), np.uint8))
    rng = np.random.default_rng(0)
    for shape, (hd, h, kv) in SHAPES.items():
        caches = []
        for _ in range(CACHES):
            pair = []
            for _ in range(2):
                b = dev.buffer(kv * n * hd * 2)
                dev.upload(b, rng.standard_normal(kv * n * hd).astype(np.float16).view(np.uint8))
                pair.append(b)
            caches.append(pair)
        q = dev.buffer(h * hd * 4)
        dev.upload(q, rng.standard_normal(h * hd).astype(np.float32).view(np.uint8))
        o = dev.buffer(h * hd * 4)
        counters = dev.buffer(4 * ops_attention.counter_words(kv))
        dev.upload(counters, np.zeros(ops_attention.counter_words(kv), np.uint32).view(np.uint8))
        for s in [int(x) for x in args.splits.split(",")]:
            part = dev.buffer(4 * ops_attention.partial_floats(h, hd, s))

            def record(cl, s=s, part=part):
                for i in range(CHAIN):
                    k, v = caches[i % CACHES]
                    ops_attention.attention_decode(
                        cl,
                        dev,
                        step,
                        q,
                        k,
                        v,
                        part,
                        counters,
                        o,
                        head_dim=hd,
                        n_heads=h,
                        n_kv_heads=kv,
                        cache_slots=n,
                        window=0,
                        scale=0.0625,
                        n_splits=s,
                        wg=args.wg,
                    )
                    cl.barrier()

            time_us(dev, record, reps=4)  # clocks up
            us = time_us(dev, record, reps=8) / CHAIN
            out[f"{shape}_splits{s}_us"] = us
            print(f"{shape:5s} splits {s:3d}: {us:7.2f} us", flush=True)
            part.destroy()
        for pair in caches:
            for b in pair:
                b.destroy()
        for b in (q, o, counters):
            b.destroy()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
