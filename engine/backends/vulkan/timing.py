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
