"""GPU memory: buffers, weight tensors bound in ranges, staging uploads and downloads.

Device-local memory everywhere; on a UMA device (iGPU, lavapipe) device-local memory is also
host-visible, so buffers are mapped and written in place with no staging copy. Weights larger
than `maxStorageBufferRange` (lavapipe: 128 MiB; the 270M embedding table is 178 MB) live in
one buffer and are *bound* in row ranges, each within the limit and at an aligned offset.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

from phoenix_chat.engine.errors import OutOfMemoryError

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device

ByteProgress: TypeAlias = Callable[[int, int], None]  # progress(done_bytes, total_bytes)


class Buffer:
    """A VkBuffer with its own allocation. `mapped` is a writable numpy uint8 view, or None."""

    def __init__(self, dev: Device, nbytes: int, *, host: bool = False, name: str = ""):
        vk = dev.vk
        self.dev = dev
        self.name = name
        self.size = max(int(nbytes), 4)
        usage = (
            vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
        )
        self.handle = vk.vkCreateBuffer(
            dev.device,
            vk.VkBufferCreateInfo(size=self.size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE),
            None,
        )
        req = vk.vkGetBufferMemoryRequirements(dev.device, self.handle)
        local = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        visible = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        if host:
            mtype = dev.memory_type(visible, 0, req.memoryTypeBits)
        elif dev.alloc_heap is not None:  # Device.allocating_in: an iGPU's weights in its GTT heap
            mtype = dev.memory_type(0, visible, req.memoryTypeBits, heap=dev.alloc_heap)
        elif dev.caps.uma:
            mtype = dev.memory_type(local, visible, req.memoryTypeBits)
        else:
            mtype = dev.memory_type(local, 0, req.memoryTypeBits)
        try:
            self.memory = vk.vkAllocateMemory(
                dev.device, vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=mtype), None
            )
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory):
            vk.vkDestroyBuffer(dev.device, self.handle, None)
            raise OutOfMemoryError(
                f"{dev.name}: could not allocate {self.size / 2**20:.1f} MiB for {name or 'a buffer'} "
                f"({dev.allocated_bytes / 2**20:.0f} MiB already allocated)"
            ) from None
        vk.vkBindBufferMemory(dev.device, self.handle, self.memory, 0)
        flags = dev._mem_props.memoryTypes[mtype].propertyFlags
        self.host_visible = bool(flags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
        self.coherent = bool(flags & vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT)
        self.mapped: npt.NDArray[np.uint8] | None = None
        self.address = 0  # integer address of the mapping, for raw memmove in hot paths
        if self.host_visible:
            raw = vk.vkMapMemory(dev.device, self.memory, 0, req.size, 0)
            self.mapped = np.frombuffer(raw, dtype=np.uint8, count=self.size)
            self.address = int(dev.ffi.cast("uintptr_t", dev.ffi.from_buffer(raw)))
        self.alloc_size = int(req.size)
        dev.allocated_bytes += self.alloc_size
        self.owner = dev.alloc_owner  # Device.owning
        dev._buffers.append(self)
        self._alive = True

    def view(self, dtype: npt.DTypeLike = np.uint8, count: int | None = None, offset: int = 0) -> npt.NDArray[Any]:
        """A numpy view of the mapped memory (host-visible buffers only)."""
        if self.mapped is None:
            raise ValueError(f"buffer {self.name!r} is not host-visible")
        itemsize = np.dtype(dtype).itemsize
        n = (self.size - offset) // itemsize if count is None else count
        return self.mapped[offset : offset + n * itemsize].view(dtype)

    def write(self, array: npt.ArrayLike | bytearray | memoryview, offset: int = 0) -> None:
        """Write through the mapping when there is one, else through the staging buffer."""
        self.dev.upload(self, array, offset)

    def read(
        self, dtype: npt.DTypeLike = np.float32, shape: int | tuple[int, ...] | None = None, offset: int = 0
    ) -> npt.NDArray[Any]:
        return self.dev.download(self, dtype, shape, offset)

    def range(self, offset: int = 0, size: int | None = None) -> tuple[Buffer, int, int]:
        """A binding: (buffer, offset, size)."""
        return (self, offset, self.size - offset if size is None else size)

    def destroy(self) -> None:
        if not self._alive:
            return
        self._alive = False
        vk, dev = self.dev.vk, self.dev
        if self.mapped is not None:
            self.mapped = None
            vk.vkUnmapMemory(dev.device, self.memory)
        vk.vkDestroyBuffer(dev.device, self.handle, None)
        vk.vkFreeMemory(dev.device, self.memory, None)
        dev.allocated_bytes -= self.alloc_size
        if self in dev._buffers:
            dev._buffers.remove(self)

    def __repr__(self) -> str:
        return f"<Buffer {self.name or '?'} {self.size} B{' mapped' if self.mapped is not None else ''}>"


@dataclass(frozen=True)
class RowRange:
    """Rows [row_start, row_start + rows) of a tensor, bindable as (buffer, offset, size)."""

    buffer: Buffer
    offset: int
    size: int
    row_start: int
    rows: int

    @property
    def binding(self) -> tuple[Buffer, int, int]:
        return (self.buffer, self.offset, self.size)


# what a binding slot takes (CommandList.dispatch): a whole buffer, a row range, (buffer, offset, size)
Binding: TypeAlias = Buffer | RowRange | tuple[Buffer, int, int]


def row_ranges(rows: int, row_bytes: int, limit: int, align: int) -> list[tuple[int, int]]:
    """Split `rows` rows into (row_start, n) pieces of at most `limit` bytes at `align`ed offsets."""
    if rows * row_bytes <= limit:
        return [(0, rows)]
    step = align // math.gcd(row_bytes, align)  # rows per aligned offset
    per = (limit // row_bytes) // step * step
    if per == 0:
        raise ValueError(f"a row of {row_bytes} B cannot be bound within {limit} B")
    return [(r, min(per, rows - r)) for r in range(0, rows, per)]


class Tensor:
    """A weight on the device in its file layout (quantized blocks), bound in row ranges."""

    def __init__(self, buffer: Buffer, rows: int, row_bytes: int, name: str = "", prefix: int = 0):
        """`prefix`: bytes before the first row that every kernel reads from the start of its
        binding (a codebook type's grid): such a tensor is bound whole, in one range."""
        caps = buffer.dev.caps
        self.buffer = buffer
        self.rows = rows
        self.row_bytes = row_bytes
        self.name = name
        self.prefix = prefix
        self.nbytes = prefix + rows * row_bytes
        limit = min(caps.max_storage_buffer_range, 1 << 31)  # keep offsets in 32-bit index math
        if prefix:
            if self.nbytes > limit:
                raise ValueError(f"{name}: {self.nbytes} B with its grid cannot be bound within {limit} B")
            self.ranges = [RowRange(buffer, 0, self.nbytes, 0, rows)]
            return
        self.ranges = [
            RowRange(buffer, r * row_bytes, n * row_bytes, r, n)
            for r, n in row_ranges(rows, row_bytes, limit, max(caps.min_storage_offset_alignment, 4))
        ]

    @classmethod
    def upload(
        cls,
        dev: Device,
        data: npt.NDArray[Any],
        row_bytes: int,
        *,
        rows: int | None = None,
        name: str = "",
        progress: ByteProgress | None = None,
        prefix: bytes = b"",
    ) -> Tensor:
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        rows = raw.size // row_bytes if rows is None else rows
        if rows * row_bytes != raw.size:
            raise ValueError(f"{name}: {raw.size} B is not {rows} rows of {row_bytes} B")
        buf = Buffer(dev, len(prefix) + raw.size, name=name)
        if prefix:
            upload(dev, buf, np.frombuffer(prefix, dtype=np.uint8), 0)
        upload(dev, buf, raw, len(prefix), progress)
        return cls(buf, rows, row_bytes, name, prefix=len(prefix))

    def __repr__(self) -> str:
        return f"<Tensor {self.name} {self.rows}x{self.row_bytes}B in {len(self.ranges)} range(s)>"


# ---- transfers ------------------------------------------------------------------------


def _one_shot(dev: Device, record: Callable[[Any], None]) -> None:
    """Record `record(cmd)` into the device's transfer command buffer, submit and wait."""
    vk = dev.vk
    if dev._xfer_cmd is None:
        dev._xfer_cmd = vk.vkAllocateCommandBuffers(
            dev.device,
            vk.VkCommandBufferAllocateInfo(
                commandPool=dev.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1
            ),
        )[0]
        dev._xfer_fence = vk.vkCreateFence(dev.device, vk.VkFenceCreateInfo(), None)
    cmd = dev._xfer_cmd
    vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
    full = vk.VkMemoryBarrier(
        srcAccessMask=vk.VK_ACCESS_MEMORY_WRITE_BIT,
        dstAccessMask=vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT,
    )
    vk.vkCmdPipelineBarrier(
        cmd,
        vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
        vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
        0,
        1,
        [full],
        0,
        None,
        0,
        None,
    )
    record(cmd)
    vk.vkCmdPipelineBarrier(
        cmd,
        vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
        vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
        0,
        1,
        [full],
        0,
        None,
        0,
        None,
    )
    vk.vkEndCommandBuffer(cmd)
    with dev.queue_lock:
        vk.vkQueueSubmit(dev.queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])], dev._xfer_fence)
    vk.vkWaitForFences(dev.device, 1, [dev._xfer_fence], vk.VK_TRUE, (1 << 64) - 1)
    vk.vkResetFences(dev.device, 1, [dev._xfer_fence])


