"""What the GPU driver made of kernels: registers, code size and whatever else it reports
(VK_KHR_pipeline_executable_properties), so a kernel's speed can be read against its occupancy.

    python -m bench.pipeline_stats --gemm q4_0:cmf1hr,coopmat_p [--geglu]
    python -m bench.pipeline_stats gemm_q4_0_f32_f32_cmf1hr:WG=64 matvec_q4_0:WG=64
    python -m bench.pipeline_stats --list cmf       # the table's variant names containing "cmf"
    ... [--ir DIR]   # also write each executable's internal representations (what the driver shows)

A name is a pipeline variant (engine/backends/vulkan/pipelines.VARIANTS), optionally with its
specialization constants; --gemm builds the GEMM tiles as ops_gemm.gemm runs them (tile_pipeline).
Refused (exit 2, saying why) on a driver without the extension (lavapipe has none).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from phoenix_chat.engine.backends.vulkan import ops_gemm
from phoenix_chat.engine.backends.vulkan.device import Device, DeviceUnavailableError
from phoenix_chat.engine.backends.vulkan.pipeline_stats import executables
from phoenix_chat.engine.backends.vulkan.pipelines import VARIANTS, Pipeline


def parse(item: str) -> tuple[str, dict[str, int]]:
    name, _, rest = item.partition(":")
    spec = {k: int(v) for k, v in (kv.split("=") for kv in rest.split(",") if kv)}
    return name, spec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("pipelines", nargs="*", help="variant[:KEY=VALUE,...]")
    ap.add_argument("--gemm", help="TYPES:KERNELS, e.g. q4_0,q4_k:cmf1hr,coopmat_p")
    ap.add_argument("--geglu", action="store_true", help="--gemm builds the GEGLU products")
    ap.add_argument("--list", metavar="TEXT", help="print the variant names containing TEXT and stop")
    ap.add_argument("--ir", type=Path, help="write each executable's internal representations here")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.list is not None:
        print("\n".join(sorted(n for n in VARIANTS if args.list in n)))
        return 0
    try:
        dev = Device.open(allow_software=True, capture_statistics=True)
    except DeviceUnavailableError as exc:
        print(f"pipeline_stats: {exc}", file=sys.stderr)
        return 2
    # each: how to build the pipeline, and its name for the report
    todo: list[tuple[str, Callable[[], Pipeline]]] = [
        (name, lambda name=name, spec=spec: dev.pipeline(name, **spec)) for name, spec in map(parse, args.pipelines)
    ]
    if args.gemm:
        types, _, kernels = args.gemm.partition(":")
        todo += [
            (f"{wt}:{kn}", lambda wt=wt, kn=kn: ops_gemm.tile_pipeline(dev, wt, kn, args.geglu))
            for wt in types.split(",")
            for kn in kernels.split(",")
        ]
    print(f"# {dev.name} ({dev.caps.driver})")
    report = []
    for label, build in todo:
        try:
            p = build()
            exes = executables(p, representations=args.ir is not None)
        except (KeyError, ValueError, RuntimeError) as exc:
            print(f"{label}: {exc}")
            continue
        name, spec = p.name, p.spec_values
        for e in exes:
            stats = ", ".join(f"{k}: {v}" for k, v in e.statistics.items())
            print(f"{name} {spec or ''} [{e.name}, subgroup {e.subgroup_size}] {stats}")
            report.append({"pipeline": name, "spec": spec, "executable": e.name, "statistics": e.statistics})
            if args.ir is not None:
                args.ir.mkdir(parents=True, exist_ok=True)
                for rname, text in e.representations.items():
                    safe = "".join(c if c.isalnum() else "_" for c in rname)
                    (args.ir / f"{name}.{safe}.txt").write_text(text)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    dev.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
