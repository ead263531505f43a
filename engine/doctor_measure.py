"""`phoenix-chat doctor`'s short measurement: the embedded model on each device, ~10 s of work.

Copy bandwidth (engine/bench.py's copy kernel on a Vulkan device, a numpy copy on the CPU),
prefill tok/s and decode tok/s of the model, and decode's share of the bandwidth roofline
(the bytes a decode step reads x tok/s / copy bandwidth), on the bench's own prompt. Bounded by
a time budget per device, not by fixed sizes: a fast GPU ramps the prompt to 512 tokens and
decodes for seconds; a slow one (lavapipe on two busy cores decodes ~1 tok/s) measures an 8-token
prompt and a few tokens, and a step the budget leaves no room to repeat is reported as its first
(cold) run, flagged `warm: false`. Everything reported was measured; a failure ends the device's
measurement with one line and keeps what was measured before it (`partial`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from phoenix_chat.engine import bench
from phoenix_chat.engine.sampling import SamplingParams

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.base import Backend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanOptions
    from phoenix_chat.engine.config import ModelConfig
    from phoenix_chat.engine.weights.base import WeightSource

T = TypeVar("T")
SECONDS = 10.0  # the budget of one device's measurement (the model's load and tuning not counted)
CONTEXT = 1024  # the loaded context: a 512-token prompt and decode runs of up to 128 tokens
MAX_PROMPT = 512  # bench's default prompt
FIRST_PROMPT = 8  # the prompt the ramp starts from (all a slow device gets)
DECODE_RUN = 128  # tokens of one timed decode run at most (each starts at the prompt's end)
CLOCK_RAMP_S = 0.5  # a GPU idling before a run ramps its clocks up over ~0.5 s (bench.run_bench)
PREFILL_SHARE = 0.5  # the part of the budget prefill may take; decode has the rest


@dataclass
class Budget:
    """Seconds of work one device may take, from `start`."""

    seconds: float
    start: float = field(default_factory=time.perf_counter)

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def left(self, share: float = 1.0) -> float:
        return self.seconds * share - self.spent()


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def host_copy_bandwidth(nbytes: int = 512 << 20, repeats: int = 3, threads: int | None = None) -> float:
    """GB/s of a numpy copy in RAM by every core at once (each thread a slice; numpy lets go of
    the GIL while it copies), bytes read plus bytes written, best of N: the CPU's counterpart of
    bench.copy_bandwidth, and its roofline (the reference's BLAS reads weights on every core)."""
    n = threads or os.cpu_count() or 1
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    cuts = np.linspace(0, a.size, n + 1).astype(int)
    slices = [(b[lo:hi], a[lo:hi]) for lo, hi in zip(cuts[:-1], cuts[1:])]
    with ThreadPoolExecutor(n) as pool:

        def copy() -> None:
            list(pool.map(lambda ba: np.copyto(*ba), slices))

        copy()  # first touch of b's pages
        best = min(_timed(copy)[0] for _ in range(repeats))
    return 2 * a.nbytes / best / 1e9


def measure_prefill(be: Backend, cfg: ModelConfig, budget: Budget, gpu: bool) -> tuple[dict[str, Any], int]:
    """Prefill tok/s of bench's prompt, ramping 8 -> 32 -> 128 -> 512 tokens while a run 4x longer
    (and its warm-up) fits the prefill share. Returns the result and the next token (greedy)."""
    n = FIRST_PROMPT
    cold, logits = _timed(lambda: be.forward(bench.bench_prompt(cfg, n), 0))
    if budget.left() < cold:  # no room for a warm run: the first one is the measurement
        return {"tokens": n, "seconds": cold, "tok_s": n / cold, "warm": False}, int(np.argmax(logits))
    t, logits = _timed(lambda: be.forward(bench.bench_prompt(cfg, n), 0))
    while n < MAX_PROMPT and 8 * t < budget.left(PREFILL_SHARE):  # 2 runs, 4x the tokens
        n = min(MAX_PROMPT, 4 * n)
        prompt = bench.bench_prompt(cfg, n)
        be.forward(prompt, 0)  # records this length's command lists
        t, logits = _timed(partial(be.forward, prompt, 0))
    prompt = bench.bench_prompt(cfg, n)
    if gpu:  # clocks up, then the best of the runs that fit
        ramp = time.perf_counter()
        while time.perf_counter() - ramp < CLOCK_RAMP_S and budget.left(PREFILL_SHARE) > t:
            be.forward(prompt, 0)
        for _ in range(3):
            if budget.left(PREFILL_SHARE) < t:
                break
            t2, logits2 = _timed(lambda: be.forward(prompt, 0))
            if t2 < t:
                t, logits = t2, logits2
    return {"tokens": n, "seconds": t, "tok_s": n / t, "warm": True}, int(np.argmax(logits))


def measure_decode(be: Backend, first: int, pos: int, budget: Budget, gpu: bool) -> dict[str, Any]:
    """Greedy decode tok/s after the prompt: runs of up to DECODE_RUN tokens from `pos` (each run
    rewrites the same cache positions), sized to end near the budget. The first run records
    the step's command lists and is not counted unless nothing else fits."""
    greedy = SamplingParams(temperature=0.0)
    step = int(getattr(be, "steps_per_submit", 1))  # a GPU submission computes this many steps

    def run(n: int) -> int:
        gen = be.decode_tokens(first, pos, greedy, n)
        if gen is not None:
            return sum(1 for _ in gen)
        tok = first  # the CPU reference has no token loop of its own: forwards of one token
        for i in range(n):
            tok = int(np.argmax(be.forward([tok], pos + i)))
        return n

    cold, n_cold = _timed(lambda: run(step))
    if budget.left() < cold:
        return {"tokens": n_cold, "seconds": cold, "tok_s": n_cold / cold, "warm": False}
    if gpu:
        ramp = time.perf_counter()
        while time.perf_counter() - ramp < CLOCK_RAMP_S and budget.left() > 2 * cold:
            run(min(16, DECODE_RUN))
    tokens, seconds, rate = 0, 0.0, n_cold / cold
    while True:
        want = int(rate * budget.left() * 0.9) // step * step
        t, n = _timed(partial(run, max(step, min(DECODE_RUN, want))))
        tokens, seconds = tokens + n, seconds + t
        rate = tokens / seconds
        if budget.left() < step / rate:
            break
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "warm": True}


