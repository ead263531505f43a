"""Attention alone. Decode (default): GPU microseconds of one attention_decode dispatch behind a
barrier, by model shape and split count, each repeat on its own KV cache (read from memory, as
in a step). --prefill: a whole prompt's prefill attention, kernel by kernel (scalar f32 against
the matrix-core flash kernel), for global and local layers.

    python -m bench.attention_sweep [--positions 648] [--json OUT]
    python -m bench.attention_sweep --prefill [--tokens 512,4096,16384] [--shape 27b] [--chunk 512]
        [--prefill-splits 1,2,4,8] [--no-scalar]
Decode: where a step's attention time goes: the split-K work against the last workgroup's
combine of the splits (n_splits = 1 has no combine to speak of but walks every position in one
workgroup per kv head), beside a tiny dispatch's cost on the same device.
Prefill: a prompt of N tokens attended as the engine does it, in chunks of --chunk tokens (each
a dispatch at its position, behind a barrier; --chunk 0: one dispatch for the whole prompt):
global layers over a cache of N positions, local layers over a ring of window + chunk slots.
Reports GPU microseconds per layer and TFLOP/s (4 * head_dim * heads per visible query-key
pair: S = Q K^T and P V, masked pairs not counted). The matrix-core kernel runs with the key split
the engine would choose for the chunk (ops_attention.prefill_splits), and with each count of
--prefill-splits ("coopmat/s4": each query block's keys split between 4 workgroups).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from phoenix_chat.engine.backends.vulkan import ops_attention
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.ops_common import pack_step
from phoenix_chat.engine.backends.vulkan.timing import time_many, time_us

SHAPES = {  # head_dim, query heads, kv heads
    "270m": (256, 4, 1),
    "4b": (256, 8, 4),
    "27b": (128, 32, 16),
}
WINDOWS = {"270m": 512, "1b": 512, "4b": 1024, "12b": 1024, "27b": 1024}  # DESIGN.md
PREFILL_SHAPES = {**SHAPES, "1b": (256, 4, 1), "12b": (256, 16, 8)}
SCALES = {"27b": 168.0}  # query_pre_attn_scalar (256 elsewhere)
CACHES = 16
CHAIN = 16


def visible_pairs(n: int, window: int) -> int:
    """Query-key pairs a causal prompt of n tokens attends (window 0: global)."""
    if not window or window >= n:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def prefill_sweep(dev: Device, args: argparse.Namespace) -> dict:
    """Time every kernel on every prompt length and layer kind; print and return the numbers."""
    hd, h, kv = PREFILL_SHAPES[args.shape]
    window = WINDOWS[args.shape] if args.window is None else args.window
    kernels = [] if args.no_scalar else ["scalar"]
    why = ops_attention.prefill_refusal(dev, hd)
    if why is None:
        kernels.append("coopmat")
        chunk = args.chunk or max(int(x) for x in args.tokens.split(","))
        for n in (int(x) for x in args.prefill_splits.split(",") if x):
            if n > 1 and ops_attention.split_record_bytes(chunk, h, hd, n) > ops_attention.ATTN_SPLIT_BYTES:
                print(f"coopmat/s{n} not run: its records exceed the {ops_attention.ATTN_SPLIT_BYTES} B scratch")
            else:
                kernels.append(f"coopmat/s{n}")
        engine_splits = ops_attention.prefill_splits(chunk, h, kv, hd)
        print(f"the engine splits a {chunk}-token chunk's keys {engine_splits} ways", flush=True)
    else:
        print(f"coopmat prefill attention not run: {why}", flush=True)
    out: dict = {"device": dev.name, "shape": args.shape, "head_dim": hd, "heads": h, "kv_heads": kv}
    out["window"], out["chunk"], out["kernels"] = window, args.chunk, kernels
    if why is None:
        out["engine_splits"] = engine_splits
    rng = np.random.default_rng(0)
    scale = SCALES.get(args.shape, 256.0) ** -0.5
    print(f"{args.shape}: head_dim {hd}, {h}/{kv} heads, window {window}, chunk {args.chunk or 'whole prompt'}")
    for n in [int(x) for x in args.tokens.split(",")]:
        chunk = args.chunk or n
        for layer, w in (("global", 0), ("local", window)):
            slots = n if not w else min(n, w + chunk)
            bufs = []

            def buf(array: np.ndarray, host: bool = False):
                b = dev.buffer(array.nbytes, host=host)
                if host:
                    b.write(array.reshape(-1).view(np.uint8))
                else:
                    dev.upload(b, array.reshape(-1).view(np.uint8))
                bufs.append(b)
                return b

            kc = buf(rng.standard_normal((kv, slots, hd)).astype(np.float16))
            vc = buf(rng.standard_normal((kv, slots, hd)).astype(np.float16))
            q = buf(rng.standard_normal((chunk, h * hd)).astype(np.float32))
            o = buf(np.zeros((chunk, h * hd), np.float32))
            steps = []
            for p0 in range(0, n, chunk):
                raw = pack_step(pos=p0, n_tokens=min(chunk, n - p0)).ljust(64, b"\0")
                steps.append(buf(np.frombuffer(raw, np.uint8).copy(), host=True))

            def record(cl, kernel: str, w=w, slots=slots, chunk=chunk, steps=steps, kc=kc, vc=vc, q=q, o=o):
                for st in steps:
                    ops_attention.attention_prefill(
                        cl,
                        dev,
                        st,
                        q,
                        kc,
                        vc,
                        o,
                        head_dim=hd,
                        n_heads=h,
                        n_kv_heads=kv,
                        cache_slots=slots,
                        window=w,
                        scale=scale,
                        max_tokens=chunk,
                        kernel=kernel.split("/")[0],
                        splits=int(kernel.split("/s")[1]) if "/s" in kernel else None,
                    )
                    cl.barrier()

            flops = 4.0 * hd * h * visible_pairs(n, w)
            times = time_many(dev, {k: (lambda cl, k=k: record(cl, k)) for k in kernels}, reps=args.reps)
            for k in kernels:
                us = times[k]
                out[f"{n}_{layer}_{k}_us"] = us
                out[f"{n}_{layer}_{k}_tflops"] = flops / us / 1e6
                print(f"{n:6d} tokens {layer:6s} {k:7s}: {us:11.1f} us  {flops / us / 1e6:7.2f} TFLOP/s", flush=True)
            if "coopmat" in times and "scalar" in times:
                print(f"{'':20s}coopmat / scalar speed-up {times['scalar'] / times['coopmat']:.2f}x", flush=True)
            for b in bufs:
                b.destroy()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", action="store_true", help="prefill attention kernels instead of decode")
    ap.add_argument("--tokens", default="512,4096,16384", help="--prefill: prompt lengths")
    ap.add_argument("--shape", default="27b", choices=sorted(PREFILL_SHAPES), help="--prefill: model shape")
    ap.add_argument("--chunk", type=int, default=512, help="--prefill: tokens per dispatch (0: whole prompt)")
    ap.add_argument("--window", type=int, help="--prefill: local layers' window (default: the shape's)")
    ap.add_argument("--reps", type=int, default=3, help="--prefill: timed repeats")
    ap.add_argument("--prefill-splits", default="", help="--prefill: key splits to time besides the engine's choice")
    ap.add_argument("--no-scalar", action="store_true", help="--prefill: skip the scalar kernel (slow at 16k)")
    ap.add_argument("--positions", type=int, default=648)
    ap.add_argument("--splits", default="1,8,21,41,64")
    ap.add_argument("--wg", type=int, default=128, help="workgroup size")
    ap.add_argument("--software", action="store_true", help="allow a CPU Vulkan device (smoke test)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = Device.open(allow_software=args.software)
    if args.prefill:
        res = prefill_sweep(dev, args)
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
        return 0
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
