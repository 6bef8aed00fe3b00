"""Operations recorded into a Sequence (Kompute's Op* classes plus kbench's transfer ops).

Each op declares which tensors it reads and writes; the Sequence uses that to place barriers
only where one op depends on another (Kompute places none, so dependent dispatches race).
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Sequence as Seq

import numpy as np

from ._vk import vk
from .algorithm import Algorithm, _as_constants, check_push_constants
from .tensor import Tensor, TensorTypes
from .transfer import StagedTransfer, as_bytes, host_copy, mapped_bytes

if TYPE_CHECKING:  # pragma: no cover
    from .recorder import Recorder
    from .sequence import Sequence


class AccessFlags(enum.IntFlag):
    """VkAccessFlagBits for OpMemoryBarrier (combine with ``|``)."""

    none = 0
    indirect_command_read = vk.VK_ACCESS_INDIRECT_COMMAND_READ_BIT
    uniform_read = vk.VK_ACCESS_UNIFORM_READ_BIT
    shader_read = vk.VK_ACCESS_SHADER_READ_BIT
    shader_write = vk.VK_ACCESS_SHADER_WRITE_BIT
    transfer_read = vk.VK_ACCESS_TRANSFER_READ_BIT
    transfer_write = vk.VK_ACCESS_TRANSFER_WRITE_BIT
    host_read = vk.VK_ACCESS_HOST_READ_BIT
    host_write = vk.VK_ACCESS_HOST_WRITE_BIT
    memory_read = vk.VK_ACCESS_MEMORY_READ_BIT
    memory_write = vk.VK_ACCESS_MEMORY_WRITE_BIT


class PipelineStageFlags(enum.IntFlag):
    """VkPipelineStageFlagBits for OpMemoryBarrier (combine with ``|``)."""

    top_of_pipe = vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT
    draw_indirect = vk.VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT
    compute_shader = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
    transfer = vk.VK_PIPELINE_STAGE_TRANSFER_BIT
    bottom_of_pipe = vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT
    host = vk.VK_PIPELINE_STAGE_HOST_BIT
    all_commands = vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT


def _tensor_list(tensors: Any, what: str, minimum: int = 1) -> list[Tensor]:
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    try:
        tensors = list(tensors)
    except TypeError:
        raise TypeError(f"{what}: expected a list of tensors, got {type(tensors).__name__}") from None
    if len(tensors) < minimum:
        raise ValueError(f"{what}: needs at least {minimum} tensor(s), got {len(tensors)}")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{what}: tensors[{i}] is {type(t).__name__}, expected a kbench.runtime.Tensor")
        t._check()
        if t._mgr is not tensors[0]._mgr:
            raise ValueError(f"{what}: tensors[{i}] belongs to another Manager than tensors[0]")
    return tensors


def _byte_view(data: Any, writable: bool, what: str) -> memoryview:
    try:
        mv = memoryview(data)
    except TypeError:
        raise TypeError(f"{what}: expected a bytes-like object or numpy array, got {type(data).__name__}") from None
    if not mv.c_contiguous:
        raise ValueError(f"{what}: buffer must be C-contiguous")
    if writable and mv.readonly:
        raise TypeError(f"{what}: buffer is read-only; pass a writable bytearray or numpy array")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _host_range(tensor: Tensor, buf: Any, offset: Any, op: str, arg: str, verb: str) -> memoryview:
    """Check a host buffer and byte offset against ``tensor`` for a transfer op."""
    _tensor_list([tensor], op)
    mv = _byte_view(buf, verb == "reading", f"{op} {arg}")
    if not isinstance(offset, (int, np.integer)) or offset < 0:
        raise ValueError(f"{op}: offset must be a non-negative int, got {offset!r}")
    if mv.nbytes == 0:
        raise ValueError(f"{op}: {arg} is empty")
    if offset + mv.nbytes > tensor.nbytes():
        raise ValueError(f"{op}: {verb} {mv.nbytes} bytes at offset {offset} overruns the {tensor.nbytes()}-byte tensor")
    return mv


class OpBase:
    """Base of all operations. Subclasses implement ``record(rec)``, recording through the
    Recorder (kbench.runtime.recorder) and the tensors' and algorithms' record_* methods, as
    Kompute's OpBase::record gets a command buffer; ``pre_eval``/``post_eval`` run on the host
    before submission and after the wait; ``accesses`` lists (tensor, writes) pairs."""

    def record(self, rec: "Recorder") -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def pre_eval(self, seq: "Sequence") -> None:
        pass

    #: whether after_submit / while_waiting do anything (the sequence calls them only then)
    streams = False

    def after_submit(self, seq: "Sequence") -> None:
        """Host work that overlaps the submitted GPU work (streamed uploads)."""

    def while_waiting(self, seq: "Sequence", fence_done) -> None:
        """Host work done in a blocking ``eval_await`` before the fence (streamed downloads)."""

    def post_eval(self, seq: "Sequence") -> None:
        pass

    def accesses(self) -> list[tuple[Tensor, bool]]:
        return []

    def objects(self) -> list:
        """The tensors and algorithms this op refers to (by default those of ``accesses()``, a
        ``tensors`` list and an ``algorithm`` attribute). The sequence refuses an op whose objects
        belong to another Manager, and refuses to submit once one of them was destroyed."""
        objs = [t for t, _ in self.accesses()]
        tensors = getattr(self, "tensors", None)
        if isinstance(tensors, list):
            objs.extend(tensors)
        algo = getattr(self, "algorithm", None)
        if algo is not None:
            objs.append(algo)
        return objs

    def release(self) -> None:
        """Give back transient resources (staging) when the sequence is cleared or destroyed."""


class _StagingOp(OpBase):
    streams = True
    _staging = None
    _transfer: StagedTransfer | None = None
    _staged: list = []
    _direct: list = []

    def _acquire(self, rec: "Recorder", nbytes: int):
        if self._staging is None or self._staging.size < nbytes:
            if self._staging is not None:
                st, self._staging = self._staging, None
                st.give_back()
            self._staging = rec.staging(nbytes)
        return self._staging

    def _record_transfer(self, rec: "Recorder", direction: str, ranges) -> None:
        """Record a staged copy of ``ranges`` (tensor, byte offset in it, bytes)."""
        if self._transfer is not None:
            self._transfer.destroy()
        self._transfer = StagedTransfer(rec.manager, direction, ranges)
        self._transfer.record(rec, self._acquire(rec, self._transfer.total))

    def _record_tensors(self, rec: "Recorder", direction: str, tensors: list) -> None:
        """Record whole-tensor copies: straight from/to the host memory of tensors the device
        imported (Manager.zero_copy_min_bytes), through staging for the rest."""
        self._direct, staged = [], []
        for t in tensors:
            imp = rec.host_import(t)
            if imp is None:
                staged.append(t)
                continue
            self._direct.append(t)
            if direction == "up":
                t.record_copy_from(rec, imp)
            else:
                t.record_copy_to(rec, imp)
        self._staged = staged
        if staged:
            self._record_transfer(rec, direction, [(t, 0, t.nbytes()) for t in staged])
        elif self._transfer is not None:
            tr, self._transfer = self._transfer, None
            tr.destroy()

    def _hosts(self) -> list[np.ndarray]:
        """Host side of each staged range, in the order they were recorded."""
        return [as_bytes(t.data()) for t in self._staged]

    def _tensors_used(self) -> list:
        return self._direct + self._staged

    def pre_eval(self, seq):
        for t in self._tensors_used():
            t._check()  # a destroyed tensor's buffers (and imported host memory) are gone: never submit
        if self._transfer is not None:
            self._transfer.before_submit(self._staging, self._hosts())

    def after_submit(self, seq):
        if self._transfer is not None:
            self._transfer.after_submit(self._staging, self._hosts())

    def while_waiting(self, seq, fence_done):
        if self._transfer is not None:
            self._transfer.while_waiting(self._staging, self._hosts(), fence_done)

    def post_eval(self, seq):
        if self._transfer is not None:
            self._transfer.after_wait(self._staging, self._hosts())

    def release(self) -> None:
        if self._transfer is not None:
            tr, self._transfer = self._transfer, None
            tr.destroy()
        if self._staging is not None:
            st, self._staging = self._staging, None
            st.give_back()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


class OpTensorSyncDevice(_StagingOp):
    """Copy host-side data of ``device`` tensors to the device (no-op for the other types).

    Large syncs are streamed: the GPU copies each chunk as soon as the host threads have put it
    into staging (kbench.runtime.transfer)."""

    def __init__(self, tensors: Seq[Tensor]):
        self.tensors = _tensor_list(tensors, "OpTensorSyncDevice")

    def _device_tensors(self):
        return [t for t in self.tensors if t.tensor_type() == TensorTypes.device]

    def accesses(self):
        return [(t, True) for t in self._device_tensors()]

    def record(self, rec):
        self._record_tensors(rec, "up", self._device_tensors())


class OpTensorSyncLocal(_StagingOp):
    """Make device results visible in ``tensor.data()`` after the sequence's wait.

    Large syncs are streamed: the host threads copy each chunk out of staging while the GPU
    copies the next (kbench.runtime.transfer)."""

    def __init__(self, tensors: Seq[Tensor]):
        self.tensors = _tensor_list(tensors, "OpTensorSyncLocal")

    def _device_tensors(self):
        return [t for t in self.tensors if t.tensor_type() == TensorTypes.device]

    def accesses(self):
        return [(t, False) for t in self.tensors if t.tensor_type() != TensorTypes.storage]

    def record(self, rec):
        self._record_tensors(rec, "down", self._device_tensors())
        rec.barrier(vk.VK_PIPELINE_STAGE_TRANSFER_BIT | vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                         vk.VK_PIPELINE_STAGE_HOST_BIT,
                         vk.VK_ACCESS_TRANSFER_WRITE_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT, vk.VK_ACCESS_HOST_READ_BIT)


class OpTensorCopy(OpBase):
    """Copy tensor 0 into every other tensor (same dtype and size); host views follow."""

    def __init__(self, tensors: Seq[Tensor]):
        self.tensors = _tensor_list(tensors, "OpTensorCopy", minimum=2)
        src = self.tensors[0]
        for i, t in enumerate(self.tensors[1:], 1):
            if t.dtype != src.dtype or t.size() != src.size():
                raise ValueError(f"OpTensorCopy: tensors[{i}] is {t.size()} x {t.dtype}, tensors[0] is "
                                 f"{src.size()} x {src.dtype}; they must match")
            if t is src:
                raise ValueError(f"OpTensorCopy: tensors[{i}] is the source tensor itself")

    def accesses(self):
        return [(self.tensors[0], False)] + [(t, True) for t in self.tensors[1:]]

    def record(self, rec):
        src = self.tensors[0]
        for t in self.tensors[1:]:
            t.record_copy_from(rec, src)

    def post_eval(self, seq):
        src = self.tensors[0]
        if src.tensor_type() == TensorTypes.storage:
            return
        data = src.data()
        for t in self.tensors[1:]:
            if t.tensor_type() == TensorTypes.device:
                np.copyto(t.data(), data)


class OpAlgoDispatch(OpBase):
    """Bind an algorithm and dispatch its grid; ``push_consts`` overrides its push constants."""

    def __init__(self, algorithm: Algorithm, push_consts: Any = None):
        if not isinstance(algorithm, Algorithm):
            raise TypeError(f"OpAlgoDispatch: expected an Algorithm, got {type(algorithm).__name__}")
        algorithm._check()
        self.algorithm = algorithm
        self.push = None
        if push_consts is not None:
            self.push = _as_constants(push_consts, "push_consts")
            self._push_bytes = check_push_constants(algorithm.shader_info, self.push, "OpAlgoDispatch")

    def accesses(self):
        info = self.algorithm.shader_info
        ro = info.readonly_bindings()
        out = []
        for i, t in enumerate(self.algorithm.get_tensors()):
            out.append((t, i not in ro))
        return out

    def record(self, rec):
        self.algorithm.record_dispatch(rec, self._push_bytes if self.push is not None else None)


class OpMult(OpAlgoDispatch):
    """Kompute's built-in elementwise multiply: tensors [a, b, out], out = a * b (float32)."""

    def __init__(self, tensors: Seq[Tensor], algorithm: Algorithm):
        tensors = _tensor_list(tensors, "OpMult")
        if len(tensors) != 3:
            raise ValueError(f"OpMult needs exactly 3 tensors [a, b, out], got {len(tensors)}")
        for i, t in enumerate(tensors):
            if t.dtype != np.float32:
                raise TypeError(f"OpMult works on float32 tensors; tensors[{i}] is {t.dtype}")
            if t.size() != tensors[2].size():
                raise ValueError(f"OpMult: tensors[{i}] has {t.size()} elements, out has {tensors[2].size()}")
        from .builtin import grid_1d, mult_spirv

        n = tensors[2].size()
        grid = grid_1d((n + 63) // 64, algorithm._mgr._props["max_work_group_count"][0])
        algorithm.rebuild(tensors, mult_spirv(), workgroup=grid,
                          push_consts=np.array([n], dtype=np.uint32))
        super().__init__(algorithm)


class OpMemoryBarrier(OpBase):
    """An explicit pipeline barrier over ``tensors`` (masks combine with ``|``).

    ``barrier_on_primary=True`` puts buffer barriers on the tensors' device buffers; False puts a
    global memory barrier, which also covers staging transfers (kbench has no permanent staging
    buffers to name)."""

    def __init__(self, tensors: Seq[Tensor], src_access_mask, dst_access_mask, src_stage_mask, dst_stage_mask,
                 barrier_on_primary: bool = True):
        self.tensors = _tensor_list(tensors, "OpMemoryBarrier")
        for name, v in (("src_access_mask", src_access_mask), ("dst_access_mask", dst_access_mask),
                        ("src_stage_mask", src_stage_mask), ("dst_stage_mask", dst_stage_mask)):
            if not isinstance(v, (int, np.integer)) or int(v) < 0:
                raise TypeError(f"OpMemoryBarrier: {name} must be a non-negative int mask, got {v!r}")
        if not int(src_stage_mask) or not int(dst_stage_mask):
            raise ValueError("OpMemoryBarrier: stage masks must not be empty")
        self.masks = (int(src_access_mask), int(dst_access_mask), int(src_stage_mask), int(dst_stage_mask))
        self.on_primary = bool(barrier_on_primary)

    def record(self, rec):
        sa, da, ss, ds = self.masks
        if self.on_primary:
            rec.buffer_barriers(self.tensors, ss, ds, sa, da)
        else:
            rec.barrier(ss, ds, sa, da)


class OpTensorCopyRegion(_StagingOp):
    """Copy ``size`` bytes from ``src`` at ``src_offset`` to ``dst`` at ``dst_offset``."""

    def __init__(self, src: Tensor, dst: Tensor, src_offset: int, dst_offset: int, size: int):
        _tensor_list([src, dst], "OpTensorCopyRegion")
        for name, v in (("src_offset", src_offset), ("dst_offset", dst_offset), ("size", size)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"OpTensorCopyRegion: {name} must be a non-negative int, got {v!r}")
        if size == 0:
            raise ValueError("OpTensorCopyRegion: size must be > 0")
        if src_offset + size > src.nbytes():
            raise ValueError(f"OpTensorCopyRegion: source range [{src_offset}, {src_offset + size}) is outside the "
                             f"{src.nbytes()}-byte source")
        if dst_offset + size > dst.nbytes():
            raise ValueError(f"OpTensorCopyRegion: destination range [{dst_offset}, {dst_offset + size}) is outside the "
                             f"{dst.nbytes()}-byte destination")
        self.src, self.dst = src, dst
        self.args = (int(src_offset), int(dst_offset), int(size))
        self.overlap = src is dst and src_offset < dst_offset + size and dst_offset < src_offset + size

    def accesses(self):
        return [(self.src, False), (self.dst, True)]

    def record(self, rec):
        so, do, n = self.args
        if not self.overlap:
            self.dst.record_copy_from(rec, self.src, n, so, do)
            return
        # vkCmdCopyBuffer forbids overlapping regions of one buffer: bounce through staging
        st = self._acquire(rec, n)
        self.src.record_copy_to(rec, st, n, so, 0)
        rec.barrier(vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                    vk.VK_ACCESS_TRANSFER_WRITE_BIT, vk.VK_ACCESS_TRANSFER_READ_BIT)
        self.dst.record_copy_from(rec, st, n, 0, do)


class OpTensorWrite(_StagingOp):
    """Write host bytes into ``tensor`` at byte ``offset`` (captured when the op is recorded)."""

    def __init__(self, tensor: Tensor, data: Any, offset: int = 0):
        mv = _host_range(tensor, data, offset, "OpTensorWrite", "data", "writing")
        self.tensor, self.data, self.offset = tensor, mv, int(offset)

    def accesses(self):
        return [(self.tensor, True)]

    def _tensors_used(self) -> list:
        return [self.tensor]

    def record(self, rec):
        if self.data is not None:  # first recording: capture the bytes (rerecord reuses them)
            self.nbytes = self.data.nbytes
            st = self._acquire(rec, self.nbytes)
            host_copy(mapped_bytes(st.ptr, self.nbytes), as_bytes(self.data))
            self.data = None  # do not keep the caller's buffer alive
        self.tensor.record_copy_from(rec, self._staging, self.nbytes, 0, self.offset)


class OpTensorRead(_StagingOp):
    """Read ``len(out)`` bytes of ``tensor`` from byte ``offset`` into ``out`` after the wait."""

    def __init__(self, tensor: Tensor, out: Any, offset: int = 0):
        mv = _host_range(tensor, out, offset, "OpTensorRead", "out", "reading")
        self.tensor, self.out, self.offset = tensor, mv, int(offset)

    def accesses(self):
        return [(self.tensor, False)]

    def record(self, rec):
        self._record_transfer(rec, "down", [(self.tensor, self.offset, self.out.nbytes)])
        rec.barrier(vk.VK_PIPELINE_STAGE_TRANSFER_BIT, vk.VK_PIPELINE_STAGE_HOST_BIT,
                         vk.VK_ACCESS_TRANSFER_WRITE_BIT, vk.VK_ACCESS_HOST_READ_BIT)

    def _hosts(self):
        return [as_bytes(self.out)]

    def _tensors_used(self) -> list:
        return [self.tensor]


class OpTensorFill(OpBase):
    """Fill a tensor (or a 4-byte aligned byte range of it) with a repeated uint32 ``value``."""

    def __init__(self, tensor: Tensor, value: int = 0, offset: int = 0, size: int | None = None):
        _tensor_list([tensor], "OpTensorFill")
        total = (tensor.nbytes() + 3) // 4 * 4
        size = total - offset if size is None else size
        if offset % 4 or size % 4 or offset < 0 or size <= 0 or offset + size > total:
            raise ValueError(f"OpTensorFill: range [{offset}, {offset + size}) must be 4-byte aligned and inside the "
                             f"{total}-byte buffer")
        if not 0 <= int(value) <= 0xFFFFFFFF:
            raise ValueError(f"OpTensorFill: value must fit in uint32, got {value}")
        self.tensor, self.value, self.offset, self.size = tensor, int(value), int(offset), int(size)

    def accesses(self):
        return [(self.tensor, True)]

    def record(self, rec):
        self.tensor.record_fill(rec, self.value, self.offset, self.size)
