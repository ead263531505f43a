"""GPU time of a recorded piece of work, from timestamp queries (the autotuner and bench/)."""
from __future__ import annotations

import numpy as np


def time_us(dev, record, reps: int = 6) -> float:
    """Median GPU microseconds of `record(cl)`, recorded `reps` times back to back with a barrier
    after each (dependent work, as in a decode step); the list runs twice, the second is timed."""
    cl = dev.commands(timestamps=reps + 1)
    cl.timestamp(0)
    for i in range(reps):
        record(cl)
        cl.barrier()
        cl.timestamp(i + 1)
    cl.end()
    cl.submit()
    cl.submit()
    us = float(np.median(np.diff(cl.timestamps_ns()))) / 1e3
    cl.destroy()
    return us


def warm_up(dev, record, seconds: float = 0.1) -> None:
    """Run `record(cl)` repeatedly for `seconds`: a GPU left idle (e.g. while the host uploads or
    records) drops its clocks within milliseconds, and timings taken then read 2x slow (an H100
    timed a 27B decode step at 24 ms cold, 10 ms warm), which would bias whichever candidate
    is timed first."""
    import time
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        time_us(dev, record, reps=20)