def upload(
    dev: Device,
    buf: Buffer,
    array: npt.ArrayLike | bytearray | memoryview,
    offset: int = 0,
    progress: ByteProgress | None = None,
) -> None:
    """Copy `array` (any numpy array or bytes) into `buf` at byte `offset`.

    Mapped buffers are written in place (the queue must be idle for that region); others go
    through the staging buffer in 64 MiB pieces. `progress(done_bytes, total_bytes)` is called
    after each piece.
    """
    src = (
        np.ascontiguousarray(
            np.asarray(array)
            if not isinstance(array, (bytes, bytearray, memoryview))
            else np.frombuffer(array, np.uint8)
        )
        .reshape(-1)
        .view(np.uint8)
    )
    n = src.size
    if offset + n > buf.size:
        raise ValueError(f"upload of {n} B at {offset} overflows {buf!r}")
    if buf.mapped is not None:
        step = 64 << 20
        for s in range(0, n, step):
            buf.mapped[offset + s : offset + min(n, s + step)] = src[s : s + step]
            if progress:
                progress(min(n, s + step), n)
        if progress and n == 0:
            progress(0, 0)
        return
    stage = dev.staging()
    staged = stage.mapped
    assert staged is not None  # the staging buffer is host-visible
    vk = dev.vk
    for s in range(0, n, stage.size):
        m = min(stage.size, n - s)
        staged[:m] = src[s : s + m]
        region = vk.VkBufferCopy(srcOffset=0, dstOffset=offset + s, size=m)
        _one_shot(dev, lambda cmd: vk.vkCmdCopyBuffer(cmd, stage.handle, buf.handle, 1, [region]))
        if progress:
            progress(s + m, n)


def download(
    dev: Device,
    buf: Buffer,
    dtype: npt.DTypeLike = np.float32,
    shape: int | tuple[int, ...] | None = None,
    offset: int = 0,
) -> npt.NDArray[Any]:
    """A copy of `buf`'s contents from byte `offset` as `dtype` (all of it, or `shape`)."""
    itemsize = np.dtype(dtype).itemsize
    count = (buf.size - offset) // itemsize if shape is None else int(np.prod(shape))
    n = count * itemsize
    if buf.mapped is not None:
        out = buf.mapped[offset : offset + n].copy()
    else:
        stage = dev.staging()
        staged = stage.mapped
        assert staged is not None  # the staging buffer is host-visible
        vk = dev.vk
        out = np.empty(n, np.uint8)
        for s in range(0, n, stage.size):
            m = min(stage.size, n - s)
            region = vk.VkBufferCopy(srcOffset=offset + s, dstOffset=0, size=m)
            _one_shot(dev, lambda cmd: vk.vkCmdCopyBuffer(cmd, buf.handle, stage.handle, 1, [region]))
            out[s : s + m] = staged[:m]
    out = out.view(dtype)
    return out.reshape(shape) if shape is not None else out
