"""A stand-in engine for fast protocol tests: same API as `engine`, echoes words slowly.

Selected in the worker with PHOENIX_CHAT_ENGINE_MODULE=tests.app.fake_engine.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

from engine.errors import CancelledError


class _Backend:
    name = "fake"
    device_name = "Fake device"

    def __init__(self, context_length):
        self.context_length = context_length

    def stats(self):
        return {"busy": 0.5}

    def close(self):
        pass


class LoadedModel:
    def __init__(self, path, context_length, quant):
        self.config = SimpleNamespace(name="Fake Gemma", context_length=32768)
        self.backend = _Backend(context_length or 32768)
        self.is_instruction_tuned = False
        self.quant = quant

    def describe(self):
        return f"Fake Gemma ({self.quant or 'file'})"


def load(path=None, backend="auto", context_length=None, quant=None, device=None, progress=None, cancel=None):
    for i in range(5):
        if cancel is not None and cancel.is_set():
            raise CancelledError("loading cancelled")
        if progress:
            progress(i / 5, f"step {i}")
        time.sleep(0.02)
    if progress:
        progress(1.0, "done")
    return LoadedModel(path, context_length, quant)
