"""The NPU's own errors. npu/ sits below the engine and never imports it: the engine turns these
into its one-line user errors (engine.errors.PhoenixError) where it calls in, in
engine/backends/npu_hybrid.py.
"""

from __future__ import annotations


class NpuError(Exception):
    """A problem the user can act on; `str(err)` is the whole message."""


class NpuUnavailableError(NpuError):
    """The NPU cannot be used here: no pyxrt, or no built kernel of the kind asked for."""


class NpuRunError(NpuError):
    """The NPU did not complete a run (timeout, error state, bad artifact)."""
