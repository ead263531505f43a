"""GPU time of a recorded piece of work, from timestamp queries (the autotuner and bench/)."""
from __future__ import annotations

import time

import numpy as np

# A GPU left idle (while the host uploads or records) drops its clocks, and a short list timed
# then reads several times slow: an H100 timed a 27B-shaped o-proj matvec at 69 us against
# 11 us in a running decode step, which made the load-time autotune's choices noise. Before
# timing, the recorded list is replayed back to back for this long (hardware devices).
BUSY_S = 0.02


def time_us(dev, record, reps: int = 6, busy_s: float | None = None) -> float:
    """Median GPU microseconds of `record(cl)`, recorded `reps` times back to back with a barrier
    after each (dependent work, as in a decode step). The list is replayed for `busy_s` seconds
    first (default BUSY_S on hardware, 0 on CPU Vulkan), so clocks are up, then timed once."""
    cl = dev.commands(timestamps=reps + 1)
    cl.timestamp(0)
    for i in range(reps):
        record(cl)
        cl.barrier()
        cl.timestamp(i + 1)
    cl.end()
    cl.submit()
    busy_s = (0.0 if dev.caps.is_software else BUSY_S) if busy_s is None else busy_s
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < busy_s:
        cl.submit(wait=False)
    cl.submit()
    us = float(np.median(np.diff(cl.timestamps_ns()))) / 1e3
    cl.destroy()
    return us


def warm_up(dev, record, seconds: float = 0.1) -> None:
    """Replay `record(cl)` back to back for `seconds`, so the clocks are up for what follows."""
    time_us(dev, record, reps=20, busy_s=seconds)
