"""The memory plan on the heap layouts of real devices, given as plain inputs (plan.Heap):
an iGPU whose device-local heap is only the BIOS carve-out puts its weights in the large
host-visible (GTT) heap and keeps the KV cache and scratch in the carve-out; a discrete card
refuses what its VRAM cannot hold; the error names the heaps."""

from __future__ import annotations

import pytest

from phoenix_chat.engine.backends.vulkan.plan import Heap, place_weights
from phoenix_chat.engine.errors import OutOfMemoryError

GiB = 2**30
# Radeon 780M under RADV with a 2 GiB carve-out on a 32 GiB machine: heap 0 the carve-out
# (device-local, with a host-visible type), heap 1 GTT (host-visible, not device-local)
RADV_780M = [Heap(2 * GiB, True, True), Heap(15 * GiB, False, True)]
H100 = [Heap(80 * GiB, True, True), Heap(250 * GiB, False, True)]  # resizable BAR: VRAM host-visible too
LAVAPIPE = [Heap(2 * GiB, True, True)]


def test_small_model_stays_in_the_carve_out():
    assert place_weights(RADV_780M, True, weights=300 << 20, rest=200 << 20) == (None, "device-local")


def test_model_larger_than_the_carve_out_goes_to_gtt():
    heap, where = place_weights(RADV_780M, True, weights=int(7.5 * GiB), rest=900 << 20)  # 12B Q4_0
    assert heap == 1 and "GTT" in where


def test_kv_cache_larger_than_the_carve_out_is_refused_with_both_heaps_named():
    with pytest.raises(OutOfMemoryError, match=r"1\.60 GiB of its 2\.00 GiB device-local.*12\.00 GiB of its 15\.00"):
        place_weights(RADV_780M, True, weights=3 * GiB, rest=int(1.8 * GiB))


def test_weights_larger_than_gtt_are_refused():
    with pytest.raises(OutOfMemoryError, match="GTT heap"):
        place_weights(RADV_780M, True, weights=13 * GiB, rest=GiB)


def test_discrete_card_never_streams_weights_from_system_memory():
    assert place_weights(H100, False, weights=60 * GiB, rest=10 * GiB) == (None, "device-local")
    with pytest.raises(OutOfMemoryError, match="80.00 GiB device-local heap"):
        place_weights(H100, False, weights=75 * GiB, rest=2 * GiB)


def test_one_heap_uma_device_keeps_a_fifth_free():
    assert place_weights(LAVAPIPE, True, weights=GiB, rest=GiB // 2)[0] is None
    with pytest.raises(OutOfMemoryError, match=r"1\.60 GiB of its 2\.00 GiB"):
        place_weights(LAVAPIPE, True, weights=GiB, rest=GiB)


def test_backend_loads_into_the_heap_the_plan_names(vk_device, monkeypatch):
    """On the real device: a plan that names heap 0 explicitly (as the GTT case does) puts
    the weights' buffers there through Device.allocating_in, and the model still runs."""
    import numpy as np

    from phoenix_chat.engine.backends.vulkan import backend as vk_backend
    from phoenix_chat.engine.backends.vulkan import plan as vk_plan
    from phoenix_chat.engine.weights import embedded_model_path, open_weights

    monkeypatch.setattr(vk_plan, "place_weights", lambda *a: (0, "host-visible heap 0 (forced)"))
    weights = open_weights(embedded_model_path())
    b = vk_backend.VulkanBackend(weights, 128, vk_backend.VulkanOptions(), device=vk_device)
    try:
        assert b.stats()["weights_heap"] == "host-visible heap 0 (forced)"
        assert vk_device.alloc_heap is None  # restored after the upload
        logits = b.forward([2, 818, 5279], 0)
        assert np.isfinite(logits).all() and int(logits.argmax()) > 0
    finally:
        b.close()
