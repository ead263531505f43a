"""Vulkan device layer: pick a device, probe what it can do, run compute work on it.

How to use it (the ops modules and the backend follow exactly this):

Open a device
    from phoenix_chat.engine.backends.vulkan.device import Device
    dev = Device.open(index=None, allow_software=False)   # hardware GPU preferred
    dev.caps            # Capabilities: subgroup_size, int_dot, fp16, storage8/16, shared_memory,
                        # max_storage_buffer_range, heaps, uma, timestamp_period, ...
    dev.close()
  No loader or no usable device raises `engine.errors.DeviceUnavailableError("no Vulkan device: ...")`.
  Software devices (lavapipe) are skipped unless `allow_software=True`.
  `list_devices()` describes every device without opening one.

Buffers (engine/backends/vulkan/memory.py)
    buf = dev.buffer(nbytes)                    # device-local (host-visible too on UMA iGPUs)
    buf = dev.buffer(nbytes, host=True)         # host-visible + coherent, mapped: buf.write()/buf.read()
    dev.upload(buf, array, offset=0)            # any numpy array, via a staging buffer when needed
    arr = dev.download(buf, np.float32, shape)  # copy back (waits)
    t = dev.tensor(array_bytes, row_bytes)      # a weight: one buffer, bound in row ranges so
    t.ranges                                    # no binding exceeds maxStorageBufferRange

Pipelines (engine/backends/vulkan/pipelines.py holds ONE table of every product variant)
    p = dev.pipeline("matvec_q4_0_f32", WG=128)  # name from the table, specialization by name
    dev.register_variants(bench_variants)       # bench/shaders' probes: usable on this device only
    p.push.pack(n_rows=..., n_cols=...)          # the push-constant layout, defined once
  A variant names its shader file, -D defines, the number of storage-buffer bindings
  (bindings 0..n-1, all `buffer` blocks), a PushLayout and its specialization constants.
  `python -m tools.build_shaders` compiles each to shaders/spv/<name>.spv. Unknown spec names raise.
  A variant's push block is generated from its PushLayout and passed to glslc as the macro
  PUSH_CONSTANTS: write `PUSH_CONSTANTS` once at the top level of the shader, read `pc.field`.

Record and submit (engine/backends/vulkan/recorder.py)
    cl = dev.commands()                          # a CommandList: command buffer + descriptor sets
    cl.dispatch(p, [buf_a, (buf_b, offset, size), t.ranges[0]], groups=(x, 1, 1), push=bytes)
    cl.barrier()                                 # compute->compute (+transfer) memory barrier
    cl.copy(src, dst, nbytes, src_offset=0, dst_offset=0)
    cl.fill(buf, 0)                              # zero a buffer
    cl.timestamp(i)                              # needs cl = dev.commands(timestamps=N)
    cl.end()
    cl.submit(wait=True)                         # or dev.submit(cl); replays as often as you like
    cl.timestamps_ns()                           # after the wait: list of ns since timestamp 0
  Recording happens once; a recorded CommandList is re-submitted with raw `vk.lib` calls
  (~10 us of Python). Descriptor sets are written at record time and never again, so a
  buffer bound in a recording must outlive it and must not be reallocated.
  A whole command list runs in submission order after everything submitted earlier:
  `begin()` records a leading barrier so consecutive submissions see each other's writes.

Per-step values that change between replays (position, sampling parameters, RNG seed) never
go into push constants (they are frozen at record time): kernels read them from the step
buffer, `shaders/include/step.glsl`, which the host writes through a mapped pointer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from phoenix_chat.engine.errors import DeviceUnavailableError

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.memory import Buffer, ByteProgress, Tensor
    from phoenix_chat.engine.backends.vulkan.pipelines import Pipeline, PipelineCache
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList
    from phoenix_chat.engine.backends.vulkan.variants import Variant

log = logging.getLogger(__name__)


def _vk() -> Any:
    """The `vulkan` module, or DeviceUnavailableError when no loader is installed."""
    try:
        import vulkan as vk
    except OSError as exc:  # cffi raises OSError when libvulkan.so.1 is missing
        raise DeviceUnavailableError(f"no Vulkan device: the Vulkan loader is not installed ({exc})") from None
    except ImportError as exc:
        raise DeviceUnavailableError(f"no Vulkan device: the `vulkan` Python package is missing ({exc})") from None
    return vk


_DEVICE_TYPES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}


@dataclass
class Capabilities:
    """What one physical device offers the kernels; probed once, read everywhere."""

    index: int
    name: str
    device_type: str  # integrated / discrete / virtual / cpu / other
    vendor_id: int
    api_version: tuple[int, int, int]
    driver: str
    subgroup_size: int
    subgroup_arithmetic: bool
    fp16: bool  # shaderFloat16
    int8: bool  # shaderInt8
    int16: bool
    int64: bool
    storage8: bool  # storageBuffer8BitAccess
    storage16: bool  # storageBuffer16BitAccess
    int_dot: bool  # shaderIntegerDotProduct (the instruction exists)
    int_dot_accelerated: bool  # packed 4x8 signed dot is hardware-accelerated
    cooperative_matrix: bool  # VK_KHR_cooperative_matrix with 16x16x16 f16 x f16 -> f32 per subgroup
    shared_memory: int  # maxComputeSharedMemorySize
    max_storage_buffer_range: int
    max_push_constants: int
    max_workgroup_invocations: int
    max_workgroup_count: tuple[int, int, int]
    max_allocation: int  # maxMemoryAllocationSize
    min_storage_offset_alignment: int
    non_coherent_atom: int
    timestamp_period: float  # ns per tick
    timestamp_bits: int  # 0: queue has no timestamps
    heaps: list[tuple[int, bool]] = field(default_factory=list)  # (size, device_local)
    uma: bool = False  # device-local memory is also host-visible (iGPU / CPU)
    host_visible_heaps: frozenset[int] = frozenset()  # heaps (indices into `heaps`) the host can map
    # (min, max) subgroup sizes a pipeline may ask for (VK_EXT_subgroup_size_control); (0, 0): unknown
    subgroup_size_range: tuple[int, int] = (0, 0)
    # sizes a compute pipeline may require (SUBGROUP_SIZE in Device.pipeline): the powers of two
    # in subgroup_size_range where subgroupSizeControl is on and covers compute; () where not
    compute_subgroup_sizes: tuple[int, ...] = ()
    extensions: frozenset[str] = frozenset()
    driver_id: int = 0  # VkDriverId (3: RADV, 2: AMDVLK, 1: AMD proprietary; 0: not reported)
    # VK_EXT_memory_budget at probe time: (budget, usage) bytes per heap, in `heaps` order; None
    # where the device lacks the extension (Device.heap_budgets() asks again, for the plan)
    heap_budgets: tuple[tuple[int, int], ...] | None = None
    # why each feature the kernels could use is off here, by the doctor's feature names
    # (cooperative_matrix_f16, int_dot, int_dot_accelerated, fp16, ..., subgroup_size_control)
    refused: dict[str, str] = field(default_factory=dict)
    # K of the 16 x 16 x K s8 x s8 -> s32 subgroup cooperative matrix gemm_coopmat_int8.comp uses
    # (32, else 16); 0 where there is none (or no f16 one: the device is created with matrix cores
    # only where cooperative_matrix is on)
    coopmat_int8_k: int = 0
    # VK_KHR_pipeline_executable_properties: the driver can report each compiled kernel's
    # statistics (registers, code size, spills where it says so): pipeline_stats.py, on request
    pipeline_statistics: bool = False

    @property
    def is_software(self) -> bool:
        return self.device_type == "cpu" or "llvmpipe" in self.name.lower() or "swiftshader" in self.name.lower()

    @property
    def device_local_bytes(self) -> int:
        return sum(size for size, local in self.heaps if local)

    def int8_activations(self, option: bool | None = None) -> tuple[bool, str]:
        """Do the matvecs quantize activations to int8 (VulkanOptions.int_dot: None lets the
        device decide), and why: only where the int8 dot instruction exists, and by default only
        where the driver says it is hardware-accelerated (an emulated one is slower than f32)."""
        if not self.int_dot:
            return False, self.refused.get("int_dot", "no int8 dot product")
        if option is False:
            return False, "disabled by option (int_dot=False)"
        if option is True:
            emulated = "" if self.int_dot_accelerated else ", although the driver reports the dot as emulated"
            return True, f"forced by option (int_dot=True){emulated}"
        if not self.int_dot_accelerated:
            return False, "the int8 dot is emulated here: integerDotProduct4x8BitPackedSignedAccelerated is false"
        return True, "the packed 4x8 int8 dot is hardware-accelerated"

    def summary(self) -> str:
        gib = self.device_local_bytes / 2**30
        flags = [f"subgroup {self.subgroup_size}", f"{gib:.1f} GiB", "UMA" if self.uma else "dedicated"]
        if self.int_dot:
            flags.append("int8-dot" + ("" if self.int_dot_accelerated else " (emulated)"))
        if self.cooperative_matrix:
            flags.append("coopmat")
        if self.coopmat_int8_k:
            flags.append(f"coopmat int8 16x16x{self.coopmat_int8_k}")
        return f"[{self.index}] {self.display_name} ({self.device_type}; {', '.join(flags)})"

    @property
    def display_name(self) -> str:
        """The name a user knows ("AMD Radeon 780M (RADV PHOENIX)" for "RADV PHOENIX"): gpu_names."""
        from phoenix_chat.engine.gpu_names import cpu_model_name, gpu_name

        cpu = cpu_model_name() if self.device_type == "integrated" else None
        return gpu_name(
            self.name,
            self.driver_id,
            vendor_id=self.vendor_id,
            integrated=self.device_type == "integrated",
            cpu_model=cpu,
        ).display()


# ---- instance and probing -----------------------------------------------------------

_INSTANCE: Any = None  # one per process: creating instances is slow (~50 ms) and they are cheap to keep


def _instance(vk: Any) -> Any:
    global _INSTANCE
    if _INSTANCE is None:
        app = vk.VkApplicationInfo(
            pApplicationName="phoenix-chat",
            applicationVersion=1,
            pEngineName="phoenix",
            engineVersion=1,
            apiVersion=vk.VK_MAKE_VERSION(1, 3, 0),
        )
        try:
            _INSTANCE = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
        except vk.VkError as exc:
            raise DeviceUnavailableError(f"no Vulkan device: vkCreateInstance failed ({type(exc).__name__})") from None
    return _INSTANCE


def loader_version() -> tuple[int, int, int] | None:
    """The Vulkan loader's instance version (vkEnumerateInstanceVersion); None for a 1.0 loader,
    which lacks the call. DeviceUnavailableError where no loader is installed."""
    vk = _vk()
    try:
        v = int(vk.vkEnumerateInstanceVersion())
    except Exception:  # the binding cannot find the entry point: a Vulkan 1.0 loader
        return None
    return ((v >> 22) & 0x7F, (v >> 12) & 0x3FF, v & 0xFFF)


def _physical_devices(vk: Any) -> list[Any]:
    try:
        return list(vk.vkEnumeratePhysicalDevices(_instance(vk)))
    except vk.VkError as exc:
        raise DeviceUnavailableError(f"no Vulkan device: enumeration failed ({type(exc).__name__})") from None


def _probe(vk: Any, pd: Any, index: int) -> Capabilities:
    props = vk.vkGetPhysicalDeviceProperties(pd)
    api = props.apiVersion
    exts = frozenset(e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(pd, None))

    sg = vk.VkPhysicalDeviceSubgroupProperties()
    chain = sg
    idp = None
    if api >= vk.VK_MAKE_VERSION(1, 3, 0) or "VK_KHR_shader_integer_dot_product" in exts:
        idp = vk.VkPhysicalDeviceShaderIntegerDotProductProperties(pNext=chain)
        chain = idp
    ssc = None
    if api >= vk.VK_MAKE_VERSION(1, 3, 0) or "VK_EXT_subgroup_size_control" in exts:
        ssc = vk.VkPhysicalDeviceSubgroupSizeControlProperties(pNext=chain)
        chain = ssc
    drv = vk.VkPhysicalDeviceDriverProperties(pNext=chain)
    vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=drv))
    sg_range = (int(ssc.minSubgroupSize), int(ssc.maxSubgroupSize)) if ssc is not None else (0, 0)
    sg_compute = ssc is not None and bool(ssc.requiredSubgroupSizeStages & vk.VK_SHADER_STAGE_COMPUTE_BIT)

    f11 = vk.VkPhysicalDeviceVulkan11Features()
    f12 = vk.VkPhysicalDeviceVulkan12Features(pNext=f11)
    chain = f12
    f13 = None
    if api >= vk.VK_MAKE_VERSION(1, 3, 0):
        f13 = vk.VkPhysicalDeviceVulkan13Features(pNext=chain)
        chain = f13
    cm = None
    if "VK_KHR_cooperative_matrix" in exts:
        cm = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(pNext=chain)
        chain = cm
    f2 = vk.VkPhysicalDeviceFeatures2(pNext=chain)
    vk.vkGetPhysicalDeviceFeatures2(pd, f2)

    mem = vk.vkGetPhysicalDeviceMemoryProperties(pd)
    heaps: list[tuple[int, bool]] = []
    for i in range(mem.memoryHeapCount):
        h = mem.memoryHeaps[i]
        heaps.append((int(h.size), bool(h.flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)))
    budgets = _memory_budget(vk, pd, len(heaps)) if MEMORY_BUDGET_EXT in exts else None
    want = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT | vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
    host_visible_heaps = frozenset(
        int(mem.memoryTypes[i].heapIndex)
        for i in range(mem.memoryTypeCount)
        if mem.memoryTypes[i].propertyFlags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
    )
    big_local = max((s for s, local in heaps if local), default=0)
    # integrated GPUs and CPU devices share system memory; a discrete card's host-visible VRAM
    # window (resizable BAR) is not UMA: its reads from the host are slow
    uma = int(props.deviceType) in (1, 4) and any(
        (mem.memoryTypes[i].propertyFlags & want) == want and heaps[mem.memoryTypes[i].heapIndex][0] >= big_local
        for i in range(mem.memoryTypeCount)
    )

    fams = vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)
    ts_bits = max((q.timestampValidBits for q in fams if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), default=0)
    lim = props.limits
    int_dot = bool(f13.shaderIntegerDotProduct) if f13 is not None else False
    refused = _refusals(vk, pd, api, exts, sg, ssc, sg_compute, f11, f12, f13, cm, idp, int_dot)
    return Capabilities(
        index=index,
        name=str(props.deviceName),
        device_type=_DEVICE_TYPES.get(int(props.deviceType), "other"),
        vendor_id=int(props.vendorID),
        api_version=(api >> 22, (api >> 12) & 0x3FF, api & 0xFFF),
        driver=f"{_cstr(vk, drv.driverName)} {_cstr(vk, drv.driverInfo)}".strip(),
        subgroup_size=int(sg.subgroupSize),
        subgroup_arithmetic=bool(sg.supportedOperations & vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT),
        subgroup_size_range=sg_range,
        compute_subgroup_sizes=_required_sizes(sg_range)
        if sg_compute and f13 is not None and f13.subgroupSizeControl
        else (),
        fp16=bool(f12.shaderFloat16),
        int8=bool(f12.shaderInt8),
        int16=bool(f2.features.shaderInt16),
        int64=bool(f2.features.shaderInt64),
        storage8=bool(f12.storageBuffer8BitAccess),
        storage16=bool(f11.storageBuffer16BitAccess),
        int_dot=int_dot,
        int_dot_accelerated=bool(idp and idp.integerDotProduct4x8BitPackedSignedAccelerated),
        cooperative_matrix="cooperative_matrix_f16" not in refused,
        pipeline_statistics=STATISTICS_EXT in exts,
        coopmat_int8_k=0 if "cooperative_matrix_int8" in refused else _coopmat_int8_k(vk, pd),
        shared_memory=int(lim.maxComputeSharedMemorySize),
        max_storage_buffer_range=int(lim.maxStorageBufferRange),
        max_push_constants=int(lim.maxPushConstantsSize),
        max_workgroup_invocations=int(lim.maxComputeWorkGroupInvocations),
        max_workgroup_count=(
            int(lim.maxComputeWorkGroupCount[0]),
            int(lim.maxComputeWorkGroupCount[1]),
            int(lim.maxComputeWorkGroupCount[2]),
        ),
        max_allocation=_max_allocation(vk, pd),
        min_storage_offset_alignment=int(lim.minStorageBufferOffsetAlignment),
        non_coherent_atom=int(lim.nonCoherentAtomSize),
        timestamp_period=float(lim.timestampPeriod),
        timestamp_bits=int(ts_bits),
        heaps=heaps,
        uma=uma,
        host_visible_heaps=host_visible_heaps,
        extensions=exts,
        driver_id=int(drv.driverID),
        heap_budgets=budgets,
        refused=refused,
    )


MEMORY_BUDGET_EXT = "VK_EXT_memory_budget"
STATISTICS_EXT = "VK_KHR_pipeline_executable_properties"


def _memory_budget(vk: Any, pd: Any, n_heaps: int) -> tuple[tuple[int, int], ...]:
    """(heapBudget, heapUsage) per heap from VkPhysicalDeviceMemoryBudgetPropertiesEXT chained
    into vkGetPhysicalDeviceMemoryProperties2: what this process may allocate from each heap
    (its own allocations included) and what it has allocated. Only where the device lists
    VK_EXT_memory_budget."""
    budget = vk.VkPhysicalDeviceMemoryBudgetPropertiesEXT()
    vk.vkGetPhysicalDeviceMemoryProperties2(pd, vk.VkPhysicalDeviceMemoryProperties2(pNext=budget))
    return tuple((int(budget.heapBudget[i]), int(budget.heapUsage[i])) for i in range(n_heaps))


def _refusals(
    vk: Any,
    pd: Any,
    api: int,
    exts: frozenset[str],
    sg: Any,
    ssc: Any,
    sg_compute: bool,
    f11: Any,
    f12: Any,
    f13: Any,
    cm: Any,
    idp: Any,
    int_dot: bool,
) -> dict[str, str]:
    """Why each feature the kernels could use is off (absent keys: on), the first missing piece
    of each in the order the probe needs them."""
    v13 = vk.VK_MAKE_VERSION(1, 3, 0)
    api_s = f"{api >> 22}.{(api >> 12) & 0x3FF}"
    out: dict[str, str] = {}
    if "VK_KHR_cooperative_matrix" not in exts:
        out["cooperative_matrix_f16"] = "no VK_KHR_cooperative_matrix"
    elif not cm.cooperativeMatrix:
        out["cooperative_matrix_f16"] = "VK_KHR_cooperative_matrix listed but its cooperativeMatrix feature is off"
    elif not f12.vulkanMemoryModel:
        out["cooperative_matrix_f16"] = "no vulkanMemoryModel (the coopmat shader declares it)"
    elif not f12.shaderFloat16:
        out["cooperative_matrix_f16"] = "no shaderFloat16"
    elif not f11.storageBuffer16BitAccess:
        out["cooperative_matrix_f16"] = "no storageBuffer16BitAccess"
    elif api < v13:
        out["cooperative_matrix_f16"] = f"Vulkan API {api_s} (the coopmat shader needs 1.3)"
    elif not _coopmat_f16_16x16(vk, pd):
        out["cooperative_matrix_f16"] = "no f16 16x16x16 configuration (f16 x f16 -> f32, subgroup scope)"
    if "cooperative_matrix_f16" in out:
        out["cooperative_matrix_int8"] = out["cooperative_matrix_f16"]
    elif not f12.shaderInt8:
        out["cooperative_matrix_int8"] = "no shaderInt8"
    elif not _coopmat_int8_k(vk, pd):
        out["cooperative_matrix_int8"] = "no s8 16x16x32 or 16x16x16 configuration (s8 x s8 -> s32, subgroup scope)"
    if not int_dot:
        if api < v13 and "VK_KHR_shader_integer_dot_product" not in exts:
            out["int_dot"] = "no VK_KHR_shader_integer_dot_product"
        elif f13 is None:
            out["int_dot"] = f"Vulkan API {api_s}: the engine reads shaderIntegerDotProduct from the 1.3 features"
        else:
            out["int_dot"] = "shaderIntegerDotProduct is off (VK_KHR_shader_integer_dot_product)"
        out["int_dot_accelerated"] = "no int8 dot product at all"
    elif not (idp and idp.integerDotProduct4x8BitPackedSignedAccelerated):
        out["int_dot_accelerated"] = "the driver reports the packed 4x8 signed dot as emulated, not hardware"
    for key, on, name in (
        ("fp16", f12.shaderFloat16, "shaderFloat16"),
        ("storage16", f11.storageBuffer16BitAccess, "storageBuffer16BitAccess"),
        ("storage8", f12.storageBuffer8BitAccess, "storageBuffer8BitAccess"),
        ("subgroup_arithmetic", sg.supportedOperations & vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT, "subgroup arithmetic"),
    ):
        if not on:
            out[key] = f"the driver does not offer {name}"
    if ssc is None:
        out["subgroup_size_control"] = f"no VK_EXT_subgroup_size_control (Vulkan API {api_s})"
    elif not sg_compute:
        out["subgroup_size_control"] = "requiredSubgroupSizeStages does not include compute"
    elif f13 is None or not f13.subgroupSizeControl:
        out["subgroup_size_control"] = "the subgroupSizeControl feature is off"
    return out


def _required_sizes(sg_range: tuple[int, int]) -> tuple[int, ...]:
    """The subgroup sizes a pipeline may require: the powers of two from min to max."""
    lo, hi = sg_range
    return tuple(1 << k for k in range(7) if lo <= 1 << k <= hi)


def _coopmat_props(vk: Any, pd: Any) -> list[Any]:
    """The device's VkCooperativeMatrixPropertiesKHR list ([] where the loader or driver lacks
    the entry point)."""
    try:
        get = vk.vkGetInstanceProcAddr(_instance(vk), "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
        return list(get(pd))
    except Exception:  # the loader or driver lacks the entry point: treat as absent
        return []


def _coopmat_f16_16x16(vk: Any, pd: Any) -> bool:
    """Does the device offer the one shape gemm_coopmat.comp uses: 16x16x16, f16 A/B, f32 C,
    subgroup scope?"""
    f16, f32 = vk.VK_COMPONENT_TYPE_FLOAT16_KHR, vk.VK_COMPONENT_TYPE_FLOAT32_KHR
    return any(
        p.MSize == 16
        and p.NSize == 16
        and p.KSize == 16
        and p.AType == f16
        and p.BType == f16
        and p.CType == f32
        and p.ResultType == f32
        and p.scope == vk.VK_SCOPE_SUBGROUP_KHR
        for p in _coopmat_props(vk, pd)
    )


def _coopmat_int8_k(vk: Any, pd: Any) -> int:
    """K of the int8 shape gemm_coopmat_int8.comp can use — 16 x 16 x K, s8 A/B, s32 C and result,
    subgroup scope — 32 where offered (one product per q8_1 block), else 16; 0: neither."""
    s8, s32 = vk.VK_COMPONENT_TYPE_SINT8_KHR, vk.VK_COMPONENT_TYPE_SINT32_KHR
    ks = {
        int(p.KSize)
        for p in _coopmat_props(vk, pd)
        if p.MSize == 16
        and p.NSize == 16
        and p.AType == s8
        and p.BType == s8
        and p.CType == s32
        and p.ResultType == s32
        and p.scope == vk.VK_SCOPE_SUBGROUP_KHR
    }
    return 32 if 32 in ks else 16 if 16 in ks else 0


def _cstr(vk: Any, v: Any) -> str:
    return vk.ffi.string(v).decode(errors="replace") if isinstance(v, vk.ffi.CData) else str(v)


def _max_allocation(vk: Any, pd: Any) -> int:
    m3 = vk.VkPhysicalDeviceMaintenance3Properties()
    vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=m3))
    return int(m3.maxMemoryAllocationSize)


def list_devices() -> list[Capabilities]:
    """Every Vulkan device (software ones included, flagged by `is_software`); raises
    DeviceUnavailableError when there is no loader or no device at all."""
    vk = _vk()
    pds = _physical_devices(vk)
    if not pds:
        raise DeviceUnavailableError("no Vulkan device: the loader found no physical device")
    return [_probe(vk, pd, i) for i, pd in enumerate(pds)]


def _choose(caps: list[Capabilities], index: int | None, allow_software: bool) -> Capabilities:
    if index is not None:
        if not 0 <= index < len(caps):
            raise DeviceUnavailableError(f"no Vulkan device: index {index} out of range ({len(caps)} devices)")
        c = caps[index]
        if c.is_software and not allow_software:
            raise DeviceUnavailableError(f"no Vulkan device: device {index} ({c.name}) is a software renderer")
        return c
    usable = [c for c in caps if allow_software or not c.is_software]
    if not usable:
        names = ", ".join(c.name for c in caps)
        raise DeviceUnavailableError(f"no Vulkan device: only software renderers ({names})")
    rank = {"discrete": 0, "integrated": 1, "virtual": 2, "other": 3, "cpu": 4}
    return min(usable, key=lambda c: (rank.get(c.device_type, 3), -c.device_local_bytes, c.index))


# ---- the device ---------------------------------------------------------------------


class Device:
    """One logical device with one compute queue; owns the pipeline cache and a staging buffer."""

    STAGING_BYTES = 64 << 20

    def __init__(self, vk: Any, physical: Any, caps: Capabilities, *, capture_statistics: bool = False):
        if capture_statistics and not caps.pipeline_statistics:
            raise DeviceUnavailableError(
                f"{caps.name} cannot report kernel statistics: its driver lacks {STATISTICS_EXT}"
            )
        # every pipeline is then built with its statistics captured (bench/pipeline_stats.py);
        # off in the product: a driver may skip its pipeline cache for such pipelines
        self.capture_statistics = capture_statistics
        # asked between the load-time timing's candidates (timing.interrupt): a load sets it to
        # its Cancel's check for as long as it times, so Cancel needs no timing stage to end
        self.timing_interrupt: Callable[[], None] | None = None
        self.vk = vk
        self.ffi = vk.ffi
        self.lib = vk.lib
        self.physical = physical
        self.caps = caps
        self.name = caps.name
        fams = vk.vkGetPhysicalDeviceQueueFamilyProperties(physical)
        compute = [i for i, q in enumerate(fams) if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        # prefer a family that also does graphics: it has timestamps on every driver we know
        self.queue_family = compute[0]
        try:
            self.device = self._create(vk, physical, caps, coopmat=caps.cooperative_matrix)
        except vk.VkError as exc:
            if capture_statistics:
                raise DeviceUnavailableError(
                    f"vkCreateDevice with {STATISTICS_EXT} failed on {caps.name} ({type(exc).__name__})"
                ) from None
            if not caps.cooperative_matrix:
                raise DeviceUnavailableError(
                    f"no Vulkan device: vkCreateDevice failed on {caps.name} ({type(exc).__name__})"
                ) from None
            # the driver advertised cooperative matrices but refused them: run without (the
            # prefill GEMM then takes the f32 kernel; stats()["prefill_gemm"] and the log say so)
            log.warning(
                "%s: vkCreateDevice with cooperative matrices failed (%s); prefill GEMM falls "
                "back to the f32 %s kernel",
                caps.name,
                type(exc).__name__,
                "register-tiled" if caps.is_software else "tiled",
            )
            caps.cooperative_matrix = False
            caps.refused["cooperative_matrix_f16"] = (
                f"vkCreateDevice with VK_KHR_cooperative_matrix failed ({type(exc).__name__})"
            )
            try:
                self.device = self._create(vk, physical, caps, coopmat=False)
            except vk.VkError as exc2:
                raise DeviceUnavailableError(
                    f"no Vulkan device: vkCreateDevice failed on {caps.name} ({type(exc2).__name__})"
                ) from None
        self.queue = vk.vkGetDeviceQueue(self.device, self.queue_family, 0)
        # vkQueueSubmit needs the queue externally synchronized: a picture's vision tower
        # (siglip_graph.py) is submitted from the thread that encodes it while the scheduler's
        # thread submits the text model's steps
        self.queue_lock = threading.Lock()
        self.command_pool = vk.vkCreateCommandPool(
            self.device,
            vk.VkCommandPoolCreateInfo(
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue_family
            ),
            None,
        )
        self._mem_props = vk.vkGetPhysicalDeviceMemoryProperties(physical)
        self._pipelines: PipelineCache | None = None
        self._staging: Buffer | None = None
        self._buffers: list[Buffer] = []  # weak bookkeeping for close(): everything we allocated
        self._scratch: dict[str, Buffer] = {}  # scratch(): kernels' shared scratch buffers
        self._closed = False
        self.allocated_bytes = 0
        self.alloc_heap: int | None = None  # allocating_in
        self.alloc_owner: object | None = None  # owning: whose buffers are being made
        # memory.py's one-shot transfers and matvec.dummy() keep these, made on first use
        self._xfer_cmd: Any = None
        self._xfer_fence: Any = None
        self._dummy_buffer: Buffer | None = None

    def _create(self, vk: Any, physical: Any, caps: Capabilities, *, coopmat: bool) -> Any:
        """vkCreateDevice with the features the kernels use (coopmat: + VK_KHR_cooperative_matrix
        and the Vulkan memory model its SPIR-V declares)."""
        f11 = vk.VkPhysicalDeviceVulkan11Features(
            storageBuffer16BitAccess=caps.storage16, uniformAndStorageBuffer16BitAccess=caps.storage16
        )
        f12 = vk.VkPhysicalDeviceVulkan12Features(
            pNext=f11,
            shaderFloat16=caps.fp16,
            shaderInt8=caps.int8,
            storageBuffer8BitAccess=caps.storage8,
            uniformAndStorageBuffer8BitAccess=caps.storage8,
            vulkanMemoryModel=coopmat,
        )
        chain = f12
        if caps.api_version >= (1, 3, 0):
            chain = vk.VkPhysicalDeviceVulkan13Features(
                pNext=f12,
                shaderIntegerDotProduct=caps.int_dot,
                subgroupSizeControl=bool(caps.compute_subgroup_sizes),
            )
        extensions: list[str] = []
        if coopmat:
            chain = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(pNext=chain, cooperativeMatrix=True)
            extensions.append("VK_KHR_cooperative_matrix")
        if self.capture_statistics:
            chain = vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(pNext=chain, pipelineExecutableInfo=True)
            extensions.append(STATISTICS_EXT)
        feats = vk.VkPhysicalDeviceFeatures(shaderInt16=caps.int16, shaderInt64=caps.int64)
        f2 = vk.VkPhysicalDeviceFeatures2(pNext=chain, features=feats)
        qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=self.queue_family, queueCount=1, pQueuePriorities=[1.0])
        return vk.vkCreateDevice(
            physical,
            vk.VkDeviceCreateInfo(
                pNext=f2,
                queueCreateInfoCount=1,
                pQueueCreateInfos=[qinfo],
                enabledExtensionCount=len(extensions),
                ppEnabledExtensionNames=extensions or None,
            ),
            None,
        )

    # -- construction --
    @classmethod
    def open(
        cls, index: int | None = None, *, allow_software: bool = False, capture_statistics: bool = False
    ) -> Device:
        """Open device `index` (or the best hardware GPU). PHOENIX_VULKAN_DEVICE overrides index.
        capture_statistics: build every pipeline so that pipeline_stats.py can read the driver's
        statistics of it (a diagnostic; refused where the driver lacks the extension)."""
        vk = _vk()
        pds = _physical_devices(vk)
        if not pds:
            raise DeviceUnavailableError("no Vulkan device: the loader found no physical device")
        if index is None and os.environ.get("PHOENIX_VULKAN_DEVICE"):
            index = int(os.environ["PHOENIX_VULKAN_DEVICE"])
        caps = _choose([_probe(vk, pd, i) for i, pd in enumerate(pds)], index, allow_software)
        return cls(vk, pds[caps.index], caps, capture_statistics=capture_statistics)

    # -- memory (see memory.py) --
    def memory_type(
        self, required: int, preferred: int = 0, type_bits: int = 0xFFFFFFFF, heap: int | None = None
    ) -> int:
        """Index of a memory type holding `required` flags, the one also holding `preferred`
        first; only types of memory heap `heap` where one is given."""
        mp = self._mem_props
        best = None
        for i in range(mp.memoryTypeCount):
            if not type_bits & (1 << i) or (heap is not None and mp.memoryTypes[i].heapIndex != heap):
                continue
            flags = mp.memoryTypes[i].propertyFlags
            if flags & required != required:
                continue
            if flags & preferred == preferred:
                return i
            if best is None:
                best = i
        if best is None:
            raise DeviceUnavailableError(f"no Vulkan device: {self.name} has no memory type with flags {required:#x}")
        return best

    def heap_budgets(self) -> tuple[tuple[int, int], ...] | None:
        """(budget, usage) bytes per heap from VK_EXT_memory_budget, asked now (usage grows with
        what this process allocated since the probe); None where the device lacks the extension."""
        if MEMORY_BUDGET_EXT not in self.caps.extensions:
            return None
        return _memory_budget(self.vk, self.physical, int(self._mem_props.memoryHeapCount))

    @contextlib.contextmanager
    def allocating_in(self, heap: int | None) -> Iterator[None]:
        """Device buffers made inside go to memory heap `heap` (None: the usual heap): the
        memory plan puts an iGPU's weights in its large host-visible heap (GTT) when the
        device-local carve-out is too small for them (plan.place_weights)."""
        before, self.alloc_heap = self.alloc_heap, heap
        try:
            yield
        finally:
            self.alloc_heap = before

    @contextlib.contextmanager
    def owning(self, owner: object | None) -> Iterator[None]:
        """Buffers made inside belong to `owner` (a backend sharing this device with others), so
        `free_owned(owner)` gives them back when it closes; None: the device's own (kept until
        close(): the staging buffer, kernels' shared scratch)."""
        before, self.alloc_owner = self.alloc_owner, owner
        try:
            yield
        finally:
            self.alloc_owner = before

    def free_owned(self, owner: object) -> None:
        """Destroy every buffer `owner` made (see owning). A backend closed on a shared device
        used to leave its weights and caches allocated until the device closed: ~290 MiB a load
        of the 270M, which a session of tests on one device piled up to gigabytes."""
        for b in [b for b in self._buffers if b.owner is owner]:
            b.destroy()

    def buffer(self, nbytes: int, *, host: bool = False, name: str = "") -> Buffer:
        from phoenix_chat.engine.backends.vulkan.memory import Buffer

        return Buffer(self, nbytes, host=host, name=name)

    def scratch(self, name: str, nbytes: int) -> Buffer:
        """A device buffer shared by every recording that asks for `name` (a kernel's scratch, such
        as the split-K GEMM's partial sums): allocated on first use, freed by close(). Always asked
        for at one size, so a recording never holds a buffer that was replaced."""
        buf = self._scratch.get(name)
        if buf is None:
            with self.owning(None):
                buf = self._scratch[name] = self.buffer(nbytes, name=name)
        elif buf.size != nbytes:
            raise ValueError(f"scratch {name!r} exists with {buf.size} B, asked for {nbytes}")
        return buf

    def tensor(
        self,
        data: npt.NDArray[Any],
        row_bytes: int,
        *,
        rows: int | None = None,
        name: str = "",
        progress: ByteProgress | None = None,
    ) -> Tensor:
        """Upload a weight (raw bytes, row-major) and split it into bindable row ranges."""
        from phoenix_chat.engine.backends.vulkan.memory import Tensor

        return Tensor.upload(self, data, row_bytes, rows=rows, name=name, progress=progress)

    def upload(
        self,
        buf: Buffer,
        array: npt.ArrayLike | bytearray | memoryview,
        offset: int = 0,
        progress: ByteProgress | None = None,
    ) -> None:
        from phoenix_chat.engine.backends.vulkan.memory import upload

        upload(self, buf, array, offset, progress)

    def download(
        self,
        buf: Buffer,
        dtype: npt.DTypeLike = np.float32,
        shape: int | tuple[int, ...] | None = None,
        offset: int = 0,
    ) -> npt.NDArray[Any]:
        from phoenix_chat.engine.backends.vulkan.memory import download

        return download(self, buf, dtype, shape, offset)

    def staging(self) -> Buffer:
        if self._staging is None:
            with self.owning(None):
                self._staging = self.buffer(self.STAGING_BYTES, host=True, name="staging")
        return self._staging

    # -- pipelines --
    def _pipeline_cache(self) -> PipelineCache:
        if self._pipelines is None:
            from phoenix_chat.engine.backends.vulkan.pipelines import PipelineCache

            self._pipelines = PipelineCache(self)
        return self._pipelines

    def pipeline(self, name: str, **spec: int) -> Pipeline:
        return self._pipeline_cache().get(name, **spec)

    def register_variants(self, variants: Iterable[Variant]) -> None:
        """Make `variants` (not in the product table: bench/shaders' probes) available to `pipeline()`."""
        self._pipeline_cache().register(variants)

    # -- commands --
    def commands(self, *, timestamps: int = 0, name: str = "") -> CommandList:
        from phoenix_chat.engine.backends.vulkan.recorder import CommandList

        return CommandList(self, timestamps=timestamps, name=name)

    def submit(self, cl: CommandList, wait: bool = True) -> None:
        cl.submit(wait=wait)

    def wait_idle(self) -> None:
        self.vk.vkQueueWaitIdle(self.queue)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        vk = self.vk
        try:
            vk.vkDeviceWaitIdle(self.device)
        except vk.VkError:
            pass
        if self._pipelines is not None:
            self._pipelines.destroy()
        for b in list(self._buffers):
            b.destroy()
        vk.vkDestroyCommandPool(self.device, self.command_pool, None)
        vk.vkDestroyDevice(self.device, None)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Device {self.caps.summary()}>"
