"""Aggregate decode throughput of the Vulkan backend's batched step at 1..32 streams.

    python -m bench.batched_decode [--model PATH | --synthetic 27b] [--streams 1,2,4,8,16,32]
                                   [--steps 64] [--prompt 128] [--context 512] [--sampled] [--json F]

Loads the model with as many KV slots as the largest stream count, prefills every slot with its
own prompt (engine.bench.bench_prompt, a seed per slot), then for each stream count B times
`decode_batch_tokens` over slots 0..B-1 (each sequence at its own position, sampled on the GPU,
the steps pipelined as the scheduler runs a steady batch; `--step-by-step` also times one
`decode_batch_sampled` call a step): aggregate tok/s (B x steps / wall time), per-stream tok/s,
and the p50 / p99 step latency. The
single-sequence pipelined decode (`decode_tokens`, the chat path) is timed beside it as the
baseline the batched figures are a multiple of. Every stream count starts again from the
prompts' end, so the context only needs prompt + steps + 2 positions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.model_file import model_file
from bench.profile import show

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend


@dataclass(frozen=True)
class StreamsResult:
    streams: int
    steps: int
    aggregate_tok_s: float
    per_stream_tok_s: float
    p50_step_ms: float
    p99_step_ms: float


def time_batched_decode(
    backend: VulkanBackend,
    streams: list[int],
    steps: int,
    prompt: int,
    sampled: bool = False,
    warmup: int = 2,
    profile: bool = False,
    pipelined: bool = True,
) -> dict[str, object]:
    """The figures above on a loaded backend with >= max(streams) slots (its context >= prompt +
    warmup + steps + 2): {"single_stream_tok_s": ..., "batched": [StreamsResult as dicts]}.
    pipelined: 2+ streams run through `decode_batch_tokens` (the scheduler's batch with nothing
    else to do), else one `decode_batch_sampled` call a step, each waiting for its ids.
    profile: also each stream count's GPU time by op kind (us) of one step after the timed ones
    ("profiles", keyed by stream count; one stream: the decode recording's)."""
    from phoenix_chat.engine.backends.base import SeqStep
    from phoenix_chat.engine.bench import bench_prompt
    from phoenix_chat.engine.sampling import SamplingParams

    n_slots = max(streams)
    if backend.n_slots < n_slots:
        raise ValueError(f"the backend holds {backend.n_slots} slots, the bench asks {n_slots}")
    if prompt + warmup + steps + 2 > backend.context_length:
        raise ValueError(f"context {backend.context_length} < prompt {prompt} + {warmup + steps} steps + 2")
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95) if sampled else SamplingParams(temperature=0.0)
    first = [
        backend.prefill_sampled(s, bench_prompt(backend.config, prompt, seed=s), 0, params, seed=s)
        for s in range(n_slots)
    ]
    # the single-sequence chat path (pipelined, several steps per submit) as the baseline; the
    # first call records its command lists, so it is not timed
    single_params = SamplingParams(**{**params.__dict__, "seed": 0})
    for _ in backend.decode_tokens(first[0], prompt, single_params, warmup + 1):
        pass
    t = time.perf_counter()
    n_single = sum(1 for _ in backend.decode_tokens(first[0], prompt, single_params, steps))
    single = n_single / (time.perf_counter() - t)
    results = []
    for B in streams:
        tokens = list(first[:B])
        lat: list[float] = []
        if pipelined and B > 1:
            # a warm-up run records both copies of the step, then the timed run: each latency is
            # the wall time between two steps' ids (the first includes writing the rows)
            warm = backend.decode_batch_tokens(
                [SeqStep(s, tokens[s], prompt, params, seed=s) for s in range(B)], warmup
            )
            tokens = list(warm)[-1]
            run = backend.decode_batch_tokens(
                [SeqStep(s, tokens[s], prompt + warmup, params, seed=s) for s in range(B)], steps
            )
            t = time.perf_counter()
            for _ in run:
                now = time.perf_counter()
                lat.append(now - t)
                t = now
        else:
            for i in range(warmup + steps):
                batch = [SeqStep(s, tokens[s], prompt + i, params, seed=s) for s in range(B)]
                t = time.perf_counter()
                tokens = backend.decode_batch_sampled(batch)
                if i >= warmup:
                    lat.append(time.perf_counter() - t)
        total = sum(lat)
        results.append(
            StreamsResult(
                B,
                steps,
                round(B * steps / total, 1),
                round(steps / total, 1),
                round(1e3 * float(np.percentile(lat, 50)), 3),
                round(1e3 * float(np.percentile(lat, 99)), 3),
            )
        )
    out: dict[str, object] = {"single_stream_tok_s": round(single, 1), "batched": [asdict(r) for r in results]}
    if profile:  # after every timing: the one-stream profile rewrites slot 0's first position
        from phoenix_chat.engine.backends.vulkan.profiling import profile_step

        profiles: dict[int, dict[str, float]] = {}
        for B in streams:
            batch = [SeqStep(s, first[s], prompt + warmup + steps, params, seed=s) for s in range(B)]
            profiles[B] = backend.profile_batch(batch) if B > 1 else profile_step(backend, 1)
        out["profiles"] = profiles
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", help="a GGUF (default: the embedded 270M)")
    ap.add_argument("--synthetic", help="a shape of tools/make_synthetic_gguf.py (q4_0), e.g. 27b")
    ap.add_argument("--streams", default="1,2,4,8,16,32")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--sampled", action="store_true", help="top-k 40 sampling instead of greedy")
    ap.add_argument("--workdir", default="/tmp/phoenix-bench")
    ap.add_argument(
        "--batch-attn-splits",
        default="",
        help="comma-separated PHOENIX_VULKAN_BATCH_ATTN_SPLITS values to time in turn on one load (0: the rule)",
    )
    ap.add_argument("--profile", action="store_true", help="GPU time by op kind of one step at each stream count")
    ap.add_argument(
        "--step-by-step",
        action="store_true",
        help="also time the batches one decode_batch_sampled call a step (no pipelining), on the same load",
    )
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.weights import open_weights

    path = model_file(args.model, args.synthetic, args.workdir)
    streams = [int(s) for s in args.streams.split(",")]
    weights = open_weights(path)
    t = time.perf_counter()  # the load includes every load-time timing (tiles, paths)
    be = VulkanBackend(weights, args.context, VulkanOptions(allow_software=True), slots=max(streams))
    load_s = round(time.perf_counter() - t, 1)
    try:
        out = time_batched_decode(be, streams, args.steps, args.prompt, args.sampled, profile=args.profile)
        out |= {"model": str(path), "device": be.device_name, "load_s": load_s, "stats": be.stats()}
        if args.step_by_step:
            many = [b for b in streams if b > 1]
            out["step_by_step"] = time_batched_decode(be, many, args.steps, args.prompt, args.sampled, pipelined=False)
        sweep = {}
        for splits in filter(None, args.batch_attn_splits.split(",")):
            os.environ.pop("PHOENIX_VULKAN_BATCH_ATTN_SPLITS", None)
            if splits != "0":
                os.environ["PHOENIX_VULKAN_BATCH_ATTN_SPLITS"] = splits
            be.drop_batch_recordings()
            many = [b for b in streams if b > 1]
            sweep[splits] = time_batched_decode(be, many, args.steps, args.prompt, args.sampled)
            print(f"batched attention splits {splits} (0: the rule):")
            for r in sweep[splits]["batched"]:  # type: ignore[attr-defined]
                print(f"  {r['streams']:3d} streams {r['aggregate_tok_s']:9.1f} tok/s  p50 {r['p50_step_ms']:.2f} ms")
        os.environ.pop("PHOENIX_VULKAN_BATCH_ATTN_SPLITS", None)
        if sweep:
            out["batch_attn_splits_sweep"] = sweep
    finally:
        be.close()
        weights.close()
    single = float(out["single_stream_tok_s"])  # type: ignore[arg-type]
    rec = dict(out["stats"]).get("tuning_record", {})  # type: ignore[call-overload]
    how = (
        f"the kernel choices read from the record of {rec.get('saved')} ({rec.get('timed_s')} s of timing skipped)"
        if rec.get("source") == "record"
        else f"every load-time timing included ({rec.get('timed_s')} s of it)"
    )
    print(f"== {path.name} on {out['device']}, loaded in {out['load_s']} s ({how})")
    print(f"single-stream decode_tokens {single:.1f} tok/s")
    print(f"{'streams':>7} {'aggregate tok/s':>16} {'x single':>9} {'per stream':>11} {'p50 ms':>8} {'p99 ms':>8}")
    for r in out["batched"]:  # type: ignore[attr-defined]
        print(
            f"{r['streams']:7d} {r['aggregate_tok_s']:16.1f} {r['aggregate_tok_s'] / single:9.2f} "
            f"{r['per_stream_tok_s']:11.1f} {r['p50_step_ms']:8.2f} {r['p99_step_ms']:8.2f}"
        )
    if "step_by_step" in out:
        print("step by step (one decode_batch_sampled call a step, each waiting for its ids):")
        for r in out["step_by_step"]["batched"]:  # type: ignore[index]
            print(f"{r['streams']:7d} {r['aggregate_tok_s']:16.1f} {r['aggregate_tok_s'] / single:9.2f}")
    for B, prof in dict(out.get("profiles", {})).items():  # type: ignore[call-overload]
        show(f"GPU time of one step, {B} stream(s)", prof)
    stats = out["stats"]
    assert isinstance(stats, dict)
    for key in (
        "gemm_kernel_few",
        "gemm_kernels_few",
        "gemm_few_timing",
        "few_token_timing",
        "few_token_int8",
        "few_token_matvec",
        "few_token_paths",
        "batch_step_us",
        "batch_step_tiles",
    ):
        if key in stats:  # the load-time choice of the batched step's path, and what ran
            print(f"{key}: {json.dumps(stats[key], default=str)}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
