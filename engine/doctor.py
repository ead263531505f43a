"""`phoenix-chat doctor`: what a user pastes into a bug report, from real probes only.

The machine (OS, kernel, CPU, RAM, Python, our version), each Vulkan device (driver, API,
subgroup size and the range a pipeline may ask for, memory heaps, the features the kernels use
or go without), which kernel paths the engine picks there, a short self-test (a quantized
matvec and a prefill GEMM on the device against numpy), the autotuner's picks and timings when
the embedded model loads there, a ~10 s measurement on each device and the CPU
(doctor_measure.py: copy bandwidth, prefill, decode, % of roofline), and the NPU chain's state.
Every probe is wrapped: a missing piece is a line in the report, never a crash.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from phoenix_chat.engine.doctor_tuning import measurement_line


def _guarded(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # the report says what failed instead of failing
        return {"error": f"{type(exc).__name__}: {exc}", "where": traceback.format_exc(limit=2).splitlines()[-2:]}


def system_section() -> dict[str, Any]:
    from phoenix_chat.engine.gpu_names import cpu_model_name

    try:
        version = importlib.metadata.version("phoenix-chat")
    except importlib.metadata.PackageNotFoundError:
        version = "not installed (running from a source tree)"
    return {
        "os": platform.platform(),
        "kernel": platform.release(),
        "cpu": cpu_model_name() or platform.processor() or platform.machine(),
        "cores": psutil.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "python": sys.version.split()[0],
        "phoenix_chat": version,
        "numpy": np.__version__,
    }


NOT_RUN = {"skipped": "not run (--no-self-test: no model was loaded)"}


def _one_line(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """fn's dict, or {"error": one line} where it raised."""
    from phoenix_chat.engine.doctor_measure import one_line

    try:
        return fn()
    except Exception as exc:
        return {"error": one_line(exc)}


def loader_section() -> dict[str, Any]:
    """The Vulkan loader's version (vkEnumerateInstanceVersion), or why there is none."""
    from phoenix_chat.engine.backends.vulkan.device import loader_version
    from phoenix_chat.engine.errors import DeviceUnavailableError

    try:
        v = loader_version()
    except DeviceUnavailableError as exc:
        return {"error": str(exc)}
    if v is None:
        return {"version": "1.0", "note": "a Vulkan 1.0 loader (no vkEnumerateInstanceVersion): update libvulkan1"}
    return {"version": ".".join(map(str, v))}


def vulkan_section(
    self_test: bool = True, seconds: float | None = None, model: str | Path | None = None
) -> list[dict[str, Any]] | dict[str, Any]:
    from phoenix_chat.engine.backends.vulkan.device import list_devices
    from phoenix_chat.engine.errors import DeviceUnavailableError

    try:
        found = list_devices()
    except DeviceUnavailableError as exc:
        return {"error": str(exc)}
    return [_device_report(caps, self_test, seconds, model) for caps in found]


def _device_report(
    caps: Any, self_test: bool, seconds: float | None = None, model: str | Path | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": caps.index,
        "name": caps.display_name,
        "vulkan_name": caps.name,
        "type": caps.device_type,
        "driver": caps.driver,
        "driver_id": caps.driver_id,
        "api_version": ".".join(map(str, caps.api_version)),
        "vendor_id": f"{caps.vendor_id:#06x}",
        "software": caps.is_software,
        "subgroup_size": caps.subgroup_size,
        "subgroup_size_range": list(caps.subgroup_size_range),
        "compute_subgroup_sizes": list(caps.compute_subgroup_sizes),
        "uma": caps.uma,
        "memory_budget": (
            "VK_EXT_memory_budget: each heap's budget and this process's usage"
            if caps.heap_budgets is not None
            else "no VK_EXT_memory_budget: the memory plan takes a fixed fraction of each heap's size"
        ),
        "heaps": _heaps(caps),
        "features": {
            "cooperative_matrix_f16": caps.cooperative_matrix,
            "int_dot": caps.int_dot,
            "int_dot_accelerated": caps.int_dot_accelerated,
            "fp16": caps.fp16,
            "storage16": caps.storage16,
            "storage8": caps.storage8,
            "subgroup_arithmetic": caps.subgroup_arithmetic,
            "subgroup_size_control": bool(caps.compute_subgroup_sizes),
        },
        # why each feature above that is "no" is off (the probe's first missing piece)
        "why_not": dict(caps.refused),
        "limits": {
            "shared_memory": caps.shared_memory,
            "max_workgroup_invocations": caps.max_workgroup_invocations,
            "max_storage_buffer_range": caps.max_storage_buffer_range,
            "max_allocation": caps.max_allocation,
        },
    }
    out["kernels"] = _guarded(lambda: _kernel_paths(caps))
    if self_test:
        out["self_test"] = _guarded(lambda: _self_test(caps.index))
    if self_test and seconds is not None:
        from phoenix_chat.engine import doctor_measure

        loaded = _one_line(lambda: doctor_measure.vulkan_device(caps.index, seconds, model))
        failed = {"error": loaded["error"]} if "error" in loaded else None
        out["load_s"] = loaded.get("load_s")
        out["tuning"] = failed or loaded["tuning"]
        out["measurement"] = failed or loaded["measurement"]
    else:
        out["tuning"] = out["measurement"] = NOT_RUN
    return out


