"""User-facing errors.

Every problem a user can cause (a bad file, a model too big, no Vulkan device) is a
`PhoenixError` with a one-line message; the CLI prints it and exits 2, the GUI shows it.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os


class PhoenixError(Exception):
    """A problem the user can act on; `str(err)` is the whole message."""


class ModelFileError(PhoenixError):
    """A model file or folder is missing, truncated, corrupt or of an unsupported kind."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UnsupportedModelError(ModelFileError):
    """The file is well formed but holds an architecture or tensor type we do not run."""


class OutOfMemoryError(PhoenixError):
    """The model, cache and scratch would not fit in the chosen device's memory."""


class DeviceUnavailableError(PhoenixError):
    """The requested compute device (Vulkan GPU, NPU) is not present or not usable."""


class DeviceRunError(PhoenixError):
    """A compute device failed while running (an NPU run that timed out or ended in an error state)."""


class CancelledError(PhoenixError):
    """Long work (loading, re-quantizing, reading a prompt) was cancelled by the user.

    A backend raises it between prefill chunks when the `cancel` check passed to `forward`
    says so; `stream_generate` turns it into finish_reason "cancelled"."""


class ContextFull(Exception):
    """A prompt does not fit the backend's context window (raised by the token generators).

    Not a PhoenixError: `stream_generate` checks the length first and reports "context" itself."""
