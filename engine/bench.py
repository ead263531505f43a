"""Speed benchmark: prefill and decode tok/s, achieved bandwidth and % of the device's roofline.

Decode is bandwidth-bound: every token reads all the matrix weights once, so
GB/s = weight bytes x tok/s, compared with a copy kernel measured on the same device
(bytes read + written per second). Prefill reports tok/s and FLOP/s (2 x parameters per token).
Python time per decode token is the host work between GPU steps (submit, fence, id read).

Tokenizer-free on purpose: it runs on synthetic GGUFs (tools/make_synthetic_gguf.py) too.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from phoenix_chat.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.base import Backend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.config import ModelConfig
    from phoenix_chat.engine.weights.base import WeightSource


@dataclass
class BenchResult:
    model: str
    backend: str
    device: str
    weights_gib: float
    prompt_tokens: int
    gen_tokens: int
    load_s: float
    prefill_tok_s: float
    prefill_tflops: float
    decode_tok_s: float
    decode_gb_s: float
    copy_gb_s: float | None
    decode_pct_of_copy: float | None
    python_ms_per_token: float | None
    python_pct_of_token: float | None
    peak_device_gib: float | None
    peak_host_gib: float | None = None  # the process's peak resident set so far (ru_maxrss)
    date: str = ""
    decode_profile_us: dict[str, float] | None = None  # GPU time of one decode step by op kind
    matvec_tuning: dict[str, dict[str, Any]] | None = None  # the kernel path/shape the autotuner picked per matrix
    decode_options: dict[str, Any] | None = None  # tuned step-level fusions (rope in QKV, GEGLU q8_1 output)
    prefill_options: dict[str, Any] | None = None  # the prefill GEMM kernel and its load-time timings
    # what was measured, as the backend holds it: the context its KV cache was sized for (--ctx,
    # else prompt + answer + 8), the re-quantization asked for (--quant; "file": none) and the
    # weight types it applied (its own count of the matrices it uploaded)
    context_length: int = 0
    kv_cache_gib: float | None = None
    quant: str = "file"  # quantization.AS_IN_FILE
    weight_types: dict[str, int] | None = None

    def table(self) -> str:
        rows = [(k, v) for k, v in asdict(self).items()]
        w = max(len(k) for k, _ in rows)
        fmt: Callable[[object], str] = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
        return "\n".join(f"{k:<{w}}  {fmt(v)}" for k, v in rows)


def copy_bandwidth(dev: Device, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """GB/s of a device-local copy by a compute shader, bytes read plus bytes written (best of N)."""
    nbytes = min(nbytes, dev.caps.device_local_bytes // 8, dev.caps.max_storage_buffer_range) // 16 * 16
    a, b = dev.buffer(nbytes, name="bw_a"), dev.buffer(nbytes, name="bw_b")
    p = dev.pipeline("copy_u32x4", WG=256)
    cl = dev.commands(timestamps=2)
    cl.timestamp(0)
    cl.dispatch(
        p,
        [a, b],
        (min(65535, dev.caps.max_workgroup_count[0], -(-nbytes // 16 // 256 // 4)), 1, 1),
        p.push.pack(n=nbytes // 16),
    )
    cl.barrier()
    cl.timestamp(1)
    cl.end()
    best: float | None = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        cl.submit()
        wall = time.perf_counter() - t0
        dt = float(cl.timestamps_ns()[1]) * 1e-9 if dev.caps.timestamp_bits else wall
        best = dt if best is None else min(best, dt)
    cl.destroy()
    a.destroy()
    b.destroy()
    assert best is not None  # repeats >= 1
    return 2 * nbytes / best / 1e9


def bench_prompt(cfg: ModelConfig, n: int, seed: int = 0) -> list[int]:
    """The benchmark's prompt: <bos> and n - 1 random ids of ordinary tokens (the same for every
    backend and for llama.cpp, so their figures compare)."""
    rng = np.random.default_rng(seed)
    ids: list[int] = rng.integers(min(1000, cfg.vocab_size - 1), min(cfg.vocab_size, 200_000), n - 1).tolist()
    return [cfg.bos_token_id] + ids


def _peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB, macOS in bytes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _matrix_bytes(weights: WeightSource) -> int:
    return sum(t.nbytes for n, t in weights.tensors.items() if not t.is_norm)


def run_bench(
    path: str | os.PathLike[str],
    backend: str = "vulkan",
    *,
    context_length: int | None = None,
    quant: str | None = None,
    device: int | None = None,
    prompt_tokens: int = 512,
    gen_tokens: int = 128,
    allow_software: bool = True,
    seed: int = 0,
) -> BenchResult:
    from phoenix_chat.engine.quantization import AS_IN_FILE, WeightQuant
    from phoenix_chat.engine.weights import open_weights

    wanted = WeightQuant.parse(quant)
    weights = open_weights(path)
    cfg = weights.config
    ctx = context_length or (prompt_tokens + gen_tokens + 8)
    t0 = time.perf_counter()
    be: Backend
    vk: VulkanBackend | None = None
    if backend == "vulkan":
        from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

        be = vk = VulkanBackend(
            weights, ctx, VulkanOptions(device_index=device, allow_software=allow_software, quant=wanted)
        )
        wbytes = vk.budget["weights"]
    elif backend == "cpu":
        from phoenix_chat.engine.backends.cpu import CpuBackend

        be = CpuBackend(weights, ctx, quant=wanted)
        wbytes = _matrix_bytes(weights)  # the file's bytes: the CPU holds f32 copies of them
    else:
        raise ValueError(f"bench: unknown backend {backend!r}")
    load_s = time.perf_counter() - t0
    try:
        prompt = bench_prompt(cfg, prompt_tokens, seed)
        # warm-up: pipelines, every chunk's recording, and clocks (a GPU idling before the run ramps
        # up over ~0.5 s: a first cold run on an H100 measured the 270M's prefill 4.7x slow)
        t0 = time.perf_counter()
        be.forward(prompt, 0)
        while backend != "cpu" and time.perf_counter() - t0 < 0.5:
            be.forward(prompt, 0)
        t0 = time.perf_counter()
        logits = be.forward(prompt, 0)
        prefill_s = time.perf_counter() - t0
        first = int(np.argmax(logits))
        greedy = SamplingParams(temperature=0.0)
        gen = be.decode_tokens(first, prompt_tokens, greedy, 16)
        if gen is not None:  # warm-up of the recorded token step
            list(gen)
            t0 = time.perf_counter()  # and of the clocks, which the prefill warm-up may have left
            while backend != "cpu" and time.perf_counter() - t0 < 0.5:
                list(be.decode_tokens(first, prompt_tokens, greedy, 16) or ())
            if vk is not None:
                vk.host_time.reset()  # python_ms_per_token of the measured run only
        t0 = time.perf_counter()
        gen = be.decode_tokens(first, prompt_tokens, greedy, gen_tokens)
        n = 0
        if gen is None:
            tok, pos = first, prompt_tokens
            for _ in range(gen_tokens):
                tok = int(np.argmax(be.forward([tok], pos)))
                pos += 1
                n += 1
        else:
            for _ in gen:
                n += 1
        decode_s = time.perf_counter() - t0
        stats = be.stats()
        # what the measured backend held (the result's last fields)
        held_context, held_kv_gib = be.context_length, be.live_stats().kv_cache_bytes / 2**30
        held_types = be.weight_types() or None
        profile = None
        if vk is not None:
            from phoenix_chat.engine.backends.vulkan.profiling import profile_step

            profile = profile_step(vk, 1)
        dev = getattr(be, "dev", None)
        copy = copy_bandwidth(dev) if dev is not None else None
    finally:
        be.close()
        weights.close()
    decode_tps = n / decode_s
    gbs = wbytes * decode_tps / 1e9
    py_ms = stats.get("python_ms_per_token")
    return BenchResult(
        model=str(cfg.name),
        backend=backend,
        device=getattr(be, "device_name", "?"),
        weights_gib=wbytes / 2**30,
        prompt_tokens=prompt_tokens,
        gen_tokens=n,
        load_s=load_s,
        prefill_tok_s=prompt_tokens / prefill_s,
        prefill_tflops=2 * cfg.parameter_count() * prompt_tokens / prefill_s / 1e12,
        decode_tok_s=decode_tps,
        decode_gb_s=gbs,
        copy_gb_s=copy,
        decode_pct_of_copy=100 * gbs / copy if copy else None,
        python_ms_per_token=py_ms,
        python_pct_of_token=(100 * py_ms * decode_tps / 1000) if py_ms is not None else None,
        peak_device_gib=(stats.get("allocated_bytes", 0) / 2**30) or None,
        peak_host_gib=_peak_rss_bytes() / 2**30,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        decode_profile_us={k: round(v, 1) for k, v in profile.items()} if profile else None,
        matvec_tuning=stats.get("matvec_tuning"),
        decode_options={
            k: stats[k] for k in ("qkv_rope", "qkv_rope_timing", "geglu_q8_1", "geglu_q8_1_timing") if k in stats
        }
        or None,
        prefill_options={
            k: stats[k]
            for k in (
                "prefill_gemm",
                "prefill_attention",
                "gemm_kernel",
                "gemm_timing",
                "gemm_kernels",
                "gemm_shape_timing",
                "gemm_kernels_note",
                "gemm_kernel_few",
                "gemm_few_timing",
            )
            if k in stats
        }
        or None,
        context_length=held_context,
        kv_cache_gib=held_kv_gib,
        quant=wanted.value if wanted is not None else AS_IN_FILE,
        weight_types=held_types,
    )


def bench_backend(args: argparse.Namespace) -> str:
    """The backend a bench runs on: "auto" is a Vulkan device if one opens, else the CPU."""
    from phoenix_chat.engine.errors import PhoenixError

    backend: str = args.backend
    if backend == "auto":
        try:
            from phoenix_chat.engine.backends.vulkan.device import Device

            Device.open(args.device).close()
            backend = "vulkan"
        except PhoenixError:
            backend = "cpu"
    if backend not in ("cpu", "vulkan"):
        raise PhoenixError(f"bench runs the cpu and vulkan backends, not {backend}")
    return backend


def run_bench_cli(args: argparse.Namespace) -> int:
    """`phoenix-chat bench`: args carry model, backend, device, ctx, quant, json, prompt/gen tokens."""
    from phoenix_chat.engine.weights import embedded_model_path

    backend = bench_backend(args)
    r = run_bench(
        args.model or embedded_model_path(),
        backend,
        context_length=args.ctx,
        quant=args.quant,
        device=args.device,
        prompt_tokens=args.prompt_tokens,
        gen_tokens=args.gen_tokens,
    )
    print(json.dumps(asdict(r), indent=1) if args.json else r.table())
    return 0
