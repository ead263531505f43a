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
