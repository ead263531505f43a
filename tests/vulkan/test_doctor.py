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
    from phoenix_chat.engine.doctor_measure import CONTEXT, FIRST_PROMPT, MAX_PROMPT, cpu_weights_bytes
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
    # the load's own reasons: the memory plan's rule for the heap of the weights, int8 activations' why
    local = max((h for h in dev["heaps"] if h["device_local"]), key=lambda h: h["bytes"])
    assert tuning["weights_heap"] == "device-local" and tuning["memory_budget"] == local["plan_rule"]
    assert tuning["int8_activations_why"] == dev["kernels"]["int8_activations_why"]

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
        # the 2 s budget leaves room for the first prompt only, so it is flagged cut short (whether
        # decode also got a warm run depends on the machine's load: an idle one gets it)
        assert m["cut_short"] is True and p["tokens"] < MAX_PROMPT
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
    _loader_budget_and_why(vk_device, rep, text)


def _loader_budget_and_why(vk_device, rep, text):
    """The loader's version, each heap's budget (or the rule without one) and why each refused
    feature is off, in the JSON and the Markdown of one run, against this device's own probe."""
    import vulkan

    from phoenix_chat.engine.backends.vulkan import ops_gemm
    from phoenix_chat.engine.backends.vulkan.device import MEMORY_BUDGET_EXT

    v = vulkan.vkEnumerateInstanceVersion()
    loader = f"{(v >> 22) & 0x7F}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"
    assert rep["vulkan_loader"] == {"version": loader}
    assert f"## Vulkan\n- loader: Vulkan {loader} (vkEnumerateInstanceVersion)\n" in text
    caps = vk_device.caps
    dev = next(d for d in rep["vulkan"] if d["vulkan_name"] == caps.name)
    has_budget = MEMORY_BUDGET_EXT in caps.extensions
    assert dev["memory_budget"].startswith("VK_EXT_memory_budget" if has_budget else "no VK_EXT_memory_budget")
    for h in dev["heaps"]:
        if has_budget:
            assert 0 < h["budget"] <= h["bytes"] and h["usage"] >= 0
            assert h["plan_rule"].startswith("budget from VK_EXT_memory_budget")
            assert f"; budget {h['budget'] / 2**30:.2f} GiB, {h['usage'] / 2**30:.2f} GiB in use;" in text
        else:
            assert "budget" not in h and "usage" not in h
            pct = 80 if caps.uma or not h["device_local"] else 92
            assert h["plan_rule"] == f"{pct}% of heap size: no memory budget extension"
            assert h["plan_usable_bytes"] == int(h["bytes"] * pct / 100)
        assert f"- heap {h['index']}: {h['bytes'] / 2**30:.2f} GiB" in text and f"({h['plan_rule']})" in text
    # every feature that says no says why; the reasons are the probe's
    assert dev["why_not"] == caps.refused
    for name, on in dev["features"].items():
        assert on or name in dev["why_not"], name
        if not on:
            assert f"{name} no ({dev['why_not'][name]})" in text
    if "VK_KHR_cooperative_matrix" not in caps.extensions:  # lavapipe of Mesa 22.3
        assert dev["why_not"]["cooperative_matrix_f16"] == "no VK_KHR_cooperative_matrix"
    k = dev["kernels"]
    assert (k["int8_activations"], k["int8_activations_why"]) == caps.int8_activations()
    on = "on" if k["int8_activations"] else "off"
    assert f"- int8 activations: {on} ({k['int8_activations_why']})" in text
    refusal = ops_gemm.coopmat_refusal(vk_device)
    assert k["prefill_gemm_why"] == (f"no cooperative-matrix GEMM: {refusal}" if refusal else "cooperative matrices")
    assert f"- prefill GEMM: {k['prefill_gemm']}; {k['prefill_gemm_why']}" in text
    # the NPU section: XRT (none on this machine unless installed) and the layout the runtime uses
    npu = rep["npu"]
    assert npu["columns"]["layout"] == "npu1_4col" and npu["columns"]["columns"] == 4
    assert "- column layout: npu1_4col (4 columns x 4 compute rows" in text
    assert npu["xrt"]["kernels_need"].startswith(">= 2.19") and "- XRT: " in text


