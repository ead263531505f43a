"""What the driver made of a kernel: VK_KHR_pipeline_executable_properties' statistics (register
count, code size, spills where the driver reports them) and internal representations.

Why: a GPU kernel's speed is often set by what its source does not show — registers per lane
decide how many subgroups an SM keeps in flight. Only a device opened with
`Device.open(capture_statistics=True)` builds its pipelines so that they can be asked
(bench/pipeline_stats.py does); the product never does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phoenix_chat.engine.backends.vulkan.device import STATISTICS_EXT, Device
from phoenix_chat.engine.backends.vulkan.pipelines import Pipeline

_BOOL32, _INT64, _UINT64, _FLOAT64 = 0, 1, 2, 3  # VkPipelineExecutableStatisticFormatKHR


@dataclass(frozen=True)
class Executable:
    """One compiled stage of a pipeline, as its driver describes it."""

    name: str
    description: str
    subgroup_size: int
    statistics: dict[str, int | float | bool]
    representations: dict[str, str] = field(default_factory=dict)


def _function(dev: Device, name: str) -> Any:
    ptr = dev.lib.vkGetDeviceProcAddr(dev.device, name.encode())
    if ptr == dev.ffi.NULL:
        raise RuntimeError(f"{dev.name}: the driver has no {name}")
    return dev.ffi.cast("PFN_" + name, ptr)


def _text(ffi: Any, chars: Any) -> str:
    return str(ffi.string(chars).decode("utf-8", "replace"))


def _array(dev: Device, fn: Any, info: Any, ctype: str, stype: int) -> Any:
    """The two-call idiom: count, then the array with every element's sType set."""
    ffi = dev.ffi
    count = ffi.new("uint32_t*")
    fn(dev.device, info, count, ffi.NULL)
    out = ffi.new(ctype + "[]", count[0])
    for i in range(count[0]):
        out[i].sType = stype
    fn(dev.device, info, count, out)
    return out[0 : count[0]]


def _value(stat: Any) -> int | float | bool:
    fmt = int(stat.format)
    if fmt == _BOOL32:
        return bool(stat.value.b32)
    if fmt == _INT64:
        return int(stat.value.i64)
    if fmt == _FLOAT64:
        return float(stat.value.f64)
    return int(stat.value.u64)


def executables(p: Pipeline, *, representations: bool = False) -> list[Executable]:
    """The driver's executables of pipeline `p` with their statistics (and, where asked, their
    internal representations as text: NVIDIA's, RADV's, ... whatever the driver exposes)."""
    dev, vk, ffi = p.dev, p.dev.vk, p.dev.ffi
    if not dev.capture_statistics:
        raise RuntimeError(
            f"{p.name}: open the device with capture_statistics=True to read its statistics ({STATISTICS_EXT})"
        )
    info = ffi.new("VkPipelineInfoKHR*", {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, "pipeline": p.handle})
    props = _array(
        dev,
        _function(dev, "vkGetPipelineExecutablePropertiesKHR"),
        info,
        "VkPipelineExecutablePropertiesKHR",
        vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR,
    )
    get_stats = _function(dev, "vkGetPipelineExecutableStatisticsKHR")
    out = []
    for i, prop in enumerate(props):
        exe = ffi.new(
            "VkPipelineExecutableInfoKHR*",
            {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, "pipeline": p.handle, "executableIndex": i},
        )
        stype = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR
        stats = _array(dev, get_stats, exe, "VkPipelineExecutableStatisticKHR", stype)
        out.append(
            Executable(
                name=_text(ffi, prop.name),
                description=_text(ffi, prop.description),
                subgroup_size=int(prop.subgroupSize),
                statistics={_text(ffi, s.name): _value(s) for s in stats},
                representations=_representations(dev, exe) if representations else {},
            )
        )
    return out


def _representations(dev: Device, exe: Any) -> dict[str, str]:
    """Internal representations: sizes first, then the data (three calls, per the extension)."""
    vk, ffi = dev.vk, dev.ffi
    fn = _function(dev, "vkGetPipelineExecutableInternalRepresentationsKHR")
    reps = _array(
        dev,
        fn,
        exe,
        "VkPipelineExecutableInternalRepresentationKHR",
        vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR,
    )
    n = len(reps)
    arr = ffi.new("VkPipelineExecutableInternalRepresentationKHR[]", n)
    keep = []
    for i, r in enumerate(reps):
        arr[i].sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR
        arr[i].dataSize = r.dataSize
        buf = ffi.new("char[]", max(int(r.dataSize), 1))
        keep.append(buf)
        arr[i].pData = buf
    count = ffi.new("uint32_t*", n)
    fn(dev.device, exe, count, arr)
    out = {}
    for i in range(count[0]):
        data = ffi.buffer(arr[i].pData, int(arr[i].dataSize))[:]
        text = data.rstrip(b"\0").decode("utf-8", "replace") if arr[i].isText else f"<{len(data)} bytes of binary>"
        out[_text(ffi, arr[i].name)] = text
    return out
