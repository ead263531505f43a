"""Perplexity cost of int8 NPU prefill: the CPU reference vs the hybrid backend on the same text.

    python -m tools.eval_npu_prefill [--n-ctx 512] [--text tests/goldens/ppl_text.txt] [--mode emulator|host]

`emulator` runs the real hybrid backend over the emulated NPU (slow: the emulator multiplies the
padded tiles in numpy). `host` replaces the NPU GEMM by `npu.gemm.reference_matmul`, which the
tests show to be bit-identical to the emulated kernels, to measure long texts quickly.
Both use engine.perplexity (llama.cpp's method). Without a Phoenix NPU nothing here touches one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from phoenix_chat.engine.perplexity import perplexity


@dataclass
class _Model:  # what engine.perplexity needs of a LoadedModel
    tokenizer: object
    config: object
    backend: object


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument("--text", default=str(Path(__file__).resolve().parents[1] / "tests/goldens/ppl_text.txt"))
    ap.add_argument("--mode", choices=["emulator", "host"], default="emulator")
    args = ap.parse_args(argv)

    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.backends.npu_hybrid import NpuHybridBackend
    from phoenix_chat.engine.weights import embedded_model_path, open_weights
    from phoenix_chat.npu.gemm import reference_matmul
    from phoenix_chat.npu.kernels.spec import DEFAULT_SPECS
    from tests.npu.emulator import EmulatedXrt, write_test_kernel

    text = Path(args.text).read_text()
    weights = open_weights(embedded_model_path())
    tok = weights.tokenizer()
    cpu = CpuBackend(weights, args.n_ctx)
    t = time.perf_counter()
    ref = perplexity(_Model(tok, weights.config, cpu), text, n_ctx=args.n_ctx)
    ref_s = time.perf_counter() - t

    kernels = Path(tempfile.mkdtemp(prefix="npu-emulator-kernels-"))
    for spec in DEFAULT_SPECS:
        write_test_kernel(kernels, spec)
    hybrid = NpuHybridBackend(weights, args.n_ctx, xrt=EmulatedXrt(), kernel_dirs=[kernels], decoder=cpu)
    if args.mode == "host":
        model = hybrid.prefill_model
        host_w = {name: model.w[name] for name in model.on_npu}

        class HostGemm:  # same numbers as the emulated kernels, without tiling
            stats = hybrid.gemm.stats

            def matmul(self, x, name):
                return reference_matmul(x, host_w[name])

        model.gemm = HostGemm()
    t = time.perf_counter()
    npu = perplexity(_Model(tok, weights.config, hybrid), text, n_ctx=args.n_ctx)
    npu_s = time.perf_counter() - t
    result = {
        "n_ctx": args.n_ctx,
        "windows": ref["windows"],
        "scored_tokens": ref["scored_tokens"],
        "ppl_cpu_f32": round(ref["ppl"], 4),
        "ppl_npu_int8_prefill": round(npu["ppl"], 4),
        "relative_increase": round(npu["ppl"] / ref["ppl"] - 1, 5),
        "mode": args.mode,
        "cpu_seconds": round(ref_s, 1),
        "hybrid_seconds": round(npu_s, 1),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
