"""Give the memory of freed models back to the operating system.

A model's freed buffers stay in glibc's heaps: once a large block has been freed, glibc raises
its mmap threshold and serves later large allocations from the heap, which it keeps. Without a
trim a process that unloads a model keeps (part of) its footprint until exit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from functools import cache


@cache
def _libc() -> ctypes.CDLL | None:
    """glibc, where this process runs on it (None on musl or macOS: no malloc_trim there)."""
    name = ctypes.util.find_library("c") if os.name == "posix" else None
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    return libc if hasattr(libc, "malloc_trim") else None


def can_trim() -> bool:
    """Whether release_freed_memory can hand heap memory back here (glibc's malloc_trim)."""
    return _libc() is not None


def release_freed_memory() -> None:
    """Collect cycles (a model's graph keeps buffers until then), then return freed heap pages."""
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
