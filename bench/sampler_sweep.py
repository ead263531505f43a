"""GPU time of the samplers alone: B rows of Gaussian logits (a batched decode step's sampling),
through the top-k sampler in each block shape (workgroup x logits a workgroup takes) and the
argmax as the floor, in one dispatch each (the batched step's `sample_*_rows`).

    python -m bench.sampler_sweep [--rows 32] [--vocab 262144] [--shapes 256x1024,512x2048,1024x4096] [--json OUT]

GPU timestamps through timing.time_many (the load-time autotune's timer), each shape twice. Every
top-k shape must draw the same ids (same logits, seeds and settings): the run says whether they
did. On an H100 this is where blocks of 4,096 came from (docs/PERFORMANCE.md): a top-k block's
fixed costs outweighed its 1,024 logits.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.memory import Buffer
from phoenix_chat.engine.backends.vulkan.ops_common import STEP_ROW_BYTES, pack_step
from phoenix_chat.engine.backends.vulkan.ops_sample import BLOCK, KC, sample, scratch_bytes, topk_shape
from phoenix_chat.engine.backends.vulkan.recorder import CommandList
from phoenix_chat.engine.backends.vulkan.timing import time_many

TOKENS_PER_ROW = 16  # each row's slice of the token buffer (its draw lands at position 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--shapes", default="", help="WGxBLOCK,... of the top-k sampler (default: 256x1024 and up)")
    ap.add_argument("--software", action="store_true", help="allow a CPU Vulkan device (smoke test)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = Device.open(allow_software=args.software)
    R, V = args.rows, args.vocab
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    if not shapes:
        widest = topk_shape(dev)[0]
        shapes = [(wg, 4 * wg) for wg in (256, 512, 1024) if wg <= widest]
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((R, V)) * 3).astype(np.float32)
    crow = scratch_bytes(V)  # a row's candidates: enough for every sampler and block shape
    bufs: list[Buffer] = []

    def buffer(nbytes: int, data: np.ndarray | None = None, host: bool = False) -> Buffer:
        b = dev.buffer(nbytes, host=host)
        bufs.append(b)
        if data is not None:
            dev.upload(b, data.reshape(-1).view(np.uint8))
        return b

    try:
        lb = buffer(logits.nbytes, logits)
        cand = buffer(R * crow)
        counters = buffer(4 * R, np.zeros(R, np.uint32))
        tokens = buffer(4 * R * TOKENS_PER_ROW, np.zeros(R * TOKENS_PER_ROW, np.uint32))

        def step_rows(temperature: float) -> Buffer:
            """R rows' Steps: a row draws only in the sampler its settings select (sample.comp)."""
            rows = np.zeros(R * STEP_ROW_BYTES, np.uint8)
            for r in range(R):
                d = pack_step(
                    n_tokens=1, seed=r, top_k=40, temperature=temperature, top_p=0.95, tok_base=r * TOKENS_PER_ROW
                )
                rows[r * STEP_ROW_BYTES : r * STEP_ROW_BYTES + len(d)] = np.frombuffer(d, np.uint8)
            b = buffer(R * STEP_ROW_BYTES, host=True)
            b.write(rows)
            return b

        sampled_steps, greedy_steps = step_rows(0.8), step_rows(0.0)

        def recorder(wg: int, block: int, greedy: bool = False):
            steps = greedy_steps if greedy else sampled_steps

            def record(cl: CommandList) -> None:
                sample(
                    cl, dev, steps, lb, cand, counters, tokens, vocab=V, greedy=greedy, advance=False,
                    wg=wg, block=block, kc=KC, rows=R, row_strides=(V * 4, crow, 4),
                )  # fmt: skip

            return record

        records = {f"topk {wg}x{block}": recorder(wg, block) for wg, block in shapes}
        records[f"argmax 256x{BLOCK}"] = recorder(256, BLOCK, greedy=True)
        best: dict[str, float] = {}
        for _ in range(2):
            for name, us in time_many(dev, records, reps=8).items():
                best[name] = min(us, best.get(name, us))
        draws: dict[str, list[int]] = {}
        for name, record in records.items():
            cl = dev.commands()
            record(cl)
            cl.end()
            cl.submit(wait=True)
            cl.destroy()
            draws[name] = dev.download(tokens, np.uint32).reshape(R, TOKENS_PER_ROW)[:, 1].tolist()
    finally:
        for b in bufs:
            b.destroy()
    agree = len({tuple(d) for name, d in draws.items() if name.startswith("topk")}) == 1
    print(f"{dev.name}: {R} rows of {V} logits, top-k 40 / top-p 0.95")
    for name, us in best.items():
        print(f"  {name:20s} {us:9.1f} us  {us / R:7.1f} us a row")
    print(f"  the top-k shapes drew the same ids: {agree}")
    if args.json:
        report = {"device": dev.name, "rows": R, "vocab": V, "us": best, "draws": draws, "agree": agree}
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
