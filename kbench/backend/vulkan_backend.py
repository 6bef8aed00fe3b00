"""VulkanBackend: every ComputeBackend op as compute shaders on kbench.runtime.

Ops are recorded into a ring of Sequences and submitted in batches (every ``batch_ops`` ops,
or when ``copy_from_device``/``synchronize`` needs the results), so the host records the next
batch while the device runs the previous ones; the runtime places the barriers between
dependent ops.  Pipelines are shared through the runtime's pipeline cache; each Algorithm
(one descriptor set) is cached per (kernel, buffers) in an LRU that only evicts entries no
submitted-but-unfinished batch uses, and a freed buffer's algorithms go with it.  Buffers
freed while a batch may still use them are destroyed once that batch has finished.  With the
quantized_matmul knob ``layout="packed"`` the backend also keeps a repacked copy of each weight
buffer, and where matmul_f16's coopmat2 kernel reads B transposed a transposed copy of B (each made
on the GPU on first use, remade once any other op has used the buffer, dropped with it).

:meth:`VulkanBackend.replay_gpu_ns` records the calls a benchmark issues into one command
buffer and submits it again and again: the device then runs the calls back to back (with the
same barriers between them), so kernels that take less time than Python needs to issue them are
timed at the clock a busy GPU runs at, not the idle clock of a GPU waiting for its host.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np

import kbench.runtime as kp
from kbench.backend.base import BufferHandle, ComputeBackend, DeviceInfo
from kbench.backend.kernels import (QMATVEC_DTYPES, ROPE_MAX_POS, Kernel, KernelPolicy, QMatmulCoopPlan, QMatvecKernel,
                                    describe_policy)
from kbench.quant import DType, row_bytes

__all__ = ["VulkanBackend"]

# Device buffers are padded to whole vec4s so that shaders may view every buffer as vec4[]
# without indexing past the bound range (the caller sees only the requested bytes).
_ALIGN = 16


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class _Slot:
    """One sequence of the ring and the batch it holds."""

    seq: Any
    serial: int = 0
    n_ops: int = 0
    submitted: bool = False


class ReplayTimes(NamedTuple):
    """Per timed run of :meth:`VulkanBackend.replay_gpu_ns`: GPU ns (first to last
    timestamp) and host wall ns (submit to wait returned, an independent check), and the
    ops one run holds."""

    gpu_ns: list[float]
    wall_ns: list[float]
    ops: int = 0


@dataclass
class _Capture:
    """Ops recorded into one sequence (never submitted by the ring) for replay_gpu_ns."""

    seq: Any
    n_ops: int = 0


#: most ops one replay_gpu_ns capture records (its sequence holds a timestamp after each op);
#: a longer issue() runs through the ring instead, and replay_gpu_ns returns None
CAPTURE_MAX_OPS = 8192


@dataclass
class _CachedAlgorithm:
    algo: Any
    keys: tuple[int, ...]
    last_serial: int = 0
    grid: tuple[int, int, int] = (1, 1, 1)  # the algorithm's current dispatch grid


@dataclass
class _DeviceBuffer:
    tensor: Any
    last_serial: int = 0
    algorithms: set = field(default_factory=set)  # cache keys that bind this buffer
    touches: int = 0  # ops recorded that use it (a derived copy is current while this stays put)


@dataclass
class _DerivedCopy:
    """A copy of a buffer made by a kernel (weights repacked by KernelPolicy.qmatvec_pack, B of
    matmul_f16 transposed by KernelPolicy.transpose16) and what it was made from."""

    key: int  # internal buffer
    what: tuple  # what the copy holds, e.g. ("packed", dtype, n_rows, n_cols)
    touches: int  # the source buffer's touches right after the copy was recorded
    nbytes: int


class VulkanBackend(ComputeBackend):
    """ComputeBackend on a Vulkan device through kbench.runtime.

    Options: ``batch_ops`` (ops per submission, default 64), ``ring_size`` (sequences in
    flight, default 3), ``algorithm_cache_size`` (cached descriptor sets, default 256),
    ``use_subgroups`` (None = when the device has subgroup arithmetic), ``matmul_tile``
    ((BM, BN, BK, TM, TN[, GROUP_M])), ``matmul_warp_n`` (matmul.comp's invocation layout; None: the
    policy's), ``matmul_f16_tile`` ((WG_M, WG_N, SG_M, SG_N, BK[, GROUP_M]),
    the KHR cooperative-matrix :meth:`matmul_f16`), ``matmul_f16_cm2_tile`` ((BM, BN, BK, THREADS[, GROUP_M[, UNROLL]]),
    its VK_NV_cooperative_matrix2 kernel), ``matmul_f16_path`` (None: KernelPolicy.MATMUL_F16_PATHS' order
    among the paths the device has; "coopmat2" or "khr" forces one), ``matmul_f16_cm2_b`` (None: the policy's;
    "rows" or "transposed": whether the coopmat2 kernel reads B after a transpose pass), ``single_group_limit`` (softmax/rms_norm sizes done by one
    workgroup), ``grid_limit`` (cap on the grid's x dimension; for tests of large grids),
    ``validation`` (Khronos validation layer), ``qmatvec`` (quantized_matmul kernel knobs, e.g.
    ``{"kernel": "fast", "lanes": 32, "rows": 4}``: see KernelPolicy.configure_qmatvec),
    ``attention_chunk`` (keys per workgroup of the fused :meth:`attention`; None: KernelPolicy.attention's
    choice from the device's properties), ``attention`` (its kernel knobs, e.g. ``{"kernel": "split"}``
    or ``{"lanes": 16, "unroll": 4}``: see KernelPolicy.configure_attention).
    """

    #: most ops one :meth:`replay_gpu_ns` records (a timer sizing its samples keeps under it)
    replay_max_ops = CAPTURE_MAX_OPS

    def __init__(self, device: int = 0, *, batch_ops: int = 64, ring_size: int = 3,
                 algorithm_cache_size: int = 256, use_subgroups: bool | None = None,
                 matmul_tile: tuple[int, ...] | None = None,
                 single_group_limit: int = 8192, grid_limit: int | None = None,
                 validation: bool | None = None,
                 matmul_f16_tile: tuple[int, ...] | None = None,
                 qmatvec: dict[str, Any] | None = None, attention_chunk: int | None = None,
                 matmul_warp_n: int | None = None,
                 attention: dict[str, Any] | None = None,
                 matmul_f16_cm2_tile: tuple[int, ...] | None = None, matmul_f16_path: str | None = None,
                 matmul_f16_cm2_b: str | None = None) -> None:
        for name, value, lo in (("batch_ops", batch_ops, 1), ("ring_size", ring_size, 1),
                                ("algorithm_cache_size", algorithm_cache_size, 16),
                                ("single_group_limit", single_group_limit, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ValueError(f"VulkanBackend: {name} must be an int >= {lo}, got {value!r}")
        if attention_chunk is not None and (isinstance(attention_chunk, bool) or not isinstance(attention_chunk, int)
                                            or attention_chunk < 1):
            raise ValueError(f"VulkanBackend: attention_chunk must be None or an int >= 1, got {attention_chunk!r}")
        super().__init__()
        self._attention_chunk = attention_chunk
        self._mgr = kp.Manager(device, validation=validation)
        try:
            self._props = self._mgr.get_device_properties()
            self._policy = KernelPolicy(self._props, use_subgroups=use_subgroups,
                                        matmul_tile=matmul_tile, single_group_limit=single_group_limit,
                                        grid_limit=grid_limit, matmul_f16_tile=matmul_f16_tile,
                                        matmul_warp_n=matmul_warp_n,
                                        matmul_f16_cm2_tile=matmul_f16_cm2_tile, matmul_f16_path=matmul_f16_path,
                                        matmul_f16_cm2_b=matmul_f16_cm2_b)
            if qmatvec:  # quantized_matmul kernel knobs: KernelPolicy.configure_qmatvec
                self._policy.configure_qmatvec(qmatvec)
            if attention:  # fused attention kernel knobs: KernelPolicy.configure_attention
                self._policy.configure_attention(attention)
            self._batch_ops = batch_ops
            self._cache_size = algorithm_cache_size
            # every batch records GPU timestamps (one per op, a few ns of GPU time each) so that
            # measure_gpu_ns can report device time without host overhead
            fam = self._mgr.queues[0][0]
            stamps = self._props["queue_families"][fam]["timestamp_valid_bits"] > 0
            self._ts_capacity = 2 * batch_ops + 8 if stamps else 0
            self._ring = [_Slot(self._mgr.sequence(total_timestamps=self._ts_capacity)) for _ in range(ring_size)]
        except BaseException:
            self._mgr.destroy()
            raise
        self._current = 0
        self._serial = 1  # serial of the batch being recorded
        self._completed = 0  # every batch with serial <= this has finished
        self._buffers: dict[int, _DeviceBuffer] = {}  # user handles > 0, internal buffers < 0
        self._internal_ids = itertools.count(-1, -1)
        self._algos: OrderedDict[tuple, _CachedAlgorithm] = OrderedDict()
        self._graveyard: list[tuple[int, Any]] = []  # (serial after which it may go, object)
        self._scratch_bufs: dict[str, tuple[int, int]] = {}  # kind -> (buffer key, bytes)
        self._rope_tables: OrderedDict[tuple[int, float], int] = OrderedDict()
        self._derived: OrderedDict[int, _DerivedCopy] = OrderedDict()  # source buffer id -> copy, LRU
        self._derived_bytes = 0
        self._submissions = 0
        self._dispatches = 0  # compute dispatches recorded (cache_stats; tests count an op's)
        self._timing: list[int | None] | None = None  # GPU ns per retired batch while measuring
        self._capture: _Capture | None = None  # while replay_gpu_ns records

    # -- identity ---------------------------------------------------------------------------------
    def name(self) -> str:
        return "vulkan"

    def device_info(self) -> DeviceInfo:
        heaps = self._props.get("memory_heaps", [])
        memory = sum(int(h["size"]) for h in heaps if h.get("device_local"))
        return DeviceInfo(str(self._props["device_name"]), "vulkan", memory, 0)

    def quantized_dtypes(self) -> frozenset[DType]:
        return frozenset(QMATVEC_DTYPES)

    @property
    def manager(self) -> "kp.Manager":
        """The kbench.runtime Manager this backend runs on."""
        return self._mgr

    @property
    def device_properties(self) -> dict[str, Any]:
        return dict(self._props)

    def kernel_policy(self) -> dict[str, Any]:
        """Launch-shape choices for this device (workgroup size, matmul tile, subgroups)."""
        return describe_policy(self._policy)

    def cache_stats(self) -> dict[str, int]:
        """Sizes of the backend's caches plus the runtime's live object counts."""
        stats = {
            "cached_algorithms": len(self._algos),
            "buffers": len(self._buffers),
            "graveyard": len(self._graveyard),
            "rope_tables": len(self._rope_tables),
            "derived_copies": len(self._derived),
            "derived_bytes": self._derived_bytes,
            "submissions": self._submissions,
            "dispatches": self._dispatches,
        }
        stats.update({f"runtime_{k}": v for k, v in self._mgr.get_stats().items()})
        return stats

    # -- memory -----------------------------------------------------------------------------------
    def _allocate(self, handle: BufferHandle) -> None:
        # refused before anything is allocated: a size no memory holds (OutOfDeviceMemoryError),
        # then one no kernel could bind (every op binds whole buffers)
        self._mgr.check_allocation(_padded(handle.size_bytes))
        limit = int(self._props["max_storage_buffer_range"])
        if handle.size_bytes > limit:
            raise ValueError(f"allocate: {handle.size_bytes} bytes is more than the device's maxStorageBufferRange "
                             f"({limit} bytes), the largest buffer a kernel can bind")
        tensor = self._mgr.buffer(_padded(handle.size_bytes))
        self._buffers[handle.id] = _DeviceBuffer(tensor)

    def _free(self, handle: BufferHandle) -> None:
        self._drop_derived(handle.id)
        self._drop_buffer(handle.id)

    def _close(self) -> None:
        try:
            self._flush_and_wait()
        finally:
            for key in list(self._buffers):
                self._drop_buffer(key)
            self._bury_done(force=True)
            self._mgr.destroy()

    def _copy_to_device(self, data: memoryview, handle: BufferHandle) -> None:
        self._record(kp.OpTensorWrite(self._tensor(handle.id), data, 0), (handle.id,))

    def _copy_from_device(self, handle: BufferHandle, data: memoryview) -> None:
        self._record(kp.OpTensorRead(self._tensor(handle.id), data, 0), (handle.id,), flush_ok=False)
        self._flush_and_wait()

    def _copy_buffer(self, src: BufferHandle, dst: BufferHandle, size: int) -> None:
        self._copy_buffer_offset(src, dst, 0, 0, size)

    def _copy_buffer_offset(self, src: BufferHandle, dst: BufferHandle, src_offset: int,
                            dst_offset: int, size: int) -> None:
        src_t, dst_t = self._tensor(src.id), self._tensor(dst.id)
        unit = next((u for u in (16, 4) if not (src_offset | dst_offset | size) % u), 0)
        bindable = max(src_t.nbytes(), dst_t.nbytes()) <= self._props["max_storage_buffer_range"]
        if unit and bindable and size // unit <= 0xFFFFFFFF:
            # aligned copies run as a shader: full bandwidth where vkCmdCopyBuffer is slower
            kernel = self._policy.copy(unit)
            count = size // unit
            grid = self._policy.grid_1d(_ceil_div(count, self._policy.wg))
            push = kernel.push_record(src_offset // unit, dst_offset // unit, count)
            self._dispatch(kernel, (src.id, dst.id), grid, push)
            return
        op = kp.OpTensorCopyRegion(src_t, dst_t, src_offset, dst_offset, size)
        self._record(op, (src.id, dst.id))

    def _synchronize(self) -> None:
        self._flush_and_wait()

    # -- compute ops ----------------------------------------------------------------------------
    def _matmul(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        pol = self._policy
        kernel = pol.matmul(pol.matmul_path(m, n, k))
        grid = pol.matmul_grid(m, n)
        self._dispatch(kernel, (a.id, b.id, out.id), grid, kernel.push_record(m, n, k))

    def matmul_f16(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        """``out[m,n] = A[m,k] @ B[k,n]`` with A, B float16 and out float32 (row-major), on
        cooperative matrices (fp32 accumulation): VK_KHR_cooperative_matrix or
        VK_NV_cooperative_matrix2, chosen from the device's properties (KernelPolicy.matmul_f16_plan). Raises
        kp.UnsupportedFeatureError, before any GPU work, on devices with neither."""
        from kbench.backend.base import check_matmul_f16

        ha, hb, ho, m, n, k = check_matmul_f16(self, a, b, out, m, n, k)
        self._matmul_f16(ha, hb, ho, m, n, k)

    def matmul_bf16(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        """:meth:`matmul_f16` with A and B bfloat16 (16-bit patterns); the device needs
        VK_KHR_shader_bfloat16's cooperative matrices besides."""
        from kbench.backend.base import check_matmul_f16

        ha, hb, ho, m, n, k = check_matmul_f16(self, a, b, out, m, n, k, op="matmul_bf16")
        self._matmul_f16(ha, hb, ho, m, n, k, "bf16")

    def _matmul_f16(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int,
                    dtype: str = "f16") -> None:
        pol = self._policy
        kernel, grid = pol.matmul_f16_plan(m, n, k, dtype)  # UnsupportedFeatureError first
        b_key = b.id
        if pol.matmul_f16_b_transposed(dtype):
            # B^T is kept like repacked weights: made once, remade after any other op used B's buffer
            b_key = self._derived_copy(b.id, ("transposed", k, n), 2 * n * k,
                                       lambda src, dst: self._transpose16(src, dst, k, n))
        self._dispatch(kernel, (a.id, b_key, out.id), grid, kernel.push_record(m, n, k))

    def _transpose16(self, src: int, dst: int, rows: int, cols: int) -> None:
        """Write the transpose of the rows x cols matrix of 16-bit elements in buffer ``src`` to
        buffer ``dst`` (cols rows of rows elements; shaders/transpose16.comp)."""
        kernel, grid = self._policy.transpose16(rows, cols)
        self._dispatch(kernel, (src, dst), grid, kernel.push_record(rows, cols))

    def _softmax(self, input: BufferHandle, output: BufferHandle, size: int) -> None:
        self._reduce_op("softmax", (input.id,), output.id, size, ())

    def _rms_norm(self, input: BufferHandle, weight: BufferHandle, output: BufferHandle, size: int,
                  eps: float) -> None:
        self._reduce_op("rms_norm", (input.id, weight.id), output.id, size, (np.float32(eps),))

    def _reduce_op(self, op: str, inputs: tuple[int, ...], out: int, size: int, extra: tuple) -> None:
        pol = self._policy
        plan = pol.reduction_plan(size)
        if plan.single:
            k = pol.reduction(op, "small")
            self._dispatch(k, inputs + (out,), (1, 1, 1), k.push_record(size, size, 1, *extra))
            return
        # scratch layout (see shaders/softmax.comp): counter, pad, total[2], then per part
        # (max, sum) for softmax or (max |x|, scaled sum of squares) for rms_norm; its own buffer,
        # because the counter must stay zero between calls and other ops' scratch would overwrite it
        per_part = 2
        scratch = self._scratch(4 * (4 + per_part * plan.n_parts), "reduction")
        k = pol.reduction(op, "partial")
        push = k.push_record(size, plan.chunk, plan.n_parts, *extra)
        self._dispatch(k, (inputs[0], scratch), pol.grid_1d(plan.n_parts), push)
        k = pol.reduction(op, "normalize")
        self._dispatch(k, inputs + (out, scratch), pol.grid_1d(pol.vec4_groups(size)), push)

    def _rope(self, q: BufferHandle, k: BufferHandle, pos: int, head_dim: int, freq_base: float,
              n_heads_q: int, n_heads_k: int) -> None:
        if pos > ROPE_MAX_POS:
            raise ValueError(f"rope: pos={pos} is beyond the Vulkan kernel's range (pos <= {ROPE_MAX_POS})")
        half = head_dim // 2
        nq_pairs = n_heads_q * half
        total = nq_pairs + n_heads_k * half
        table = self._rope_table(head_dim, freq_base)
        kernel = self._policy.rope()
        grid = self._policy.grid_1d(_ceil_div(total, self._policy.wg))
        self._dispatch(kernel, (q.id, k.id, table), grid, kernel.push_record(pos, half, nq_pairs, total))

    def _silu(self, input: BufferHandle, output: BufferHandle, size: int) -> None:
        self._elementwise("silu", (input.id, output.id), size)

    def _element_mul(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        self._elementwise("mul", (a.id, b.id, output.id), size)

    def _add(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        self._elementwise("add", (a.id, b.id, output.id), size)

    def _elementwise(self, op: str, keys: tuple[int, ...], size: int) -> None:
        kernel = self._policy.elementwise(op)
        grid = self._policy.grid_1d(self._policy.vec4_groups(size))
        self._dispatch(kernel, keys, grid, kernel.push_record(size))

    def _attn_score(self, q: BufferHandle, k_cache: BufferHandle, scores: BufferHandle, head_dim: int,
                    seq_len: int, head_offset: int, kv_offset: int, kv_stride: int) -> None:
        kernel = self._policy.attn_score(head_dim)
        rows_per_group = kernel.spec[0] // kernel.spec[1]
        grid = self._policy.grid_1d(_ceil_div(seq_len, rows_per_group))
        scale = np.float32(1.0 / math.sqrt(head_dim))
        push = kernel.push_record(head_dim, seq_len, head_offset, kv_offset, kv_stride, scale)
        self._dispatch(kernel, (q.id, k_cache.id, scores.id), grid, push)

    def _attn_value(self, weights: BufferHandle, v_cache: BufferHandle, output: BufferHandle, head_dim: int,
                    seq_len: int, kv_offset: int, kv_stride: int, out_offset: int) -> None:
        plan = self._policy.attn_value(head_dim, seq_len)
        kernel = plan.kernel
        grid = (_ceil_div(head_dim, kernel.spec[0]), plan.n_chunks, 1)
        if plan.n_chunks == 1:
            push = kernel.push_record(head_dim, seq_len, kv_offset, kv_stride, plan.chunk, out_offset, 0)
            self._dispatch(kernel, (weights.id, v_cache.id, output.id), grid, push)
            return
        scratch = self._scratch(4 * plan.n_chunks * head_dim)
        push = kernel.push_record(head_dim, seq_len, kv_offset, kv_stride, plan.chunk, 0, head_dim)
        self._dispatch(kernel, (weights.id, v_cache.id, scratch), grid, push)
        combine = self._policy.attn_combine()
        grid = self._policy.grid_1d(_ceil_div(head_dim, self._policy.wg))
        self._dispatch(combine, (scratch, output.id), grid, combine.push_record(head_dim, plan.n_chunks, out_offset))

    def attention(self, q: BufferHandle, k_cache: BufferHandle, v_cache: BufferHandle, out: BufferHandle,
                  head_dim: int, seq_len: int, n_heads: int, n_kv_heads: int) -> None:
        """Fused decode attention over every head (see backend.base.check_attention) in two
        dispatches: per (chunk of keys, kv head, block of its query heads) the chunk's scores,
        maximum, sum of exp and exp-weighted V rows; then one combine per head.  fp32 throughout."""
        from kbench.backend.base import check_attention

        self._attention(*check_attention(self, q, k_cache, v_cache, out, head_dim, seq_len, n_heads, n_kv_heads))

    def _attention(self, q: BufferHandle, k_cache: BufferHandle, v_cache: BufferHandle, out: BufferHandle,
                   head_dim: int, seq_len: int, n_heads: int, n_kv_heads: int, combine: bool = True) -> None:
        """``combine=False``: the partial pass alone (``kbench probe attention`` times it; out is not written)."""
        plan = self._policy.attention(head_dim, seq_len, n_heads, n_kv_heads, self._attention_chunk)
        scratch = self._scratch(4 * plan.scratch_floats, "attention")
        push = plan.partial_push(seq_len, n_heads // n_kv_heads, n_kv_heads * head_dim, 1.0 / math.sqrt(head_dim))
        self._dispatch(plan.partial, (q.id, k_cache.id, v_cache.id, scratch), plan.partial_grid, push)
        if not combine:
            return
        comb = plan.combine
        self._dispatch(comb, (scratch, out.id), plan.combine_grid, comb.push_record(plan.n_chunks, plan.ml_off))

    def _quantized_matmul(self, weights: BufferHandle, input: BufferHandle, output: BufferHandle,
                          n_rows: int, n_cols: int, dtype: DType) -> None:
        self._quantized_matmul_vecs(weights, input, output, n_rows, n_cols, dtype, 1)

    def _quantized_matmul_vecs(self, weights: BufferHandle, input: BufferHandle, output: BufferHandle,
                               n_rows: int, n_cols: int, dtype: DType, n_vecs: int) -> None:
        rb = row_bytes(dtype, n_cols)
        if n_rows * rb > 0xFFFFFFFF:
            raise ValueError(f"quantized_matmul: {n_rows} rows of {rb} bytes exceed the kernel's 4 GiB byte offsets")
        coop = self._policy.qmatmul_coop(dtype, n_cols, n_rows, n_vecs)
        if coop is not None:
            self._qmatmul_coop_dispatch(coop, weights, input, output, n_rows, n_cols, dtype, n_vecs)
            return
        kernel = self._policy.qmatvec(dtype, n_cols, n_rows, n_vecs)
        if kernel.vectors != n_vecs:  # a GGUF kernel takes one vector
            self._each_vector(lambda xs, ys: self._qmatvec_dispatch(kernel, weights, xs, ys, n_rows, n_cols, dtype),
                              input, output, n_rows, n_cols, n_vecs)
            return
        self._qmatvec_dispatch(kernel, weights, input, output, n_rows, n_cols, dtype)

    def _each_vector(self, product: Callable[[BufferHandle, BufferHandle], None], input: BufferHandle,
                     output: BufferHandle, n_rows: int, n_cols: int, n_vecs: int) -> None:
        """A batch of n_vecs products by a kernel that takes one vector: ``product(x, y)`` on scratch
        copies of each vector's x and y."""
        xs = BufferHandle(self._scratch(4 * n_cols, "qmatvec_xv"), 4 * n_cols)
        ys = BufferHandle(self._scratch(4 * n_rows, "qmatvec_yv"), 4 * n_rows)
        for v in range(n_vecs):
            self._copy_buffer_offset(input, xs, 4 * v * n_cols, 0, 4 * n_cols)
            product(xs, ys)
            self._copy_buffer_offset(ys, output, 0, 4 * v * n_rows, 4 * n_rows)

    def _qmatvec_dispatch(self, kernel: QMatvecKernel, weights: BufferHandle, input: BufferHandle,
                          output: BufferHandle, n_rows: int, n_cols: int, dtype: DType) -> None:
        grid = self._policy.grid_1d(kernel.groups(n_rows))
        w, x = weights.id, input.id
        if kernel.packed:
            w = self._packed_weights(weights, dtype, n_rows, n_cols, kernel.packed_bytes)
        if kernel.uses_xq:
            xq_kernel = self._policy.qmatvec_xq()
            elems = kernel.vectors * n_cols  # every vector quantized as one long x
            x = self._scratch(kernel.xq_bytes, "qmatvec_x")
            self._dispatch(xq_kernel, (input.id, x), self._policy.grid_1d(_ceil_div(elems // 4, xq_kernel.spec[0])),
                           xq_kernel.push_record(elems))
        push = kernel.push_record(n_rows, n_cols, row_bytes(dtype, n_cols))
        if kernel.splits == 1:
            self._dispatch(kernel, (w, x, output.id), grid, push)
            return
        n = kernel.vectors * n_rows
        part = self._scratch(4 * kernel.splits * n, "qmatvec_part")
        if kernel.split_last:  # a count per row group, zero between calls (a new scratch buffer is zero-filled)
            arrivals = self._scratch(4 * _ceil_div(n_rows, kernel.rows), "qmatvec_arrivals")
            self._dispatch(kernel, (w, x, part, output.id, arrivals), grid[:2] + (kernel.splits,), push)
            return
        self._dispatch(kernel, (w, x, part), grid[:2] + (kernel.splits,), push)
        self._split_sum(part, output, n, kernel.splits)

    def _split_sum(self, part: int, output: BufferHandle, n: int, splits: int) -> None:
        """y[i] = the sum of the ``splits`` partial sums part[s * n + i] (a split quantized matmul's second dispatch)."""
        total = self._policy.split_sum()
        self._dispatch(total, (part, output.id), self._policy.grid_1d(_ceil_div(n, total.spec[0])),
                       total.push_record(n, splits))

    def _qmatmul_coop_dispatch(self, plan: QMatmulCoopPlan, weights: BufferHandle, input: BufferHandle,
                               output: BufferHandle, n_rows: int, n_cols: int, dtype: DType, n_vecs: int) -> None:
        """x as the B operand, the product on cooperative matrices, then the splits' sum (shaders/qmatmul_coop*.comp)."""
        w = self._packed_weights(weights, dtype, n_rows, n_cols, plan.packed_bytes)
        xb = self._scratch(plan.b_bytes, "qmatmul_coop_b")
        prep = plan.prep
        self._dispatch(prep, (input.id, xb), (_ceil_div(plan.kp8, prep.spec[0]), n_vecs, 1),
                       prep.push_record(n_cols, plan.kp8, n_vecs, plan.scales_at, plan.sums_at))
        push = plan.main.push_record(n_rows, n_cols, plan.bps, plan.kp8)
        if plan.splits == 1:
            self._dispatch(plan.main, (w, xb, output.id), plan.grid(n_rows), push)
            return
        n = n_vecs * n_rows
        part = self._scratch(4 * plan.splits * n, "qmatmul_coop_part")
        self._dispatch(plan.main, (w, xb, part), plan.grid(n_rows), push)
        self._split_sum(part, output, n, plan.splits)

    #: device memory the derived copies (repacked weights, B transposed) may hold; beyond it the least
    #: recently used copies go (and are made again on their next use)
    DERIVED_CACHE_BYTES = 8 << 30

    def _packed_weights(self, weights: BufferHandle, dtype: DType, n_rows: int, n_cols: int, nbytes: int) -> int:
        """The repacked copy of ``weights`` (its internal buffer key) for qmatvec layout "packed"."""
        kernel = self._policy.qmatvec_pack(dtype)
        n_blocks = n_rows * (n_cols // dtype.block_elems)
        grid = self._policy.grid_1d(_ceil_div(_ceil_div(n_blocks, 2), kernel.spec[0]))
        return self._derived_copy(weights.id, ("packed", dtype, n_rows, n_cols), nbytes,
                                  lambda src, dst: self._dispatch(kernel, (src, dst), grid, kernel.push_record(n_blocks)))

    def _derived_copy(self, source: int, what: tuple, nbytes: int, make: Callable[[int, int], None]) -> int:
        """The internal copy of buffer ``source`` that ``make(source, copy)`` records (its key),
        made now where there is none holding ``what``, or the buffer was used by any other op
        since (a write may have changed it)."""
        src = self._buffers[source]
        found = self._derived.get(source)
        if found is not None and found.what == what and found.touches == src.touches:
            self._derived.move_to_end(source)
            return found.key
        self._drop_derived(source)
        key = self._new_internal(nbytes)
        try:
            make(source, key)  # a kernel's refusal (its limits) comes before it records anything
        except BaseException:
            self._drop_buffer(key)
            raise
        self._derived[source] = _DerivedCopy(key, what, src.touches, nbytes)
        self._derived_bytes += nbytes
        while self._derived_bytes > self.DERIVED_CACHE_BYTES and len(self._derived) > 1:
            self._drop_derived(next(iter(self._derived)))
        return key

    def _drop_derived(self, source: int) -> None:
        found = self._derived.pop(source, None)
        if found is not None:
            self._derived_bytes -= found.nbytes
            self._drop_buffer(found.key)

    # -- internal buffers ---------------------------------------------------------------------------
    def _tensor(self, key: int) -> Any:
        return self._buffers[key].tensor

    def _new_internal(self, nbytes: int) -> int:
        key = next(self._internal_ids)
        self._buffers[key] = _DeviceBuffer(self._mgr.buffer(_padded(nbytes)))
        return key

    def _scratch(self, nbytes: int, kind: str = "partials") -> int:
        """The scratch buffer of ``kind`` for multi-pass ops, grown to at least nbytes (a new
        buffer starts zero-filled)."""
        key, have = self._scratch_bufs.get(kind, (None, 0))
        if key is None or nbytes > have:
            if key is not None:
                self._drop_buffer(key)
            size = max(_padded(nbytes), 2 * have, 64 << 10)
            key = self._new_internal(size)
            self._scratch_bufs[kind] = (key, size)
        return key

    def _rope_table(self, head_dim: int, freq_base: float) -> int:
        """Device buffer of (g0, g1, g2, 0) per pair, g = freq_base^(-2i/head_dim) / 2pi split so
        that g0 and g1 carry 12 significant bits each (see shaders/rope.comp)."""
        key = (head_dim, float(freq_base))
        found = self._rope_tables.get(key)
        if found is not None:
            self._rope_tables.move_to_end(key)
            return found
        half = head_dim // 2
        i = np.arange(half, dtype=np.float64)
        g = np.power(float(freq_base), -2.0 * i / head_dim) / (2.0 * math.pi)
        g0 = _top_bits(g, 12)
        g1 = _top_bits(g - g0, 12)
        g2 = (g - g0 - g1).astype(np.float32)
        table = np.zeros((half, 4), np.float32)
        table[:, 0], table[:, 1], table[:, 2] = g0, g1, g2
        buf = self._new_internal(table.nbytes)
        self._record(kp.OpTensorWrite(self._tensor(buf), table.tobytes(), 0), (buf,))
        self._rope_tables[key] = buf
        while len(self._rope_tables) > 8:
            _, old = self._rope_tables.popitem(last=False)
            self._drop_buffer(old)
        return buf

    def _drop_buffer(self, key: int) -> None:
        """Forget a buffer and its cached algorithms; destroy them once no batch can use them."""
        entry = self._buffers.pop(key)
        for akey in list(entry.algorithms):
            cached = self._algos.pop(akey, None)
            if cached is not None:
                self._unlink(akey, cached, skip=key)
                self._bury(cached.last_serial, cached.algo)
        self._bury(entry.last_serial, entry.tensor)

    def _unlink(self, akey: tuple, cached: _CachedAlgorithm, skip: int | None = None) -> None:
        for k in cached.keys:
            if k != skip and k in self._buffers:
                self._buffers[k].algorithms.discard(akey)

    def _bury(self, serial: int, obj: Any) -> None:
        if serial <= self._completed:
            obj.destroy()
        else:
            self._graveyard.append((serial, obj))

    def _bury_done(self, force: bool = False) -> None:
        keep = []
        for serial, obj in self._graveyard:
            if force or serial <= self._completed:
                obj.destroy()
            else:
                keep.append((serial, obj))
        self._graveyard = keep

    # -- algorithms -------------------------------------------------------------------------------
    def _algorithm(self, kernel: Kernel, keys: tuple[int, ...]) -> _CachedAlgorithm:
        akey = (kernel.spv, kernel.spec, keys)
        cached = self._algos.get(akey)
        if cached is not None:
            self._algos.move_to_end(akey)
            return cached
        self._evict(self._cache_size - 1)
        tensors = [self._tensor(k) for k in keys]
        algo = self._mgr.algorithm(tensors, kernel.spirv(), (1, 1, 1), np.asarray(kernel.spec, np.uint32), None)
        cached = _CachedAlgorithm(algo, keys)
        self._algos[akey] = cached
        for k in keys:
            self._buffers[k].algorithms.add(akey)
        return cached

    def _evict(self, limit: int) -> None:
        """Shrink the cache to ``limit`` entries, oldest first, never one a pending batch uses.
        When every entry is still in flight, wait for the oldest batch (submitting the one being
        recorded only as a last resort) and try again."""
        while len(self._algos) > limit:
            for akey in list(self._algos):
                if len(self._algos) <= limit:
                    return
                cached = self._algos[akey]
                if cached.last_serial <= self._completed:
                    del self._algos[akey]
                    self._unlink(akey, cached)
                    cached.algo.destroy()
            if len(self._algos) <= limit:
                return
            pending = [s.serial for s in self._ring if s.submitted]
            if pending:
                self._retire_through(min(pending))
            else:
                self._flush_and_wait()

    # -- batching ---------------------------------------------------------------------------------
    def _dispatch(self, kernel: Kernel, keys: tuple[int, ...], grid: tuple[int, int, int],
                  push: np.ndarray) -> None:
        cached = self._algorithm(kernel, keys)
        if cached.grid != grid:
            cached.algo.set_workgroup(grid)
            cached.grid = grid
        op = kp.OpAlgoDispatch(cached.algo, push)
        cached.last_serial = self._serial
        self._record(op, keys)
        self._dispatches += 1

    def _record(self, op: Any, keys: Iterable[int], flush_ok: bool = True) -> None:
        cap = self._capture
        if cap is not None:
            if getattr(op, "streams", False) or cap.n_ops >= CAPTURE_MAX_OPS:
                # host work around the submission (streamed transfers) cannot be replayed
                self._spill_capture()
            else:
                cap.seq.record(op)
                cap.n_ops += 1
                self._mark_used(keys)
                return
        slot = self._ring[self._current]
        if slot.submitted:
            self._retire_through(slot.serial)
        slot.seq.record(op)
        slot.serial = self._serial
        slot.n_ops += 1
        self._mark_used(keys)
        if flush_ok and slot.n_ops >= self._batch_ops:
            self._submit()

    def _mark_used(self, keys: Iterable[int]) -> None:
        """The buffers an op just recorded uses: kept until its batch finishes; packed copies stale."""
        for k in keys:
            buf = self._buffers[k]
            buf.last_serial = self._serial
            buf.touches += 1

    def _submit(self) -> None:
        """Submit the batch being recorded (if any) and move to the next ring slot."""
        if self._capture is not None:
            self._spill_capture()  # the caller needs the results now: run what was captured
        slot = self._ring[self._current]
        if slot.submitted or slot.n_ops == 0:
            return  # nothing recorded since the ring came round to a slot still in flight
        slot.seq.eval_async()
        slot.submitted = True
        self._submissions += 1
        self._serial += 1
        self._current = (self._current + 1) % len(self._ring)

    def _retire_through(self, serial: int) -> None:
        """Wait for every submitted batch up to ``serial``, oldest first, and recycle its slot."""
        for slot in sorted((s for s in self._ring if s.submitted), key=lambda s: s.serial):
            if slot.serial > serial:
                break
            slot.seq.eval_await()
            if self._timing is not None:
                ts = slot.seq.get_timestamps()
                # a batch longer than the timestamp capacity has no end stamp: its time is unknown
                self._timing.append(ts[-1] - ts[0] if len(ts) == slot.n_ops + 1 and len(ts) >= 2 else None)
            slot.seq.clear()  # releases staging memory and op references
            slot.submitted = False
            slot.n_ops = 0
            self._completed = max(self._completed, slot.serial)
        self._bury_done()

    def measure_gpu_ns(self, issue: Callable[[], None]) -> float | None:
        """Run ``issue()`` (which calls backend ops) and return the GPU time its batches took,
        from sequence timestamps (the sum over batches of last minus first stamp), or None when
        the device has no timestamps. Earlier work is finished first and not counted."""
        self._check_open("measure_gpu_ns")
        self._flush_and_wait()
        self._timing = []
        try:
            issue()
            self._flush_and_wait()
            spans = self._timing
        finally:
            self._timing = None
        if not spans or any(x is None for x in spans):
            return None
        return float(sum(spans))

    def replay_gpu_ns(self, issue: Callable[[], None], runs: int, *,
                      warm_until: Callable[[], bool] | None = None, warm_max_s: float = 0.0,
                      after_run: Callable[[], None] | None = None) -> ReplayTimes | None:
        """Record the ops ``issue()`` makes into one command buffer, then submit it
        ``runs`` times and return the GPU ns of each (its first to last timestamp) and the
        host wall time of each submission (to its wait's return).

        Before the timed runs it is submitted while ``warm_until()`` is False, for at most
        ``warm_max_s`` seconds (to bring the GPU to its boost clock); ``after_run()`` is called
        after each timed run (e.g. to read the clock it ran at).  Each run repeats the same
        work, so the calls must be safe to run again (benchmarks are).  Returns None, with
        every op issued still run once and in order, when ``issue()`` needed results on the
        host midway (a read, synchronize, a streamed transfer), recorded more than
        CAPTURE_MAX_OPS ops, or the device has no timestamps."""
        self._check_open("replay_gpu_ns")
        if isinstance(runs, bool) or not isinstance(runs, int) or runs < 1:
            raise ValueError(f"replay_gpu_ns: runs must be an int >= 1, got {runs!r}")
        if not self._ts_capacity:
            return None
        self._flush_and_wait()
        cap = _Capture(self._mgr.sequence(total_timestamps=CAPTURE_MAX_OPS + 1))
        self._capture = cap
        try:
            issue()
        except BaseException:
            if self._capture is cap:
                self._spill_capture()  # what was issued before the error still runs
            raise
        if self._capture is not cap:
            return None  # spilled: issue() needed the host; its work has run
        self._capture = None
        out = ReplayTimes([], [], cap.n_ops)
        try:
            if cap.n_ops == 0:
                return None
            def run() -> None:
                cap.seq.eval()
                self._submissions += 1

            t0 = time.perf_counter()
            run()  # at least once untimed: first touches, lazy driver work
            while warm_until is not None and not warm_until() and time.perf_counter() - t0 < warm_max_s:
                run()
            for _ in range(runs):
                t1 = time.perf_counter_ns()
                run()
                wall = time.perf_counter_ns() - t1
                ts = cap.seq.get_timestamps()
                if after_run is not None:
                    after_run()
                if len(ts) != cap.n_ops + 1:
                    return None
                out.gpu_ns.append(float(ts[-1] - ts[0]))
                out.wall_ns.append(float(wall))
        finally:
            self._end_capture(cap)
        return out

    def _spill_capture(self) -> None:
        """Stop capturing: run the captured ops once, now, as an ordinary batch would."""
        cap, self._capture = self._capture, None
        try:
            if cap.n_ops:
                cap.seq.eval()
                self._submissions += 1
        finally:
            self._end_capture(cap)

    def _end_capture(self, cap: _Capture) -> None:
        # the capture ran as batch `serial` (nothing else used that serial): it is complete,
        # and what was buried under it may go; the ring records on under the next serial
        cap.seq.destroy()
        self._completed = max(self._completed, self._serial)
        self._serial += 1
        self._bury_done()

    def _flush_and_wait(self) -> None:
        self._submit()
        self._retire_through(self._serial)


def _top_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """``values`` (positive float64) truncated to their ``bits`` most significant bits."""
    mant, exp = np.frexp(values)
    return np.ldexp(np.floor(mant * (1 << bits)), exp - bits)
