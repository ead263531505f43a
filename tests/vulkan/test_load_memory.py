"""Process memory while the real 270M loads on lavapipe (a UMA device), measured the way
bench/load_rss.py does (a fresh process sampling /proc/self/status): the weights are in memory
once. Each tensor's file pages are dropped once it is on the device, so the memory-mapped file
does not stay resident beside the device copy (before: 1.26x the file after loading, peak RSS
2.1x the weights; docs/PERFORMANCE.md)."""

from __future__ import annotations

import pytest

from bench.load_rss import measure


@pytest.fixture(scope="module")
def loaded(vk_device):
    if not vk_device.caps.uma:
        pytest.skip(f"{vk_device.name} is not a UMA device")
    return measure(None, 512, "backend")


def test_no_second_private_copy(loaded):
    # private memory: the device copy (process memory on lavapipe), the KV cache, small buffers
    assert loaded["private_growth_x_weights"] < 1.3, loaded


def test_file_pages_do_not_stay_resident(loaded):
    assert loaded["after_file_mib"] < 0.5 * loaded["file_mib"], loaded


def test_peak_rss_stays_under_two_copies(loaded):
    # the peak: the device copy plus the largest tensor's pages (the 170 MiB embedding table)
    assert loaded["rss_growth_x_weights"] < 1.8, loaded


def test_a_backend_closed_on_a_shared_device_gives_its_memory_back(open_tiny, vk_device):
    """Backends sharing one Device (several models on one GPU; the test session's device): one
    closed frees the weights, caches and buffers it made, and the device's own (staging, scratch,
    the dummy binding) stay for the others, which go on working."""
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    w = open_tiny("q4_0", 11)
    first = VulkanBackend(w, 64, device=vk_device)
    expected = first.forward([2, 17, 30], 0)
    before = vk_device.allocated_bytes
    second = VulkanBackend(w, 64, device=vk_device)
    assert vk_device.allocated_bytes > before + second.budget["weights"]
    second.close()
    assert vk_device.allocated_bytes <= before  # no more than before it loaded
    assert not [b for b in vk_device._buffers if b.owner is second]
    try:
        assert (first.forward([2, 17, 30], 0) == expected).all()
    finally:
        first.close()
