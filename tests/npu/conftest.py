"""Fixtures for the NPU tests: emulator stand-in kernels in a temporary folder."""

from __future__ import annotations

import shutil

import pytest

from phoenix_chat.npu.runtime import NpuDevice, find_kernels
from tests.npu.emulator import EmulatedXrt


@pytest.fixture
def kernel_dir(tmp_path, npu_test_kernels):
    """This test's own copy of the shared stand-in kernels (tests may break one)."""
    return shutil.copytree(npu_test_kernels, tmp_path / "kernels")


@pytest.fixture
def artifacts(kernel_dir):
    found, problems = find_kernels([kernel_dir], allow_emulator=True)
    assert not problems
    return found


@pytest.fixture
def emu():
    return EmulatedXrt()


@pytest.fixture
def device(emu):
    return NpuDevice(xrt=emu)
