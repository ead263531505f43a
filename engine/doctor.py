"""`phoenix-chat doctor`: what a user pastes into a bug report, from real probes only.

The machine (OS, kernel, CPU, RAM, Python, our version), each Vulkan device (driver, API,
subgroup size and the range a pipeline may ask for, memory heaps, the features the kernels use
or go without), which kernel paths the engine picks there, a short self-test (a quantized
matvec and a prefill GEMM on the device against numpy), and the NPU chain's state. Every probe
is wrapped: a missing piece is a line in the report, never a crash.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil


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


def vulkan_section(self_test: bool = True) -> list[dict[str, Any]] | dict[str, Any]:
    from phoenix_chat.engine.backends.vulkan.device import list_devices
    from phoenix_chat.engine.errors import DeviceUnavailableError

    try:
        found = list_devices()
    except DeviceUnavailableError as exc:
        return {"error": str(exc)}
    return [_device_report(caps, self_test) for caps in found]


def _device_report(caps: Any, self_test: bool) -> dict[str, Any]:
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
        "heaps": [
            {"index": i, "bytes": size, "device_local": local, "host_visible": i in caps.host_visible_heaps}
            for i, (size, local) in enumerate(caps.heaps)
        ],
        "features": {
            "cooperative_matrix_f16": caps.cooperative_matrix,
            "int_dot": caps.int_dot,
            "int_dot_accelerated": caps.int_dot_accelerated,
            "fp16": caps.fp16,
            "storage16": caps.storage16,
            "storage8": caps.storage8,
            "subgroup_arithmetic": caps.subgroup_arithmetic,
        },
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
    return out


def _kernel_paths(caps: Any) -> dict[str, Any]:
    """The engine's choices for this device, by the same functions the backend calls."""
    from phoenix_chat.engine.backends.vulkan import ops_gemm
    from phoenix_chat.engine.backends.vulkan.autotune import matvec_candidates
    from phoenix_chat.engine.backends.vulkan.matvec import default_spec
    from phoenix_chat.engine.backends.vulkan.plan import Heap, place_weights

    class _Dev:  # the kernel-choice functions read only .caps
        pass

    d = _Dev()
    d.caps = caps  # type: ignore[attr-defined]
    heaps = [Heap(size, local, i in caps.host_visible_heaps) for i, (size, local) in enumerate(caps.heaps)]
    local = max((h.size for h in heaps if h.device_local), default=0)
    try:  # a model twice the device-local heap: where would its weights go?
        big = place_weights(heaps, caps.uma, weights=int(local * 1.5), rest=local // 8)[1]
    except Exception as exc:
        big = f"refused: {exc}"
    return {
        "prefill_gemm": ops_gemm.path(d),  # type: ignore[arg-type]
        "int8_activations": bool(caps.int_dot and caps.int_dot_accelerated),
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


def npu_section() -> dict[str, Any]:
    from phoenix_chat.engine.devices import npu_entry

    e = npu_entry()
    return {"name": e.name, "available": e.available, "status": e.status, "details": e.details}


def report(self_test: bool = True) -> dict[str, Any]:
    return {
        "system": _guarded(system_section),
        "vulkan": _guarded(lambda: vulkan_section(self_test)),
        "npu": _guarded(npu_section),
    }


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _sizes(sizes: list[int] | None) -> str:
    return ", ".join(map(str, sizes)) if sizes else "none (no subgroup size control)"


def markdown(rep: dict[str, Any]) -> str:
    """The report as Markdown, for pasting into an issue."""
    lines = ["# phoenix-chat doctor", "", "## System"]
    sysr = rep["system"]
    for k, v in sysr.items():
        lines.append(f"- {k}: {_gib(v) if k == 'ram_bytes' else v}")
    lines += ["", "## Vulkan"]
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
            for h in d["heaps"]:
                flags = [f for f in ("device_local", "host_visible") if h[f]]
                lines.append(f"- heap {h['index']}: {_gib(h['bytes'])} {' '.join(flags) or '(no flags)'}")
            feats = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in d["features"].items())
            lines.append(f"- features: {feats}")
            lines.append(f"- kernels: {d['kernels']}")
            if "self_test" in d:
                lines.append(f"- self-test: {d['self_test']}")
            lines.append("")
    npu = rep["npu"]
    lines += ["## NPU", f"- {npu.get('name')}: {'available' if npu.get('available') else 'not available'}"]
    lines.append(f"- status: {npu.get('status', npu.get('error'))}")
    for k, v in (npu.get("details") or {}).items():
        lines.append(f"- {k}: {v}")
    return "\n".join(lines) + "\n"
