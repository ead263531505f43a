"""The Vulkan backend: device layer (device.py, memory.py), the pipeline table (pipelines.py),
command recording (recorder.py), kernels (ops_*.py, matvec.py), and the backend: options
(options.py), memory plan (plan.py), resident weights and buffers (resident.py), Gemma 3's
graph (gemma3_graph.py), load-time tuning (autotune.py), measurements (profiling.py) and the
facade (backend.py).

Importing this package never touches the Vulkan loader; `Device.open()` does.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("VulkanBackend", "VulkanOptions"):
        from phoenix_chat.engine.backends.vulkan import backend

        return getattr(backend, name)
    if name in ("Device", "list_devices", "Capabilities"):
        from phoenix_chat.engine.backends.vulkan import device

        return getattr(device, name)
    raise AttributeError(name)
