"""A Vulkan load can be given up while it uploads or times kernels (the app's Cancel on a long
first load on a GPU): CancelledError, and what the load had allocated is released.

On lavapipe (a tiny synthetic model; `autotune=True` makes the load time its matvecs, as a GPU's
does) the cancel is set from the load's own progress messages, so it lands at a known stage, or at a
known count of askings inside the first timing stage.
"""

from __future__ import annotations

import threading

import pytest

from phoenix_chat.engine.errors import CancelledError


def _cancel_at(prefix: str) -> tuple[threading.Event, list[str], object]:
    """An event set when a progress message starts with `prefix`, and the messages seen."""
    event = threading.Event()
    seen: list[str] = []

    def progress(fraction: float, message: str) -> None:
        seen.append(message)
        if message.startswith(prefix):
            event.set()

    return event, seen, progress


@pytest.mark.parametrize("prefix", ["uploading", "timing the kernels"], ids=["while uploading", "while timing kernels"])
def test_a_cancelled_load_stops_and_releases_its_device(open_tiny, prefix):
    from phoenix_chat.engine.backends.vulkan import backend as vk_backend
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    event, seen, progress = _cancel_at(prefix)
    closed: list[object] = []
    real_close = vk_backend.Device.close

    def recording_close(dev):
        closed.append(dev)
        real_close(dev)

    options = VulkanOptions(allow_software=True, autotune=True, tuning_record="off")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vk_backend.Device, "close", recording_close)
        with pytest.raises(CancelledError, match="loading cancelled"):
            VulkanBackend(open_tiny(), 64, options, progress=progress, cancel=event)
    assert event.is_set() and len(closed) == 1, (seen, closed)  # its own device, closed once
    after = seen[seen.index(next(m for m in seen if m.startswith(prefix))) + 1 :]
    if prefix == "uploading":
        assert after == [], f"the upload went on after the cancel: {after}"  # stopped at the next tensor


def test_a_load_not_cancelled_keeps_going_and_forgets_the_event(open_tiny, vk_device):
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    event = threading.Event()
    be = VulkanBackend(open_tiny(), 64, VulkanOptions(autotune=True), device=vk_device, cancel=event)
    try:
        event.set()  # after the load: a later Cancel (of another load) is nothing to this backend
        assert be.forward([2, 5, 7], 0).shape == (be.config.vocab_size,)
    finally:
        be.close()


def test_the_loader_passes_cancel_to_a_vulkan_load(model_path):
    """`engine.load(..., cancel=)`, what the app's worker calls, on the embedded model: the Vulkan
    backend stops at the tensor after the Cancel."""
    from phoenix_chat.engine import loader

    event, seen, progress = _cancel_at("uploading")
    with pytest.raises(CancelledError):
        loader.load(model_path, backend="vulkan", context_length=64, progress=progress, cancel=event)
    uploads = [m for m in seen if m.startswith("uploading")]
    assert len(uploads) == 1, seen


class _SetOnAsking(threading.Event):
    """An Event that sets itself the n-th time it is asked after `arm()`: a Cancel pressed while
    the load is in the middle of something, at a point the test chooses by count."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.armed, self.asked = n, False, 0

    def arm(self) -> None:
        self.armed = True

    def is_set(self) -> bool:
        if self.armed and not super().is_set():
            self.asked += 1
            if self.asked >= self.n:
                self.set()
        return super().is_set()


def test_a_cancel_reaches_into_a_timing_stage_and_leaves_a_shared_device_clean(open_tiny, vk_device):
    """Cancel while the matvec candidates are timed (the first stage; seconds of a GPU load) stops
    the load from inside the timing, not at the stage's end; the shared device's hook is cleared,
    and the next load on it times in full."""
    import traceback

    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend, VulkanOptions

    event = _SetOnAsking(3)

    def progress(fraction: float, message: str) -> None:
        if message.startswith("timing the kernels"):
            event.arm()

    options = VulkanOptions(autotune=True, tuning_record="off")
    with pytest.raises(CancelledError, match="loading cancelled") as err:
        VulkanBackend(open_tiny(), 64, options, device=vk_device, progress=progress, cancel=event)
    frames = [f.name for f in traceback.extract_tb(err.value.__traceback__)]
    assert "interrupt" in frames and "tune" in frames, frames  # raised by the timing, inside autotune.tune
    assert event.asked == 3  # asked no more once set
    assert vk_device.timing_interrupt is None
    be = VulkanBackend(open_tiny(), 64, options, device=vk_device)
    try:
        assert be.stats()["tuning_record"]["source"] == "timed" and be.tuning.matvec
    finally:
        be.close()
