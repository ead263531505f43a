"""Would a persistent decode kernel beat the barrier-per-step chain? A timing probe.

    python -m bench.persistent_chain [--groups 132,264] [--layers 8] [--json OUT]

A 27B-shaped layer as 8 dependent phases (QKV, o, gate/up, down weight streams, each followed
by a small norm-like phase; bench/shaders/persistent_probe.comp), timed per layer five ways, each
layer on its own weights so nothing is served from L2:
  chain       one dispatch per phase, a pipeline barrier between (the engine's design);
  streams     the four streams alone, barrier between (no small phases);
  chain_norm_in_stream
              4 dispatches a layer: each stream's workgroups compute the norm themselves
              (redundantly) before streaming — with as many workgroups as a copy, or `--groups`;
  persistent  one dispatch for all layers, workgroups meeting at grid barriers in memory and
              issuing the next stream's first loads before each wait;
  fused       as persistent, but every workgroup computes the small phase's norm itself
              before its stream: one grid barrier per stream instead of two.
Each as % of the copy bandwidth (the issue's roofline): what fraction of a token a
megakernel would win back. The persistent version needs every workgroup resident at once,
which Vulkan does not promise (the `--groups` default assumes an H100's 132 SMs): a run where a
wait timed out, the arrival count is short or the activations differ from the chain's is
marked invalid. (On lavapipe, Mesa 22.3, runs of more than one workgroup lose arrivals: only
`--groups 1` is valid there.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import shaders as probes
from bench.dispatch_cost import copy_gb_s
from phoenix_chat.engine.backends.vulkan.device import Device
from phoenix_chat.engine.backends.vulkan.timing import time_many

BYTES_27B = {"qkv": 24_772_608, "o": 12_386_304, "gu": 130_056_192, "down": 65_028_096}
HIDDEN_27B = 5376
WG = 512


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="132,264", help="persistent grid sizes to try")
    ap.add_argument("--pre", default="4,8", help="loads issued before each grid barrier (per invocation)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--scale", type=float, default=1.0, help="scale the stream sizes (smoke test: 0.01)")
    ap.add_argument("--software", action="store_true", help="allow a CPU Vulkan device (smoke test)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = Device.open(allow_software=args.software)
    probes.register(dev)
    out: dict = {"device": dev.name, "layers": args.layers}
    bw = copy_gb_s(dev, int((1 << 30) * args.scale))
    out["copy_gb_s"] = bw

    n = {k: max(1, int(b * args.scale) // 16) for k, b in BYTES_27B.items()}
    layer_bytes = 16 * sum(n.values())
    m = HIDDEN_27B
    weights = [dev.buffer(16 * n[k] * args.layers) for k in ("qkv", "o", "gu", "down")]
    act = dev.buffer(8 * m)
    flags = dev.buffer(16)
    stream_groups = [min(65535, -(-n[k] // (WG * 4))) for k in ("qkv", "o", "gu", "down")]
    max_groups = max(stream_groups + [int(g) for g in args.groups.split(",")])
    partials = dev.buffer(4 * WG * max_groups)
    cl = dev.commands()
    for b in weights + [act, flags]:
        cl.fill(b, 0)
    cl.run()
    cl.destroy()
    bindings = [*weights, act, flags, partials]

    def push(p, phase=0):
        return p.push.pack(
            n_qkv=n["qkv"], n_o=n["o"], n_gu=n["gu"], n_down=n["down"], layers=args.layers, m=m, phase=phase
        )

    def chain(with_small: bool, norm_in_stream: bool = False, groups: int | None = None):
        p = dev.pipeline("persistent_probe", WG=WG, PERSIST=0, PRE=4, NORM_IN_STREAM=int(norm_in_stream))

        def record(cl):
            for phase in range(8 * args.layers):
                k = phase % 8
                if k % 2 and not with_small:
                    continue
                g = (groups or stream_groups[k // 2]) if k % 2 == 0 else -(-m // WG)
                cl.dispatch(p, bindings, (g,), push(p, phase))
                cl.barrier(transfer=False)

        return record

    def persistent(mode: int, groups: int, pre: int):
        p = dev.pipeline("persistent_probe", WG=WG, PERSIST=mode, PRE=pre)

        def record(cl):
            cl.fill(flags, 0, 0, 4)
            cl.barrier()
            cl.dispatch(p, bindings, (groups,), push(p))

        return record

    records = {"chain": chain(True), "streams": chain(False), "chain_norm_in_stream": chain(False, True)}
    for g in (int(x) for x in args.groups.split(",")):
        records[f"chain_norm_in_stream_g{g}"] = chain(False, True, g)
    for _ in range(2):  # clocks up, pipelines built
        time_many(dev, {"chain": records["chain"]}, reps=1)
    times = time_many(dev, records, reps=4)
    for mode, name in ((1, "persistent"), (2, "fused")):
        for g in (int(x) for x in args.groups.split(",")):
            for pre in (int(x) for x in args.pre.split(",")):
                key, rec = f"{name}_g{g}_pre{pre}", persistent(mode, g, pre)
                clear(dev, flags)
                if mode == 1:
                    out[f"{key}_matches_chain"] = same_result(dev, records["chain"], rec, act, flags)
                times[key] = time_many(dev, {key: rec}, reps=4)[key]
                arrivals, timed_out = (int(x) for x in dev.download(flags, dtype="uint32")[:2])
                syncs = (8 if mode == 1 else 4) * args.layers - 1  # grid barriers in one run
                out[f"{key}_waits_timed_out"] = timed_out
                out[f"{key}_valid"] = timed_out == 0 and arrivals == syncs * g and out.get(f"{key}_matches_chain", True)
    ideal_us = layer_bytes / (bw * 1e9) * 1e6
    out["layer_mb"] = layer_bytes / 1e6
    out["layer_at_copy_bw_us"] = ideal_us
    for k, us in times.items():
        per_layer = us / args.layers
        out[f"{k}_us_per_layer"] = per_layer
        out[f"{k}_pct_of_copy"] = 100 * ideal_us / per_layer
    for k, v in out.items():
        print(f"{k:40s} {v:.2f}" if isinstance(v, float) else f"{k:40s} {v}")
    for k, v in out.items():
        if k.endswith("_valid") and not v:
            print(
                f"WARNING: {k[:-6]}: a grid-barrier wait timed out, an arrival went missing or the result "
                "differs from the chain's (its workgroups were not all resident at once): its figures are not valid"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


def clear(dev, buf) -> None:
    cl = dev.commands()
    cl.fill(buf, 0)
    cl.run()
    cl.destroy()


def same_result(dev, chain, persistent, act, flags) -> bool:
    """Do the small phases leave the same activation rows after one run of each? (A grid
    barrier that let a workgroup read a row before every slice of it was written would not.)"""
    rows = []
    for record in (chain, persistent):
        cl = dev.commands()
        cl.fill(act, 0)
        cl.fill(flags, 0, 0, 4)  # arrivals; [1] keeps counting timed-out waits
        cl.barrier()
        record(cl)
        cl.run()
        cl.destroy()
        rows.append(dev.download(act))
    return bool((rows[0] == rows[1]).all())


if __name__ == "__main__":
    raise SystemExit(main())
