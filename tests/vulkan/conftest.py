"""Vulkan tests run on whatever device exists, lavapipe (CPU) included; CI installs lavapipe.

They skip only when there is no Vulkan loader or no device at all, and say so.
"""

from __future__ import annotations

import pytest

from phoenix_chat.engine.errors import DeviceUnavailableError


@pytest.fixture(scope="session")
def vk_device():
    from phoenix_chat.engine.backends.vulkan.device import Device

    try:
        dev = Device.open(allow_software=True)
    except DeviceUnavailableError as exc:
        pytest.skip(f"no Vulkan loader/device on this machine ({exc}); CI installs lavapipe (mesa-vulkan-drivers)")
    yield dev
    dev.close()


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    """A tiny synthetic Gemma 3 GGUF (tools/make_synthetic_gguf.py) for the bench and CLI tests."""
    from tools.make_synthetic_gguf import write

    return write(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny", "q4_0", "q8_0", seed=5)


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/vulkan/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.vulkan)