def measure(
    be: Backend, cfg: ModelConfig, weights_bytes: int, copy: Callable[[], float], seconds: float, gpu: bool
) -> dict[str, Any]:
    """Copy bandwidth, prefill and decode on a loaded backend within `seconds`, and decode's
    % of the roofline. A step that fails ends it: `error` (one line) and what was measured."""
    budget = Budget(seconds)
    out: dict[str, Any] = {"budget_s": seconds, "weights_bytes_per_token": weights_bytes}
    step = "copy bandwidth"
    try:
        out["copy_gb_s"] = copy()
        step = "prefill"
        out["prefill"], first = measure_prefill(be, cfg, budget, gpu)
        step = "decode"
        out["decode"] = measure_decode(be, first, out["prefill"]["tokens"], budget, gpu)
    except Exception as exc:  # a device that fails mid-way: the report says where, and goes on
        return {"error": f"{step}: {one_line(exc)}", "partial": out, "spent_s": budget.spent()}
    out["spent_s"] = budget.spent()
    out["decode_gb_s"] = weights_bytes * out["decode"]["tok_s"] / 1e9
    out["decode_pct_of_copy"] = 100 * out["decode_gb_s"] / out["copy_gb_s"]
    out["cut_short"] = out["prefill"]["tokens"] < MAX_PROMPT or not (out["prefill"]["warm"] and out["decode"]["warm"])
    return out


def one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def model_path(model: str | Path | None) -> Path:
    """`model`, else the embedded model (a PhoenixError-free ImportError where it is missing)."""
    if model is not None:
        return Path(model)
    from phoenix_chat.engine.weights import embedded_model_path

    return embedded_model_path()


def model_section(model: str | Path | None) -> dict[str, Any]:
    path = model_path(model)
    return {"path": str(path), "file_bytes": path.stat().st_size}


def vulkan_device(
    index: int,
    seconds: float = SECONDS,
    model: str | Path | None = None,
    options: VulkanOptions | None = None,
) -> dict[str, Any]:
    """Load the model on Vulkan device `index` (the load runs the autotuner afresh), then measure.
    Returns {load_s, tuning, measurement}; a load that fails is {error} in one line."""
    from dataclasses import replace

    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions
    from phoenix_chat.engine.doctor_tuning import tuning_picks
    from phoenix_chat.engine.weights import open_weights

    # timed afresh (and the record of it rewritten: tuning_record.py), since a report is asked
    # for when something looks wrong, and the picks it shows should be this machine's now
    opts = replace(options or VulkanOptions(), device_index=index, allow_software=True, tuning_record="refresh")
    try:
        weights = open_weights(model_path(model))
    except Exception as exc:
        return {"error": f"model: {one_line(exc)}"}
    try:
        load_s, be = _timed(lambda: VulkanBackend(weights, CONTEXT, opts))
    except Exception as exc:
        weights.close()
        return {"error": f"load: {one_line(exc)}"}
    try:
        dev = be.dev
        out: dict[str, Any] = {"load_s": load_s, "tuning": tuning_picks(be)}
        out["measurement"] = measure(
            be,
            weights.config,
            be.budget["weights"],
            lambda: bench.copy_bandwidth(dev, repeats=3),
            seconds,
            gpu=not dev.caps.is_software,
        )
        return out
    finally:
        be.close()
        weights.close()


def cpu_weights_bytes(weights: WeightSource) -> int:
    """Bytes a CPU decode step reads: every matrix in f32 (the reference dequantizes at load)."""
    return sum(4 * int(np.prod(t.shape)) for t in weights.tensors.values() if not t.is_norm)


def cpu(seconds: float = SECONDS, model: str | Path | None = None) -> dict[str, Any]:
    """Load the model on the numpy reference and measure it (the CPU's own bandwidth: numpy copy)."""
    from phoenix_chat.engine.backends.cpu import CpuBackend
    from phoenix_chat.engine.weights import open_weights

    try:
        weights = open_weights(model_path(model))
    except Exception as exc:
        return {"error": f"model: {one_line(exc)}"}
    try:
        load_s, be = _timed(lambda: CpuBackend(weights, CONTEXT))
    except Exception as exc:
        weights.close()
        return {"error": f"load: {one_line(exc)}"}
    try:
        m = measure(be, weights.config, cpu_weights_bytes(weights), host_copy_bandwidth, seconds, gpu=False)
        return {"name": be.device_name, "load_s": load_s, "measurement": m}
    finally:
        be.close()
        weights.close()