def test_the_reasons_each_decision_gives(vk_device, monkeypatch):
    """int8 activations and the coopmat GEMM as the backend decides them, each with its reason,
    on this device's capabilities changed one piece at a time."""
    from dataclasses import replace

    from phoenix_chat.engine.backends.vulkan import ops_gemm

    caps = vk_device.caps
    no_dot = replace(
        caps, int_dot=False, int_dot_accelerated=False, refused={"int_dot": "no VK_KHR_shader_integer_dot_product"}
    )
    assert no_dot.int8_activations() == (False, "no VK_KHR_shader_integer_dot_product")
    assert no_dot.int8_activations(True) == (False, "no VK_KHR_shader_integer_dot_product")
    fast = replace(caps, int_dot=True, int_dot_accelerated=True, refused={})
    assert fast.int8_activations() == (True, "the packed 4x8 int8 dot is hardware-accelerated")
    assert fast.int8_activations(False) == (False, "disabled by option (int_dot=False)")
    slow = replace(caps, int_dot=True, int_dot_accelerated=False)
    assert slow.int8_activations()[0] is False and "emulated" in slow.int8_activations()[1]
    assert slow.int8_activations(True)[0] is True and "forced by option" in slow.int8_activations(True)[1]

    class Dev:
        def __init__(self, c):
            self.caps = c

    shape = "no f16 16x16x16 configuration (f16 x f16 -> f32, subgroup scope)"
    no_shape = replace(caps, cooperative_matrix=False, refused={"cooperative_matrix_f16": shape})
    assert ops_gemm.coopmat_refusal(Dev(no_shape)) == shape and not ops_gemm.coopmat_ok(Dev(no_shape))
    big = replace(
        caps, cooperative_matrix=True, subgroup_size=32, max_workgroup_invocations=1024, shared_memory=64 << 10
    )
    assert ops_gemm.coopmat_refusal(Dev(big)) is None and ops_gemm.kernel(Dev(big)) == "coopmat"
    small = replace(big, shared_memory=32 << 10)
    assert ops_gemm.coopmat_refusal(Dev(small)) == "32 KiB of shared memory, the coopmat tiles need 40 KiB"
    wave = replace(big, subgroup_size=256)
    assert "8 subgroups of 256 exceed maxComputeWorkGroupInvocations 1024" == ops_gemm.coopmat_refusal(Dev(wave))
    monkeypatch.setenv("PHOENIX_VULKAN_COOPMAT", "0")
    assert ops_gemm.coopmat_refusal(Dev(big)) == "disabled by PHOENIX_VULKAN_COOPMAT=0"


def test_the_probe_names_the_first_missing_piece(monkeypatch):
    """device._refusals on a RADV-like device: VK_KHR_cooperative_matrix and every feature it
    needs are there but no 16x16x16 f16 shape; API 1.3 without subgroup size control for compute."""
    from types import SimpleNamespace as NS

    import vulkan as vk

    from phoenix_chat.engine.backends.vulkan import device

    monkeypatch.setattr(device, "_coopmat_f16_16x16", lambda vk, pd: False)
    on = dict(vulkanMemoryModel=1, shaderFloat16=1, storageBuffer8BitAccess=1)
    args = dict(
        vk=vk,
        pd=None,
        api=vk.VK_MAKE_VERSION(1, 3, 0),
        exts=frozenset({"VK_KHR_cooperative_matrix"}),
        sg=NS(supportedOperations=vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT),
        ssc=NS(),
        sg_compute=False,
        f11=NS(storageBuffer16BitAccess=1),
        f12=NS(**on),
        f13=NS(subgroupSizeControl=1),
        cm=NS(cooperativeMatrix=1),
        idp=NS(integerDotProduct4x8BitPackedSignedAccelerated=1),
        int_dot=True,
    )
    no_f16 = "no f16 16x16x16 configuration (f16 x f16 -> f32, subgroup scope)"
    assert device._refusals(**args) == {
        "cooperative_matrix_f16": no_f16,
        "cooperative_matrix_int8": no_f16,  # the int8 tiles need the device made with matrix cores
        "subgroup_size_control": "requiredSubgroupSizeStages does not include compute",
    }
    # f16 matrices but no s8 shape, then no shaderInt8 at all: each says so
    monkeypatch.setattr(device, "_coopmat_f16_16x16", lambda vk, pd: True)
    monkeypatch.setattr(device, "_coopmat_int8_k", lambda vk, pd: 0)
    got = device._refusals(**{**args, "f12": NS(**on, shaderInt8=1)})
    assert "cooperative_matrix_f16" not in got
    assert got["cooperative_matrix_int8"] == "no s8 16x16x32 or 16x16x16 configuration (s8 x s8 -> s32, subgroup scope)"
    assert device._refusals(**{**args, "f12": NS(**on, shaderInt8=0)})["cooperative_matrix_int8"] == "no shaderInt8"
    monkeypatch.setattr(device, "_coopmat_int8_k", lambda vk, pd: 32)
    assert "cooperative_matrix_int8" not in device._refusals(**{**args, "f12": NS(**on, shaderInt8=1)})
    monkeypatch.setattr(device, "_coopmat_f16_16x16", lambda vk, pd: False)
    older = {**args, "api": vk.VK_MAKE_VERSION(1, 2, 0), "exts": frozenset(), "f13": None, "ssc": None}
    got = device._refusals(**{**older, "int_dot": False})
    assert got["cooperative_matrix_f16"] == "no VK_KHR_cooperative_matrix"
    assert got["int_dot"] == "no VK_KHR_shader_integer_dot_product"
    assert got["subgroup_size_control"] == "no VK_EXT_subgroup_size_control (Vulkan API 1.2)"


