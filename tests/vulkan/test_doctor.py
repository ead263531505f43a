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


def test_doctor_json_on_this_machine(vk_device, model_path):
    """The real command on the real model with a 2 s budget: lavapipe and the numpy reference
    are both slower than that, so each is cut short to its smallest measurement and says so."""
    from phoenix_chat.engine.backends.vulkan import ops_attention
    from phoenix_chat.engine.doctor_measure import CONTEXT, FIRST_PROMPT, cpu_weights_bytes
    from phoenix_chat.engine.weights import open_weights

    proc = _doctor("--json", "--seconds", "2")
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
    assert rep["model"] == {"path": str(model_path), "file_bytes": model_path.stat().st_size}

    tuning = dev["tuning"]  # lavapipe is a CPU device: not timed at load, the defaults recorded
    assert tuning["timed"] is False and "CPU device" in tuning["note"] and tuning["matvec_tuning"] == {}
    assert tuning["context_length"] == CONTEXT and tuning["attention_splits"] == ops_attention.default_splits(CONTEXT)
    assert tuning["prefill_gemm"] == dev["kernels"]["prefill_gemm"] and tuning["gemm_kernel"] is None
    assert tuning["qkv_rope"]["WG"] == vk_device.caps.subgroup_size and tuning["few_token_matvec"] == []

    w = open_weights(model_path)
    cpu_bytes = cpu_weights_bytes(w)
    w.close()
    for m, weights_bytes in ((dev["measurement"], None), (rep["cpu"]["measurement"], cpu_bytes)):
        assert m["budget_s"] == 2 and m["spent_s"] > 0 and m["copy_gb_s"] > 0.1, m
        if weights_bytes is not None:
            assert m["weights_bytes_per_token"] == weights_bytes
        p, d = m["prefill"], m["decode"]
        assert p["tokens"] == FIRST_PROMPT and p["tok_s"] == p["tokens"] / p["seconds"]
        assert d["tokens"] >= 1 and d["tok_s"] == d["tokens"] / d["seconds"]
        assert m["decode_gb_s"] == m["weights_bytes_per_token"] * d["tok_s"] / 1e9
        assert m["decode_pct_of_copy"] == 100 * m["decode_gb_s"] / m["copy_gb_s"]
        assert m["cut_short"] is True and d["warm"] is False  # decode's first run alone overran 2 s
    # lavapipe's weights are the device budget's: the file's 253 MB less what stays on the host
    assert (
        0.5 * rep["model"]["file_bytes"] < dev["measurement"]["weights_bytes_per_token"] <= rep["model"]["file_bytes"]
    )
    assert rep["cpu"]["name"].startswith("CPU") and rep["cpu"]["load_s"] > 0


def test_doctor_markdown_to_a_file(vk_device, tmp_path):
    out, js = tmp_path / "report.md", tmp_path / "report.json"
    proc = _doctor("--out", str(out), "--no-self-test", "--json-out", str(js))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text == proc.stdout
    rep = json.loads(js.read_text())  # the same run as JSON
    assert f"### [{rep['vulkan'][0]['index']}] {rep['vulkan'][0]['name']}" in text and rep["cpu"]["measurement"] == {
        "skipped": "not run (--no-self-test: no model was loaded)"
    }
    assert f"subgroup size {vk_device.caps.subgroup_size}" in text and "## NPU" in text and "- self-test:" not in text
    assert "- autotuner and measurement: not run (--no-self-test: no model was loaded)" in text
    assert "## CPU (numpy reference)\n- measurement: not run (--no-self-test" in text


def test_doctor_without_any_vulkan_driver(tmp_path):
    icd = tmp_path / "none.json"  # a loader pointed at no driver finds no device
    env = {"VK_ICD_FILENAMES": str(icd), "VK_DRIVER_FILES": str(icd)}
    proc = _doctor("--json", "--no-self-test", env=env)
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
    proc = _doctor("--json", "--root", str(root), "--no-self-test", env=env)
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
    proc = _doctor("--root", str(root), "--out", str(out), "--no-self-test", env=env)
    assert proc.returncode == 0, proc.stderr
    md = out.read_text()
    assert "- 0000:c4:00.0 1002:15bf: driver amdgpu; vram_total: 0.50 GiB; gtt_total: 15.00 GiB" in md
    assert "**what to do:** amdgpu drives the GPU but Vulkan lists no hardware device" in md
    assert "## NPU" in md and "not available" in md


