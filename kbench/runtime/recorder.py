"""Recorder: the command buffer an op records into.

As Kompute's ``OpBase::record`` receives a command buffer and calls the tensors' own recording
methods, an op's ``record(rec)`` gets a Recorder and names tensors, algorithms and staging
buffers; the Recorder (with Tensor.record_* and Algorithm.record_dispatch) turns them into
Vulkan commands. Ops never reach into a sequence, a tensor's buffer or the Manager's pools.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence as Seq

from ._vk import ffi, lib, vk

if TYPE_CHECKING:  # pragma: no cover
    from .manager import Manager
    from .memory import Buffer, HostImport
    from .tensor import Tensor


def _handle(obj: Any):
    """The VkBuffer of a tensor, a staging buffer or an imported host region."""
    from .tensor import Tensor

    return obj._vk_buffer if isinstance(obj, Tensor) else obj.handle


class Recorder:
    """Commands into one sequence's command buffer (made by the Sequence; an op gets it in record).
    It holds the command buffer and the Manager, not the sequence (no reference cycle: a dropped
    sequence is freed at once)."""

    __slots__ = ("_cmd", "_mgr")

    def __init__(self, command_buffer: Any, mgr: "Manager"):
        self._cmd = command_buffer
        self._mgr = mgr

    @property
    def manager(self) -> "Manager":
        return self._mgr

    @property
    def command_buffer(self) -> Any:
        """The VkCommandBuffer itself, for an op that records Vulkan commands of its own (the
        sequence's automatic barriers do not know what such commands touch)."""
        return self._cmd

    # --- memory an op may borrow while it is recorded ----------------------------------------------
    def staging(self, nbytes: int) -> "Buffer":
        """A mapped staging buffer of at least ``nbytes`` from the Manager's pool; give it back
        with its ``give_back()`` once the op no longer needs it."""
        return self._mgr._staging.acquire(nbytes)

    def host_import(self, tensor: "Tensor") -> "HostImport | None":
        """The device's import of a device tensor's host memory, where whole-tensor syncs go
        without staging (Manager.zero_copy_min_bytes); None otherwise."""
        return tensor._host_import() if self._mgr._zero_copy(tensor.nbytes()) else None

    # --- commands ------------------------------------------------------------------------------------
    def copy(self, src: Any, dst: Any, src_offset: int, dst_offset: int, size: int) -> None:
        """Copy ``size`` bytes between tensors, staging buffers or imported host memory."""
        region = ffi.new("VkBufferCopy*", {"srcOffset": src_offset, "dstOffset": dst_offset, "size": size})
        lib.vkCmdCopyBuffer(self._cmd, _handle(src), _handle(dst), 1, region)

    def fill(self, tensor: "Tensor", value: int, offset: int, size: int) -> None:
        lib.vkCmdFillBuffer(self._cmd, tensor._vk_buffer, offset, size, value)

    def barrier(self, src_stage: int, dst_stage: int, src_access: int, dst_access: int) -> None:
        """A global memory barrier."""
        mb = ffi.new("VkMemoryBarrier*", {"sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                          "srcAccessMask": src_access, "dstAccessMask": dst_access})
        lib.vkCmdPipelineBarrier(self._cmd, src_stage, dst_stage, 0, 1, mb, 0, ffi.NULL, 0, ffi.NULL)

    def buffer_barriers(self, tensors: Seq["Tensor"], src_stage: int, dst_stage: int, src_access: int,
                        dst_access: int) -> None:
        """One buffer memory barrier per tensor (its whole buffer)."""
        arr = ffi.new("VkBufferMemoryBarrier[]", len(tensors))
        for i, t in enumerate(tensors):
            arr[i].sType = vk.VK_STRUCTURE_TYPE_BUFFER_MEMORY_BARRIER
            arr[i].srcAccessMask = src_access
            arr[i].dstAccessMask = dst_access
            arr[i].srcQueueFamilyIndex = vk.VK_QUEUE_FAMILY_IGNORED
            arr[i].dstQueueFamilyIndex = vk.VK_QUEUE_FAMILY_IGNORED
            arr[i].buffer = t._vk_buffer
            arr[i].offset = 0
            arr[i].size = max(4, (t.nbytes() + 3) // 4 * 4)
        lib.vkCmdPipelineBarrier(self._cmd, src_stage, dst_stage, 0, 0, ffi.NULL, len(tensors), arr, 0, ffi.NULL)

    def dispatch(self, pipeline: Any, descriptor_set: Any, push: bytes, grid: tuple[int, int, int]) -> None:
        """Bind a pipeline and its descriptor set, push constants, dispatch ``grid`` (called by
        Algorithm.record_dispatch)."""
        cmd = self._cmd
        lib.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.pipeline)
        sets = ffi.new("VkDescriptorSet[1]", [descriptor_set])
        lib.vkCmdBindDescriptorSets(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout, 0, 1, sets, 0, ffi.NULL)
        if push:
            lib.vkCmdPushConstants(cmd, pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(push), push)
        lib.vkCmdDispatch(cmd, grid[0], grid[1], grid[2])

    def wait_host_event(self, events: Any, index: int, barrier: Any) -> None:
        """Wait for event ``index`` of the cffi array ``events``, set by the host, with ``barrier``
        (a VkMemoryBarrier) making the host's writes visible to transfers."""
        lib.vkCmdWaitEvents(self._cmd, 1, events + index, vk.VK_PIPELINE_STAGE_HOST_BIT,
                            vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 1, barrier, 0, ffi.NULL, 0, ffi.NULL)

    def set_event(self, event: Any, dependency: Any) -> None:
        """Signal ``event`` with ``dependency`` (a VkDependencyInfo; synchronization2)."""
        lib.vkCmdSetEvent2(self._cmd, event, dependency)
