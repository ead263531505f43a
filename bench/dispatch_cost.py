"""What one dependent dispatch costs on a device, apart from its work: the floor under a
decode token's ~10 dependent steps per layer.

    python -m bench.dispatch_cost [--json OUT]
Times chains of dispatches (GPU timestamps, median of repeats): a one-workgroup kernel with a
barrier after each (the cost of launch + drain + barrier), the same with a compute-only
barrier, the same with no barrier (launch alone), and streaming copies of decode-matvec sizes
with a barrier after each (each copy on its own buffers, so none is served from L2), whose
excess over bytes / copy bandwidth is the ramp-up and tail a dependent step pays.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.backends.vulkan.device import Device  # noqa: E402
from engine.backends.vulkan.timing import time_us  # noqa: E402

CHAIN = 64


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--software", action="store_true", help="allow a CPU Vulkan device (smoke test)")
    ap.add_argument("--scale", type=float, default=1.0, help="scale the copy sizes (smoke test: 0.01)")
    args = ap.parse_args(argv)
    dev = Device.open(allow_software=args.software)
    p = dev.pipeline("copy_u32x4", WG=256)
    a, b = dev.buffer(64 << 20), dev.buffer(64 << 20)
    out: dict = {"device": dev.name}

    def chain(barrier):
        def record(cl):
            for _ in range(CHAIN):
                cl.dispatch(p, [a, b], (1, 1, 1), p.push.pack(n=1))
                barrier(cl)
        return time_us(dev, record, reps=8) / CHAIN

    for _ in range(3):        # clocks up
        chain(lambda cl: cl.barrier())
    out["tiny_dispatch_barrier_us"] = chain(lambda cl: cl.barrier())
    out["tiny_dispatch_compute_barrier_us"] = chain(lambda cl: cl.barrier(transfer=False))
    out["tiny_dispatch_no_barrier_us"] = chain(lambda cl: None)

    big = int((1 << 30) * args.scale)
    big = min(big, dev.caps.max_storage_buffer_range) // 16 * 16
    ba, bb = dev.buffer(big), dev.buffer(big)

    def copy_us(nbytes, transfer=True, pairs=None):
        """One copy of nbytes, from a chain of 8 with a barrier after each. `pairs`: 8 distinct
        (src, dst) buffers, one per copy, so small copies do not run out of L2 (H100: 50 MB)."""
        n16 = nbytes // 16
        groups = min(65535, max(1, -(-n16 // 256 // 4)))

        def record(cl):
            for k in range(8):
                src, dst = pairs[k] if pairs else (ba, bb)
                cl.dispatch(p, [src, dst], (groups, 1, 1), p.push.pack(n=n16))
                cl.barrier(transfer=transfer)
        return time_us(dev, record, reps=4) / 8

    bw = 2 * big / (copy_us(big) * 1e-6) / 1e9
    out["copy_gb_s"] = bw
    sizes = {"o_27b_12MB": 12_386_304, "qkv_27b_25MB": 24_772_608, "down_27b_65MB": 65_028_096,
             "gate_up_27b_130MB": 130_056_192}
    for name, nbytes in sizes.items():
        nbytes = int(nbytes * args.scale) // 32 * 32
        pairs = [(dev.buffer(nbytes // 2), dev.buffer(nbytes // 2)) for _ in range(8)]
        us = copy_us(nbytes // 2, pairs=pairs)   # read + write = nbytes moved, as a matvec reads its weights
        for pair in pairs:
            for buf in pair:
                buf.destroy()
        ideal = nbytes / (bw * 1e9) * 1e6
        out[f"copy_{name}_us"] = us
        out[f"copy_{name}_pct_of_bw"] = 100 * ideal / us
        out[f"copy_{name}_overhead_us"] = us - ideal
    for k, v in out.items():
        print(f"{k:40s} {v:.2f}" if isinstance(v, float) else f"{k:40s} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