def test_doctor_reports_the_tuning_timed_on_lavapipe_and_a_full_measurement(vk_device, tiny_path):
    """Timing forced on lavapipe (the autotuner times GPUs only): the doctor's tuning record is
    the load's, winners among the device's candidates with their times; on a tiny model the
    budget fits the whole ramp, so nothing is cut short."""
    from phoenix_chat.engine.backends.vulkan.autotune import matvec_candidates
    from phoenix_chat.engine.backends.vulkan.backend import VulkanOptions
    from phoenix_chat.engine.doctor_measure import MAX_PROMPT, vulkan_device
    from phoenix_chat.engine.doctor_tuning import measurement_line, tuning_lines

    got = vulkan_device(vk_device.caps.index, 4.0, tiny_path, VulkanOptions(autotune=True))
    t = got["tuning"]
    assert t["timed"] is True and set(t["matvec_tuning"]) >= {"o", "geglu", "down"}
    shapes = [dict(s) for s in matvec_candidates(vk_device.caps)]
    for key, pick in t["matvec_tuning"].items():
        assert pick["us"] > 0 and pick["int8"] is False, key  # no int8 path where the dot is emulated
        assert {k: pick[k] for k in shapes[0]} in shapes, key
    lines = tuning_lines(t)
    assert lines[0].startswith("- autotuner (timed at load; context 1024)")
    assert f"o: f32 {' '.join(f'{k}={v}' for k, v in shapes[0].items())} {t['matvec_tuning']['o']['us']} µs" in lines[1]
    m = got["measurement"]
    p, d = m["prefill"], m["decode"]
    assert p["tokens"] in (32, 128, MAX_PROMPT) and p["warm"] and d["warm"], m  # ramped past the first 8
    assert m["cut_short"] is (p["tokens"] < MAX_PROMPT) and d["tokens"] > 4 and m["spent_s"] < 4.0 + 2.0
    assert measurement_line(m).startswith(f"- measurement ({m['spent_s']:.1f} s of a 4 s budget")


def test_a_device_failing_mid_measurement_is_one_line_and_the_report_goes_on(
    vk_device, tiny_path, tmp_path, monkeypatch
):
    """The device is lost while decoding (as a GPU reset surfaces: VkErrorDeviceLost from the
    driver): that device's measurement is one line saying where, with what it measured before;
    the CPU is still measured and the report is whole."""
    import vulkan

    from phoenix_chat.engine import doctor
    from phoenix_chat.engine.backends.vulkan.backend import VulkanBackend

    def lost(self, *a, **k):
        raise vulkan.VkErrorDeviceLost("vkQueueSubmit: VK_ERROR_DEVICE_LOST\n(second line)")

    monkeypatch.setattr(VulkanBackend, "decode_tokens", lost)
    rep = doctor.report(root=tmp_path, seconds=1.0, model=tiny_path)
    dev = next(d for d in rep["vulkan"] if d["index"] == vk_device.caps.index)
    m = dev["measurement"]
    assert m["error"] == "decode: VkErrorDeviceLost: vkQueueSubmit: VK_ERROR_DEVICE_LOST"
    assert m["partial"]["copy_gb_s"] > 0 and m["partial"]["prefill"]["tokens"] >= 8
    assert dev["tuning"]["timed"] is False  # the load and its tuning came before the failure
    assert rep["cpu"]["measurement"]["decode"]["tokens"] >= 1  # the CPU is measured all the same
    md = doctor.markdown(rep)
    line = next(x for x in md.splitlines() if x.startswith("- measurement: decode: VkErrorDeviceLost"))
    assert line.endswith(
        f"(measured before it: copy {m['partial']['copy_gb_s']:.1f} GB/s, prefill "
        f"{m['partial']['prefill']['tok_s']:.1f} tok/s)"
    )
    assert "## CPU (numpy reference)" in md and "## NPU" in md


def test_a_model_that_does_not_load_is_one_line_per_device(vk_device, tmp_path):
    from phoenix_chat.engine import doctor

    missing = tmp_path / "missing.gguf"
    rep = doctor.report(root=tmp_path, seconds=1.0, model=missing)
    assert rep["model"]["error"].startswith("FileNotFoundError")
    dev = rep["vulkan"][0]
    assert dev["tuning"] == dev["measurement"] and dev["tuning"]["error"].startswith("model: ")
    assert rep["cpu"]["measurement"]["error"].startswith("model: ")
    md = doctor.markdown(rep)
    assert f"- autotuner and measurement: {dev['tuning']['error']}" in md
    assert f"## CPU (numpy reference)\n- measurement: {rep['cpu']['measurement']['error']}" in md
