"""Command lists: record dispatches once, replay them as often as needed.

A `CommandList` owns one primary command buffer, a fence, optionally a timestamp query pool,
and a share of the descriptor sets its dispatches bind. Dispatches and barriers are recorded
through raw `vk.lib` calls on cffi structs (a recording lands inside a request where its shape is
new: the `vulkan` package's wrappers built a Python object per struct field, half the host time);
`submit`/`wait` use raw calls on cdata built at `end()`, so replaying a recorded token step costs
microseconds of Python and allocates nothing. `clone()` records the same commands into a second list that shares the
descriptor sets: what a step run twice in flight needs, at a small part of a recording's cost
(no graph walk, no descriptor writes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from phoenix_chat.engine.backends.vulkan.memory import Binding, Buffer, RowRange

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.pipelines import Pipeline

_SETS_PER_POOL = 512
_DESCRIPTORS_PER_POOL = 512 * 8


class _DescriptorPools:
    """The descriptor pools of one recording, shared by its clones: destroyed with the last."""

    def __init__(self, dev: Device):
        self.dev = dev
        self.pools: list[Any] = []  # VkDescriptorPool handles
        self.users = 1
        self.sets = 0  # in the last pool
        self.descriptors = 0
        self.add()

    def add(self) -> None:
        vk = self.dev.vk
        size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=_DESCRIPTORS_PER_POOL)
        self.pools.append(
            vk.vkCreateDescriptorPool(
                self.dev.device,
                vk.VkDescriptorPoolCreateInfo(maxSets=_SETS_PER_POOL, poolSizeCount=1, pPoolSizes=[size]),
                None,
            )
        )
        self.sets = self.descriptors = 0

    def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            for p in self.pools:
                self.dev.vk.vkDestroyDescriptorPool(self.dev.device, p, None)
            self.pools = []


# the memory barriers' raw structs, by (all_commands, transfer): read-only once built
_BARRIERS: dict[tuple[bool, bool], Any] = {}

# what a list recorded, for clone(): ("dispatch", pipeline, descriptor set, push, groups),
# ("barrier", all_commands, transfer), ("copy", src, dst, nbytes, src_offset, dst_offset),
# ("fill", buffer, value, offset, nbytes), ("timestamp", index)
Command = tuple[Any, ...]


class CommandList:
    # set by the graph on the lists it profiles (a label per timestamp after the first) or
    # brackets with two timestamps for the busy gauge; read by profiling.py
    profile_labels: list[str] | None = None
    busy_timed: bool = False

    def __init__(self, dev: Device, *, timestamps: int = 0, name: str = ""):
        vk = dev.vk
        self.dev = dev
        self.name = name
        self.cmd = vk.vkAllocateCommandBuffers(
            dev.device,
            vk.VkCommandBufferAllocateInfo(
                commandPool=dev.command_pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1
            ),
        )[0]
        self.fence = vk.vkCreateFence(dev.device, vk.VkFenceCreateInfo(), None)
        self._sets = _DescriptorPools(dev)
        self._log: list[Command] = []
        self.query_pool: Any = None
        self.n_timestamps = timestamps
        if timestamps:
            if not dev.caps.timestamp_bits:
                raise RuntimeError(f"{dev.name}: the compute queue has no timestamps")
            self.query_pool = vk.vkCreateQueryPool(
                dev.device, vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=timestamps), None
            )
        self.dispatches = 0
        self.barriers = 0
        self._last_pipeline: Pipeline | None = None
        self._recording = False
        self._ended = False
        self._pending = False
        self._raw: tuple[Any, Any, Any] | None = None  # cdata (commands, submit info, fences), from end()
        self.begin()

    # ---- recording ----
    def begin(self) -> None:
        """Start (or restart) recording; records a leading barrier against earlier submissions."""
        vk = self.dev.vk
        if self._pending:
            self.wait()
        if self._ended:  # re-record: drop the old descriptor sets (clones keep their share)
            vk.vkResetCommandBuffer(self.cmd, 0)
            self._sets.release()
            self._sets = _DescriptorPools(self.dev)
        vk.vkBeginCommandBuffer(self.cmd, vk.VkCommandBufferBeginInfo())
        self._recording = True
        self._ended = False
        self._last_pipeline = None
        self.dispatches = self.barriers = 0
        if self.query_pool is not None:
            vk.vkCmdResetQueryPool(self.cmd, self.query_pool, 0, self.n_timestamps)
        self.barrier(all_commands=True)
        self._log = []  # the commands recorded after begin()'s own (what clone() records again)

    def _descriptor_set(self, pipeline: Pipeline) -> Any:
        """A new set for `pipeline`'s layout, as the VkDescriptorSet[1] that binding it takes."""
        vk, ffi = self.dev.vk, self.dev.ffi
        n, sets = pipeline.n_bindings, self._sets
        if sets.sets + 1 > _SETS_PER_POOL or sets.descriptors + n > _DESCRIPTORS_PER_POOL:
            sets.add()
        sets.sets += 1
        sets.descriptors += n
        info = ffi.new("VkDescriptorSetAllocateInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO
        info.descriptorPool = sets.pools[-1]
        info.descriptorSetCount = 1
        layouts = ffi.new("VkDescriptorSetLayout[1]", [pipeline.set_layout])
        info.pSetLayouts = layouts
        dset = ffi.new("VkDescriptorSet[1]")
        r = self.dev.lib.vkAllocateDescriptorSets(self.dev.device, info, dset)
        if r:
            raise vk.exception_codes[r]
        return dset

    @staticmethod
    def _binding(b: Binding) -> tuple[Buffer, int, int]:
        if isinstance(b, Buffer):
            return b, 0, b.size
        if isinstance(b, RowRange):
            return b.binding
        buf, off, size = b
        return buf, int(off), int(size)

    def dispatch(
        self,
        pipeline: Pipeline,
        bindings: Sequence[Binding],
        groups: int | tuple[int, ...] | list[int],
        push: bytes | None = None,
    ) -> None:
        """Bind `bindings` (Buffer | (Buffer, offset, size) | RowRange, one per binding slot),
        push `push` bytes (from pipeline.push.pack), dispatch `groups` (x[, y, z]) workgroups."""
        vk = self.dev.vk
        assert self._recording, "dispatch outside begin()/end()"
        if len(bindings) != pipeline.n_bindings:
            raise ValueError(f"{pipeline.name} takes {pipeline.n_bindings} bindings, got {len(bindings)}")
        groups = tuple(groups) if isinstance(groups, (tuple, list)) else (int(groups),)
        groups = tuple(int(g) for g in groups) + (1,) * (3 - len(groups))
        limit = self.dev.caps.max_workgroup_count
        if any(g < 1 or g > m for g, m in zip(groups, limit)):
            raise ValueError(f"{pipeline.name}: workgroup count {groups} outside 1..{limit}")
        dset = None
        if pipeline.n_bindings:
            # the writes as raw structs, one array each (the vulkan package's wrappers built a
            # Python struct per field: half of a recording's host time)
            ffi, n = self.dev.ffi, pipeline.n_bindings
            dset = self._descriptor_set(pipeline)
            infos = ffi.new("VkDescriptorBufferInfo[]", n)
            writes = ffi.new("VkWriteDescriptorSet[]", n)
            for i, b in enumerate(bindings):
                buf, off, size = self._binding(b)
                if off % self.dev.caps.min_storage_offset_alignment:
                    raise ValueError(f"{pipeline.name} binding {i}: offset {off} is not aligned")
                if size > self.dev.caps.max_storage_buffer_range:
                    raise ValueError(f"{pipeline.name} binding {i}: {size} B exceeds maxStorageBufferRange")
                info, w = infos[i], writes[i]
                info.buffer, info.offset, info.range = buf.handle, off, size
                w.sType = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
                w.dstSet = dset[0]
                w.dstBinding = i
                w.descriptorCount = 1
                w.descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
                w.pBufferInfo = infos + i
            self.dev.lib.vkUpdateDescriptorSets(self.dev.device, n, writes, 0, ffi.NULL)
        self._log.append(("dispatch", pipeline, dset, push, groups))
        self._record_dispatch(pipeline, dset, push, groups)

    def _record_dispatch(self, pipeline: Pipeline, dset: Any, push: bytes | None, groups: tuple[int, ...]) -> None:
        """Bind, push and dispatch through raw vk.lib calls (dset: a VkDescriptorSet[1] or None)."""
        vk, lib = self.dev.vk, self.dev.lib
        if self._last_pipeline is not pipeline:
            lib.vkCmdBindPipeline(self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
            self._last_pipeline = pipeline
        if dset is not None:
            lib.vkCmdBindDescriptorSets(
                self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout, 0, 1, dset, 0, self.dev.ffi.NULL
            )
        if pipeline.push.size:
            if push is None or len(push) != pipeline.push.size:
                raise ValueError(f"{pipeline.name} needs {pipeline.push.size} B of push constants")
            lib.vkCmdPushConstants(
                self.cmd, pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(push), self.dev.ffi.from_buffer(push)
            )
        lib.vkCmdDispatch(self.cmd, *groups)
        self.dispatches += 1

    def barrier(self, *, all_commands: bool = False, transfer: bool = True) -> None:
        """Make every earlier compute/transfer write visible to every later read and write.
        transfer=False: compute shaders only (nothing but dispatches on either side)."""
        vk, ffi = self.dev.vk, self.dev.ffi
        self._log.append(("barrier", all_commands, transfer))
        xfer = vk.VK_PIPELINE_STAGE_TRANSFER_BIT if transfer else 0
        stages = (
            vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT if all_commands else vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | xfer
        )
        mb = _BARRIERS.get((all_commands, transfer))
        if mb is None:  # one raw struct per kind, shared by every list
            mb = _BARRIERS[all_commands, transfer] = ffi.new("VkMemoryBarrier*")
            mb.sType = vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER
            mb.srcAccessMask = (
                vk.VK_ACCESS_SHADER_WRITE_BIT
                | (vk.VK_ACCESS_TRANSFER_WRITE_BIT if transfer else 0)
                | (vk.VK_ACCESS_HOST_WRITE_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT if all_commands else 0)
            )
            mb.dstAccessMask = (
                vk.VK_ACCESS_SHADER_READ_BIT
                | vk.VK_ACCESS_SHADER_WRITE_BIT
                | (vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT if transfer else 0)
            )
        self.dev.lib.vkCmdPipelineBarrier(self.cmd, stages, stages, 0, 1, mb, 0, ffi.NULL, 0, ffi.NULL)
        self.barriers += 1

    def copy(self, src: Buffer, dst: Buffer, nbytes: int, src_offset: int = 0, dst_offset: int = 0) -> None:
        vk = self.dev.vk
        self._log.append(("copy", src, dst, nbytes, src_offset, dst_offset))
        vk.vkCmdCopyBuffer(
            self.cmd,
            src.handle,
            dst.handle,
            1,
            [vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=nbytes)],
        )

    def fill(self, buf: Buffer, value: int = 0, offset: int = 0, nbytes: int | None = None) -> None:
        """Fill with a 32-bit pattern (`nbytes` a multiple of 4)."""
        size = buf.size - offset if nbytes is None else nbytes
        self._log.append(("fill", buf, value, offset, size))
        self.dev.vk.vkCmdFillBuffer(self.cmd, buf.handle, offset, size // 4 * 4, value & 0xFFFFFFFF)

    def timestamp(self, index: int) -> None:
        vk = self.dev.vk
        self._log.append(("timestamp", index))
        vk.vkCmdWriteTimestamp(self.cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.query_pool, index)

    def end(self) -> CommandList:
        vk, ffi = self.dev.vk, self.dev.ffi
        # make the last writes visible to host reads after the fence
        mb = vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_MEMORY_WRITE_BIT, dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)
        vk.vkCmdPipelineBarrier(
            self.cmd, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1, [mb], 0, None, 0, None
        )
        vk.vkEndCommandBuffer(self.cmd)
        self._recording = False
        self._ended = True
        # cdata for the hot path: built once, reused by every submit
        cmds = ffi.new("VkCommandBuffer[1]", [self.cmd])
        info = ffi.new("VkSubmitInfo*")
        info.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
        info.commandBufferCount = 1
        info.pCommandBuffers = cmds
        fences = ffi.new("VkFence[1]", [self.fence])
        self._raw = (cmds, info, fences)
        return self

    def clone(self) -> CommandList:
        """A second list of the same commands (ended), binding the same descriptor sets: to have
        a step in flight twice. Its own command buffer, fence and timestamps; the sets live until
        the last of the lists sharing them is destroyed (or re-recorded)."""
        if not self._ended:
            raise RuntimeError("clone() takes an ended list")
        other = CommandList(self.dev, timestamps=self.n_timestamps, name=self.name)
        other._sets.release()
        other._sets = self._sets
        self._sets.users += 1
        other.profile_labels, other.busy_timed = self.profile_labels, self.busy_timed
        for op in self._log:
            kind = op[0]
            if kind == "dispatch":
                other._log.append(op)
                other._record_dispatch(*op[1:])
            elif kind == "barrier":
                other.barrier(all_commands=op[1], transfer=op[2])
            elif kind == "copy":
                other.copy(*op[1:])
            elif kind == "fill":
                other.fill(op[1], op[2], op[3], op[4])
            else:
                other.timestamp(op[1])
        return other.end()

    # ---- replay ----
    def submit(self, wait: bool = True) -> None:
        """Queue the recorded commands (raw vk.lib call); with wait, block until done."""
        lib = self.dev.lib
        if not self._ended:
            self.end()
        if self._pending:
            self.wait()
        assert self._raw is not None  # end() built it
        _cmds, info, _fences = self._raw
        with self.dev.queue_lock:
            r = lib.vkQueueSubmit(self.dev.queue, 1, info, self.fence)
        if r:
            raise self.dev.vk.exception_codes[r]
        self._pending = True
        if wait:
            self.wait()

    def wait(self, timeout_ns: int = (1 << 64) - 1) -> None:
        if not self._pending:
            return
        lib = self.dev.lib
        assert self._raw is not None  # pending: submitted after end()
        fences = self._raw[2]
        r = lib.vkWaitForFences(self.dev.device, 1, fences, 1, timeout_ns)
        if r:
            raise self.dev.vk.exception_codes[r]
        lib.vkResetFences(self.dev.device, 1, fences)
        self._pending = False

    def run(self) -> None:
        """end() if needed, submit, wait."""
        self.submit(wait=True)

    def timestamps_ns(self, count: int | None = None) -> npt.NDArray[np.float64]:
        """The first `count` (default all) timestamps of the last completed run, in ns relative to
        timestamp 0. Every one of them must have been written."""
        vk, ffi = self.dev.vk, self.dev.ffi
        n = self.n_timestamps if count is None else count
        data = ffi.new("uint64_t[]", n)
        r = self.dev.lib.vkGetQueryPoolResults(
            self.dev.device,
            self.query_pool,
            0,
            n,
            n * 8,
            data,
            8,
            vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT,
        )
        if r:
            raise vk.exception_codes[r]
        ticks: npt.NDArray[np.float64] = np.frombuffer(ffi.buffer(data, n * 8), dtype=np.uint64).astype(np.float64)
        mask = (1 << self.dev.caps.timestamp_bits) - 1 if self.dev.caps.timestamp_bits < 64 else None
        if mask is not None:
            ticks = np.asarray([int(t) & mask for t in ticks], dtype=np.float64)
        elapsed: npt.NDArray[np.float64] = (ticks - ticks[0]) * self.dev.caps.timestamp_period
        return elapsed

    def destroy(self) -> None:
        vk, d = self.dev.vk, self.dev.device
        if self._pending:
            self.wait()
        self._sets.release()
        if self.query_pool is not None:
            vk.vkDestroyQueryPool(d, self.query_pool, None)
        vk.vkDestroyFence(d, self.fence, None)
        vk.vkFreeCommandBuffers(d, self.dev.command_pool, 1, [self.cmd])
