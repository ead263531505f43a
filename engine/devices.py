"""What compute exists on this machine, and why not when it doesn't.

Every entry carries an honest status string; nothing is reported as present unless a real
probe found it. Used by `phoenix-chat devices` and the GUI's Devices menu.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from phoenix_chat.engine.gpu_names import cpu_model_name


@dataclass
class DeviceEntry:
    kind: str  # "cpu" | "vulkan" | "npu"
    name: str
    available: bool
    status: str  # one line: "ready", or why not
    index: int | None = None
    details: dict[str, Any] = field(default_factory=dict)  # JSON-serialisable, shown as is

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_entry() -> DeviceEntry:
    name = cpu_model_name() or platform.processor() or platform.machine()
    mem = psutil.virtual_memory()
    return DeviceEntry(
        "cpu",
        name,
        True,
        "ready (numpy f32 reference backend)",
        details={"cores": os.cpu_count(), "memory_bytes": mem.total},
    )


def vulkan_entries() -> list[DeviceEntry]:
    from phoenix_chat.engine.errors import DeviceUnavailableError

    try:
        from phoenix_chat.engine.backends.vulkan.device import list_devices as vulkan_devices

        found = vulkan_devices()
    except DeviceUnavailableError as exc:
        return [DeviceEntry("vulkan", "Vulkan", False, str(exc))]
    entries = []
    for caps in found:
        status = (
            "ready — software renderer: correct but slow, used only with --backend vulkan"
            if caps.is_software
            else "ready"
        )
        details = {
            "vulkan_name": caps.name,
            "type": caps.device_type,
            "driver": caps.driver,
            "driver_id": caps.driver_id,
            "summary": caps.summary(),
            "device_local_bytes": caps.device_local_bytes,
            "uma": caps.uma,
            "subgroup_size": caps.subgroup_size,
            "int_dot": caps.int_dot,
            "cooperative_matrix": caps.cooperative_matrix,
            "software": caps.is_software,
        }
        entries.append(DeviceEntry("vulkan", caps.display_name, True, status, index=caps.index, details=details))
    return entries


def npu_entry() -> DeviceEntry:
    try:
        from phoenix_chat.engine.backends.npu_hybrid import npu_kernel_dirs
        from phoenix_chat.npu.detect import npu_status
    except ImportError as exc:
        return DeviceEntry("npu", "AMD XDNA NPU", False, f"NPU support not available ({exc})")
    status = npu_status(kernel_dirs=npu_kernel_dirs())
    return DeviceEntry(
        "npu", status.details.get("name", "AMD XDNA NPU"), status.available, status.reason, details=status.details
    )


def list_devices() -> list[DeviceEntry]:
    return [cpu_entry(), *vulkan_entries(), npu_entry()]
