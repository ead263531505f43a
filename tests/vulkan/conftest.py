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


@pytest.fixture(scope="session")
def open_tiny(tmp_path_factory):
    """open_tiny(matrix_type, seed): a tiny synthetic Gemma 3 (Q8_0 embedding) opened as
    WeightSource, written once per (type, seed) and closed at the end of the session."""
    from phoenix_chat.engine.weights import open_weights
    from tools.make_synthetic_gguf import write

    opened = {}

    def open_(matrix_type: str = "q4_0", seed: int = 3):
        if (matrix_type, seed) not in opened:
            path = write(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny", matrix_type, "q8_0", seed=seed)
            opened[matrix_type, seed] = open_weights(path)
        return opened[matrix_type, seed]

    yield open_
    for w in opened.values():
        w.close()


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/vulkan/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.vulkan)