def test_doctor_with_no_vulkan_loader_at_all(tmp_path, monkeypatch):
    """libvulkan.so.1 missing: the loader line and the Vulkan section say so, nothing else is lost."""
    from phoenix_chat.engine import doctor
    from phoenix_chat.engine.backends.vulkan import device
    from phoenix_chat.engine.errors import DeviceUnavailableError

    def no_loader():
        raise DeviceUnavailableError("no Vulkan device: the Vulkan loader is not installed (libvulkan.so.1)")

    monkeypatch.setattr(device, "_vk", no_loader)
    rep = doctor.report(self_test=False, root=tmp_path, seconds=None)
    assert rep["vulkan_loader"] == {"error": "no Vulkan device: the Vulkan loader is not installed (libvulkan.so.1)"}
    assert "loader is not installed" in rep["vulkan"]["error"]
    md = doctor.markdown(rep)
    assert "- loader: no Vulkan device: the Vulkan loader is not installed" in md
    assert "- XRT: not found (no version.json: looked at " in md and "- column layout: npu1_4col" in md


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
    xrt = root / "opt/xilinx/xrt"  # XRT 2.18 from a package: older than the kernels were written for
    xrt.mkdir(parents=True)
    (xrt / "version.json").write_text(
        json.dumps({"BUILD_VERSION": "2.18.179", "BUILD_BRANCH": "2024.2", "VERSION_HASH": "4bd4ab5d1"})
    )


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
    xrt_file = str(root / "opt/xilinx/xrt/version.json")
    assert npu["xrt"] == {
        "version": "2.18.179",
        "file": xrt_file,
        "branch": "2024.2",
        "hash": "4bd4ab5d1",
        "kernels_need": ">= 2.19 with the amdxdna (XDNA) plugin",
        "older_than_the_kernels_need": True,
    }
    assert npu["columns"]["layout"] == "npu1_4col" and (npu["columns"]["columns"], npu["columns"]["core_rows"]) == (
        4,
        4,
    )
    assert rep["vulkan_loader"]["version"]  # the loader is there, only no driver: its version still shows
    out = tmp_path / "report.md"
    proc = _doctor("--root", str(root), "--out", str(out), "--no-self-test", env=env)
    assert proc.returncode == 0, proc.stderr
    md = out.read_text()
    assert "- 0000:c4:00.0 1002:15bf: driver amdgpu; vram_total: 0.50 GiB; gtt_total: 15.00 GiB" in md
    assert "**what to do:** amdgpu drives the GPU but Vulkan lists no hardware device" in md
    assert "## NPU" in md and "not available" in md
    assert (
        f"- XRT: 2.18.179 (branch 2024.2, hash 4bd4ab5d1) from {xrt_file}; the kernels were written for XRT >= 2.19"
        in md
    )
    assert "(**older**: install a newer XRT with the XDNA plugin)" in md
    assert "- column layout: npu1_4col (4 columns x 4 compute rows: Phoenix/Hawk Point (XDNA1) expose 4 usable" in md
    assert f"\n- loader: Vulkan {rep['vulkan_loader']['version']} (vkEnumerateInstanceVersion)\n" in md


BUDGET_S = 8.0


