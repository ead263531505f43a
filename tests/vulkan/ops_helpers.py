"""Helpers shared by the tests/vulkan/test_ops_*.py kernel tests (numpy refs, buffers, a runner)."""

from __future__ import annotations

import numpy as np

from phoenix_chat.engine.backends.vulkan.ops_common import pack_step, unpack_step


def nmse(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sum((got - want) ** 2) / max(np.sum(want * want), 1e-30))


def rmsnorm(x, w, eps=1e-6):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


class Bufs:
    """Buffers of one test; destroyed together at the end (lavapipe memory is host RAM)."""

    def __init__(self, dev):
        self.dev = dev
        self.all = []

    def of(self, array):
        array = np.ascontiguousarray(array)
        b = self.dev.buffer(max(array.nbytes, 4))
        self.dev.upload(b, array.reshape(-1).view(np.uint8))
        self.all.append(b)
        return b

    def zeros(self, nbytes):
        return self.of(np.zeros(max(int(nbytes), 4), np.uint8))

    def step(self, **fields):
        b = self.dev.buffer(64, host=True)
        b.write(np.frombuffer(pack_step(**fields).ljust(64, b"\0"), np.uint8))
        self.all.append(b)
        return b

    def read(self, buf, dtype=np.float32, shape=None):
        return self.dev.download(buf, dtype, shape)

    def read_step(self, buf) -> dict:
        return unpack_step(self.dev.download(buf, np.uint8).tobytes())

    def close(self):
        for b in self.all:
            b.destroy()
        self.all.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run(dev, record):
    """Record `record(cl)` into a fresh command list, submit, wait."""
    cl = dev.commands()
    record(cl)
    cl.end()
    cl.submit(wait=True)
    cl.destroy()
