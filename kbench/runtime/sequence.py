"""Sequence: one command buffer on one queue, with automatic barriers and GPU timestamps."""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from . import _vk
from .memory import ManagedObject
from ._vk import UINT64_MAX, ffi, lib, vk
from .errors import DeviceBusyError, DeviceLostError
from .ops import OpBase
from .recorder import Recorder

if TYPE_CHECKING:  # pragma: no cover
    from .manager import Manager

_SHADER_OR_TRANSFER = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
_WRITES = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
_READS_WRITES = (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT
                 | vk.VK_ACCESS_TRANSFER_WRITE_BIT)
#: a blocking wait returns to Python this often, so that Ctrl-C (KeyboardInterrupt) is honoured
_WAIT_SLICE_NS = 100_000_000


class Sequence(ManagedObject):
    """Records ops into one command buffer and submits it to one queue.

    Barriers: before an op that reads or writes something an earlier op in the sequence wrote, or
    writes something an earlier op read, a compute/transfer barrier is recorded; independent ops
    are left to overlap. The first command orders the sequence after earlier submissions.
    """

    def __init__(self, mgr: "Manager", queue_index: int = 0, total_timestamps: int = 0):
        mgr._check_alive()
        if not isinstance(queue_index, int) or isinstance(queue_index, bool):
            raise TypeError(f"queue_index must be an int, got {type(queue_index).__name__}")
        if not 0 <= queue_index < len(mgr._queues):
            raise IndexError(f"queue_index {queue_index} is out of range: this Manager has {len(mgr._queues)} "
                             f"queue(s) (families {[q[1] for q in mgr._queues]})")
        if not isinstance(total_timestamps, int) or total_timestamps < 0:
            raise ValueError(f"total_timestamps must be a non-negative int, got {total_timestamps!r}")
        self._mgr = mgr
        self._queue, self.family, self._qlock, self.queue_in_family = mgr._queues[queue_index]
        self.queue_index = queue_index
        self._pool = self._cmd = self._fence = self._query_pool = None
        dev = mgr._device
        with _vk.call("vkCreateCommandPool"):
            self._pool = vk.vkCreateCommandPool(dev, vk.VkCommandPoolCreateInfo(
                flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.family), None)
        try:
            with _vk.call("vkAllocateCommandBuffers"):
                self._cmd = vk.vkAllocateCommandBuffers(dev, vk.VkCommandBufferAllocateInfo(
                    commandPool=self._pool, level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1))[0]
            with _vk.call("vkCreateFence"):
                self._fence = vk.vkCreateFence(dev, vk.VkFenceCreateInfo(), None)
            self._fences = ffi.new("VkFence[1]", [self._fence])
            self._timestamps_cap = total_timestamps
            if total_timestamps:
                bits = mgr._props["queue_families"][self.family]["timestamp_valid_bits"]
                if not bits:
                    raise ValueError(f"queue family {self.family} does not support timestamps "
                                     "(timestampValidBits = 0)")
                self._ts_mask = (1 << bits) - 1 if bits < 64 else UINT64_MAX
                with _vk.call("vkCreateQueryPool"):
                    self._query_pool = vk.vkCreateQueryPool(dev, vk.VkQueryPoolCreateInfo(
                        queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=total_timestamps), None)
        except BaseException:
            self._free_objects()
            raise
        self._ops: list[OpBase] = []
        self._streaming: list[OpBase] = []
        self._recording = False
        self._running = False
        self._ended = False
        self._ts_written = 0
        self._written: set = set()
        self._read: set = set()
        self._uses: set[int] = set()  # ids of the tensors and algorithms the recorded ops refer to
        self._stale = ""  # "tensor"/"algorithm": one was destroyed or rebuilt since it was recorded
        self._rec = Recorder(self._cmd, mgr)
        self._submit = ffi.new("VkSubmitInfo*")
        self._cmds = ffi.new("VkCommandBuffer[1]", [self._cmd])
        self._submit.sType = vk.VK_STRUCTURE_TYPE_SUBMIT_INFO
        self._submit.commandBufferCount = 1
        self._submit.pCommandBuffers = self._cmds
        self._destroyed = False
        self._lock = threading.RLock()
        mgr._track(self)
        mgr._stats["sequences"] += 1

    # --- Kompute API ---------------------------------------------------------------------------
    def record(self, op: OpBase) -> "Sequence":
        """Append ``op`` to the command buffer (starting a new recording after an eval)."""
        self._check()
        if not isinstance(op, OpBase):
            raise TypeError(f"record expects an op (kbench.runtime.OpBase), got {type(op).__name__}")
        if self._running:
            raise RuntimeError("cannot record while the sequence is running: call eval_await() first")
        if self._ended:
            self.clear()
        if not self._recording:
            self._begin()
        self._record_op(op)
        self._ops.append(op)
        return self

    def eval(self, op: OpBase | None = None) -> "Sequence":
        """Submit and wait. With ``op``: clear, record ``op`` alone, submit and wait."""
        self.eval_async(op)
        self.eval_await()
        return self

    def eval_async(self, op: OpBase | None = None) -> "Sequence":
        """Submit without waiting (truly asynchronous); finish with ``eval_await``."""
        self._check()
        if self._running:
            raise RuntimeError("sequence is already running: call eval_await() before submitting again")
        if op is not None:
            self.clear()
            self.record(op)
        if self._recording:
            self._end()
        if not self._ended:
            raise RuntimeError("nothing recorded: record an op before eval")
        if self._stale:
            raise RuntimeError(f"a {self._stale} recorded in this sequence: the {self._stale} has been destroyed or "
                               "rebuilt since; record the sequence again (clear() and record, or rerecord())")
        for o in self._ops:
            o.pre_eval(self)
        dev = self._mgr._device
        with self._qlock:
            lib.vkResetFences(dev, 1, self._fences)
            res = lib.vkQueueSubmit(self._queue, 1, self._submit, self._fence)
        self._mgr._result(res, "vkQueueSubmit")
        self._running = True
        try:
            for o in self._streaming:
                o.after_submit(self)
        except BaseException:
            self.eval_await()
            raise
        return self

    def eval_await(self, timeout_ns: int | None = None) -> bool:
        """Wait for the submitted work. Returns True when it finished, False on timeout (the
        sequence then stays running and a later ``eval_await`` completes it)."""
        self._check()
        if not self._running:
            return True
        if timeout_ns is None:
            timeout = UINT64_MAX
        else:
            if not isinstance(timeout_ns, int) or timeout_ns < 0:
                raise ValueError(f"timeout_ns must be a non-negative int (nanoseconds) or None, got {timeout_ns!r}")
            timeout = min(timeout_ns, UINT64_MAX)
        if timeout_ns is None and self._streaming:
            dev, fence = self._mgr._device, self._fence
            for o in self._streaming:
                o.while_waiting(self, lambda: lib.vkGetFenceStatus(dev, fence) != vk.VK_NOT_READY)
        res = self._spin(timeout)
        if res is None:
            res = self._block(None if timeout == UINT64_MAX else max(0, timeout - self._spun_ns))
        if res == vk.VK_TIMEOUT:
            return False
        self._mgr._result(res, "vkWaitForFences")
        self._running = False
        for o in self._ops:
            o.post_eval(self)
        return True

    def _block(self, timeout_ns: int | None) -> int:
        """Wait for the fence (None: without limit) in slices, so that a signal handler (Ctrl-C)
        runs while the GPU works; returns the fence's VkResult, VK_TIMEOUT when time ran out."""
        dev = self._mgr._device
        deadline = None if timeout_ns is None else time.monotonic_ns() + timeout_ns
        while True:
            step = _WAIT_SLICE_NS if deadline is None else max(0, min(_WAIT_SLICE_NS, deadline - time.monotonic_ns()))
            res = lib.vkWaitForFences(dev, 1, self._fences, vk.VK_TRUE, step)
            if res != vk.VK_TIMEOUT or (deadline is not None and time.monotonic_ns() >= deadline):
                return res

    def _finish_within(self, what: str, abandon: bool) -> None:
        """Wait for the running submission at most ``Manager.destroy_timeout_s``. When it does not
        finish: raise DeviceBusyError, after abandoning the Manager when ``abandon`` (the caller
        is about to free objects the GPU may still use)."""
        limit = self._mgr.destroy_timeout_s
        if self.eval_await(int(limit * 1e9)):
            return
        if abandon:
            self._mgr._abandon(f"{what}: the GPU did not finish this sequence's work within {limit:g} s")
        raise DeviceBusyError(f"{what}: the GPU did not finish this sequence's work within {limit:g} s "
                              "(Manager.destroy_timeout_s; an endless or very long shader?)"
                              + ("; the Manager was abandoned: its device memory stays allocated until "
                                 "the process exits" if abandon else ""))

    def _spin(self, timeout: int) -> int | None:
        """Poll the fence for up to the manager's ``wait_spin_ns`` before blocking: a blocking
        vkWaitForFences wakes the thread late (measured on an H200: 44 us submit-and-wait round
        trip blocking, 19 us polling), which dominates short submissions. Returns the fence's
        status once it is signalled (or an error), None when the caller should block."""
        budget = min(self._mgr.wait_spin_ns, timeout)
        self._spun_ns = 0
        if budget <= 0:
            return None
        dev, fence = self._mgr._device, self._fence
        start = time.perf_counter_ns()
        while True:
            res = lib.vkGetFenceStatus(dev, fence)
            if res != vk.VK_NOT_READY:
                return res
            self._spun_ns = time.perf_counter_ns() - start
            if self._spun_ns >= budget:
                return vk.VK_TIMEOUT if budget >= timeout else None

    def is_recording(self) -> bool:
        return self._recording

    def is_running(self) -> bool:
        """True from submission until ``eval_await`` has seen the work finish."""
        return self._running

    def is_init(self) -> bool:
        return not self._destroyed and self._mgr._alive

    def clear(self) -> None:
        """Drop all recorded ops (waits for a running submission first, at most
        ``Manager.destroy_timeout_s``: DeviceBusyError after that, with the sequence left as it was)."""
        self._check()
        if self._running:
            self._finish_within("Sequence.clear", abandon=False)
        for o in self._ops:
            o.release()
        self._ops = []
        self._streaming = []
        if self._recording or self._ended:
            lib.vkResetCommandBuffer(self._cmd, 0)
        self._recording = False
        self._ended = False
        self._uses = set()
        self._stale = ""

    def rerecord(self) -> None:
        """Record the same ops again (after an algorithm was rebuilt, say)."""
        self._check()
        if self._running:
            self.eval_await()
        ops = self._ops
        lib.vkResetCommandBuffer(self._cmd, 0)
        self._recording = self._ended = False
        self._ops = []
        self._uses = set()
        self._stale = ""
        self._begin()
        for o in ops:
            self._record_op(o)
            self._ops.append(o)

    def get_timestamps(self) -> list[int]:
        """GPU timestamps in nanoseconds: one at the start and one after each op (ops + 1)."""
        self._check()
        if self._query_pool is None:
            return []
        if self._running:
            raise RuntimeError("timestamps are not ready: call eval_await() first")
        n = self._ts_written
        if n == 0:
            return []
        data = ffi.new("uint64_t[]", n)
        res = lib.vkGetQueryPoolResults(self._mgr._device, self._query_pool, 0, n, 8 * n, data, 8,
                                        vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
        self._mgr._result(res, "vkGetQueryPoolResults")
        period = self._mgr._props["timestamp_period"]
        return [int(round((data[i] & self._ts_mask) * period)) for i in range(n)]

    def destroy(self) -> None:
        """Free the command buffer, fence and query pool (waiting for a running submission at most
        ``Manager.destroy_timeout_s``; then DeviceBusyError, and the Manager is abandoned)."""
        if self._destroyed or self._mgr._abandoned:
            return
        if self._running and self._mgr._alive:
            try:
                self._finish_within("Sequence.destroy", abandon=True)
            except DeviceLostError:
                pass
        for o in self._ops:
            o.release()
        self._ops = []
        self._streaming = []
        self._free_objects()
        self._destroyed = True
        self._mgr._stats["sequences"] -= 1
        self._mgr._untrack(self)

    # --- kbench additions ----------------------------------------------------------------------
    def ops(self) -> list[OpBase]:
        return list(self._ops)

    def uses(self, obj) -> bool:
        """Whether a recorded op touches tensor or algorithm ``obj``."""
        return id(obj) in self._uses  # the ops hold the objects, so their ids are not reused

    # --- recording internals (used by the ops) -------------------------------------------------
    def _begin(self) -> None:
        info = vk.VkCommandBufferBeginInfo()
        with _vk.call("vkBeginCommandBuffer"):
            vk.vkBeginCommandBuffer(self._cmd, info)
        self._recording = True
        self._ended = False
        self._ts_written = 0
        self._written = set()
        self._read = set()
        if self._query_pool is not None:
            lib.vkCmdResetQueryPool(self._cmd, self._query_pool, 0, self._timestamps_cap)
        # order this submission after whatever ran earlier on the queue
        self._cmd_barrier(vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                          vk.VK_ACCESS_MEMORY_WRITE_BIT, vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT)
        self._timestamp()

    def _end(self) -> None:
        _vk.check(lib.vkEndCommandBuffer(self._cmd), "vkEndCommandBuffer")
        # the few ops with host work around the submission, so a long sequence of dispatches
        # pays nothing for them on each eval
        self._streaming = [o for o in self._ops if o.streams]
        self._recording = False
        self._ended = True

    def _record_op(self, op: OpBase) -> None:
        mgr, uses = self._mgr, self._uses
        for obj in op.objects():
            if obj._mgr is not mgr:
                raise ValueError(f"{type(op).__name__}: {obj!r} belongs to another Manager than this sequence; "
                                 "an op can only use the tensors and algorithms of its sequence's Manager")
            uses.add(id(obj))
        acc = op.accesses()
        hazard = False
        for t, writes in acc:
            key = id(t)
            if key in self._written or (writes and key in self._read):
                hazard = True
                break
        if hazard:
            self._cmd_barrier(_SHADER_OR_TRANSFER, _SHADER_OR_TRANSFER, _WRITES, _READS_WRITES)
            self._written = set()
            self._read = set()
        op.record(self._rec)
        for t, writes in acc:
            (self._written if writes else self._read).add(id(t))
        self._timestamp()

    def _timestamp(self) -> None:
        if self._query_pool is not None and self._ts_written < self._timestamps_cap:
            lib.vkCmdWriteTimestamp(self._cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self._query_pool, self._ts_written)
            self._ts_written += 1

    def _cmd_barrier(self, src_stage: int, dst_stage: int, src_access: int, dst_access: int) -> None:
        """The sequence's own barriers (its start, and between dependent ops)."""
        self._rec.barrier(src_stage, dst_stage, src_access, dst_access)

    # --- lifetime ------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._destroyed:
            raise RuntimeError("sequence has been destroyed")
        self._mgr._check_alive()

    def _free_objects(self) -> None:
        dev = self._mgr._device
        if dev is None:
            return
        if self._query_pool is not None:
            vk.vkDestroyQueryPool(dev, self._query_pool, None)
        if self._fence is not None:
            vk.vkDestroyFence(dev, self._fence, None)
        if self._pool is not None:
            vk.vkDestroyCommandPool(dev, self._pool, None)  # frees its command buffers
        self._query_pool = self._fence = self._pool = self._cmd = None
