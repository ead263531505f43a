"""The memory plan on the heap layouts of real devices, given as plain inputs (plan.Heap):
an iGPU whose device-local heap is only the BIOS carve-out puts its weights in the large
host-visible (GTT) heap and keeps the KV cache and scratch in the carve-out; a discrete card
refuses what its VRAM cannot hold; the error names the heaps. Where the device has
VK_EXT_memory_budget the plan takes no more than its budget (less what the process uses) and no
more than a fraction of its size, and says which rule decided."""

from __future__ import annotations

import pytest

from phoenix_chat.engine.backends.vulkan.plan import Heap, place_weights, usable_bytes, usable_rule
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
        assert b.stats()["memory_budget"] == b.plan.budget_source != ""
        assert vk_device.alloc_heap is None  # restored after the upload
        logits = b.forward([2, 818, 5279], 0)
        assert np.isfinite(logits).all() and int(logits.argmax()) > 0
    finally:
        b.close()


def test_a_budget_smaller_than_the_heap_decides_and_says_so():
    """2 GiB heap, 1 GiB budget of which 0.25 GiB in use: 0.75 GiB can be used, not 80% of 2 GiB;
    the refusal names the budget as the rule, and without the budget the same plan fits."""
    tight = [Heap(2 * GiB, True, True, budget=GiB, usage=GiB // 4)]
    assert usable_bytes(tight[0], True) == 3 * GiB // 4
    assert usable_rule(tight[0], True) == "budget from VK_EXT_memory_budget: 1.00 GiB, 0.25 GiB in use"
    assert usable_rule(LAVAPIPE[0], True) == "80% of heap size: no memory budget extension"
    assert usable_rule(H100[0], False) == "92% of heap size: no memory budget extension"
    with pytest.raises(
        OutOfMemoryError,
        match=r"^0\.75 GiB of its 2\.00 GiB device-local heap can be used "
        r"\(budget from VK_EXT_memory_budget: 1\.00 GiB, 0\.25 GiB in use\)$",
    ):
        place_weights(tight, True, weights=GiB // 2, rest=GiB // 2)
    assert place_weights(LAVAPIPE, True, weights=GiB // 2, rest=GiB // 2) == (None, "device-local")
    with pytest.raises(OutOfMemoryError, match=r"\(80% of heap size: no memory budget extension\)"):
        place_weights(LAVAPIPE, True, weights=GiB, rest=GiB)


def test_a_budget_near_the_whole_heap_keeps_the_fractions_headroom():
    """An idle discrete card reports a budget of ~99% of its VRAM (the H100: 79.16 of 79.65 GiB):
    the plan still keeps the fraction's headroom for the driver and other programs, and says so."""
    h100 = Heap(80 * GiB, True, False, budget=79 * GiB, usage=0)
    assert usable_bytes(h100, False) == int(80 * GiB * 0.92)
    assert usable_rule(h100, False) == (
        "92% of heap size (within the budget from VK_EXT_memory_budget: 79.00 GiB, 0.00 GiB in use)"
    )
    roomy = Heap(2 * GiB, True, True, budget=3 * GiB, usage=0)  # a driver's budget above the heap size
    assert usable_bytes(roomy, True) == int(2 * GiB * 0.8)
    with pytest.raises(OutOfMemoryError):  # 2 GiB less a byte would fit the heap, not 80% of it
        place_weights([roomy], True, weights=GiB, rest=GiB - 1)


def test_the_gtt_heap_is_sized_by_its_own_budget():
    """780M: the carve-out by the fraction (no budget reported for it here), the GTT heap by its
    budget: weights that fit 80% of GTT but not its budget are refused, naming the GTT budget."""
    gtt = Heap(15 * GiB, False, True, budget=6 * GiB, usage=GiB)
    heaps = [RADV_780M[0], gtt]
    assert place_weights(heaps, True, weights=4 * GiB, rest=GiB)[0] == 1
    with pytest.raises(
        OutOfMemoryError, match=r"5\.00 GiB of its 15\.00 GiB GTT heap \(budget from VK_EXT_memory_budget"
    ):
        place_weights(heaps, True, weights=6 * GiB, rest=GiB)


def test_the_real_budget_query(vk_device):
    """This device's VK_EXT_memory_budget answer, asked through vkGetPhysicalDeviceMemoryProperties2:
    one (budget, usage) per heap with 0 < budget <= heap size, or None with the extension absent
    (lavapipe of Mesa 22.3 lists none)."""
    from phoenix_chat.engine.backends.vulkan.device import MEMORY_BUDGET_EXT, list_devices

    caps = vk_device.caps
    budgets = vk_device.heap_budgets()
    probed = next(c for c in list_devices() if c.name == caps.name).heap_budgets
    if MEMORY_BUDGET_EXT not in caps.extensions:
        assert budgets is None and caps.heap_budgets is None and probed is None
        return
    assert budgets is not None and probed is not None and len(budgets) == len(probed) == len(caps.heaps)
    for (size, _local), (budget, usage) in zip(caps.heaps, budgets):
        assert 0 < budget <= size and usage >= 0
    local = max((i for i, (_s, local) in enumerate(caps.heaps) if local), key=lambda i: caps.heaps[i][0])
    buf = vk_device.buffer(256 << 20)  # this process's usage of the device-local heap grows by it
    try:
        after = vk_device.heap_budgets()
        assert after is not None and after[local][1] - budgets[local][1] >= 128 << 20
    finally:
        buf.destroy()


def test_the_plan_takes_the_device_budget_and_refuses_with_it(vk_device, monkeypatch):
    """plan_memory on the real device and the embedded model: it says which rule sized the heap;
    a budget (as VK_EXT_memory_budget would report) below what the model needs refuses the load,
    naming the budget, although the heap's size alone would have let it in."""
    from phoenix_chat.engine.backends.vulkan.device import MEMORY_BUDGET_EXT
    from phoenix_chat.engine.backends.vulkan.plan import plan_memory
    from phoenix_chat.engine.weights import embedded_model_path, open_weights

    weights = open_weights(embedded_model_path())
    try:
        plan = plan_memory(weights, 256, vk_device, None)
        if MEMORY_BUDGET_EXT in vk_device.caps.extensions:
            assert "VK_EXT_memory_budget: " in plan.budget_source
        else:
            pct = 80 if vk_device.caps.uma else 92
            assert plan.budget_source == f"{pct}% of heap size: no memory budget extension"
        need = plan.weights + plan.kv_cache + plan.scratch
        monkeypatch.setattr(vk_device.caps, "heaps", [(8 * need, True)])
        monkeypatch.setattr(vk_device.caps, "host_visible_heaps", frozenset({0}))
        monkeypatch.setattr(vk_device, "heap_budgets", lambda: ((need, need // 2),))
        with pytest.raises(OutOfMemoryError) as err:
            plan_memory(weights, 256, vk_device, None)
        msg = str(err.value)
        assert "needs" in msg and "budget from VK_EXT_memory_budget" in msg and "--quant q4_0" in msg
        assert f"{need / 2 / GiB:.2f} GiB of its {8 * need / GiB:.2f} GiB device-local heap can be used" in msg
        monkeypatch.setattr(vk_device, "heap_budgets", lambda: None)  # the size alone: it fits
        assert plan_memory(weights, 256, vk_device, None).budget_source.endswith("no memory budget extension")
    finally:
        weights.close()
