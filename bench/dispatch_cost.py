"""What one dependent dispatch costs on a device, apart from its work: the floor under a
decode token's ~10 dependent steps per layer.

    python -m bench.dispatch_cost [--json OUT]
Times chains of dispatches (GPU timestamps, median of repeats): a one-workgroup kernel with a
barrier after each (the cost of launch + drain + barrier), the same with a compute-only
barrier, the same with no barrier (launch alone), and streaming copies of decode-matvec sizes
with a barrier after each (each copy on its own buffers, so none is served from L2), whose
excess over bytes / copy bandwidth is the ramp-up and tail a dependent step pays.

--handoff also times a small kernel followed by a weight stream that depends on it, the
stream either behind a pipeline barrier or launched with no barrier and spinning on a flag
the small kernel sets (bench/shaders/handoff_probe.comp): how much of the barrier and the stream's
ramp-up a flag handoff would hide.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import shaders as probes
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.timing import time_many, time_us

CHAIN = 64


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--software", action="store_true", help="allow a CPU Vulkan device (smoke test)")
    ap.add_argument("--scale", type=float, default=1.0, help="scale the copy sizes (smoke test: 0.01)")
    ap.add_argument("--handoff", action="store_true", help="also time barrier vs flag handoffs")
    args = ap.parse_args(argv)
    dev = Device.open(allow_software=args.software)
    probes.register(dev)
    p = dev.pipeline("copy_u32x4", WG=256)
    a, b = dev.buffer(64 << 20), dev.buffer(64 << 20)
    out: dict = {"device": dev.name}

    def chain(barrier):
        def record(cl):
            for _ in range(CHAIN):
                cl.dispatch(p, [a, b], (1, 1, 1), p.push.pack(n=1))
                barrier(cl)

        return time_us(dev, record, reps=8) / CHAIN

    for _ in range(3):  # clocks up
        chain(lambda cl: cl.barrier())
    out["tiny_dispatch_barrier_us"] = chain(lambda cl: cl.barrier())
    out["tiny_dispatch_compute_barrier_us"] = chain(lambda cl: cl.barrier(transfer=False))
    out["tiny_dispatch_no_barrier_us"] = chain(lambda cl: None)

    def copy_us(nbytes, pairs):
        """One copy of nbytes, from a chain of 8 with a barrier after each, each on its own
        (src, dst) of `pairs`, so small copies do not run out of L2 (H100: 50 MB)."""
        n16 = nbytes // 16
        groups = min(65535, max(1, -(-n16 // 256 // 4)))

        def record(cl):
            for src, dst in pairs:
                cl.dispatch(p, [src, dst], (groups, 1, 1), p.push.pack(n=n16))
                cl.barrier()

        return time_us(dev, record, reps=4) / len(pairs)

    bw = copy_gb_s(dev, int((1 << 30) * args.scale))
    out["copy_gb_s"] = bw
    sizes = {
        "o_27b_12MB": 12_386_304,
        "qkv_27b_25MB": 24_772_608,
        "down_27b_65MB": 65_028_096,
        "gate_up_27b_130MB": 130_056_192,
    }
    for name, nbytes in sizes.items():
        nbytes = int(nbytes * args.scale) // 32 * 32
        pairs = [(dev.buffer(nbytes // 2), dev.buffer(nbytes // 2)) for _ in range(8)]
        us = copy_us(nbytes // 2, pairs)  # read + write = nbytes moved, as a matvec reads its weights
        for pair in pairs:
            for buf in pair:
                buf.destroy()
        ideal = nbytes / (bw * 1e9) * 1e6
        out[f"copy_{name}_us"] = us
        out[f"copy_{name}_pct_of_bw"] = 100 * ideal / us
        out[f"copy_{name}_overhead_us"] = us - ideal
    if args.handoff:
        out.update(handoff(dev, sizes, args.scale))
    for k, v in out.items():
        print(f"{k:40s} {v:.2f}" if isinstance(v, float) else f"{k:40s} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def copy_gb_s(dev, nbytes: int) -> float:
    """Copy bandwidth (bytes read + written per second, in GB/s) of a compute-shader copy of
    nbytes, from a chain of 8 with a barrier after each: the roofline the benchmarks quote."""
    p = dev.pipeline("copy_u32x4", WG=256)
    nbytes = min(nbytes, dev.caps.max_storage_buffer_range) // 16 * 16
    src, dst = dev.buffer(nbytes), dev.buffer(nbytes)
    n16 = nbytes // 16
    groups = min(65535, max(1, -(-n16 // 256 // 4)))

    def record(cl):
        for _ in range(8):
            cl.dispatch(p, [src, dst], (groups, 1, 1), p.push.pack(n=n16))
            cl.barrier()

    us = time_us(dev, record, reps=4) / 8
    src.destroy()
    dst.destroy()
    return 2 * nbytes / (us * 1e-6) / 1e9


def handoff(dev, sizes: dict, scale: float) -> dict:
    """Per layer of a chain of 8: producer then consumer stream, with a barrier between them
    or a flag; and each alone. Every layer streams its own weights (none from L2)."""
    m = 5376  # the 27B shape's hidden size
    wg = 256
    producers = -(-m // wg)
    vbuf = dev.buffer(8 * m)
    flags = dev.buffer(256)
    cl = dev.commands()
    cl.fill(flags, 0)
    cl.fill(vbuf, 0)
    cl.run()
    cl.destroy()
    prod = dev.pipeline("handoff_probe", WG=wg, ROLE=0, WAIT=0)
    cons = {w: dev.pipeline("handoff_probe", WG=wg, ROLE=1, WAIT=w) for w in (0, 1)}
    out = {}
    for name, nbytes in sizes.items():
        nbytes = int(nbytes * scale) // 16 * 16
        n16 = nbytes // 16
        groups = min(65535, max(1, -(-n16 // wg // 4)))
        weights = [dev.buffer(nbytes) for _ in range(8)]
        obuf = dev.buffer(groups * wg * 4)
        for reps in (0, 2000):
            push = prod.push.pack(n=n16, m=m, producers=producers, reps=reps)

            def layers(producer, barrier_between, wait):
                def record(cl):
                    for k in range(8):
                        if producer:
                            cl.dispatch(prod, [weights[k], vbuf, flags, obuf], (producers, 1, 1), push)
                            if barrier_between:
                                cl.barrier(transfer=False)
                        if wait is not None:
                            cl.dispatch(cons[wait], [weights[k], vbuf, flags, obuf], (groups, 1, 1), push)
                        cl.barrier(transfer=False)

                return record

            t = time_many(
                dev,
                {
                    "barrier": layers(True, True, 0),
                    "flag": layers(True, False, 1),
                    "stream": layers(False, False, 0),
                    "small": layers(True, False, None),
                },
                reps=4,
            )
            for k, us in t.items():
                out[f"handoff_{name}_reps{reps}_{k}_us"] = us / 8
        for b in weights + [obuf]:
            b.destroy()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
