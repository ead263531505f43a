"""Kernel statistics from the driver (pipeline_stats.py, bench/pipeline_stats.py): read where the
driver has VK_KHR_pipeline_executable_properties, refused with the extension's name where not."""

from __future__ import annotations

import pytest

from bench import pipeline_stats as bench_stats
from phoenix_chat.engine.backends.vulkan.device import STATISTICS_EXT, Device
from phoenix_chat.engine.backends.vulkan.pipeline_stats import executables
from phoenix_chat.engine.errors import DeviceUnavailableError


def test_a_product_device_does_not_capture_and_says_how_to(vk_device):
    p = vk_device.pipeline("quantize_q8_1")
    assert not vk_device.capture_statistics
    with pytest.raises(RuntimeError, match="capture_statistics=True"):
        executables(p)


def test_capture_is_refused_by_name_where_the_driver_lacks_it(vk_device, capsys):
    if vk_device.caps.pipeline_statistics:
        pytest.skip(f"{vk_device.name} has {STATISTICS_EXT}: the next test reads it")
    with pytest.raises(DeviceUnavailableError, match=STATISTICS_EXT):
        Device.open(vk_device.caps.index, allow_software=True, capture_statistics=True)
    assert bench_stats.main(["--gemm", "q4_0:tiled"]) == 2
    assert STATISTICS_EXT in capsys.readouterr().err


def test_statistics_of_a_real_kernel(vk_device, capsys):
    if not vk_device.caps.pipeline_statistics:
        pytest.skip(f"{vk_device.name} lacks {STATISTICS_EXT} (lavapipe has none)")
    dev = Device.open(vk_device.caps.index, allow_software=True, capture_statistics=True)
    try:
        exes = executables(dev.pipeline("quantize_q8_1"), representations=True)
    finally:
        dev.close()
    assert exes and all(e.statistics for e in exes), exes
    assert bench_stats.main(["quantize_q8_1"]) == 0
    assert "quantize_q8_1" in capsys.readouterr().out