def _heaps(caps: Any) -> list[dict[str, Any]]:
    """Each heap with what the memory plan may take of it and by which rule; budget and usage
    where the device has VK_EXT_memory_budget."""
    from phoenix_chat.engine.backends.vulkan.plan import device_heaps, usable_bytes, usable_rule

    out = []
    for i, h in enumerate(device_heaps(caps, caps.heap_budgets)):
        d: dict[str, Any] = {
            "index": i,
            "bytes": h.size,
            "device_local": h.device_local,
            "host_visible": h.host_visible,
        }
        if h.budget is not None:
            d["budget"], d["usage"] = h.budget, h.usage
        d["plan_usable_bytes"], d["plan_rule"] = usable_bytes(h, caps.uma), usable_rule(h, caps.uma)
        out.append(d)
    return out


def _kernel_paths(caps: Any) -> dict[str, Any]:
    """The engine's choices for this device, by the same functions the backend calls."""
    from phoenix_chat.engine.backends.vulkan import ops_gemm
    from phoenix_chat.engine.backends.vulkan.autotune import matvec_candidates
    from phoenix_chat.engine.backends.vulkan.matvec import default_spec
    from phoenix_chat.engine.backends.vulkan.plan import device_heaps, place_weights

    class _Dev:  # the kernel-choice functions read only .caps
        pass

    d = _Dev()
    d.caps = caps  # type: ignore[attr-defined]
    heaps = device_heaps(caps, caps.heap_budgets)
    local = max((h.size for h in heaps if h.device_local), default=0)
    try:  # a model twice the device-local heap: where would its weights go?
        big = place_weights(heaps, caps.uma, weights=int(local * 1.5), rest=local // 8)[1]
    except Exception as exc:
        big = f"refused: {exc}"
    int8, int8_why = caps.int8_activations()  # the backend's rule with the default options
    refusal = ops_gemm.coopmat_refusal(d)  # type: ignore[arg-type]
    return {
        "prefill_gemm": ops_gemm.path(d),  # type: ignore[arg-type]
        "prefill_gemm_why": f"no cooperative-matrix GEMM: {refusal}" if refusal else "cooperative matrices",
        "int8_activations": int8,
        "int8_activations_why": int8_why,
        "matvec_default_shape": default_spec(d),  # type: ignore[arg-type]
        "matvec_autotune_candidates": matvec_candidates(caps) if not caps.is_software else "none (CPU device)",
        "weights_of_a_model_1.5x_the_device_local_heap": big,
    }


def _self_test(index: int) -> dict[str, Any]:
    """A Q8_0 matvec and a Q8_0 prefill GEMM on the device against numpy (float64)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants

    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.matvec import WeightMatrix, record_matvec
    from phoenix_chat.engine.backends.vulkan.ops_gemm import gemm, kernel

    rng = np.random.default_rng(0)
    rows, cols, m = 96, 512, 9
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    raw = quants.quantize(w, Q.Q8_0)
    ref_w = quants.dequantize(raw, Q.Q8_0).reshape(rows, cols).astype(np.float64)
    x = rng.standard_normal((m, cols)).astype(np.float32)
    dev = Device.open(index, allow_software=True)
    try:
        mat = WeightMatrix.upload(dev, raw, Q.Q8_0, (rows, cols))
        xb, yv, yg = dev.buffer(x.nbytes), dev.buffer(rows * 4), dev.buffer(m * rows * 4)
        dev.upload(xb, x)
        cl = dev.commands()
        record_matvec(cl, dev, [mat], xb, yv)
        cl.barrier()
        gemm(cl, dev, xb, mat.tensor, yg, wtype="Q8_0", m=m, n=rows, k=cols)
        cl.submit()
        cl.destroy()
        got_v = dev.download(yv, np.float32, (rows,)).astype(np.float64)
        got_g = dev.download(yg, np.float32, (m, rows)).astype(np.float64)
        gemm_kernel = kernel(dev)
    finally:
        dev.close()
    want = x.astype(np.float64) @ ref_w.T

    def nmse(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.sum((a - b) ** 2) / np.sum(b**2))

    mv, gm = nmse(got_v, want[0]), nmse(got_g, want)
    bound = 1e-5 if gemm_kernel.startswith("coopmat") else 1e-9
    return {
        "matvec_q8_0_nmse": mv,
        "gemm_q8_0_nmse": gm,
        "gemm_kernel": gemm_kernel,
        "passed": bool(mv < 1e-9 and gm < bound),
    }


def npu_section(root: Path = Path("/")) -> dict[str, Any]:
    from phoenix_chat.engine.backends.npu_hybrid import npu_kernel_dirs
    from phoenix_chat.npu.detect import npu_status

    fw = (root / "lib/firmware", root / "usr/lib/firmware")
    st = npu_status(sys_root=root / "sys", dev_root=root / "dev", firmware_roots=fw, kernel_dirs=npu_kernel_dirs())
    return {
        "name": st.details.get("name", "AMD XDNA NPU"),
        "available": st.available,
        "status": st.reason,
        "xrt": _guarded(lambda: _xrt(root, st.details.get("pyxrt"))),
        "columns": _guarded(lambda: _columns(npu_kernel_dirs())),
        "details": st.details,
    }


def _xrt(root: Path, pyxrt: str | None) -> dict[str, Any]:
    """XRT's version.json under `root` ($XILINX_XRT too when root is /, and beside pyxrt), with
    the version the kernels were written for."""
    from phoenix_chat.npu.detect import XRT_DIR, xrt_version
    from phoenix_chat.npu.kernels.build import WRITTEN_FOR

    on_this_machine = root == Path("/")  # else a copied tree: only its own XRT folder
    got = xrt_version(None if on_this_machine else [root / XRT_DIR.lstrip("/")], pyxrt if on_this_machine else None)
    got["kernels_need"] = WRITTEN_FOR["xrt"]
    need, have = re.search(r"(\d+)\.(\d+)", WRITTEN_FOR["xrt"]), re.match(r"(\d+)\.(\d+)", got["version"] or "")
    if need and have:
        got["older_than_the_kernels_need"] = tuple(map(int, have.groups())) < tuple(map(int, need.groups()))
    return got


def _columns(kernel_dirs: list[Path]) -> dict[str, Any]:
    from phoenix_chat.npu.detect import column_layout
    from phoenix_chat.npu.runtime import find_kernels

    return column_layout(find_kernels(kernel_dirs)[0])


PCI_DISPLAY_CLASS = 0x03  # PCI base class "display controller"
AMDGPU_MEMORY = ("mem_info_vram_total", "mem_info_vis_vram_total", "mem_info_gtt_total")


def gpu_pci_section(root: Path = Path("/")) -> list[dict[str, Any]]:
    """Display controllers on the PCI bus with the kernel driver bound to each, and for amdgpu
    its memory split: on an APU "VRAM" is the BIOS carve-out and GTT the system memory it may
    map. Read straight from sysfs, so it says something even where Vulkan finds no device."""
    base = root / "sys/bus/pci/devices"
    out: list[dict[str, Any]] = []
    for dev in sorted(base.iterdir()) if base.is_dir() else []:
        try:
            cls = int(_read(dev / "class") or "0", 16)
            vendor, device = int(_read(dev / "vendor") or "0", 16), int(_read(dev / "device") or "0", 16)
        except ValueError:
            continue
        if cls >> 16 != PCI_DISPLAY_CLASS:
            continue
        link = dev / "driver"
        entry: dict[str, Any] = {
            "address": dev.name,
            "id": f"{vendor:04x}:{device:04x}",
            "driver": os.path.basename(os.readlink(link)) if link.is_symlink() else None,
        }
        for f in AMDGPU_MEMORY:
            v = _read(dev / f)
            if v.isdigit():
                entry[f] = int(v)
        out.append(entry)
    return out


def vulkan_hint(gpus: Any, vulkan: Any) -> str | None:
    """What to do when the kernel drives an AMD GPU but Vulkan reports no device for it."""
    if not isinstance(gpus, list):
        return None
    amd = [g for g in gpus if g["id"].startswith("1002:")]
    if not amd:
        return None
    if not any(g["driver"] == "amdgpu" for g in amd):
        bound = ", ".join(f"{g['id']} ({g['driver'] or 'no driver'})" for g in amd)
        return f"AMD GPU {bound} is not driven by amdgpu, which RADV needs: check the kernel (amdgpu module, firmware)"
    hardware = isinstance(vulkan, list) and any(not d.get("software") for d in vulkan)
    if hardware:
        return None
    return (
        "amdgpu drives the GPU but Vulkan lists no hardware device: install Mesa's RADV driver "
        "(Debian/Ubuntu/Fedora: mesa-vulkan-drivers; Arch: vulkan-radeon) and check VK_ICD_FILENAMES is unset"
    )


def cpu_section(self_test: bool, seconds: float | None, model: str | Path | None) -> dict[str, Any]:
    """The model on the numpy reference, measured like each Vulkan device."""
    from phoenix_chat.engine import doctor_measure

    if not self_test or seconds is None:
        return {"measurement": NOT_RUN}
    got = _one_line(lambda: doctor_measure.cpu(seconds, model))
    return got if "error" not in got else {"measurement": got}


def report(
    self_test: bool = True,
    root: str | Path = "/",
    seconds: float | None = 10.0,
    model: str | Path | None = None,
) -> dict[str, Any]:
    """The whole report. `root`: where /sys, /dev and /lib/firmware are (a copied tree; tests).
    `seconds`: each device's measurement budget (doctor_measure.SECONDS); None: no model
    loaded, nothing tuned or measured; `model`: a GGUF to measure instead of the embedded model."""
    from phoenix_chat.engine import doctor_measure

    root = Path(root)
    measuring = self_test and seconds is not None
    rep = {
        "system": _guarded(system_section),
        "gpus": _guarded(lambda: gpu_pci_section(root)),
        "model": _one_line(lambda: doctor_measure.model_section(model)) if measuring else NOT_RUN,
        "vulkan_loader": _guarded(loader_section),
        "vulkan": _guarded(lambda: vulkan_section(self_test, seconds, model)),
        "cpu": _guarded(lambda: cpu_section(self_test, seconds, model)),
        "npu": _guarded(lambda: npu_section(root)),
    }
    rep["hint"] = _guarded(lambda: vulkan_hint(rep["gpus"], rep["vulkan"]))
    return rep


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _heap_line(h: dict[str, Any]) -> str:
    flags = " ".join(f for f in ("device_local", "host_visible") if h[f]) or "(no flags)"
    line = f"- heap {h['index']}: {_gib(h['bytes'])} {flags}"
    if "budget" in h:
        line += f"; budget {_gib(h['budget'])}, {_gib(h['usage'])} in use"
    if "plan_usable_bytes" in h:
        line += f"; the memory plan may use {_gib(h['plan_usable_bytes'])} ({h['plan_rule']})"
    return line


def _xrt_line(x: dict[str, Any]) -> str:
    if not x:
        return "not probed"
    if "error" in x:
        return f"not read: {x['error']}"
    need = f"; the kernels were written for XRT {x['kernels_need']}" if x.get("kernels_need") else ""
    if not x.get("version"):
        return f"not found (no version.json: looked at {', '.join(x.get('looked', []))}){need}"
    extra = ", ".join(f"{k} {x[k]}" for k in ("branch", "hash") if x.get(k))
    old = " (**older**: install a newer XRT with the XDNA plugin)" if x.get("older_than_the_kernels_need") else ""
    return f"{x['version']}{f' ({extra})' if extra else ''} from {x['file']}{need}{old}"


def _columns_line(c: dict[str, Any]) -> str:
    if "layout" not in c:
        return f"not read: {c['error']}" if "error" in c else "not probed"
    targets = c.get("kernel_targets") or {}
    built = "; ".join(f"{n}: {t}" for n, t in targets.items()) or "no built kernels found"
    return f"{c['layout']} ({c['columns']} columns x {c['core_rows']} compute rows: {c['why']}); {built}"


def _sizes(sizes: list[int] | None) -> str:
    return ", ".join(map(str, sizes)) if sizes else "none (no subgroup size control)"


def _tuned_and_measured(d: dict[str, Any]) -> list[str]:
    """A device's autotuner picks and measurement lines (each a line of its own where it failed)."""
    from phoenix_chat.engine.doctor_tuning import tuning_lines

    tuning, measured = d.get("tuning") or NOT_RUN, d.get("measurement") or NOT_RUN
    if tuning == measured and ("error" in tuning or "skipped" in tuning):  # the load failed or was not asked
        return [f"- autotuner and measurement: {tuning.get('error') or tuning.get('skipped')}"]
    load = [f"- model loaded (and tuned) in {d['load_s']:.1f} s"] if d.get("load_s") is not None else []
    return load + tuning_lines(tuning) + [measurement_line(measured)]


def markdown(rep: dict[str, Any]) -> str:
    """The report as Markdown, for pasting into an issue."""
    lines = ["# phoenix-chat doctor", "", "## System"]
    sysr = rep["system"]
    for k, v in sysr.items():
        lines.append(f"- {k}: {_gib(v) if k == 'ram_bytes' else v}")
    lines += ["", "## GPUs on the PCI bus"]
    gpus = rep.get("gpus", [])
    if isinstance(gpus, dict):
        lines.append(f"- not readable: {gpus.get('error')}")
    for g in gpus if isinstance(gpus, list) else []:
        mem = "; ".join(f"{k.removeprefix('mem_info_')}: {_gib(v)}" for k, v in g.items() if k.startswith("mem_info_"))
        lines.append(f"- {g['address']} {g['id']}: driver {g['driver'] or 'none'}" + (f"; {mem}" if mem else ""))
    if not gpus:
        lines.append("- none found (no display controller under /sys/bus/pci/devices)")
    lines += ["", "## Model measured"]
    model = rep.get("model") or {}
    if "path" in model:
        lines.append(f"- {model['path']} ({model['file_bytes'] / 1e6:.0f} MB): loaded on each device below")
    else:
        lines.append(f"- {model.get('error') or model.get('skipped')}")
    lines += ["", "## Vulkan"]
    if rep.get("hint"):
        lines.append(f"- **what to do:** {rep['hint']}")
    loader = rep.get("vulkan_loader") or {}
    if loader.get("version"):
        note = f" ({loader['note']})" if loader.get("note") else ""
        lines.append(f"- loader: Vulkan {loader['version']} (vkEnumerateInstanceVersion){note}")
    else:
        lines.append(f"- loader: {loader.get('error', 'not probed')}")
    vk = rep["vulkan"]
    if isinstance(vk, dict):
        lines.append(f"- not available: {vk.get('error')}")
    else:
        for d in vk:
            lo, hi = d["subgroup_size_range"]
            lines += [
                f"### [{d['index']}] {d['name']} ({d['type']})",
                f"- reported as: {d.get('vulkan_name', d['name'])}; driver: {d['driver']} (id {d.get('driver_id')}); "
                f"API {d['api_version']}; vendor {d['vendor_id']}",
                f"- subgroup size {d['subgroup_size']} (range {lo}..{hi}; "
                f"a compute pipeline may require {_sizes(d.get('compute_subgroup_sizes'))}); UMA: {d['uma']}",
            ]
            if d.get("memory_budget"):
                lines.append(f"- memory budget: {d['memory_budget']}")
            for h in d["heaps"]:
                lines.append(_heap_line(h))
            why = d.get("why_not") or {}
            feats = ", ".join(
                f"{k} yes" if v else f"{k} no ({why[k]})" if k in why else f"{k} no" for k, v in d["features"].items()
            )
            lines.append(f"- features: {feats}")
            k = d["kernels"]
            if isinstance(k, dict) and "int8_activations_why" in k:
                on = "on" if k["int8_activations"] else "off"
                lines.append(f"- int8 activations: {on} ({k['int8_activations_why']})")
                lines.append(f"- prefill GEMM: {k['prefill_gemm']}; {k['prefill_gemm_why']}")
                k = {key: v for key, v in k.items() if not key.endswith("_why")}
            lines.append(f"- kernels: {k}")
            if "self_test" in d:
                lines.append(f"- self-test: {d['self_test']}")
            lines += _tuned_and_measured(d)
            lines.append("")
    lines += ["## CPU (numpy reference)"]
    cpu = rep.get("cpu") or {}
    if "name" in cpu:
        lines.append(f"- {cpu['name']}; model loaded in {cpu['load_s']:.1f} s")
    lines += [measurement_line(cpu.get("measurement") or cpu), ""]
    npu = rep["npu"]
    lines += ["## NPU", f"- {npu.get('name')}: {'available' if npu.get('available') else 'not available'}"]
    lines.append(f"- status: {npu.get('status', npu.get('error'))}")
    lines.append(f"- XRT: {_xrt_line(npu.get('xrt') or {})}")
    lines.append(f"- column layout: {_columns_line(npu.get('columns') or {})}")
    for k, v in (npu.get("details") or {}).items():
        lines.append(f"- {k}: {v}")
    return "\n".join(lines) + "\n"
