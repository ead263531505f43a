"""Per-op GPU time of one decode step and one prefill chunk on the Vulkan backend.

    python -m bench.profile [--synthetic 27b] [--model PATH] [--tokens 128]

Timestamps after every barrier (`engine/backends/vulkan/profiling.py` `profile_step`), summed by op kind, beside the
kernel choices (matvec tuning, prefill GEMM path). For finding where a token's time goes;
`bench.run` is the benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def profile(path: Path, tokens: int, context: int) -> dict:
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.backends.vulkan.profiling import profile_step
    from phoenix_chat.engine.weights import open_weights

    weights = open_weights(path)
    be = VulkanBackend(weights, context, VulkanOptions(allow_software=True))
    try:
        return {"decode": profile_step(be, 1), f"prefill_{tokens}": profile_step(be, tokens), "stats": be.stats()}
    finally:
        be.close()
        weights.close()


def show(name: str, prof: dict) -> None:
    total = prof["total"]
    print(f"  {name}: {total:.0f} us, {prof['dispatches']} dispatches, {prof['barriers']} barriers")
    for k, us in sorted(
        ((k, v) for k, v in prof.items() if k not in ("total", "dispatches", "barriers")), key=lambda kv: -kv[1]
    ):
        print(f"    {k:16s} {us:9.1f} us  {100 * us / total:5.1f} %")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", default="", help="comma-separated shapes (tools/make_synthetic_gguf.py)")
    ap.add_argument("--model", action="append", default=[])
    ap.add_argument("--tokens", type=int, default=128, help="prefill chunk to profile")
    ap.add_argument("--context", type=int, default=648)
    ap.add_argument("--workdir", default="/tmp/phoenix-bench")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    runs = [(Path(m).stem, Path(m)) for m in args.model]
    for shape in filter(None, args.synthetic.split(",")):
        from tools.make_synthetic_gguf import write

        p = Path(args.workdir) / f"synthetic-{shape}-q4_0.gguf"
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            write(p, shape, "q4_0", "q8_0")
        runs.append((shape, p))
    if not runs:
        from phoenix_chat.engine.weights import embedded_model_path

        runs.append(("270m-embedded", embedded_model_path()))
    out = {}
    for label, path in runs:
        r = out[label] = profile(path, args.tokens, args.context)
        print(f"== {label} on {r['stats']['device']} (prefill GEMM: {r['stats']['prefill_gemm']})")
        for name, prof in r.items():
            if name != "stats":
                show(name, prof)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
