"""`phoenix-chat doctor` as a user runs it: a real process on this machine (lavapipe in CI),
its JSON parsed; Markdown written to --out; and no crash without any Vulkan driver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "phoenix_chat.app.cli", "doctor", *args]
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300)


def test_doctor_json_on_this_machine(vk_device):
    proc = _doctor("--json")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["system"]["python"] == sys.version.split()[0] and rep["system"]["ram_bytes"] > 0
    dev = next(d for d in rep["vulkan"] if d["name"] == vk_device.name)
    assert dev["subgroup_size"] == vk_device.caps.subgroup_size
    lo, hi = dev["subgroup_size_range"]
    assert lo <= dev["subgroup_size"] <= hi
    assert sum(h["bytes"] for h in dev["heaps"] if h["device_local"]) == vk_device.caps.device_local_bytes
    assert set(dev["features"]) >= {"cooperative_matrix_f16", "int_dot", "fp16", "storage16"}
    assert dev["kernels"]["prefill_gemm"]
    st = dev["self_test"]
    assert st["passed"] is True and st["matvec_q8_0_nmse"] < 1e-9
    assert "status" in rep["npu"]


def test_doctor_markdown_to_a_file(vk_device, tmp_path):
    out = tmp_path / "report.md"
    proc = _doctor("--out", str(out), "--no-self-test")
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text == proc.stdout
    assert f"subgroup size {vk_device.caps.subgroup_size}" in text and "## NPU" in text and "self-test" not in text


def test_doctor_without_any_vulkan_driver(tmp_path):
    icd = tmp_path / "none.json"  # a loader pointed at no driver finds no device
    proc = _doctor("--json", env={"VK_ICD_FILENAMES": str(icd), "VK_DRIVER_FILES": str(icd)})
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert "error" in rep["vulkan"] and "Vulkan" in rep["vulkan"]["error"]


def fake_phoenix_tree(root: Path) -> None:
    """sys/ and dev/ of a Ryzen 7840U laptop: the 780M bound to amdgpu (512 MiB carve-out,
    15 GiB GTT) and the XDNA NPU on the bus with the amdxdna module loaded, but no NPU firmware
    installed, so the driver did not bind and there is no /dev/accel node."""
    pci = root / "sys/bus/pci/devices"
    drivers = root / "sys/bus/pci/drivers"
    for addr, cls, ids, driver, files in (
        ("0000:c4:00.0", "0x030000", ("0x1002", "0x15bf"), "amdgpu", {"mem_info_vram_total": 512 << 20}),
        ("0000:c4:00.1", "0x118000", ("0x1022", "0x1502"), None, {}),
        ("0000:00:14.0", "0x0c0330", ("0x1022", "0x15b9"), None, {}),  # a USB controller: not a GPU
    ):
        d = pci / addr
        d.mkdir(parents=True)
        (d / "class").write_text(cls + "\n")
        (d / "vendor").write_text(ids[0] + "\n")
        (d / "device").write_text(ids[1] + "\n")
        for name, value in {**files, **({"mem_info_gtt_total": 15 << 30} if driver == "amdgpu" else {})}.items():
            (d / name).write_text(f"{value}\n")
        if driver:
            (drivers / driver).mkdir(parents=True, exist_ok=True)
            os.symlink(f"../../../bus/pci/drivers/{driver}", d / "driver")
    (root / "sys/module/amdxdna").mkdir(parents=True)
    (root / "dev").mkdir()


def test_doctor_with_no_vulkan_device_no_npu_and_a_fake_phoenix_sysfs(tmp_path):
    """No Vulkan driver, an NPU short of its firmware, amdgpu and amdxdna in a fake sysfs: the
    report still comes, names the GPU's driver and memory split, and says what to do first."""
    root = tmp_path / "root"
    fake_phoenix_tree(root)
    icd = tmp_path / "none.json"
    env = {"VK_ICD_FILENAMES": str(icd), "VK_DRIVER_FILES": str(icd)}
    proc = _doctor("--json", "--root", str(root), env=env)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    assert "error" in rep["vulkan"]
    assert rep["gpus"] == [
        {
            "address": "0000:c4:00.0",
            "id": "1002:15bf",
            "driver": "amdgpu",
            "mem_info_vram_total": 512 << 20,
            "mem_info_gtt_total": 15 << 30,
        }
    ]
    assert "install Mesa's RADV" in rep["hint"] and "mesa-vulkan-drivers" in rep["hint"]
    npu = rep["npu"]
    assert npu["available"] is False and "amdxdna is loaded but the NPU at 0000:c4:00.1 is not bound" in npu["status"]
    failed = {name: msg for name, ok, msg in npu["details"]["checks"] if not ok}
    assert "amdnpu/" in failed["firmware"] and "linux-firmware" in failed["firmware"]
    out = tmp_path / "report.md"
    proc = _doctor("--root", str(root), "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    md = out.read_text()
    assert "- 0000:c4:00.0 1002:15bf: driver amdgpu; vram_total: 0.50 GiB; gtt_total: 15.00 GiB" in md
    assert "**what to do:** amdgpu drives the GPU but Vulkan lists no hardware device" in md
    assert "## NPU" in md and "not available" in md
