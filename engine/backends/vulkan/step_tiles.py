"""A batched step's few-token GEMM tiles chosen by timing the whole step, not each product alone.

gemm_tuning times every tile on each weight shape by itself; whole steps disagree. On an H200 the
tiles cmw1_4_k8 / cmw1_8_k2 / cmw1_8_k4 won the 27B's and 4B's products of 8-16 tokens alone
(the 27B down 67 -> 62 µs) yet made whole 8-row steps 5-6 % slower where a load chose them, and
the 4B's 32-row step ran at 4,465 or 4,820 tok/s depending on which tile one load picked for its o
product. So where a bucket's step runs on the GEMMs ("mixed", batch_tuning.py), each shape the
step ran on a GEMM tile tries the tiles that timed within MARGIN of its pick alone — the shapes
that take longest first, at most MAX_TRIALS — one swap at a time, each recorded as a whole step
and timed against the incumbent step on the GPU's clock (both twice, in turn); a swap is kept
where the step runs at least 1 - KEEP faster. The picks are per timed token count
(tuning.gemm_kernels_few): the bucket of that many rows searches them, and the buckets and
forwards that take that count's tiles run the result (batch_tuning re-records and re-times
those buckets' steps).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.autotune import Tuning
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList

MARGIN = 1.15  # an alternative tile timed alone within 15 % of the shape's pick
KEEP = 0.99  # a swap is kept where the whole step runs >= 1 % faster
MAX_TRIALS = 6  # swaps tried per bucket (each a recording, ~0.15 s on an H100's host, and 4 timings)


def breadth() -> tuple[float, int]:
    """(MARGIN, MAX_TRIALS), or PHOENIX_VULKAN_STEP_SEARCH="<margin>,<trials>" (comparisons)."""
    raw = os.environ.get("PHOENIX_VULKAN_STEP_SEARCH")
    if not raw:
        return MARGIN, MAX_TRIALS
    try:
        margin, n = raw.split(",")
        out = float(margin), int(n)
    except ValueError:
        raise ValueError(f"PHOENIX_VULKAN_STEP_SEARCH={raw!r}: '<margin>,<trials>', e.g. '1.3,12'") from None
    if out[0] < 1.0 or out[1] < 0:
        raise ValueError(f"PHOENIX_VULKAN_STEP_SEARCH={raw!r}: a margin >= 1 and trials >= 0")
    return out


@dataclass
class Trials:
    """What one bucket's search tried: GPU µs of the step kept, each swap's step against the
    incumbent's timed beside it, the swaps kept (shape -> tile), and the host seconds it took
    (recordings and timings: part of the load)."""

    step_us: float
    seconds: float = 0.0
    tried: dict[str, dict[str, float]] = field(default_factory=dict)  # "shape -> tile" -> {tile µs, incumbent µs}
    kept: dict[str, str] = field(default_factory=dict)

    def stats(self) -> dict[str, object]:
        return {"step_us": round(self.step_us, 1), "tried": self.tried, "kept": self.kept, "s": round(self.seconds, 3)}


def trials(tuning: Tuning, T: int, used: dict[str, str]) -> list[tuple[str, str]]:
    """(shape, tile) swaps to try in a step of T rows: for each shape the step ran on a GEMM tile
    (`used`: graph.few_token_tiles[T]) the other tiles timed alone within MARGIN of its pick at
    count T, the shapes whose pick took longest first (a shape's faster alternative before its
    slower), at most MAX_TRIALS."""
    margin, max_trials = breadth()
    timed = tuning.gemm_shape_timing_few.get(T, {})
    ranked: list[tuple[float, float, str, str]] = []
    for shape, kn in used.items():
        us = timed.get(shape, {})
        if kn not in us:
            continue
        ranked += [(-us[kn], t, shape, alt) for alt, t in us.items() if alt != kn and t <= margin * us[kn]]
    return [(shape, alt) for _, _, shape, alt in sorted(ranked)[:max_trials]]


def search(
    tuning: Tuning,
    T: int,
    used: dict[str, str],
    incumbent: CommandList,
    step_us: float,
    record: Callable[[], CommandList],
    time_step: Callable[[CommandList], float],
) -> tuple[CommandList, Trials]:
    """Try `trials` one swap at a time (tuning.gemm_kernels_few[T] changed, the step recorded by
    `record`, timed by `time_step` in the order swap, incumbent, incumbent, swap; best of each);
    keep a swap where its step beats the incumbent's by KEEP. Returns the step kept (the
    incumbent's recording, or the last kept swap's: the others are destroyed) and what was tried."""
    t0 = time.perf_counter()
    picks = tuning.gemm_kernels_few[T]
    out = Trials(step_us)
    for shape, alt in trials(tuning, T, used):
        old = picks[shape]
        picks[shape] = alt
        cl = record()
        try:
            t_alt, t_inc = time_step(cl), time_step(incumbent)
            t_inc, t_alt = min(t_inc, time_step(incumbent)), min(t_alt, time_step(cl))
        except BaseException:
            cl.destroy()
            picks[shape] = old
            raise
        out.tried[f"{shape} -> {alt}"] = {"us": round(t_alt, 1), "incumbent_us": round(t_inc, 1)}
        if t_alt < KEEP * t_inc:
            incumbent.destroy()
            incumbent, out.kept[shape] = cl, alt
            out.step_us = t_alt
        else:
            cl.destroy()
            picks[shape] = old
            out.step_us = min(out.step_us, t_inc)
    out.seconds = time.perf_counter() - t0
    return incumbent, out
