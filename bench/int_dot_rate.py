"""How fast does the device run the packed int8 dot product, beside f32 and f16 FMAs? A probe.

    python -m bench.int_dot_rate [--groups 4096] [--iters 2048] [--json OUT]

bench/shaders/int_dot_rate.comp runs 8 independent accumulator chains per invocation through
`iters` rounds of one instruction kind: OpSDot then an integer add (as the engine's int8 kernels
write it), OpSDotAccSat (dot and accumulate in one instruction), f32 fma, f16vec2 fma. Printed:
instructions and multiply-adds per second, and each kind's instruction rate over the f32 fma's.
Why: on an H100 the int8 multi-column matvec's cost per extra vector held at ~4 x 10^12 dot
instructions a second whatever its loads looked like (docs/PERFORMANCE.md, "The multi-column
matvec's vectors staged in shared memory"); this says whether that is the instruction's own rate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench import shaders as probes
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.timing import time_many

CHAINS = 8  # the shader's independent accumulators per invocation
WG = 256
OPS = {0: ("sdot + add", 4), 1: ("sdot_acc_sat", 4), 2: ("f32 fma", 1), 3: ("f16vec2 fma", 2)}  # name, MACs a lane


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=2048, help="rounds (up to ~30,000: the sums stay in int32)")
    ap.add_argument("--software", action="store_true", help="allow a CPU Vulkan device (smoke test)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = Device.open(allow_software=args.software)
    if not dev.caps.int_dot:
        print(f"{dev.name} has no shaderIntegerDotProduct")
        return 1
    probes.register(dev)
    out_buf = dev.buffer(4 * WG * args.groups)
    records = {}
    for op in OPS:
        p = dev.pipeline("int_dot_rate", WG=WG, OP=op)

        def record(cl, p=p):
            cl.dispatch(p, [out_buf], args.groups, p.push.pack(iters=args.iters, seed=7))

        records[op] = record
    times = time_many(dev, records, reps=4)
    results = {}
    for op in (0, 1):  # the two dot kinds compute the same sums (no saturation at these sizes)
        cl = dev.commands()
        records[op](cl)
        cl.run()
        cl.destroy()
        results[op] = dev.download(out_buf, np.uint32).copy()
    agree = bool((results[0] == results[1]).all())
    lanes = WG * args.groups * CHAINS * args.iters  # instructions of the timed kind per dispatch
    rows = []
    fma_rate = lanes / times[2]
    print(f"{dev.name}: {args.groups} workgroups of {WG}, {CHAINS} chains x {args.iters} rounds")
    print(f"sdot + add and sdot_acc_sat agree: {agree}")
    for op, (name, macs) in OPS.items():
        rate = lanes / times[op]  # per µs
        rows.append({"op": name, "us": round(times[op], 1), "instr_per_s": rate * 1e6, "macs_per_s": rate * macs * 1e6})
        print(
            f"{name:14s} {times[op]:10.1f} us  {rate * 1e-6:8.2f} T instr/s  {rate * macs * 1e-6:8.2f} T MAC/s"
            f"  {rate / fma_rate:5.2f}x the f32 fma's instruction rate"
        )
    out_buf.destroy()
    if args.json:
        Path(args.json).write_text(json.dumps({"device": dev.name, "rows": rows, "dot_kinds_agree": agree}, indent=1))
    dev.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
