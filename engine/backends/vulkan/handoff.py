"""Handoffs: a decode matvec that starts while the small kernel it depends on still runs.

A pipeline barrier between a norm_add / attention / quantize dispatch and the matvec reading its
output costs ~2.3 us on an H100 plus the matvec's ramp-up, and nothing streams from memory while
the small kernel runs. With a handoff the matvec is recorded with no barrier before it: its
workgroups load the start of their weight rows, then spin on a flag the small kernel's last
workgroup sets (shaders/include/handoff.glsl says why that is safe in practice, and what Vulkan
does not promise). `bench.dispatch_cost --handoff` measures the effect.

`Handoffs` owns the flag slots of the recordings: each handoff takes one slot (a 256-byte range
of one buffer, so every device's storage-offset alignment holds), and a recording zeroes them
all first (`begin`).

Off by default (`PHOENIX_VULKAN_HANDOFF=1` turns it on): on an H100 (2026-11-23) the first
version decoded the 27B shape 12 % faster but gave wrong logits — the matvec read x through
plain readonly loads, which the driver may hoist above the wait or serve from a non-coherent
cache. Those pipelines now read x through coherent views (matvec.comp); that fix has run on
lavapipe only, where dispatches run one after another, so it stays opt-in until a real GPU
has passed tests/vulkan with it on.
"""
from __future__ import annotations

import os

SLOT_BYTES = 256


def prefetch_budget() -> int:
    """Bytes of weights all the workgroups of one waiting matvec load early, at most
    (PHOENIX_VULKAN_HANDOFF_PREFETCH_MB, default 0: off). The idea: what the memory delivers
    while a small producer runs (~7 us x 3 TB/s on an H100), well under the L2 (50 MB), so the
    early loads are still cached when the matvec reads them for real. Measured on the H100 with
    the first (wrong-result) version: 0 MB decoded the 27B shape at 127.6 tok/s, 16 MB 124.7,
    32 MB 124.3 — so off until measured again with correct synchronization."""
    return int(float(os.environ.get("PHOENIX_VULKAN_HANDOFF_PREFETCH_MB", "0")) * (1 << 20))


def enabled() -> bool:
    return os.environ.get("PHOENIX_VULKAN_HANDOFF", "0") == "1"


class Handoffs:
    def __init__(self, dev, slots: int):
        self.dev = dev
        self.slots = slots
        self.buffer = dev.buffer(slots * SLOT_BYTES, name="handoff flags")
        self.used = 0

    def begin(self, cl) -> None:
        """Zero every slot before the recording's dispatches (call right after the list begins)."""
        cl.fill(self.buffer, 0)
        cl.barrier()
        self.used = 0

    def take(self):
        """The next slot: (buffer, offset, size), for the producer's and the consumer's binding."""
        if self.used >= self.slots:
            raise RuntimeError(f"more than {self.slots} handoffs in one recording")
        slot = (self.buffer, self.used * SLOT_BYTES, SLOT_BYTES)
        self.used += 1
        return slot

    def destroy(self) -> None:
        self.buffer.destroy()


def binding(dev, slot):
    """What a kernel binds in its handoff slot: the slot, or a placeholder it never touches."""
    if slot is not None:
        return slot
    from engine.backends.vulkan.matvec import dummy
    return dummy(dev)


def spec(slot) -> dict:
    return {"HANDOFF": int(slot is not None)}


def prefetch_words(row_bytes_per_group: int, matrices: int, groups: int) -> int:
    """u16 words of its rows per matrix each workgroup of a waiting matvec loads early."""
    per_group = prefetch_budget() // max(1, groups * matrices)
    return max(0, min(row_bytes_per_group, per_group)) // 2