def test_doctor_reports_the_tuning_timed_on_lavapipe_and_a_full_measurement(vk_device, tiny_path):
    """Timing forced on lavapipe (the autotuner times GPUs only): the doctor's tuning record is
    the load's, winners among the device's candidates with their times; on a tiny model the
    budget fits the whole ramp, so nothing is cut short."""
    from phoenix_chat.engine.backends.vulkan.autotune import matvec_candidates
    from phoenix_chat.engine.backends.vulkan.backend import VulkanOptions
    from phoenix_chat.engine.doctor_measure import MAX_PROMPT, vulkan_device
    from phoenix_chat.engine.doctor_tuning import measurement_line, tuning_lines

    # 8 s: with 4 a busy 2-core box spent most of it on the copy measurement and prefill stopped at 8 tokens
    got = vulkan_device(vk_device.caps.index, BUDGET_S, tiny_path, VulkanOptions(autotune=True))
    t = got["tuning"]
    assert t["timed"] is True and set(t["matvec_tuning"]) >= {"o", "geglu", "down"}
    shapes = [dict(s) for s in matvec_candidates(vk_device.caps)]
    for key, pick in t["matvec_tuning"].items():
        assert pick["us"] > 0 and pick["int8"] is False, key  # no int8 path where the dot is emulated
        assert {k: pick[k] for k in shapes[0]} in shapes, key
    lines = tuning_lines(t)
    assert lines[0].startswith("- autotuner (timed at load; context 1024)")
    assert f"o: f32 {' '.join(f'{k}={v}' for k, v in shapes[0].items())} {t['matvec_tuning']['o']['us']} µs" in lines[1]
    # the doctor times afresh and keeps the result for later loads (tuning_record.py)
    rec = t["record"]
    assert rec["mode"] == "refresh" and rec["source"] == "timed" and Path(rec["path"]).is_file(), rec
    assert lines[-1] == f"- timing took {rec['timed_s']} s; kept for later loads in {rec['path']}"
    m = got["measurement"]
    p, d = m["prefill"], m["decode"]
    assert p["tokens"] in (32, 128, MAX_PROMPT) and p["warm"] and d["warm"], m  # ramped past the first 8
    assert m["cut_short"] is (p["tokens"] < MAX_PROMPT) and d["tokens"] > 4 and m["spent_s"] < BUDGET_S + 2.0
    assert measurement_line(m).startswith(f"- measurement ({m['spent_s']:.1f} s of a {BUDGET_S:g} s budget")


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


def test_doctor_model_flag_measures_that_file(vk_device, tiny_path):
    """`doctor --model PATH` on the command line: the report names that file and each backend's
    measurement streams its weights (the tiny file's, not the embedded 270M's ~253 MB)."""
    from phoenix_chat.engine.doctor_measure import cpu_weights_bytes
    from phoenix_chat.engine.weights import open_weights

    proc = _doctor("--json", "--seconds", "1", "--model", str(tiny_path))
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(proc.stdout)
    size = tiny_path.stat().st_size
    assert rep["model"] == {"path": str(tiny_path), "file_bytes": size}
    dev = next(d for d in rep["vulkan"] if d["name"] == vk_device.name)
    for m in (dev["measurement"], rep["cpu"]["measurement"]):
        assert m["decode"]["tokens"] >= 1, m
    assert 0 < dev["measurement"]["weights_bytes_per_token"] <= size
    w = open_weights(tiny_path)
    try:
        assert rep["cpu"]["measurement"]["weights_bytes_per_token"] == cpu_weights_bytes(w)
    finally:
        w.close()


def test_xrt_is_found_through_xilinx_xrt_and_beside_pyxrt(tmp_path, monkeypatch):
    from phoenix_chat.npu.detect import xrt_version

    xrt = tmp_path / "xrt"
    (xrt / "python").mkdir(parents=True)
    (xrt / "version.json").write_text(json.dumps({"BUILD_VERSION": "2.19.0"}))
    assert xrt_version([tmp_path / "nowhere"])["looked"] == [str(tmp_path / "nowhere/version.json")]
    assert xrt_version([tmp_path / "nowhere"], str(xrt / "python/pyxrt.so"))["version"] == "2.19.0"
    monkeypatch.setenv("XILINX_XRT", str(xrt))
    assert xrt_version() == {"version": "2.19.0", "file": str(xrt / "version.json")}
