"""The Vulkan backend: device layer (device.py, memory.py), the pipeline table (pipelines.py),
command recording (recorder.py) and the backend itself (backend.py).

Importing this package never touches the Vulkan loader; `Device.open()` does.
"""
from __future__ import annotations


def __getattr__(name):
    if name == "VulkanBackend":
        from engine.backends.vulkan.backend import VulkanBackend
        return VulkanBackend
    if name in ("Device", "list_devices", "Capabilities"):
        from engine.backends.vulkan import device
        return getattr(device, name)
    raise AttributeError(name)
