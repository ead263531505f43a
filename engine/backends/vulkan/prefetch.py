"""L2 prefetch of decode weights beside latency-bound kernels (shaders/prefetch.comp).

A decode layer is a chain of dependent dispatches; the small ones (QK-norm + RoPE + KV write,
attention, a separate norm) leave DRAM idle for microseconds, and the matvec after each barrier
then ramps up from DRAM. Reading the first bytes of the next matrices in those intervals (a few
workgroups, no barrier of their own) lets those matvecs start from the cache. Whether it pays,
and how many bytes per interval, depends on the cache (50 MB on an H100, a few MB on an iGPU):
`VulkanBackend` times whole decode steps with each budget at load and keeps the fastest (0: off).
"""
from __future__ import annotations

WG = 256
GROUPS = 32            # few enough that the kernel it runs beside keeps most of the GPU
MAGIC = 0x9E3779B9     # the kernel writes its sink only if the XOR of what it read equals this
BUDGETS = (0, 2 << 20, 4 << 20, 8 << 20, 16 << 20)     # bytes per interval the autotuner tries


def sink(dev):
    s = getattr(dev, "_prefetch_sink", None)
    if s is None:
        s = dev._prefetch_sink = dev.buffer(256, name="prefetch_sink")
    return s


def record_prefetch(cl, dev, matrices, budget: int, *, skip: int = 0, split: bool = False) -> None:
    """Read up to `budget` bytes of `matrices` (WeightMatrix list) into the cache, no barrier.
    In order (the first `skip` bytes left out), or with split=True the budget shared equally
    (GEGLU reads gate and up rows side by side)."""
    if budget <= 0:
        return
    if split:
        for m in matrices:
            record_prefetch(cl, dev, [m], budget // len(matrices), skip=skip)
        return
    p = dev.pipeline("prefetch_u32x4", WG=WG)
    left = budget
    for m in matrices:
        for rr in m.tensor.ranges:
            if skip >= rr.size:
                skip -= rr.size
                continue
            n = min(left, rr.size - skip) // 16 * 16
            if n <= 0:
                return
            # skip is rounded down to the binding alignment; a few bytes more are read then
            start = skip // 256 * 256
            cl.dispatch(p, [(rr.buffer, rr.offset + start, n + skip - start), sink(dev)], (GROUPS, 1, 1),
                        p.push.pack(n=(n + skip - start) // 16, magic=MAGIC))
            left -= n
            skip = 0
            if left <= 0:
                return
