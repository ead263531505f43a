"""What speculative decoding's verify pass costs on a backend: one forward over k + 1 tokens
(all logits back, as engine/speculative.py asks for) against one decode token.

    python -m bench.verify_cost [--model PATH | --synthetic 27b] [--backend vulkan] [--json OUT]

Speculative decoding pays off when that ratio stays near 1 (bandwidth-bound: the weights are
read once for all k + 1 tokens) and the draft's tokens are cheap. With acceptance rate a per
proposal, a pass yields (1 - a^(k+1)) / (1 - a) tokens; the speed-up over plain decode is that
divided by (verify ratio + k x draft-token / target-token). This prints the verify ratios; the
acceptance rate depends on the pair of models (measure it with `phoenix-chat run --draft`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.model_file import model_file
from phoenix_chat.engine.weights import open_weights

POSITION = 256  # cache filled this far first, as in a conversation
REPEATS = 5


def _seconds(fn, repeats=REPEATS) -> float:
    fn()  # first call records / warms up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def _decode(backend, n: int) -> None:
    from phoenix_chat.engine.sampling import SamplingParams

    greedy = SamplingParams(temperature=0)
    stream = backend.decode_tokens(7, POSITION, greedy, n)
    if stream is None:  # a backend that samples on the CPU: forward + argmax
        for i in range(n):
            backend.forward([7], POSITION + i).argmax()
        return
    for _ in stream:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--synthetic", default=None, help="a tools/make_synthetic_gguf.py shape (270m, 4b, 27b...)")
    ap.add_argument("--workdir", default="/tmp/phoenix-bench")
    ap.add_argument("--backend", choices=["vulkan", "cpu"], default="vulkan")
    ap.add_argument("--k", default="1,2,4,8", help="proposals per pass")
    ap.add_argument("--rows", type=int, default=None, help="rows per subgroup of the few-token matvec (tuning)")
    ap.add_argument(
        "--path",
        choices=["auto", "matvec", "gemm"],
        default="auto",
        help="few-token forwards through multi-column matvecs, GEMMs, or what the backend times faster",
    )
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.rows:
        from phoenix_chat.engine.backends.vulkan import matvec

        matvec.COLUMN_ROWS = args.rows
    path = model_file(args.model, args.synthetic, args.workdir)
    weights = open_weights(path)
    ctx = POSITION + 64  # room for 16 decode steps
    if args.backend == "vulkan":
        from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

        tb = VulkanBackend(
            weights,
            ctx,
            VulkanOptions(
                allow_software=True, few_token_matvec={"auto": None, "matvec": True, "gemm": False}[args.path]
            ),
        )
    else:
        from phoenix_chat.engine.backends.cpu import CpuBackend

        tb = CpuBackend(weights, ctx)
    ids = [2] + [100 + i for i in range(POSITION - 1)]
    tb.forward(ids, 0)
    out = {"model": str(path), "backend": tb.name, "device": tb.device_name}
    stats = tb.stats()
    if "few_token_matvec" in stats:  # the Vulkan backend's load-time choice
        out["few_token_matvec_counts"] = stats["few_token_matvec"]
        out["few_token_int8_counts"] = stats["few_token_int8"]
        for T, t in stats.get("few_token_timing", {}).items():
            out[f"load_timing_{T}_tokens"] = ", ".join(f"{k[:-3]} {v} ms" for k, v in t.items())
    out["forward_1_token_ms"] = _seconds(lambda: tb.forward([7], POSITION)) * 1e3  # logits back
    one = _seconds(lambda: _decode(tb, 16)) / 16
    out["decode_token_ms"] = one * 1e3  # the plain decode loop's token (sampled on the device if it can)
    for k in (int(x) for x in args.k.split(",")):
        t = _seconds(lambda k=k: tb.forward([7] * (k + 1), POSITION, all_logits=True))
        out[f"verify_k{k}_ms"] = t * 1e3
        out[f"verify_k{k}_ratio"] = t / one
    tb.close()
    for key, v in out.items():
        print(f"{key:24s} {v:.3f}" if isinstance(v, float) else f"{key:24s} {v}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
