"""npu_status() on fake sysfs/dev trees: one precise status string per missing piece."""

from __future__ import annotations

import os
import types

import pytest

from phoenix_chat.npu.detect import npu_status
from phoenix_chat.npu.kernels.spec import DEFAULT_SPECS
from tests.npu.emulator import write_test_kernel

ADDR = "0000:c4:00.1"


def machine(tmp_path, *, device="0x1502", module=True, bound="amdxdna", firmware=True, node=True):
    """A fake /sys, /dev and /lib/firmware; returns npu_status keyword arguments."""
    sys_, dev, fw = tmp_path / "sys", tmp_path / "dev", tmp_path / "firmware"
    gpu = sys_ / "bus/pci/devices/0000:c4:00.0"
    gpu.mkdir(parents=True)
    (gpu / "vendor").write_text("0x1002\n")
    (gpu / "device").write_text("0x15bf\n")
    if device:
        npu = sys_ / f"bus/pci/devices/{ADDR}"
        npu.mkdir(parents=True)
        (npu / "vendor").write_text("0x1022\n")
        (npu / "device").write_text(device + "\n")
        if bound:
            (sys_ / f"bus/pci/drivers/{bound}").mkdir(parents=True)
            os.symlink(f"../../../bus/pci/drivers/{bound}", npu / "driver")
    if module:
        (sys_ / "module/amdxdna").mkdir(parents=True)
    if firmware:
        (fw / "amdnpu/1502_00").mkdir(parents=True)
        (fw / "amdnpu/1502_00/npu.sbin.1.5.2.380.zst").write_bytes(b"\0")
    (dev / "accel").mkdir(parents=True)
    if node:
        (dev / "accel/accel0").write_bytes(b"")
    kernels = tmp_path / "kernels"
    for spec in DEFAULT_SPECS:
        write_test_kernel(kernels, spec)
    return dict(
        sys_root=sys_,
        dev_root=dev,
        firmware_roots=(fw,),
        kernel_dirs=[kernels],
        allow_emulator_kernels=True,
        import_xrt=lambda: types.SimpleNamespace(__file__="pyxrt.so"),
        kernel_release="6.14.0-test",
    )


def test_everything_present_is_available(tmp_path):
    status = npu_status(**machine(tmp_path))
    assert status.available, status.reason
    assert status.reason == f"ready: AMD XDNA1 NPU (Phoenix, npu1) at {ADDR}, {len(DEFAULT_SPECS)} kernel(s)"
    assert status.details["name"] == "AMD XDNA1 NPU (Phoenix, npu1)"
    assert all(ok for _, ok, _ in status.details["checks"])
    assert status.details["accel_nodes"][0].endswith("accel/accel0")
    assert f"[ok] kernels: {', '.join(sorted(s.name for s in DEFAULT_SPECS))}" in "\n".join(status.lines())


def test_no_npu(tmp_path):
    status = npu_status(**machine(tmp_path, device=None))
    assert not status.available
    assert status.reason.startswith("no AMD XDNA NPU (PCI 1022:1502) under ")
    assert "not a Ryzen AI Phoenix/Hawk Point machine, or the NPU ('IPU') is disabled" in status.reason


def test_xdna2_is_named_but_not_used(tmp_path):
    status = npu_status(**machine(tmp_path, device="0x17f0"))
    assert not status.available
    assert status.reason.startswith(
        f"found an XDNA2 (Strix Point / Strix Halo / Krackan Point) NPU (1022:17f0) at {ADDR}"
    )


def test_driver_not_loaded(tmp_path):
    status = npu_status(**machine(tmp_path, module=False, bound=None, node=False))
    assert not status.available
    assert status.reason == (
        "the amdxdna kernel driver is not loaded (Linux 6.14.0-test; it is part of Linux 6.14 "
        "and later, or build it from github.com/amd/xdna-driver): try `sudo modprobe amdxdna`"
    )
    names = [name for name, ok, _ in status.details["checks"] if not ok]
    assert names == ["driver", "device node"]


def test_driver_loaded_but_not_bound(tmp_path):
    status = npu_status(**machine(tmp_path, bound=None, node=False))
    assert status.reason.startswith(f"amdxdna is loaded but the NPU at {ADDR} is not bound to any driver")
    status = npu_status(**machine(tmp_path / "b", bound="vfio-pci", node=False))
    assert "is bound to vfio-pci" in status.reason


def test_firmware_missing(tmp_path):
    status = npu_status(**machine(tmp_path, bound=None, firmware=False, node=False))
    fw = [msg for name, ok, msg in status.details["checks"] if name == "firmware"][0]
    assert fw.startswith("NPU firmware amdnpu/1502_00/npu.sbin is missing under ")
    # once the driver is bound the firmware is loaded, wherever the file lives
    status = npu_status(**machine(tmp_path / "b", firmware=False))
    assert status.available


def test_device_node_missing(tmp_path):
    status = npu_status(**machine(tmp_path, node=False))
    assert status.reason.endswith("accel/accel* device node although amdxdna is bound (check udev)")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may open anything")
def test_device_node_not_permitted(tmp_path):
    kw = machine(tmp_path)
    os.chmod(kw["dev_root"] / "accel/accel0", 0)
    status = npu_status(**kw)
    assert status.reason.startswith("no permission to open ") and "`render`" in status.reason


def test_pyxrt_missing(tmp_path):
    def no_pyxrt():
        raise ImportError("No module named 'pyxrt'")

    status = npu_status(**{**machine(tmp_path), "import_xrt": no_pyxrt})
    assert status.reason.startswith(
        "pyxrt is not importable (No module named 'pyxrt'): install XRT built with the XDNA plugin"
    )


def test_kernels_missing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    status = npu_status(**{**machine(tmp_path), "kernel_dirs": [empty]})
    assert status.reason.startswith(f"no built int8 GEMM kernel (.xclbin + instructions + manifest) in {empty}: ")
    assert "python -m npu.kernels.build" in status.reason


def test_emulator_stand_ins_never_count_as_kernels(tmp_path):
    status = npu_status(**{**machine(tmp_path), "allow_emulator_kernels": False})
    assert not status.available
    assert "an emulator test stand-in, not a built kernel" in status.reason


def test_probe_reports_open_failure(tmp_path):
    def broken():
        def device(index):
            raise RuntimeError("No devices found")

        return types.SimpleNamespace(__file__="pyxrt.so", device=device)

    status = npu_status(**{**machine(tmp_path), "import_xrt": broken}, probe=True)
    assert status.reason == ("pyxrt could not open the NPU (No devices found): is this XRT built with the XDNA plugin?")


def test_this_machine_reports_a_reason():
    status = npu_status()
    assert isinstance(status.reason, str) and status.reason
    if not status.available:
        assert status.lines()
