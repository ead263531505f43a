"""Fixtures for the NPU tests: emulator stand-in kernels in a temporary folder."""
from __future__ import annotations

import pytest

from npu.emulator import EmulatedXrt, write_test_kernel
from npu.kernels.spec import DEFAULT_SPECS
from npu.runtime import NpuDevice, find_kernels


@pytest.fixture
def kernel_dir(tmp_path):
    folder = tmp_path / "kernels"
    for spec in DEFAULT_SPECS:
        write_test_kernel(folder, spec)
    return folder


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
