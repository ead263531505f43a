"""GPU time of recorded pieces of work, from timestamp queries (the autotuner and bench/).

Clocks: a GPU left idle, even for the milliseconds the host spends recording the next
candidate, drops its clocks, and work timed then reads several times slow (an H100 timed a
27B-shaped o-proj matvec at 69 us against 11 us inside a running decode step), which made the
autotuner's choices noise. So `time_many` records every candidate first, keeps the GPU busy
replaying them back to back (WARM_S first, BUSY_S before each timed run), and only then reads
the timestamps. CPU Vulkan has no clocks to raise: one untimed run, then the timed one.

A load's Cancel reaches into the timing through `Device.timing_interrupt` (asked before each
candidate is recorded and before each replay), so a load stops within one candidate's time
rather than at the end of a timing stage (seconds on a GPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList

K = TypeVar("K", bound=Hashable)
Record = Callable[["CommandList"], None]  # records one piece of work into a command list

WARM_S = 0.3  # replay before the first candidate (hardware devices)
BUSY_S = 0.02  # replay of each candidate before its timed run


def interrupt(dev: Device) -> None:
    """Raise where the work being timed was given up (a load's Cancel: CancelledError)."""
    if dev.timing_interrupt is not None:
        dev.timing_interrupt()


def _record(dev: Device, record: Record, reps: int) -> CommandList:
    interrupt(dev)
    cl = dev.commands(timestamps=reps + 1)
    cl.timestamp(0)
    for i in range(reps):
        record(cl)
        cl.barrier()
        cl.timestamp(i + 1)
    cl.end()
    return cl


def replay(cl: CommandList, seconds: float, before: Callable[[], None] | None = None) -> None:
    """Submit `cl` again and again for `seconds` (at least once): raises an idle GPU's clocks
    before a timed run. before: called ahead of each submit (a recording that moves its own
    state on, as a sampled decode step its positions, is set back)."""
    t0 = time.perf_counter()
    while True:
        interrupt(cl.dev)
        if before is not None:
            before()
        cl.submit()
        if time.perf_counter() - t0 >= seconds:
            return


def time_many(dev: Device, records: Mapping[K, Record], reps: int = 6) -> dict[K, float]:
    """{key: median GPU microseconds of records[key](cl)}, each recorded `reps` times back to back
    with a barrier after each (dependent work, as in a decode step)."""
    hw = not dev.caps.is_software
    lists: dict[K, CommandList] = {}
    try:
        for k, rec in records.items():
            lists[k] = _record(dev, rec, reps)
    except BaseException:
        for cl in lists.values():
            cl.destroy()
        raise
    out: dict[K, float] = {}
    try:
        if hw and lists:
            replay(next(iter(lists.values())), WARM_S)
        for k, cl in lists.items():
            replay(cl, BUSY_S if hw else 0.0)
            cl.submit()
            out[k] = float(np.median(np.diff(cl.timestamps_ns()))) / 1e3
    finally:
        for cl in lists.values():
            cl.destroy()
    return out


def time_us(dev: Device, record: Record, reps: int = 6) -> float:
    """Median GPU microseconds of `record(cl)` (time_many of one)."""
    return time_many(dev, {0: record}, reps)[0]
