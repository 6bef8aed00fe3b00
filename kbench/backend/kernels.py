"""The Vulkan kernel table: which shipped SPIR-V runs each op, with which local sizes.

Every shader in ``shaders/`` takes its local size from specialization constant 0 (and 1 for a
second dimension), so one SPIR-V serves every device; :class:`KernelPolicy` picks the sizes,
tile shapes and work splits from the device's properties (max invocations, shared memory,
subgroup support, grid limits).  The push-constant layouts here mirror the shaders' blocks
member by member.  Nothing here touches a device.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from kbench.quant import DType
from kbench.shaders import load_spirv


def _push(*fields: tuple[str, str]) -> np.dtype:
    return np.dtype([(name, {"u": "<u4", "f": "<f4"}[kind]) for name, kind in fields])


# push-constant blocks (field order and types match the shaders)
PUSH_ELEMENTWISE = _push(("size", "u"))
PUSH_SOFTMAX = _push(("size", "u"), ("chunk", "u"), ("n_parts", "u"))
PUSH_RMS_NORM = _push(("size", "u"), ("chunk", "u"), ("n_parts", "u"), ("eps", "f"))
PUSH_MATMUL = _push(("m", "u"), ("n", "u"), ("k", "u"))
PUSH_ROPE = _push(("pos", "u"), ("half_dim", "u"), ("nq_pairs", "u"), ("total_pairs", "u"))
PUSH_ATTN_SCORE = _push(("head_dim", "u"), ("seq_len", "u"), ("head_off", "u"), ("kv_off", "u"),
                        ("kv_stride", "u"), ("scale", "f"))
PUSH_ATTN_VALUE = _push(("head_dim", "u"), ("seq_len", "u"), ("kv_off", "u"), ("kv_stride", "u"),
                        ("chunk", "u"), ("dst_off", "u"), ("dst_chunk_stride", "u"))
PUSH_ATTN_COMBINE = _push(("head_dim", "u"), ("n_chunks", "u"), ("out_off", "u"))
PUSH_ATTENTION = _push(("seq_len", "u"), ("group", "u"), ("kv_stride", "u"), ("n_chunks", "u"), ("ml_off", "u"),
                       ("head_blocks", "u"), ("scale", "f"))
PUSH_ATTENTION_STREAM = _push(("seq_len", "u"), ("group", "u"), ("kv_stride", "u"), ("n_chunks", "u"),
                              ("ml_off", "u"), ("head_blocks", "u"), ("chunk", "u"), ("scale", "f"))
PUSH_ATTENTION_COMBINE = _push(("n_chunks", "u"), ("ml_off", "u"))
PUSH_QMATVEC = _push(("n_rows", "u"), ("n_cols", "u"), ("row_bytes", "u"))
PUSH_QMATVEC_XQ = _push(("n_cols", "u"))
PUSH_QMATVEC_PACK = _push(("n_blocks", "u"))
PUSH_QMATMUL_COOP = _push(("n_rows", "u"), ("n_cols", "u"), ("bps", "u"), ("kp8", "u"))
PUSH_QMATMUL_COOP_X = _push(("n_cols", "u"), ("kp8", "u"), ("nv", "u"), ("scales_at", "u"), ("sums_at", "u"))
PUSH_QMATMUL_COOP_SUM = _push(("n", "u"), ("splits", "u"))
PUSH_COPY = _push(("src_off", "u"), ("dst_off", "u"), ("count", "u"))
PUSH_TRANSPOSE = _push(("rows", "u"), ("cols", "u"))

#: quantized_matmul weight formats with a Vulkan kernel (qmatvec.<name>.*.spv)
QMATVEC_DTYPES: Mapping[DType, str] = {
    DType.F32: "f32", DType.F16: "f16", DType.BF16: "bf16",
    DType.Q4_0: "q4_0", DType.Q4_1: "q4_1", DType.Q5_0: "q5_0", DType.Q5_1: "q5_1",
    DType.Q8_0: "q8_0", DType.Q4_K: "q4_k", DType.Q5_K: "q5_k", DType.Q6_K: "q6_k",
}

_K_FORMATS = frozenset({DType.Q4_K, DType.Q5_K, DType.Q6_K})

#: formats with a kernel in qmatvec_fast.comp, and the elements one of its units covers
QMATVEC_FAST_UNIT: Mapping[DType, int] = {DType.Q4_0: 8, DType.Q8_0: 8, DType.Q4_K: 32, DType.Q6_K: 32}
QMATVEC_FAST_DTYPES = frozenset(QMATVEC_FAST_UNIT)
#: formats with a repacked-weights kernel (qmatvec_packed.comp; the qmatvec knob layout="packed")
QMATVEC_PACKED_DTYPES = frozenset({DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K})
#: the formats the automatic layout choice (no ``layout`` knob) repacks: those whose packed kernel
#: was timed faster than the GGUF kernels (docs/kernel-choices.md); Q4_K since its one-vector
#: shapes of QMATVEC_PACKED_FORMAT_SHAPES (before them it tied GGUF's kernel), so now every one
QMATVEC_PACKED_AUTO_DTYPES = QMATVEC_PACKED_DTYPES


def qmatvec_unit(dtype: DType) -> int:
    """Elements one invocation decodes at a time in qmatvec.comp."""
    if dtype.block_elems == 1:
        return 1
    return 64 if dtype in _K_FORMATS else 32

#: largest position rope accepts: the shader splits pos into two 12-bit halves
ROPE_MAX_POS = (1 << 24) - 1


@dataclass(frozen=True)
class Kernel:
    """One pipeline configuration: SPIR-V file, specialization constants and push layout."""

    spv: str
    spec: tuple[int, ...]
    push: np.dtype
    #: SPIR-V from elsewhere (a probe's ablated twin, a declared foreign kernel), used instead of the
    #: shipped ``spv``
    code: bytes | None = dataclasses.field(default=None, repr=False, compare=False)

    def spirv(self) -> bytes:
        return load_spirv(self.spv) if self.code is None else self.code

    def push_record(self, *values: Any) -> np.ndarray:
        """A one-record structured array holding ``values`` in block order."""
        return np.array([tuple(values)], dtype=self.push)


@dataclass(frozen=True)
class QMatvecKernel(Kernel):
    """A quantized_matmul kernel with its plan: what the backend needs besides the SPIR-V."""

    #: rows of the matrix one workgroup computes
    rows: int = 1
    #: reads the weights repacked by :meth:`KernelPolicy.qmatvec_pack` (``packed_bytes`` of them)
    packed: bool = False
    packed_bytes: int = 0
    #: reads x quantized by a first :meth:`KernelPolicy.qmatvec_xq` dispatch (``xq_bytes`` of scratch)
    uses_xq: bool = False
    xq_bytes: int = 0
    #: launch at most this many workgroups, each taking every max_groups-th group of ``rows`` rows
    #: (0: one workgroup per group of rows)
    max_groups: int = 0
    #: launch exactly this many workgroups, the matrix's row blocks spread evenly over them (the packed
    #: kernel's BALANCE; 0: one workgroup per group of ``rows`` rows)
    balanced_groups: int = 0
    #: vectors x one dispatch multiplies (quantized_matmul's n_vecs; 1: a backend runs a batch
    #: as one call per vector)
    vectors: int = 1
    #: workgroups along each row (grid z), each writing partial sums that :meth:`KernelPolicy.split_sum`
    #: adds into y (1: the kernel writes y itself)
    splits: int = 1
    #: the splits' sums added by the kernel itself (the last split of each row group; bindings: weights,
    #: x, partial sums, y, a count per row group starting at zero), not by a second dispatch
    split_last: bool = False

    def groups(self, n_rows: int) -> int:
        """Workgroups to launch for ``n_rows`` rows."""
        if self.balanced_groups:
            return self.balanced_groups
        need = _ceil_div(n_rows, self.rows)
        return min(need, self.max_groups) if self.max_groups else need


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _team_lanes(n_rows: int, rows: int, units: int) -> int:
    """Lanes per row team for the fast and packed quantized matvec kernels: about 512k
    invocations in all, one team per workgroup, so the 14336 short rows of a 14336 x 4096 matrix
    get 128 lanes a team and the 4096 long rows of 4096 x 14336 get 256 (the best probed shapes,
    docs/kernel-choices.md), no more lanes than the row has units."""
    lanes = _pow2_floor(max(1, (512 << 10) // max(1, _ceil_div(n_rows, rows))))
    return max(32, min(256, lanes, _pow2_ceil(max(1, units))))


def _qmatvec_reduce_bytes(wg: int, rows: int) -> int:
    """Shared memory of qmatvec_fast.comp's reduction: red[wg * rows] floats and sg_bad[wg]."""
    return wg * (4 * rows + 4)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _int_tuple(name: str, value: Any, lengths: tuple[int, ...], shape: str) -> tuple[int, ...]:
    """``value`` as a tuple of ints of one of ``lengths``; ValueError naming ``name`` otherwise."""
    try:
        items = tuple(value)
    except TypeError:
        raise ValueError(f"{name} must be a tuple {shape}, got {value!r}") from None
    if len(items) not in lengths or any(isinstance(v, bool) or not isinstance(v, (int, np.integer))
                                        for v in items):
        raise ValueError(f"{name} must be a tuple of {' or '.join(map(str, lengths))} ints {shape}, "
                         f"got {value!r}")
    return tuple(int(v) for v in items)


def _group_problem(group: int) -> str:
    return "" if group >= 1 else f"GROUP_M={group} must be >= 1 (1: no block-row grouping)"


def _matmul_shared_bytes(bm: int, bn: int, bk: int) -> int:
    """Shared memory of one stage of matmul.comp: A^T slice (rows padded by 4) and B slice."""
    return 4 * bk * (bm + 4 + bn)


def _coop_shared_bytes(wg_m: int, wg_n: int, sg_m: int, sg_n: int, bk: int, *, stages: int) -> int:
    """Shared memory of matmul_coop.comp (uvec4 words: padded A and B slices, or the C staging)."""
    bm, bn = wg_m * sg_m * 16, wg_n * sg_n * 16
    ab = stages * (bm * (bk // 8 + 1) + bk * (bn // 8 + 1))
    return 16 * max(ab, wg_m * wg_n * 64)


@dataclass(frozen=True)
class ReductionPlan:
    """How softmax / rms_norm split a vector: one workgroup, or partial + combine + normalize."""

    single: bool
    chunk: int  # elements per partial workgroup
    n_parts: int  # partial workgroups


@dataclass(frozen=True)
class AttentionPlan:
    """The fused attention op (shaders/attention.comp): a partial pass over a grid of
    (chunk, kv head x head block) workgroups, then a combine pass over (block of d, head)."""

    partial: Kernel
    combine: Kernel
    chunk: int  # keys per partial workgroup
    n_chunks: int
    head_blocks: int  # workgroups per kv head, each taking up to ATTENTION_HEADS of its query heads
    partial_grid: tuple[int, int, int]
    combine_grid: tuple[int, int, int]
    #: floats of scratch: n_heads * n_chunks * (head_dim + 2); the (max, sum) pairs start at ml_off
    scratch_floats: int
    ml_off: int
    #: the partial pass is attention.partial.stream (chunk in the push constants), else .sg/.tree
    stream: bool = False

    def partial_push(self, seq_len: int, group: int, kv_stride: int, scale: float) -> np.ndarray:
        """The partial pass's push constants (kv_stride: floats per cache row)."""
        head = (seq_len, group, kv_stride, self.n_chunks, self.ml_off, self.head_blocks)
        extra = (self.chunk,) if self.stream else ()
        return self.partial.push_record(*head, *extra, np.float32(scale))


@dataclass(frozen=True)
class QMatmulCoopPlan:
    """quantized_matmul of a batch on cooperative matrices (shaders/qmatmul_coop.comp): x made the
    B operand by ``prep``, the product by ``main`` over (row blocks, splits), the splits' partial sums
    added by :meth:`KernelPolicy.split_sum` where there are several."""

    main: Kernel
    prep: Kernel
    rows: int  # rows per workgroup (16 per subgroup)
    splits: int  # workgroups along each row, each taking ``bps`` blocks of 32
    bps: int
    kp8: int  # B's column pitch in uvec4 (8 halves)
    tiles: int  # 16-column tiles of B (two columns per vector)
    packed_bytes: int

    @property
    def scales_at(self) -> int:
        """uvec4 index of 1 / scale per vector in the B scratch (after its 16 * tiles columns)."""
        return 16 * self.tiles * self.kp8

    @property
    def sums_at(self) -> int:
        """uvec4 index of the sums of x per unit of 32 (Q4_K's mins), after the scales."""
        return self.scales_at + 4 * self.tiles

    @property
    def b_bytes(self) -> int:
        """Scratch of the B operand: the columns, a float per column (1 / scale), the sums of x per unit
        of 32 per column (16 * tiles * kp8 / 4 floats)."""
        return 16 * (self.sums_at + 4 * self.tiles * self.kp8)

    def grid(self, n_rows: int) -> tuple[int, int, int]:
        return (_ceil_div(n_rows, self.rows), self.splits, 1)


@dataclass(frozen=True)
class AttnValuePlan:
    kernel: Kernel
    chunk: int  # keys per workgroup row
    n_chunks: int


class KernelPolicy:
    """Chooses kernels and launch shapes from a device's properties (``get_device_properties``).

    Options: ``use_subgroups`` (None: when the device has subgroup arithmetic),
    ``matmul_tile`` = (BM, BN, BK, TM, TN[, GROUP_M]), ``matmul_warp_n`` (invocations along n in each
    32-invocation patch of matmul.comp, 0 = row-major; None: :meth:`matmul`'s rule), ``matmul_f16_tile`` = (WG_M, WG_N, SG_M, SG_N,
    BK[, GROUP_M]) (see :meth:`matmul` / :meth:`matmul_f16`), ``matmul_f16_cm2_tile`` = (BM, BN, BK,
    THREADS[, GROUP_M[, UNROLL]]) and ``matmul_f16_path`` (None: automatic, "coopmat2" or "khr"; see
    :meth:`matmul_f16_plan`), ``matmul_f16_cm2_b`` (how the coopmat2 kernel reads B: None automatic,
    "rows" as given, "transposed" after a transpose pass; see :meth:`matmul_f16_b_transposed`), ``single_group_limit`` (largest softmax/rms_norm
    size done by one workgroup), ``grid_limit`` (cap on the grid's x dimension, below the
    device's maxComputeWorkGroupCount[0]; exercises the spread-over-y path in tests).
    """

    def __init__(self, props: Mapping[str, Any], *, use_subgroups: bool | None = None,
                 matmul_tile: tuple[int, ...] | None = None,
                 single_group_limit: int = 8192, grid_limit: int | None = None,
                 matmul_f16_tile: tuple[int, ...] | None = None, matmul_warp_n: int | None = None,
                 matmul_f16_cm2_tile: tuple[int, ...] | None = None,
                 matmul_f16_path: str | None = None, matmul_f16_cm2_b: str | None = None):
        self.props = props
        feats = props.get("features", {})
        self.max_invocations = int(props["max_work_group_invocations"])
        self.max_size = tuple(int(v) for v in props["max_work_group_size"])
        self.max_count = tuple(int(v) for v in props["max_work_group_count"])
        if grid_limit is not None:
            if isinstance(grid_limit, bool) or not isinstance(grid_limit, int) or grid_limit < 1:
                raise ValueError(f"grid_limit must be a positive int, got {grid_limit!r}")
            self.max_count = (min(self.max_count[0], grid_limit),) + self.max_count[1:]
        self.max_shared = int(props["max_shared_memory"])
        self.subgroup_size = max(1, int(props.get("subgroup_size", 1)))
        self.is_cpu = props.get("device_type") == "cpu"
        #: {"count", "threads"} of the device's compute units where a vendor extension says (else None)
        self.compute_units = props.get("compute_units") or None
        has_subgroups = bool(feats.get("subgroup_basic")) and bool(feats.get("subgroup_arithmetic")) \
            and str(props.get("api_version", "1.0")) >= "1.1"
        if use_subgroups and not has_subgroups:
            from kbench.runtime import UnsupportedFeatureError

            raise UnsupportedFeatureError(
                f"use_subgroups=True but {props.get('device_name')} lacks subgroup arithmetic in compute "
                "shaders (or Vulkan 1.1)", "subgroup arithmetic operations")
        self.use_subgroups = has_subgroups if use_subgroups is None else bool(use_subgroups)
        self.has_int_dot = bool(feats.get("integer_dot_product"))
        self.has_shuffle = self.use_subgroups and bool(feats.get("subgroup_shuffle"))
        # the default 1-D workgroup: 256 invocations where allowed (Vulkan guarantees 128)
        self.wg = _pow2_floor(min(256, self.max_invocations, self.max_size[0]))
        self.single_group_limit = int(single_group_limit)
        self.matmul_tile = self._pick_matmul_tile(matmul_tile)
        self.matmul_warp_n = self._pick_matmul_warp_n(matmul_warp_n)
        self.matmul_split = self.MATMUL_GPU_SPLIT and not self.is_cpu
        self.matmul_f16_tile = self._pick_matmul_f16_tile(matmul_f16_tile)
        if matmul_f16_path not in (None, "coopmat2", "khr"):
            raise ValueError(f"matmul_f16_path must be None (automatic), 'coopmat2' or 'khr', got {matmul_f16_path!r}")
        self.matmul_f16_path_option = matmul_f16_path
        self.matmul_f16_cm2_tile_option = self._check_cm2_tile(matmul_f16_cm2_tile)
        if matmul_f16_cm2_b not in (None,) + self.MATMUL_CM2_B_LAYOUTS:
            raise ValueError(f"matmul_f16_cm2_b must be None (automatic), 'rows' or 'transposed', got {matmul_f16_cm2_b!r}")
        self.matmul_f16_cm2_b = matmul_f16_cm2_b or self.MATMUL_CM2_B
        # the ops ask for the same few kernels over and over: memoize per instance
        for name in ("elementwise", "copy", "reduction", "reduction_plan", "matmul", "matmul_f16", "matmul_f16_cm2_tile", "rope", "attn_score",
                     "attn_value", "attn_combine", "attention", "qmatvec", "qmatvec_xq", "grid_1d"):
            setattr(self, name, functools.lru_cache(maxsize=256)(getattr(self, name)))

    # -- grids ---------------------------------------------------------------------------------
    def grid_1d(self, groups: int) -> tuple[int, int, int]:
        """A grid of at least ``groups`` workgroups; beyond maxComputeWorkGroupCount[0] the
        shaders read it as y * num_x + x (extra groups find nothing to do)."""
        groups = max(1, int(groups))
        if groups <= self.max_count[0]:
            return (groups, 1, 1)
        y = _ceil_div(groups, self.max_count[0])
        if y > self.max_count[1]:
            raise ValueError(
                f"{groups} workgroups exceed the device's grid limit "
                f"{self.max_count[0]} x {self.max_count[1]}"
            )
        return (_ceil_div(groups, y), y, 1)

    # -- elementwise -----------------------------------------------------------------------------
    def elementwise(self, op: str) -> Kernel:
        """op: add, mul or silu; one vec4 per invocation."""
        return Kernel(f"elementwise.{op}.spv", (self.wg,), PUSH_ELEMENTWISE)

    def vec4_groups(self, size: int) -> int:
        return _ceil_div(_ceil_div(size, 4), self.wg)

    # -- copies ----------------------------------------------------------------------------------
    def copy(self, unit_bytes: int) -> Kernel:
        """unit_bytes: 16 (uvec4 per invocation) or 4 (one word)."""
        return Kernel(f"copy.{'vec4' if unit_bytes == 16 else 'words'}.spv", (self.wg,), PUSH_COPY)

    # -- reductions ------------------------------------------------------------------------------
    def reduction_plan(self, size: int) -> ReductionPlan:
        if size <= self.single_group_limit:
            return ReductionPlan(True, size, 1)
        # at least 8 elements per invocation, at most 4096 partials (merged by the last
        # workgroup); chunks are whole vec4s per invocation so that pass 1 loads vec4s
        step = 4 * self.wg
        chunk = max(self.wg * 8, _ceil_div(_ceil_div(size, 4096), step) * step)
        return ReductionPlan(False, chunk, _ceil_div(size, chunk))

    def reduction(self, op: str, stage: str) -> Kernel:
        """op: softmax or rms_norm; stage: small, partial (which also merges the partials) or
        normalize."""
        push = PUSH_SOFTMAX if op == "softmax" else PUSH_RMS_NORM
        return Kernel(f"{op}.{stage}.spv", (self.wg,), push)

    # -- matmul ----------------------------------------------------------------------------------
    # fp32 (shaders/matmul.comp): matmul_tile = (BM, BN, BK, TM, TN[, GROUP_M]).  GPUs get
    # 128x128x8 blocks of 8x8 outputs per invocation (256 invocations; BK 8 beats BK 16, and
    # 128 invocations of 8x16 do not beat it, see docs/kernel-choices.md), CPU drivers 64x64x16
    # blocks of 4x4, where large register tiles only spill.  The slices are double-buffered where
    # two fit in shared memory; GROUP_M block rows sweep the columns together (L2 reuse).
    # matmul_warp_n arranges each 32 invocations as a (32/WARP_N) x WARP_N patch (0: row-major);
    # GPUs get 8 x 4 patches where the tile allows (so a subgroup's shared reads of a k-step touch
    # 8 vec4s of A and 4 of B, where row-major 16 x 2 touches 2 and 16).
    MATMUL_GPU_TILE = (128, 128, 8, 8, 8)
    MATMUL_CPU_TILE = (64, 64, 16, 4, 4)
    MATMUL_TINY_TILE = (32, 32, 8, 4, 4)
    MATMUL_GPU_GROUP_M = 8
    MATMUL_GPU_WARP_N = 4
    MATMUL_GPU_SPLIT = True

    def _pick_matmul_tile(self, tile) -> tuple[int, ...]:
        if tile is None:
            first = self.MATMUL_CPU_TILE if self.is_cpu else self.MATMUL_GPU_TILE
            tile = next((t for t in (first, self.MATMUL_CPU_TILE, self.MATMUL_TINY_TILE)
                         if not self._matmul_tile_problem(t)), self.MATMUL_TINY_TILE)
            group = 1 if self.is_cpu else self.MATMUL_GPU_GROUP_M
        else:
            tile = _int_tuple("matmul_tile", tile, (5, 6), "(BM, BN, BK, TM, TN[, GROUP_M])")
            group = tile[5] if len(tile) == 6 else (1 if self.is_cpu else self.MATMUL_GPU_GROUP_M)
        problem = self._matmul_tile_problem(tile[:5]) or _group_problem(group)
        if problem:
            raise ValueError(f"matmul_tile {tile!r} does not fit this device: {problem}")
        bm, bn, bk = tile[:3]
        self.matmul_group_m = group
        self.matmul_stages = 2 if 2 * _matmul_shared_bytes(bm, bn, bk) <= self.max_shared else 1
        return tile

    def _matmul_tile_problem(self, tile) -> str:
        """What breaks the constraints of shaders/matmul.comp or the device's limits ("" if none)."""
        bm, bn, bk, tm, tn = tile
        if min(tile) <= 0:
            return "every size must be positive"
        for name, v in (("TM", tm), ("TN", tn), ("BK", bk)):
            if v % 4:
                return f"{name}={v} must be a multiple of 4 (vec4 shared-memory reads)"
        if bm % tm or bn % tn:
            return f"TM={tm} must divide BM={bm} and TN={tn} must divide BN={bn}"
        threads = (bm // tm) * (bn // tn)
        limit = min(self.max_invocations, self.max_size[0])
        if threads > limit:
            return f"(BM/TM)*(BN/TN) = {threads} invocations exceed the device's {limit}"
        shared = _matmul_shared_bytes(bm, bn, bk)
        if shared > self.max_shared:
            return (f"4*BK*(BM+4+BN) = {shared} bytes of shared memory exceed the device's "
                    f"{self.max_shared}")
        return ""

    def _pick_matmul_warp_n(self, warp_n) -> int:
        if warp_n is None:
            warp_n = 0 if self.is_cpu else self.MATMUL_GPU_WARP_N
            return warp_n if not self._matmul_warp_n_problem(warp_n) else 0
        if isinstance(warp_n, bool) or not isinstance(warp_n, (int, np.integer)):
            raise ValueError(f"matmul_warp_n must be an int (0: row-major), got {warp_n!r}")
        problem = self._matmul_warp_n_problem(int(warp_n))
        if problem:
            raise ValueError(f"matmul_warp_n={warp_n} does not fit matmul_tile {self.matmul_tile!r}: {problem}")
        return int(warp_n)

    def _matmul_warp_n_problem(self, warp_n: int) -> str:
        """What breaks matmul.comp's 32-invocation patches for this tile ("" if none)."""
        if warp_n == 0:
            return ""
        bm, bn, _, tm, tn = self.matmul_tile[:5]
        tx, ty = bn // tn, bm // tm
        if warp_n < 0 or 32 % warp_n:
            return "WARP_N must be 0 or divide 32"
        if tx % warp_n or ty % (32 // warp_n):
            return (f"a {32 // warp_n} x {warp_n} patch must tile the {ty} x {tx} invocations "
                    "(BM/TM x BN/TN)")
        return ""

    @staticmethod
    def matmul_vec4(n: int, k: int) -> bool:
        """Whether matmul.comp's vec4 path applies: rows of A and B start on 16-byte boundaries."""
        return n % 4 == 0 and k % 4 == 0

    #: let matmul_path choose matmul.comp's unchecked path (VEC4 = 2) where the sizes are whole tiles
    #: (the probe turns it off to time the checked path)
    matmul_unchecked = True
    #: matmul.comp's SPLIT: A's and B's next slices fetched half a slice apart (set from
    #: MATMUL_GPU_SPLIT on GPUs; the probe sets it per variant)
    matmul_split = False

    def matmul_path(self, m: int, n: int, k: int) -> int:
        """matmul.comp's VEC4 for these sizes: 2 (vec4, no bounds checks: m, n, k whole tiles),
        1 (vec4 loads and stores) or 0 (element-wise, any sizes)."""
        if not self.matmul_vec4(n, k):
            return 0
        bm, bn, bk = self.matmul_tile[:3]
        whole = m % bm == 0 and n % bn == 0 and k % bk == 0
        return 2 if whole and self.matmul_unchecked else 1

    def matmul(self, vec4: int = 0) -> Kernel:
        """Spec constants: (invocations, BM, BN, BK, TM, TN, VEC4, STAGES, GROUP_M, WARP_N, SPLIT);
        ``vec4`` is :meth:`matmul_path`'s VEC4 (a bool means 1 or 0)."""
        path = int(vec4)
        if path not in (0, 1, 2):
            raise ValueError(f"matmul: VEC4 must be 0, 1 or 2, got {vec4!r}")
        bm, bn, bk, tm, tn = self.matmul_tile[:5]
        spec = ((bm // tm) * (bn // tn), bm, bn, bk, tm, tn, path, self.matmul_stages,
                self.matmul_group_m, self.matmul_warp_n, int(self.matmul_split))
        return Kernel("matmul.spv", spec, PUSH_MATMUL)

    def matmul_grid(self, m: int, n: int) -> tuple[int, int, int]:
        bm, bn = self.matmul_tile[:2]
        return self._block_grid("matmul", m, n, bm, bn)

    def _block_grid(self, op: str, m: int, n: int, bm: int, bn: int) -> tuple[int, int, int]:
        gx, gy = _ceil_div(n, bn), _ceil_div(m, bm)
        if gx > self.max_count[0] or gy > self.max_count[1]:
            raise ValueError(f"{op}: m={m}, n={n} need a {gx} x {gy} grid of {bm}x{bn} tiles, beyond the "
                             f"device's limit {self.max_count[0]} x {self.max_count[1]}")
        return (gx, gy, 1)

    # fp16 x fp16 -> fp32 on cooperative matrices (shaders/matmul_coop.comp):
    # matmul_f16_tile = (WG_M, WG_N, SG_M, SG_N, BK[, GROUP_M]): WG_M x WG_N subgroups per
    # workgroup, each with SG_M x SG_N 16x16 accumulators, BK-deep slices (a multiple of 16).
    MATMUL_F16_TILE = (2, 4, 4, 4, 32)      # 128x256 blocks, 8 subgroups of 64x64 (one stage fits)
    MATMUL_F16_MID_TILE = (2, 4, 4, 2, 32)  # 128x128, 8 subgroups of 64x32: where the first does not fit
    MATMUL_F16_SMALL_TILE = (2, 2, 2, 2, 32)
    MATMUL_F16_GROUP_M = 8
    #: the cooperative-matrix configuration matmul_coop.comp uses (VkCooperativeMatrixPropertiesKHR)
    COOP_F16_CONFIG = {"M": 16, "N": 16, "K": 16, "a": "f16", "b": "f16", "c": "f32", "result": "f32",
                       "scope": 3}

    #: input types of matmul_f16 (``dtype``): IEEE half and bfloat16 (stored as 16-bit patterns)
    MATMUL_F16_DTYPES = ("f16", "bf16")
    #: features the bfloat16 variants need besides those of the f16 ones
    _BF16_FEATURES = (("bfloat16", "VK_KHR_shader_bfloat16 shaderBFloat16Type"),
                      ("bfloat16_cooperative_matrix", "VK_KHR_shader_bfloat16 shaderBFloat16CooperativeMatrix"))

    @classmethod
    def _check_dtype(cls, dtype: str) -> str:
        if dtype not in cls.MATMUL_F16_DTYPES:
            raise ValueError(f"matmul_f16: dtype must be one of {cls.MATMUL_F16_DTYPES}, got {dtype!r}")
        return dtype

    def matmul_f16_unsupported(self, dtype: str = "f16") -> str:
        """Why this device cannot run matmul_coop.comp (VK_KHR_cooperative_matrix, subgroup
        scope) on ``dtype`` inputs ("" when it can)."""
        self._check_dtype(dtype)
        feats = self.props.get("features", {})
        name = self.props.get("device_name", "this device")
        if not feats.get("cooperative_matrix"):
            return f"{name} lacks VK_KHR_cooperative_matrix (cooperativeMatrix)"
        want = dict(self.COOP_F16_CONFIG, a=dtype, b=dtype)
        configs = self.props.get("cooperative_matrix_properties") or []
        if not any(all(cfg.get(key) == val for key, val in want.items()) for cfg in configs):
            return (f"{name} has no 16x16x16 {dtype} x {dtype} -> f32 subgroup-scope cooperative-matrix "
                    "configuration")
        needs = [("float16", "shaderFloat16"), ("subgroup_basic", "subgroup basic operations"),
                 ("vulkan_memory_model", "vulkanMemoryModel")]
        if dtype == "bf16":
            needs += list(self._BF16_FEATURES)
        for key, human in needs:
            if not feats.get(key):
                return f"{name} lacks {human}, which the cooperative-matrix matmul needs"
        return ""

    # -- the same product on workgroup-scope matrices (VK_NV_cooperative_matrix2,
    # shaders/matmul_coop2.comp): matmul_f16_cm2_tile = (BM, BN, BK, THREADS[, GROUP_M[, UNROLL]]),
    # one BM x BN accumulator per workgroup of THREADS invocations, BK-deep slices loaded through
    # tensor layouts, the slice loop unrolled UNROLL times.  The default is the first of MATMUL_CM2_TILES the device's
    # flexible-dimension list admits (granularities and workgroup size).
    # fastest first as measured on the H100 and H200 (docs/kernel-choices.md), then smaller fallbacks for
    # devices that list other workgroup sizes or granularities
    MATMUL_CM2_TILES = ((128, 256, 32, 256), (128, 128, 32, 128), (128, 256, 64, 256), (128, 128, 64, 256),
                        (256, 128, 64, 256), (64, 64, 32, 128), (64, 64, 16, 64), (32, 32, 16, 32))
    MATMUL_CM2_GROUP_M = 8
    MATMUL_CM2_UNROLL = 16
    #: how matmul_coop2.comp reads B: "rows" (B as given, k rows of n) or "transposed" (B^T written by a
    #: transpose pass, shaders/transpose16.comp, and kept while B is not written, as repacked weights are;
    #: the *.bt variant then reads both operands along k, as ggml's coopmat2 matmul does); "rows" until the
    #: transposed order is measured faster
    MATMUL_CM2_B = "rows"
    MATMUL_CM2_B_LAYOUTS = ("rows", "transposed")
    #: the transpose pass's square tile (shaders/transpose16.comp)
    TRANSPOSE_TILE = 32
    #: the order in which matmul_f16_path takes the paths a device has: coopmat2 first, with its
    #: slice loop unrolled 16 times it is the faster on the one device with both (docs/kernel-choices.md)
    MATMUL_F16_PATHS = ("coopmat2", "khr")
    _CM2_FEATURES = (("cooperative_matrix", "VK_KHR_cooperative_matrix cooperativeMatrix"),
                     ("cooperative_matrix2_workgroup_scope", "VK_NV_cooperative_matrix2 cooperativeMatrixWorkgroupScope"),
                     ("cooperative_matrix2_flexible_dimensions",
                      "VK_NV_cooperative_matrix2 cooperativeMatrixFlexibleDimensions"),
                     ("cooperative_matrix2_tensor_addressing",
                      "VK_NV_cooperative_matrix2 cooperativeMatrixTensorAddressing"),
                     ("vulkan_memory_model", "vulkanMemoryModel"),
                     ("storage_buffer_16bit", "storageBuffer16BitAccess"))

    def _cm2_configs(self, dtype: str) -> list[dict]:
        """The device's workgroup-scope flexible-dimension configurations for dtype x dtype -> f32."""
        c2 = self.props.get("cooperative_matrix2_properties") or {}
        return [cfg for cfg in c2.get("flexible_dimensions") or []
                if cfg.get("a") == dtype and cfg.get("b") == dtype and cfg.get("c") == "f32"
                and cfg.get("result") == "f32" and int(cfg.get("scope", 0)) == 2]

    def matmul_f16_cm2_unsupported(self, dtype: str = "f16") -> str:
        """Why this device cannot run matmul_coop2.comp on ``dtype`` inputs ("" when it can)."""
        self._check_dtype(dtype)
        feats = self.props.get("features", {})
        name = self.props.get("device_name", "this device")
        needs = list(self._CM2_FEATURES) + (list(self._BF16_FEATURES) if dtype == "bf16" else [("float16", "shaderFloat16")])
        for key, human in needs:
            if not feats.get(key):
                return f"{name} lacks {human}"
        if not self._cm2_configs(dtype):
            return (f"{name} lists no workgroup-scope {dtype} x {dtype} -> f32 flexible-dimension "
                    "cooperative-matrix configuration")
        if not any(not self._cm2_tile_problem(t, dtype) for t in self.MATMUL_CM2_TILES):
            return f"no matmul_coop2 tile fits {name}'s configurations and limits"
        return ""

    def _check_cm2_tile(self, tile) -> tuple[int, ...] | None:
        if tile is None:
            return None
        tile = _int_tuple("matmul_f16_cm2_tile", tile, (4, 5, 6), "(BM, BN, BK, THREADS[, GROUP_M[, UNROLL]])")
        problem = (("every size must be positive" if min(tile[:4]) <= 0 else "")
                   or _group_problem(tile[4] if len(tile) >= 5 else 1)
                   or ("" if len(tile) < 6 or tile[5] >= 1 else f"UNROLL={tile[5]} must be >= 1"))
        if problem:
            raise ValueError(f"matmul_f16_cm2_tile {tile!r} is invalid: {problem}")
        return tile

    def _cm2_tile_problem(self, tile, dtype: str) -> str:
        """What keeps (BM, BN, BK, THREADS) off this device's coopmat2 configurations ("" if none)."""
        bm, bn, bk, threads = tile[:4]
        c2 = self.props.get("cooperative_matrix2_properties") or {}
        limit = min(self.max_invocations, self.max_size[0], int(c2.get("workgroup_scope_max_workgroup_size") or 1 << 30))
        if threads > limit:
            return f"THREADS={threads} exceeds the device's {limit} for workgroup-scope matrices"
        top = int(c2.get("flexible_dimensions_max_dimension") or 1 << 30)
        if max(bm, bn, bk) > top:
            return f"a dimension of {bm}x{bn}x{bk} exceeds the device's {top}"
        for cfg in self._cm2_configs(dtype):
            if (bm % cfg["M"] == 0 and bn % cfg["N"] == 0 and bk % cfg["K"] == 0
                    and threads == int(cfg["workgroup_invocations"])):
                return ""
        offered = sorted({(c["M"], c["N"], c["K"], c["workgroup_invocations"]) for c in self._cm2_configs(dtype)})
        return (f"{bm}x{bn}x{bk} with {threads} invocations matches none of the device's {dtype} configurations "
                f"(granularity M, N, K and workgroup size: {offered})")

    def matmul_f16_cm2_tile(self, dtype: str = "f16") -> tuple[int, ...]:
        """(BM, BN, BK, THREADS, GROUP_M, UNROLL) of matmul_coop2.comp for dtype on this device."""
        tile = self.matmul_f16_cm2_tile_option
        defaults = (self.MATMUL_CM2_GROUP_M, self.MATMUL_CM2_UNROLL)
        if tile is not None:
            problem = self._cm2_tile_problem(tile, dtype)
            if problem:
                raise ValueError(f"matmul_f16_cm2_tile {tile!r} does not fit this device: {problem}")
            return tuple(tile) + defaults[len(tile) - 4:]
        for t in self.MATMUL_CM2_TILES:
            if not self._cm2_tile_problem(t, dtype):
                return tuple(t) + defaults
        raise ValueError(f"no matmul_coop2 tile fits {self.props.get('device_name')}")

    def matmul_f16_path(self, dtype: str = "f16") -> str:
        """The kernel that serves matmul_f16 on dtype here: the first of MATMUL_F16_PATHS the
        device has for dtype ("khr": VK_KHR_cooperative_matrix; "coopmat2":
        VK_NV_cooperative_matrix2), else "" (none; :meth:`matmul_f16_plan` says why).  The
        ``matmul_f16_path`` option forces one."""
        self._check_dtype(dtype)
        forced = self.matmul_f16_path_option
        for path in self.MATMUL_F16_PATHS:
            if forced not in (None, path):
                continue
            if path == "coopmat2" and not self.matmul_f16_cm2_unsupported(dtype):
                return path
            if path == "khr" and not self.matmul_f16_unsupported(dtype) and self.matmul_f16_tile is not None:
                return path
        return ""

    def matmul_f16_plan(self, m: int, n: int, k: int, dtype: str = "f16") -> tuple[Kernel, tuple[int, int, int]]:
        """(kernel, grid) of matmul_f16 for this shape and dtype on the path :meth:`matmul_f16_path`
        picks (the emulated KHR kernel when ``coop_emulate`` is set).  Raises
        UnsupportedFeatureError, saying what the device lacks, where no path runs."""
        self._check_dtype(dtype)
        if self.coop_emulate:
            kernel = self.matmul_f16(self.matmul_f16_vec(n, k), True, dtype=dtype)
            return kernel, self.matmul_f16_grid(m, n)
        path = self.matmul_f16_path(dtype)
        if path == "coopmat2":
            bm, bn, bk, threads, group, unroll = self.matmul_f16_cm2_tile(dtype)
            clamp = int(bool(m % bm or n % bn or k % bk))
            vec = int(self.matmul_f16_vec(n, k))
            bt = ".bt" if self.matmul_f16_cm2_b == "transposed" else ""
            kernel = Kernel(f"matmul_coop2.{dtype}{bt}.spv", (threads, bm, bn, bk, group, clamp, unroll, vec), PUSH_MATMUL)
            return kernel, self._block_grid("matmul_f16", m, n, bm, bn)
        if path == "khr":
            return self.matmul_f16(self.matmul_f16_vec(n, k), dtype=dtype), self.matmul_f16_grid(m, n)
        forced = self.matmul_f16_path_option
        khr_why = (self.matmul_f16_unsupported(dtype)
                   or f"no matmul_f16 tile fits {self.props.get('device_name')}'s limits")
        cm2_why = self.matmul_f16_cm2_unsupported(dtype)
        why = {"coopmat2": cm2_why, "khr": khr_why}.get(forced, f"{khr_why} (VK_NV_cooperative_matrix2: {cm2_why})")
        from kbench.runtime import UnsupportedFeatureError

        raise UnsupportedFeatureError(f"matmul_{dtype}: {why}", "cooperative_matrix")

    def matmul_f16_b_transposed(self, dtype: str = "f16") -> bool:
        """Whether :meth:`matmul_f16_plan`'s kernel reads B transposed (B^T, n rows of k), written
        first by :meth:`transpose16`: the coopmat2 path with ``matmul_f16_cm2_b`` "transposed"."""
        return (not self.coop_emulate and self.matmul_f16_cm2_b == "transposed"
                and self.matmul_f16_path(dtype) == "coopmat2")

    def transpose16(self, rows: int, cols: int) -> tuple[Kernel, tuple[int, int, int]]:
        """(kernel, grid) of shaders/transpose16.comp for a rows x cols matrix of 16-bit elements;
        its push record is (rows, cols)."""
        if rows * cols >= 1 << 32:
            raise ValueError(f"transpose16: {rows} x {cols} elements are beyond the kernel's 32-bit indices")
        t = self.TRANSPOSE_TILE
        return Kernel("transpose16.spv", (), PUSH_TRANSPOSE), self._block_grid("transpose16", rows, cols, t, t)

    def _pick_matmul_f16_tile(self, tile) -> tuple[int, ...] | None:
        if tile is None:
            tile = next((t for t in (self.MATMUL_F16_TILE, self.MATMUL_F16_MID_TILE, self.MATMUL_F16_SMALL_TILE)
                         if not self._matmul_f16_tile_problem(t)), None)
            if tile is None:
                self.matmul_f16_group_m, self.matmul_f16_stages = 1, 1
                return None  # matmul_f16() says why
            group = 1 if self.is_cpu else self.MATMUL_F16_GROUP_M
        else:
            tile = _int_tuple("matmul_f16_tile", tile, (5, 6), "(WG_M, WG_N, SG_M, SG_N, BK[, GROUP_M])")
            group = tile[5] if len(tile) == 6 else self.MATMUL_F16_GROUP_M
            problem = self._matmul_f16_tile_problem(tile[:5]) or _group_problem(group)
            if problem:
                raise ValueError(f"matmul_f16_tile {tile!r} does not fit this device: {problem}")
        self.matmul_f16_group_m = group
        self.matmul_f16_stages = 2 if _coop_shared_bytes(*tile[:5], stages=2) <= self.max_shared else 1
        return tile

    def _matmul_f16_tile_problem(self, tile) -> str:
        wg_m, wg_n, sg_m, sg_n, bk = tile
        if min(tile) <= 0:
            return "every size must be positive"
        if bk % 16:
            return f"BK={bk} must be a multiple of 16 (the cooperative matrices' K)"
        threads = wg_m * wg_n * self.subgroup_size
        limit = min(self.max_invocations, self.max_size[0])
        if threads > limit:
            return (f"WG_M*WG_N*subgroup_size = {wg_m}*{wg_n}*{self.subgroup_size} = {threads} invocations "
                    f"exceed the device's {limit}")
        if sg_m * sg_n > 64:
            return f"SG_M*SG_N = {sg_m * sg_n} accumulators per subgroup is beyond any register file"
        shared = _coop_shared_bytes(wg_m, wg_n, sg_m, sg_n, bk, stages=1)
        if shared > self.max_shared:
            return f"{shared} bytes of shared memory exceed the device's {self.max_shared}"
        return ""

    @staticmethod
    def matmul_f16_vec(n: int, k: int) -> bool:
        """Whether matmul_coop.comp's uvec4 loads apply: rows of A and B start on 16-byte boundaries."""
        return n % 8 == 0 and k % 8 == 0

    #: run matmul_f16 on matmul_coop.emulated.spv (plain code in place of the cooperative-matrix
    #: operations; slow): for testing the kernel's staging and edges on devices without them
    coop_emulate = False

    def matmul_f16(self, vec: bool = False, emulate: bool = False, dtype: str = "f16") -> Kernel:
        """The KHR kernel (matmul_coop.comp). Spec constants: (invocations, WG_M, WG_N, SG_M,
        SG_N, BK, VEC, STAGES, GROUP_M). Raises UnsupportedFeatureError on devices without the
        cooperative-matrix configuration (``emulate``: the emulated variant, which needs only
        subgroups of >= 8 invocations)."""
        self._check_dtype(dtype)
        if emulate:
            feats = self.props.get("features", {})
            why = "" if feats.get("subgroup_basic") and self.subgroup_size >= 8 else \
                "the emulated cooperative-matrix kernel needs subgroups of >= 8 invocations"
        else:
            why = self.matmul_f16_unsupported(dtype)
        if not why and self.matmul_f16_tile is None:
            why = f"no matmul_f16 tile fits {self.props.get('device_name')}'s limits"
        if why:
            from kbench.runtime import UnsupportedFeatureError

            raise UnsupportedFeatureError(f"matmul_f16: {why}", "cooperative_matrix")
        wg_m, wg_n, sg_m, sg_n, bk = self.matmul_f16_tile[:5]
        spec = (wg_m * wg_n * self.subgroup_size, wg_m, wg_n, sg_m, sg_n, bk, int(bool(vec)),
                self.matmul_f16_stages, self.matmul_f16_group_m)
        name = ("emulated" if emulate else "khr") + ("" if dtype == "f16" else f".{dtype}")
        return Kernel(f"matmul_coop.{name}.spv", spec, PUSH_MATMUL)

    def matmul_f16_grid(self, m: int, n: int) -> tuple[int, int, int]:
        wg_m, wg_n, sg_m, sg_n = self.matmul_f16_tile[:4]
        return self._block_grid("matmul_f16", m, n, wg_m * sg_m * 16, wg_n * sg_n * 16)

    # -- rope ------------------------------------------------------------------------------------
    def rope(self) -> Kernel:
        return Kernel("rope.spv", (self.wg,), PUSH_ROPE)

    # -- attention -------------------------------------------------------------------------------
    def attn_score(self, head_dim: int) -> Kernel:
        """ROW_THREADS invocations per key row: enough to cover head_dim in few steps."""
        row_threads = min(32, _pow2_ceil(head_dim), self.wg)
        return Kernel("attn_score.spv", (self.wg, row_threads), PUSH_ATTN_SCORE)

    def attn_value(self, head_dim: int, seq_len: int) -> AttnValuePlan:
        dx = min(64, _pow2_ceil(head_dim), self.wg)
        dy = max(1, self.wg // dx)
        kernel = Kernel("attn_value.partial.spv", (dx, dy), PUSH_ATTN_VALUE)
        # each invocation row adds >= 16 keys; at most 64 chunks (and within the grid's y limit)
        chunk = max(dy * 16, _ceil_div(seq_len, 64), _ceil_div(seq_len, self.max_count[1]))
        return AttnValuePlan(kernel, chunk, _ceil_div(seq_len, chunk))

    def attn_combine(self) -> Kernel:
        return Kernel("attn_value.combine.spv", (self.wg,), PUSH_ATTN_COMBINE)

    # -- fused decode attention (shaders/attention.comp) -------------------------------------------
    #: query heads one partial workgroup takes (HB in the shader): they share its K and V rows
    ATTENTION_HEADS = 4
    #: the chunk choice aims at this many partial workgroups: several per compute unit of a large
    #: GPU (132 SMs on an H200) with whole chunks of at least ATTENTION_MIN_CHUNK keys
    ATTENTION_TARGET_GROUPS = 1024
    ATTENTION_MIN_CHUNK = 64
    ATTENTION_MAX_CHUNK = 2048
    ATTENTION_COMBINE_COLUMNS = 32

    def attention_shared_bytes(self, chunk: int, head_dim: int) -> int:
        """Shared memory of the partial pass: scores[HB*chunk], q[HB*head_dim], red[HB*wg]."""
        return 4 * self.ATTENTION_HEADS * (chunk + head_dim + self.wg)

    #: knobs of the streaming partial pass (see :meth:`configure_attention`); empty: the device-based choice
    attention_config: Mapping[str, Any] = {}
    #: lanes per key row of the streaming pass (at most the subgroup size and head_dim / 4)
    ATTENTION_STREAM_LANES = 32
    #: vec4 loads of K (and as many of V) each lane issues before using them
    ATTENTION_STREAM_LOADS = 4
    #: the streaming pass's chunk aims at this many workgroups (of ATTENTION_STREAM_WG invocations):
    #: two per SM of an H200 (132), long chunks that amortize each workgroup's start and merge
    #: (docs/kernel-choices.md)
    ATTENTION_STREAM_TARGET_GROUPS = 264
    ATTENTION_STREAM_WG = 256
    ATTENTION_STREAM_HEADS_FIRST = False
    ATTENTION_STREAM_PREFETCH = False

    def configure_attention(self, config: Mapping[str, Any] | None = None, **knobs: Any) -> None:
        """Override the fused attention's kernel choice (for probes and tests).  Keys: ``kernel``
        "auto" (default: "stream" where the device has subgroup shuffles and head_dim % 4 == 0),
        "stream" or "split" (the partial.sg / partial.tree passes); for the streaming pass ``lanes``
        (lanes per key row, a power of two <= the subgroup size), ``unroll`` (keys each team loads
        before using them), ``wg`` (invocations per workgroup, a power of two), ``groups`` (the
        workgroup count the chunk aims at), ``heads_first`` (bool: the grid's x runs over the kv
        head blocks, so workgroups launched together read whole cache rows), ``prefetch`` (bool: each
        team loads its next batch of keys before using the current one); for both passes
        ``combine_cols`` (columns per combine workgroup, a power of two)."""
        cfg = dict(config or {}, **knobs)
        unknown = set(cfg) - {"kernel", "lanes", "unroll", "wg", "groups", "heads_first", "prefetch", "combine_cols"}
        if unknown:
            raise ValueError(f"attention config: unknown keys {sorted(unknown)}")
        if cfg.get("kernel", "auto") not in ("auto", "stream", "split"):
            raise ValueError(f"attention config: kernel must be auto, stream or split, got {cfg['kernel']!r}")
        for key in ("heads_first", "prefetch"):
            if cfg.get(key) is not None and not isinstance(cfg[key], bool):
                raise ValueError(f"attention config: {key} must be True or False, got {cfg[key]!r}")
        for key in ("lanes", "unroll", "wg", "groups", "combine_cols"):
            v = cfg.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"attention config: {key} must be a positive int, got {v!r}")
        for key in ("lanes", "wg", "combine_cols"):
            v = cfg.get(key)
            if v is not None and v & (v - 1):
                raise ValueError(f"attention config: {key} must be a power of two, got {v}")
        if cfg.get("lanes") is not None and cfg["lanes"] > self.subgroup_size:
            raise ValueError(f"attention config: lanes={cfg['lanes']} exceed the subgroup size {self.subgroup_size}")
        if cfg.get("kernel") == "stream" and self._attention_stream_missing(4):
            raise ValueError(f"attention config: kernel='stream' {self._attention_stream_missing(4)}")
        self.attention_config = cfg
        self.attention.cache_clear()

    def _attention_stream_missing(self, head_dim: int) -> str:
        """Why the streaming pass cannot run head_dim here ('' when it can)."""
        feats = self.props.get("features", {})
        if not (self.use_subgroups and feats.get("subgroup_shuffle")):
            return "needs subgroup arithmetic and shuffles"
        if head_dim % 4:
            return f"needs head_dim % 4 == 0 (16-byte rows), got {head_dim}"
        return ""

    @staticmethod
    def attention_stream_shared_bytes(wg: int, subgroup: int, heads: int, head_dim: int) -> int:
        """Shared memory of the streaming pass: o[d], m and l per subgroup and head."""
        return (wg // subgroup) * heads * (4 * head_dim + 8)

    def _attention_stream(self, head_dim: int, seq_len: int, n_heads: int, n_kv_heads: int,
                          chunk: int | None) -> AttentionPlan | None:
        """The streaming pass's plan, or None where it does not fit (then the split passes run)."""
        cfg = self.attention_config
        group = n_heads // n_kv_heads
        head_blocks = _ceil_div(group, self.ATTENTION_HEADS)
        hb = _ceil_div(group, head_blocks)  # the heads spread evenly over the blocks
        blocks = n_kv_heads * head_blocks
        sg = self.subgroup_size
        hd4 = head_dim // 4
        lanes = cfg.get("lanes") or min(self.ATTENTION_STREAM_LANES, sg, _pow2_floor(hd4))
        nv = _ceil_div(hd4, lanes)
        unroll = cfg.get("unroll") or max(1, self.ATTENTION_STREAM_LOADS // nv)
        limit = _pow2_floor(min(self.max_invocations, self.max_size[0]))
        wg = min(cfg.get("wg") or self.ATTENTION_STREAM_WG, limit)
        while wg > sg and self.attention_stream_shared_bytes(wg, sg, hb, head_dim) > self.max_shared:
            wg //= 2
        if wg < sg or self.attention_stream_shared_bytes(wg, sg, hb, head_dim) > self.max_shared:
            return None
        min_chunk = _ceil_div(seq_len, self.max_count[0])
        if chunk is None:
            # about `groups` workgroups in all, the same number of keys for every team
            groups = cfg.get("groups") or self.ATTENTION_STREAM_TARGET_GROUPS
            teams = wg // lanes
            chunk = _ceil_div(_ceil_div(seq_len * blocks, groups), teams) * teams
            chunk = max(chunk, min_chunk)
        self._attention_grid_check(chunk, min_chunk, seq_len, blocks, n_heads)
        n_chunks = _ceil_div(seq_len, chunk)
        heads_first = bool(cfg.get("heads_first", self.ATTENTION_STREAM_HEADS_FIRST))
        if heads_first and (n_chunks > self.max_count[1] or blocks > self.max_count[0]):
            heads_first = False  # the chunks fit the grid's x only
        prefetch = bool(cfg.get("prefetch", self.ATTENTION_STREAM_PREFETCH))
        partial = Kernel("attention.partial.stream.spv",
                         (wg, head_dim, lanes, hb, unroll, wg // sg, int(heads_first), int(prefetch), sg),
                         PUSH_ATTENTION_STREAM)
        plan = self._attention_plan(partial, head_dim, n_heads, chunk, n_chunks, head_blocks, blocks, True)
        if heads_first:
            plan = dataclasses.replace(plan, partial_grid=(blocks, n_chunks, 1))
        return plan

    def _attention_grid_check(self, chunk: int, min_chunk: int, seq_len: int, blocks: int, n_heads: int) -> None:
        """ValueError where the attention passes' grids exceed the device's limits."""
        if chunk < min_chunk:
            raise ValueError(f"attention: a chunk of {chunk} keys makes more than {self.max_count[0]} chunks of "
                             f"{seq_len} keys (the device's grid limit)")
        if blocks > self.max_count[1] or n_heads > self.max_count[1]:
            raise ValueError(f"attention: {n_heads} heads ({blocks} kv head blocks) exceed the device's grid "
                             f"limit {self.max_count[1]} in y")

    def _attention_plan(self, partial: Kernel, head_dim: int, n_heads: int, chunk: int, n_chunks: int,
                        head_blocks: int, blocks: int, stream: bool) -> AttentionPlan:
        # the combine: COMBINE_COLUMNS columns of a head per workgroup, its other rows of
        # invocations splitting the chunks (more workgroups, fewer chunks each, than a column each)
        cx = min(self.wg, self.attention_config.get("combine_cols") or self.ATTENTION_COMBINE_COLUMNS,
                 _pow2_ceil(head_dim))
        combine = Kernel("attention.combine.spv", (self.wg, head_dim, cx), PUSH_ATTENTION_COMBINE)
        ml_off = n_heads * n_chunks * head_dim
        return AttentionPlan(partial, combine, chunk, n_chunks, head_blocks, (n_chunks, blocks, 1),
                             (_ceil_div(head_dim, cx), n_heads, 1), ml_off + 2 * n_heads * n_chunks, ml_off,
                             stream)

    def attention(self, head_dim: int, seq_len: int, n_heads: int, n_kv_heads: int,
                  chunk: int | None = None) -> AttentionPlan:
        """The launch of the fused attention for these shapes: the streaming partial pass
        (:meth:`_attention_stream`) where the device has subgroup shuffles, head_dim % 4 == 0 and
        its shared memory fits, else the split passes below.

        The split passes (partial.sg / partial.tree).  Keys per workgroup (``chunk``,
        a power of two unless given): about ATTENTION_TARGET_GROUPS partial workgroups in all,
        within [ATTENTION_MIN_CHUNK, ATTENTION_MAX_CHUNK] (also for shorter sequences: the chunk is
        a specialization constant, so one pipeline serves them all) and what shared memory holds,
        and few enough chunks for the grid.  The partial pass teams a subgroup per key row where the
        device has subgroup arithmetic (one invocation per row otherwise).  ValueError when
        head_dim is too large for shared memory or the heads exceed the grid."""
        kind = self.attention_config.get("kernel", "auto")
        if kind == "stream" or (kind == "auto" and not self._attention_stream_missing(head_dim)):
            why = self._attention_stream_missing(head_dim)
            if why:
                raise ValueError(f"attention: the streaming pass {why}")
            plan = self._attention_stream(head_dim, seq_len, n_heads, n_kv_heads, chunk)
            if plan is not None:
                return plan
            if kind == "stream":
                raise ValueError(f"attention: the streaming pass's shared memory for head_dim={head_dim} exceeds "
                                 f"the device's {self.max_shared} bytes")
        hb = self.ATTENTION_HEADS
        group = n_heads // n_kv_heads
        head_blocks = _ceil_div(group, hb)
        blocks = n_kv_heads * head_blocks
        fixed = self.attention_shared_bytes(0, head_dim)
        room = (self.max_shared - fixed) // (4 * hb)
        if room < 1:
            raise ValueError(f"attention: head_dim={head_dim} needs {fixed + 4 * hb} bytes of shared memory "
                             f"per workgroup, the device has {self.max_shared}")
        min_chunk = _ceil_div(seq_len, self.max_count[0])  # the grid's x dimension counts chunks
        if chunk is None:
            want = _pow2_ceil(_ceil_div(seq_len * blocks, self.ATTENTION_TARGET_GROUPS))
            # not shortened to short sequences: one pipeline serves every seq_len up to it
            chunk = max(self.ATTENTION_MIN_CHUNK, min(want, self.ATTENTION_MAX_CHUNK))
            chunk = max(min(chunk, _pow2_floor(room)), min_chunk)
        if chunk > room:
            raise ValueError(f"attention: a chunk of {chunk} keys needs {self.attention_shared_bytes(chunk, head_dim)} "
                             f"bytes of shared memory, the device has {self.max_shared}")
        self._attention_grid_check(chunk, min_chunk, seq_len, blocks, n_heads)
        n_chunks = _ceil_div(seq_len, chunk)
        dx = min(self.wg, _pow2_ceil(head_dim))
        variant = "sg" if self.use_subgroups else "tree"
        partial = Kernel(f"attention.partial.{variant}.spv", (self.wg, chunk, head_dim, dx), PUSH_ATTENTION)
        return self._attention_plan(partial, head_dim, n_heads, chunk, n_chunks, head_blocks, blocks, False)

    # -- quantized matrix-vector -------------------------------------------------------------------
    #: knobs of :meth:`qmatvec` (see :meth:`configure_qmatvec`); empty = the device-based choice
    qmatvec_config: Mapping[str, Any] = {}

    def configure_qmatvec(self, config: Mapping[str, Any] | None = None, **knobs: Any) -> None:
        """Override the quantized_matmul kernel choice (for probes and tests). Keys:
        ``kernel``: "auto" (default), "fast" (qmatvec_fast.comp, Q4_0/Q8_0/Q4_K/Q6_K) or
        "generic" (qmatvec.comp); for the fast kernel ``lanes`` (invocations per row team, a
        power of two), ``rows`` (rows per team), ``teams`` (teams per workgroup) and
        ``reduce`` ("subgroup" or "tree"; default: subgroup where the device has subgroup
        arithmetic), ``staged`` (True: stage weights through shared memory where the shape
        allows it, see :meth:`qmatvec_chunk`; default QMATVEC_STAGED), ``chunk`` (blocks per
        row and staged chunk), ``tile_kib`` (the staged tile's size limit when ``chunk`` is
        not given) and ``dot`` (True: the integer-dot variant on x quantized to 16 bits per
        element, see shaders/qmatvec_xq.comp; False: exact fp32 decoding; default: QMATVEC_DOT
        where the device has shaderIntegerDotProduct, from QMATVEC_DOT_MIN_ELEMS weights) and,
        for it, ``xq`` ("lane": every lane quantizes its own unit's x; "dispatch": a first
        qmatvec_xq dispatch quantizes x once; default QMATVEC_XQ).  ``layout``: "gguf"
        or "packed" (default: QMATVEC_LAYOUT's automatic choice): for QMATVEC_PACKED_DTYPES, the backend
        repacks each weight buffer on first use into a 16-byte-aligned copy (qmatvec_pack.comp, the weight
        bytes again in device memory) and runs qmatvec_packed.comp on it (integer dots, ``lanes`` per
        team, ``teams`` per workgroup, ``unroll`` units per row loaded before decoding (defaults:
        QMATVEC_PACKED_SHAPE, QMATVEC_PACKED_ROWS, QMATVEC_PACKED_BATCH_TEAMS and the per-format
        QMATVEC_PACKED_FORMAT_SHAPES), ``per_cu``: launch that many
        workgroups per compute unit where the device reports its compute units, each taking
        several row groups (0: one workgroup per row group), ``groups``: at most that many
        workgroups whatever the device (for tests and probes), ``prefetch`` (default True): a
        workgroup's first loads go out before it quantizes x, ``rows`` per team, ``xq`` "workgroup"
        (default where x fits in shared memory): each workgroup quantizes x into shared memory
        itself, no second dispatch, "dispatch", or "lane": each lane quantizes the blocks of x its units
        meet, in registers, no x in shared memory and no barrier, variants ``*.xlane.*``), ``x_bits``
        16 (default: x's error about 2e-10 NMSE) or 8 (with ``xq`` "workgroup" only: x as signed bytes, one
        byte dot per weight word instead of two, x's error about 3e-5 NMSE against float64: a faster,
        less exact kernel, never the automatic choice), ``x_chunk`` (with ``xq`` "workgroup": columns of x
        each workgroup holds in shared memory at a time, a multiple of 32 (Q4_K: 64); default: all of x
        where it fits, else the largest chunk that does, see QMATVEC_PACKED_MIN_X_CHUNK), ``splits``: workgroups
        along each row (default QMATVEC_PACKED_SPLIT_GROUPS_PER_CU's rule), their partial sums added by
        ``split_sum`` "dispatch" (a second dispatch) or "last" (the last split of each row group, in the
        kernel; 16-bit x and subgroup sums only; default QMATVEC_PACKED_SPLIT_SUM), ``balance`` (default:
        QMATVEC_PACKED_BALANCE where the device reports its compute units; an int: that many units): a
        whole number of workgroups per compute unit, the rows spread evenly over them a team's rows at a
        time (unsplit rows, no ``per_cu`` or ``groups``), ``stagger`` (16-bit x held by each workgroup,
        subgroup sums; default: QMATVEC_PACKED_STAGGER): of the teams that load their first batch before x
        is quantized (``prefetch``), only the even ones do, so that teams step out of phase (variants
        ``*.stagger.*``); other formats keep the GGUF kernels."""
        cfg = dict(config or {}, **knobs)
        unknown = set(cfg) - {"kernel", "lanes", "rows", "teams", "reduce", "staged", "chunk", "tile_kib", "dot", "xq",
                              "layout", "unroll", "per_cu", "groups", "prefetch", "x_bits", "x_chunk", "splits",
                              "split_sum", "balance", "stagger",
                              "coop", "coop_subgroups", "coop_unroll", "coop_splits", "coop_bshared", "coop_stages", "coop_depth",
                              "coop_accs"}
        if unknown:
            raise ValueError(f"qmatvec config: unknown keys {sorted(unknown)}")
        if cfg.get("kernel", "auto") not in ("auto", "fast", "generic"):
            raise ValueError(f"qmatvec config: kernel must be auto, fast or generic, got {cfg['kernel']!r}")
        if cfg.get("reduce", "subgroup") not in ("subgroup", "tree"):
            raise ValueError(f"qmatvec config: reduce must be subgroup or tree, got {cfg['reduce']!r}")
        if cfg.get("reduce") == "subgroup" and not self.use_subgroups:
            raise ValueError("qmatvec config: reduce='subgroup' needs subgroup arithmetic")
        if cfg.get("staged") is not None and not isinstance(cfg["staged"], bool):
            raise ValueError(f"qmatvec config: staged must be True or False, got {cfg['staged']!r}")
        if cfg.get("dot") is not None and not isinstance(cfg["dot"], bool):
            raise ValueError(f"qmatvec config: dot must be True or False, got {cfg['dot']!r}")
        if cfg.get("xq", "lane") not in ("lane", "dispatch", "workgroup"):
            raise ValueError(f"qmatvec config: xq must be lane, dispatch or workgroup, got {cfg['xq']!r}")
        if cfg.get("xq") == "workgroup" and cfg.get("layout") != "packed":
            raise ValueError("qmatvec config: xq='workgroup' is a choice of layout='packed'")
        if cfg.get("dot") and not self.has_int_dot:
            raise ValueError("qmatvec config: dot=True needs shaderIntegerDotProduct, which this device lacks")
        if cfg.get("dot") and cfg.get("staged"):
            raise ValueError("qmatvec config: the staged kernels have no integer-dot variant (dot and staged)")
        if cfg.get("layout", "gguf") not in ("gguf", "packed"):
            raise ValueError(f"qmatvec config: layout must be gguf or packed, got {cfg['layout']!r}")
        if cfg.get("layout") == "packed":
            if not self.has_int_dot:
                raise ValueError("qmatvec config: layout='packed' needs shaderIntegerDotProduct, "
                                 "which this device lacks")
            clash = [k for k, bad in (("kernel", cfg.get("kernel", "auto") == "generic"), ("staged", cfg.get("staged")),
                                      ("dot", cfg.get("dot") is False)) if bad]
            if clash:
                raise ValueError(f"qmatvec config: layout='packed' has one kernel (integer dots on x quantized by a "
                                 f"first dispatch, by each workgroup or by each lane); it cannot take "
                                 f"{', '.join(clash)}="
                                 f"{', '.join(repr(cfg[k]) for k in clash)}")
        if cfg.get("balance") is not None and not (isinstance(cfg["balance"], bool) or
                                                   (isinstance(cfg["balance"], int) and cfg["balance"] > 0)):
            raise ValueError(f"qmatvec config: balance must be True, False or a number of compute units > 0, "
                             f"got {cfg['balance']!r}")
        for key in ("prefetch", "stagger"):
            if cfg.get(key) is not None and not isinstance(cfg[key], bool):
                raise ValueError(f"qmatvec config: {key} must be True or False, got {cfg[key]!r}")
        if cfg.get("x_bits") is not None:
            if cfg["x_bits"] not in (8, 16) or isinstance(cfg["x_bits"], bool):
                raise ValueError(f"qmatvec config: x_bits must be 8 or 16, got {cfg['x_bits']!r}")
            if cfg["x_bits"] == 8 and cfg.get("xq") in ("dispatch", "lane"):
                raise ValueError("qmatvec config: x_bits=8 quantizes x in each workgroup; it cannot take "
                                 f"xq={cfg['xq']!r}")
        for key in ("unroll", "per_cu", "groups", "prefetch", "x_bits", "x_chunk", "splits",
                    "split_sum", "balance", "stagger"):
            if cfg.get(key) is not None and cfg.get("layout") != "packed":
                raise ValueError(f"qmatvec config: {key} is a choice of layout='packed'")
        if cfg.get("per_cu") is not None and (isinstance(cfg["per_cu"], bool) or not isinstance(cfg["per_cu"], int)
                                              or cfg["per_cu"] < 0):
            raise ValueError(f"qmatvec config: per_cu must be an int >= 0 (0: one workgroup per row group), "
                             f"got {cfg['per_cu']!r}")
        if cfg.get("split_sum", "dispatch") not in ("dispatch", "last"):
            raise ValueError(f"qmatvec config: split_sum must be dispatch or last, got {cfg['split_sum']!r}")
        if cfg.get("x_chunk") is not None and cfg.get("xq") in ("dispatch", "lane"):
            raise ValueError("qmatvec config: x_chunk is the chunk of x each workgroup holds; it cannot take "
                             f"xq={cfg['xq']!r}")
        if cfg.get("coop") is not None and not isinstance(cfg["coop"], bool):
            raise ValueError(f"qmatvec config: coop must be True or False, got {cfg['coop']!r}")
        if cfg.get("coop_bshared") is not None and not isinstance(cfg["coop_bshared"], bool):
            raise ValueError(f"qmatvec config: coop_bshared must be True or False, got {cfg['coop_bshared']!r}")
        for key in ("coop_stages", "coop_depth"):
            if cfg.get(key) is not None and (isinstance(cfg[key], bool) or cfg[key] not in (1, 2)):
                raise ValueError(f"qmatvec config: {key} must be 1 or 2, got {cfg[key]!r}")
        if cfg.get("coop_accs") is not None and (isinstance(cfg["coop_accs"], bool) or cfg["coop_accs"] not in (1, 2, 4)):
            raise ValueError(f"qmatvec config: coop_accs must be 1, 2 or 4, got {cfg['coop_accs']!r}")
        for key in ("coop_subgroups", "coop_unroll", "coop_splits", "coop_bshared", "coop_stages", "coop_depth",
                    "coop_accs"):
            if cfg.get(key) is not None and not cfg.get("coop"):
                raise ValueError(f"qmatvec config: {key} is a choice of coop=True")
        for key in ("lanes", "rows", "teams", "chunk", "tile_kib", "unroll", "groups", "x_chunk", "splits",
                    "coop_subgroups", "coop_unroll", "coop_splits"):
            v = cfg.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"qmatvec config: {key} must be a positive int, got {v!r}")
        if cfg.get("lanes") is not None and cfg["lanes"] & (cfg["lanes"] - 1):
            raise ValueError(f"qmatvec config: lanes must be a power of two, got {cfg['lanes']}")
        self.qmatvec_config = cfg
        self.qmatvec.cache_clear()

    def qmatvec_fast_ok(self, dtype: DType) -> bool:
        """The automatic choice of qmatvec_fast.comp: a GPU with 32-wide subgroups and subgroup
        arithmetic (NVIDIA, and AMD/Intel in wave32 / SIMD32) for Q4_0, Q8_0, Q4_K, Q6_K."""
        return (dtype in QMATVEC_FAST_DTYPES and self.use_subgroups and self.subgroup_size == 32
                and not self.is_cpu)

    def qmatvec(self, dtype: DType, n_cols: int, n_rows: int = 1 << 14, n_vecs: int = 1) -> QMatvecKernel:
        """The quantized_matmul kernel for an ``n_rows`` x ``n_cols`` matrix of ``dtype`` times
        ``n_vecs`` vectors, with its plan (rows per workgroup, packed weights, quantized x and
        their byte counts, how many vectors one dispatch takes: all for the packed kernel, one
        for the GGUF kernels)."""
        cfg = self.qmatvec_config
        name = QMATVEC_DTYPES[dtype]
        if dtype in QMATVEC_PACKED_DTYPES and self._qmatvec_layout(dtype, n_cols, n_rows, n_vecs) == "packed":
            return self._qmatvec_packed(dtype, n_cols, n_rows, n_vecs)
        choice = cfg.get("kernel", "auto")
        fast = self.qmatvec_fast_ok(dtype) if choice == "auto" else choice == "fast"
        if fast and dtype not in QMATVEC_FAST_DTYPES:
            raise ValueError(f"qmatvec config: the fast kernel has no {dtype.name} variant")
        if fast:
            return self._qmatvec_fast(dtype, n_cols, n_rows)
        units = n_cols // qmatvec_unit(dtype)
        # 4 rows per workgroup, 32 invocations for the 32-element formats, 64 for the K formats,
        # 128 for F16/BF16/F32: the fastest probed (docs/kernel-choices.md)
        cap = 128 if dtype.block_elems == 1 else 64 if dtype in _K_FORMATS else 32
        wg = min(self.wg, cap, max(32, _pow2_ceil(units)))
        wg = _pow2_floor(min(wg, self.max_invocations))
        rows = 4
        variant = "subgroup" if self.use_subgroups else "shared"
        while rows > 1 and 4 * wg * rows > self.max_shared:
            rows //= 2
        return QMatvecKernel(f"qmatvec.{name}.{variant}.spv", (wg, rows), PUSH_QMATVEC, rows=rows)

    def _qmatvec_fast(self, dtype: DType, n_cols: int, n_rows: int) -> QMatvecKernel:
        cfg = self.qmatvec_config
        name = QMATVEC_DTYPES[dtype]
        units = n_cols // QMATVEC_FAST_UNIT[dtype]
        rows = int(cfg.get("rows") or 4)
        lanes = cfg.get("lanes") or _team_lanes(n_rows, rows, units)
        limit = _pow2_floor(min(self.max_invocations, self.max_size[0]))
        lanes = min(int(lanes), limit)
        teams = cfg.get("teams")
        if teams is None:
            teams = max(1, 128 // lanes)
        teams = max(1, min(int(teams), limit // lanes))
        wg = lanes * teams
        while _qmatvec_reduce_bytes(wg, rows) > self.max_shared and teams > 1:
            teams //= 2
            wg = lanes * teams
        while _qmatvec_reduce_bytes(wg, rows) > self.max_shared and rows > 1:
            rows //= 2
        reduce = cfg.get("reduce") or ("subgroup" if self.use_subgroups else "tree")
        variant = "sg" if reduce == "subgroup" else "tree"
        dot = cfg.get("dot")
        if dot is None:
            dot = (self.QMATVEC_DOT and self.has_int_dot and not cfg.get("staged")
                   and n_rows * n_cols >= self.QMATVEC_DOT_MIN_ELEMS)
        plan = {"rows": teams * rows}
        if dot:
            kind = "dotl" if cfg.get("xq", self.QMATVEC_XQ) == "lane" else "dot"
            if kind == "dot":
                plan.update(uses_xq=True, xq_bytes=self.qmatvec_xq_bytes(n_cols))
            return QMatvecKernel(f"qmatvec_fast.{name}.{kind}.{variant}.spv", (wg, lanes, rows), PUSH_QMATVEC, **plan)
        chunk = None
        if cfg.get("staged", self.QMATVEC_STAGED):
            chunk = self.qmatvec_chunk(dtype, n_cols, teams * rows, wg, rows, cfg.get("chunk"),
                                       (cfg.get("tile_kib") or self.QMATVEC_TILE_KIB) << 10)
        if chunk is None:
            return QMatvecKernel(f"qmatvec_fast.{name}.{variant}.spv", (wg, lanes, rows), PUSH_QMATVEC, **plan)
        return QMatvecKernel(f"qmatvec_fast.{name}.staged.{variant}.spv", (wg, lanes, rows, chunk), PUSH_QMATVEC,
                             **plan)

    #: whether the automatic choice stages weights through shared memory where it can
    QMATVEC_STAGED = False
    #: whether the automatic choice of the fast kernel takes its integer-dot variant (where the
    #: device has shaderIntegerDotProduct): faster than exact fp32 decoding at a held clock
    #: (docs/kernel-choices.md)
    QMATVEC_DOT = True
    #: the automatic choice keeps exact fp32 decoding below this many weights: small products
    #: are bound by latency, not decoding, and a few rows' NMSE is one row's relative error,
    #: which x's 16-bit quantization can push past 1e-8 where a row's sum nearly cancels
    QMATVEC_DOT_MIN_ELEMS = 1 << 20
    #: how the integer-dot kernels get quantized x: "dispatch" (qmatvec_xq first, the faster one
    #: measured, docs/kernel-choices.md) or "lane" (in registers, per unit; not yet timed on a GPU)
    QMATVEC_XQ = "dispatch"

    # -- packed weights (shaders/qmatvec_pack.comp, qmatvec_packed.comp) ---------------------------
    #: the automatic choice of weight layout where no ``layout`` knob is set: "gguf" (the GGUF
    #: kernels read the weights as they are) or "packed" (QMATVEC_PACKED_AUTO_DTYPES on GPUs with
    #: integer dot products and subgroups, from QMATVEC_DOT_MIN_ELEMS weights, with the knob-free
    #: kernel choices): "packed", faster than the GGUF kernels for every format and shape timed
    #: on the H200 (docs/kernel-choices.md), at the price of a repacked copy of each weight buffer
    #: in device memory (made on its first use)
    QMATVEC_LAYOUT = "packed"

    def _qmatvec_layout(self, dtype: DType, n_cols: int, n_rows: int, n_vecs: int = 1) -> str:
        cfg = self.qmatvec_config
        if "layout" in cfg:
            return cfg["layout"]
        plain = not ({"kernel", "staged", "dot", "xq", "teams"} & set(cfg))  # the other knobs pick GGUF kernels
        # batches: every packed format, since its kernel takes all vectors in one pass over the
        # weights where the GGUF kernels take one vector per pass (Q4_K: 117 against 40 us for
        # Q4_0 at 4 vectors on the H100, docs/kernel-choices.md)
        packs = QMATVEC_PACKED_AUTO_DTYPES if n_vecs == 1 else QMATVEC_PACKED_DTYPES
        if (self.QMATVEC_LAYOUT == "packed" and plain and dtype in packs
                and self.qmatvec_fast_ok(dtype) and self.has_int_dot and n_rows * n_cols >= self.QMATVEC_DOT_MIN_ELEMS):
            return "packed"
        return "gguf"

    #: the automatic launch shape of qmatvec_packed.comp: lanes per row team, rows per team,
    #: teams per workgroup, units per row loaded before decoding (docs/kernel-choices.md)
    QMATVEC_PACKED_SHAPE = {"lanes": 32, "teams": 16, "per_cu": 0, "xq": "workgroup"}
    #: rows per team and units loaded ahead: (rows, unroll) for rows of fewer than LONG_ROW_UNITS
    #: units of 32 weights, and for longer rows (fewer, longer rows: fewer rows in flight, more
    #: units of each); the H200's fastest (docs/kernel-choices.md)
    QMATVEC_PACKED_ROWS = {"short": (4, 1), "long": (2, 2)}
    QMATVEC_PACKED_LONG_ROW_UNITS = 256
    #: (format, rows) where one vector's workgroups quantize x before their first loads: Q8_0's
    #: first batch of short rows held 96 registers a lane, one workgroup per SM of the H100, and
    #: was 1.7 us slower than without it, twice (docs/kernel-choices.md)
    QMATVEC_PACKED_NO_PREFETCH = {(DType.Q8_0, "short")}
    #: (format, "short" | "long" rows, "one" vector or a "batch") whose packed kernel lets only its even
    #: teams load before x is quantized (the shader's variants *.stagger.*; the ``stagger`` knob), so that
    #: a workgroup's teams step out of phase: one vector of long rows (one workgroup per SM), where it was
    #: 0.25-1.1 us faster for every format on the H100; short rows gained for Q4_0 only, within the spread,
    #: and lost for Q4_K and Q6_K (docs/kernel-choices.md)
    QMATVEC_PACKED_STAGGER: frozenset = frozenset(
        (dtype, "long", "one") for dtype in (DType.Q4_0, DType.Q8_0, DType.Q4_K, DType.Q6_K))
    #: the automatic choice shrinks the teams per workgroup (small matrices) until the grid has at
    #: least this many workgroups per compute unit (or 64 workgroups where the device does not say
    #: how many units it has): fewer, fuller workgroups were faster than two per unit on the H200
    #: (docs/kernel-choices.md)
    QMATVEC_PACKED_MIN_GROUPS_PER_CU = 0.5
    #: where 16-bit x (several vectors, or long rows) does not fit whole in shared memory, each
    #: workgroup quantizes it chunk by chunk (no second dispatch, x read from L2 once per workgroup)
    #: where a chunk holds at least this many columns; shorter chunks (a barrier pair each, all
    #: teams waiting) lost to x from a first dispatch, read by every team from L2/L1
    #: (docs/kernel-choices.md)
    QMATVEC_PACKED_MIN_X_CHUNK = 4096
    #: (vectors, teams): from this many vectors on, this many teams per workgroup (256 invocations
    #: of up to 255 registers: two workgroups per H100 SM where 16 teams of 128 registers got one):
    #: 8 vectors of Q4_0 46.6 / 50.9 us against 50.3 / 53.7 with 16 teams, torch fp16 mm 50.9 / 50.7
    #: (docs/kernel-choices.md)
    QMATVEC_PACKED_BATCH_TEAMS = (8, 8)
    #: (format, row class, "one" vector or a "batch" of QMATVEC_PACKED_BATCH_TEAMS' vectors and more)
    #: -> exceptions to the automatic teams, rows per team and units ahead, each timed faster on the
    #: H100 where the driver's registers had left one workgroup per SM (docs/kernel-choices.md):
    #: batches of short rows in 4 teams (Q8_0's 8 teams already had two per SM), Q4_K's long rows 2
    #: a team one unit ahead (128 registers where 175); one vector of Q6_K's short rows 2 a team,
    #: of Q4_K's short rows 8 teams, of its long rows 2 a team one unit ahead
    QMATVEC_PACKED_FORMAT_SHAPES = {
        (DType.Q4_0, "short", "batch"): {"teams": 4},
        (DType.Q4_K, "short", "batch"): {"teams": 4},
        (DType.Q6_K, "short", "batch"): {"teams": 4},
        (DType.Q4_K, "long", "batch"): {"rows": 2, "unroll": 1},
        (DType.Q6_K, "short", "one"): {"rows": 2},
        (DType.Q4_K, "short", "one"): {"teams": 8},
        (DType.Q4_K, "long", "one"): {"rows": 2, "unroll": 1},
    }

    #: splits of each row of the packed kernel (knob ``splits``): where a matrix has fewer row groups
    #: than this many per compute unit, its rows are split (each split at least
    #: QMATVEC_PACKED_SPLIT_MIN_STEPS of its teams' batches long) until it has about that many
    #: workgroups (0: never split automatically)
    QMATVEC_PACKED_SPLIT_GROUPS_PER_CU = 0.0
    QMATVEC_PACKED_SPLIT_MIN_STEPS = 2
    #: who adds the splits' partial sums: "dispatch" (qmatmul_coop_io's sum, a second dispatch) or
    #: "last" (the last split of each row group, in the kernel: variants *.last.*, 16-bit x, subgroup sums)
    QMATVEC_PACKED_SPLIT_SUM = "dispatch"

    def _qmatvec_packed_splits(self, nu: int, n_rows: int, group_rows: int, step: int,
                               knob: int | None) -> tuple[int, int]:
        """(splits, units per split) of rows of ``nu`` units: the ``splits`` knob, else
        QMATVEC_PACKED_SPLIT_GROUPS_PER_CU's rule; a split is whole team steps (``step`` units) where
        the row has several, and no split is empty."""
        if knob is None:
            want = self.QMATVEC_PACKED_SPLIT_GROUPS_PER_CU * (self.compute_units["count"] if self.compute_units else 0)
            groups = _ceil_div(n_rows, group_rows)
            knob = max(1, min(math.ceil(want / groups) if groups < want else 1,
                              nu // (step * self.QMATVEC_PACKED_SPLIT_MIN_STEPS)))
        spu = _ceil_div(nu, int(knob))
        if spu > step:
            spu = _ceil_div(spu, step) * step
        splits = _ceil_div(nu, spu)
        if splits > self.max_count[2]:
            raise ValueError(f"quantized_matmul: {splits} splits of each row exceed the device's grid limit "
                             f"{self.max_count[2]} in z")
        return splits, spu

    #: ("one" vector, "batch" of vectors) where the packed kernel spreads the rows evenly over a whole
    #: number of workgroups per compute unit (knob ``balance``; the shader's BALANCE) where the device
    #: reports its compute units: one vector, 0.1-0.8 us faster in 7 of 8 cases on the H100, where 224
    #: row groups had left 40 SMs one workgroup and 92 two; batches mixed (docs/kernel-choices.md)
    QMATVEC_PACKED_BALANCE = frozenset({"one"})

    def _qmatvec_packed_balance(self, n_rows: int, rows: int, teams: int, splits: int, capped: bool,
                                vecs: str) -> int:
        """Workgroups of the balanced grid (0: the grid of whole row groups): the fewest whole
        number per compute unit whose teams cover the matrix's blocks of ``rows`` rows; ``vecs``: "one"
        vector or a "batch" (QMATVEC_PACKED_BALANCE's keys)."""
        asked = self.qmatvec_config.get("balance")
        if not (vecs in self.QMATVEC_PACKED_BALANCE if asked is None else asked):
            return 0
        units = asked if type(asked) is int else self.compute_units["count"] if self.compute_units else 0
        why = ("its rows are split over workgroups" if splits > 1 else
               "the per_cu or groups knob caps the grid" if capped else
               "the device does not report its compute units (balance=N takes N)" if not units else "")
        blocks = _ceil_div(n_rows, rows)
        groups = 0 if why else min(blocks, _ceil_div(_ceil_div(blocks, teams), units) * units)
        if groups and blocks * groups >= 1 << 32:
            why = f"{blocks} blocks of rows x {groups} workgroups overflow the shader's 32-bit arithmetic"
        if why:
            if asked:
                raise ValueError(f"quantized_matmul: balance=True cannot be had here: {why}")
            return 0
        return groups

    def split_sum(self) -> Kernel:
        """The kernel that adds the splits' partial sums of a split quantized matmul into y
        (qmatmul_coop_io.comp's sum variant: y[i] = sum over s of part[s * n + i])."""
        return Kernel("qmatmul_coop_io.sum.spv", (self.wg, 0), PUSH_QMATMUL_COOP_SUM)

    def _qmatvec_packed(self, dtype: DType, n_cols: int, n_rows: int, nx: int = 1) -> QMatvecKernel:
        cfg = self.qmatvec_config
        auto = self.QMATVEC_PACKED_SHAPE
        blocks = n_cols // 32  # x's blocks of 32, one scale each (the packed kernels' units; Q4_K's are 2 of them)
        limit = _pow2_floor(min(self.max_invocations, self.max_size[0]))
        lanes = min(int(cfg.get("lanes") or auto["lanes"]), limit)
        # variant sg sums a team's lanes with subgroup shuffles
        subgroup = self.has_shuffle and cfg.get("reduce", "subgroup") == "subgroup"
        if cfg.get("reduce") == "subgroup" and not self.has_shuffle:
            raise ValueError("quantized_matmul: the packed kernel's reduce='subgroup' needs subgroup shuffles, "
                             "which this device lacks")
        if subgroup and lanes > self.subgroup_size and lanes % self.subgroup_size:
            raise ValueError(f"quantized_matmul: {lanes} lanes per team is not a whole number of "
                             f"{self.subgroup_size}-wide subgroups")
        row_class = "long" if blocks >= self.QMATVEC_PACKED_LONG_ROW_UNITS else "short"
        auto_rows, auto_unroll = self.QMATVEC_PACKED_ROWS[row_class]
        from_vecs, batch_teams = self.QMATVEC_PACKED_BATCH_TEAMS
        vecs = "one" if nx == 1 else "batch"  # the keys of the automatic balance and stagger choices
        vec_class = vecs if nx == 1 or nx >= from_vecs else ""  # FORMAT_SHAPES' batches: from_vecs and more
        shape = self.QMATVEC_PACKED_FORMAT_SHAPES.get((dtype, row_class, vec_class), {})
        auto_rows, auto_unroll = shape.get("rows", auto_rows), shape.get("unroll", auto_unroll)
        prefetch = cfg.get("prefetch")
        if prefetch is None:
            prefetch = nx > 1 or (dtype, row_class) not in self.QMATVEC_PACKED_NO_PREFETCH
        # at most a sum (row, vector) per lane where it can be: every lane holds all of its team's
        # sums, and more rows than that only spend registers (many vectors: one row, lanes write
        # several sums each)
        rows = max(1, min(int(cfg.get("rows") or auto_rows), max(1, lanes // nx)))
        unroll = int(cfg.get("unroll") or auto_unroll)
        auto_teams = shape.get("teams", batch_teams if nx >= from_vecs else auto["teams"])
        teams = max(1, min(int(cfg.get("teams") or auto_teams), limit // lanes))
        if not cfg.get("teams"):  # small matrices: fewer teams, so that every compute unit gets work
            want = (self.compute_units["count"] * self.QMATVEC_PACKED_MIN_GROUPS_PER_CU if self.compute_units
                    else 64)
            while teams > 1 and _ceil_div(n_rows, teams * rows) < want:
                teams //= 2
        wg = lanes * teams
        if subgroup and wg % self.subgroup_size:
            teams = _ceil_div(self.subgroup_size, lanes)  # whole subgroups per workgroup
            wg = lanes * teams
        xq = cfg.get("xq") or auto["xq"]
        x_bits = int(cfg.get("x_bits") or 16)
        ux = 2 if dtype == DType.Q4_K else 1  # x's blocks of 32 per unit of the kernel
        nu = blocks // ux  # units per row
        splits, spu = self._qmatvec_packed_splits(nu, n_rows, rows * teams, lanes * unroll, cfg.get("splits"))

        def part_floats(rows: int, wg: int) -> int:  # the reduction's shared array (the shader's PART)
            if not subgroup:
                return wg  # tree: a slot per lane, reused for each sum
            return rows * nx * wg // self.subgroup_size if lanes > self.subgroup_size else 1

        def room_units(rows: int, wg: int) -> int:  # units of every vector's x that fit beside the partial sums
            return (self.max_shared - 4 * part_floats(rows, wg)) // (nx * ux * self.qmatvec_xwg_bytes(32, x_bits))

        def fits(rows: int, wg: int) -> bool:
            return room_units(rows, wg) >= 1 if xq == "workgroup" else 4 * part_floats(rows, wg) <= self.max_shared

        def auto_chunk(room: int) -> int:  # whole teams' steps per chunk where they fit, so no lane idles in one
            step = lanes * unroll
            return min(nu, room // step * step or room // lanes * lanes or room)

        room = room_units(rows, wg)
        if (xq == "workgroup" and "xq" not in cfg and x_bits == 16 and room < spu
                and 32 * ux * auto_chunk(room) < self.QMATVEC_PACKED_MIN_X_CHUNK):
            xq = "dispatch"  # short chunks of x: a first dispatch quantizes it instead
        while rows > 1 and not fits(rows, wg):
            rows //= 2
        min_teams = _ceil_div(self.subgroup_size, lanes) if subgroup else 1
        while not cfg.get("teams") and teams > min_teams and not fits(rows, wg):
            teams //= 2
            wg = lanes * max(teams, min_teams)
        teams = max(teams, min_teams)
        if not fits(rows, wg):
            raise ValueError(f"quantized_matmul: the packed kernel's {wg} lanes x {rows * nx} sums need "
                             f"{4 * part_floats(rows, wg)} bytes of shared memory"
                             + (f" beside one unit of x ({nx} vector(s))" if xq == "workgroup" else "")
                             + f"; the device has {self.max_shared}")
        chunk = nu  # units of x per chunk held in shared memory (variants xwg, xwg8)
        if xq == "workgroup":
            room = room_units(rows, wg)
            if cfg.get("x_chunk"):
                chunk = int(cfg["x_chunk"]) // (32 * ux)
                if int(cfg["x_chunk"]) % (32 * ux):
                    raise ValueError(f"quantized_matmul: x_chunk={cfg['x_chunk']} is not a positive multiple of "
                                     f"{32 * ux} columns (the {dtype.name} kernel's unit)")
                if min(chunk, spu) > room:
                    raise ValueError(f"quantized_matmul: x_chunk={cfg['x_chunk']} columns of {nx} vector(s) do not "
                                     f"fit in shared memory beside the partial sums: at most {32 * ux * room}")
            elif room < spu:  # else all of the split's x, held whole
                chunk = auto_chunk(room)
            chunk = min(chunk, spu)
        reduce = "sg" if subgroup else "tree"
        last = splits > 1 and cfg.get("split_sum", self.QMATVEC_PACKED_SPLIT_SUM) == "last"
        if last and (not subgroup or x_bits == 8 or xq == "lane"):
            if cfg.get("split_sum") == "last":
                raise ValueError("quantized_matmul: split_sum='last' has variants for 16-bit x with subgroup "
                                 "sums, x from a dispatch or held by each workgroup, only"
                                 + ("" if subgroup else " (this kernel sums by a shared-memory tree)"))
            last = False  # the automatic choice: the second dispatch there
        if last:
            reduce = "last." + reduce
        stagger = cfg.get("stagger")
        if stagger is None:
            stagger = (dtype, row_class, vecs) in self.QMATVEC_PACKED_STAGGER
        if stagger and (reduce != "sg" or x_bits == 8 or xq != "workgroup"):
            if cfg.get("stagger"):
                raise ValueError("quantized_matmul: stagger has variants for 16-bit x held by each workgroup "
                                 "(xq='workgroup'), with subgroup sums, rows unsplit or summed by a second "
                                 "dispatch only")
            stagger = False  # the automatic choice: the kernel without it there
        if stagger:
            reduce = "stagger." + reduce
        plan = {"rows": rows * teams, "packed": True,
                "packed_bytes": self.qmatvec_packed_bytes(dtype, n_rows, n_cols)}
        per_cu = cfg.get("per_cu", auto["per_cu"])
        if cfg.get("groups"):
            plan["max_groups"] = int(cfg["groups"])
        elif per_cu and self.compute_units:  # whole waves: as many workgroups as the device holds at once
            cu = self.compute_units
            plan["max_groups"] = cu["count"] * max(1, min(int(per_cu), cu["threads"] // wg))
        plan["vectors"] = nx
        plan["splits"] = splits
        plan["split_last"] = last
        plan["balanced_groups"] = self._qmatvec_packed_balance(n_rows, rows, teams, splits, "max_groups" in plan,
                                                               vecs)
        spec = (wg, rows, chunk * ux if xq == "workgroup" else blocks, lanes, unroll, int(prefetch), nx,
                part_floats(rows, wg), spu if splits > 1 else 0, int(bool(plan["balanced_groups"])))
        # where x comes from names the variant: held by each workgroup, quantized by each lane (x bound
        # itself either way), or quantized by a first qmatvec_xq dispatch (no tag)
        x_tag = {"workgroup": "xwg8." if x_bits == 8 else "xwg.", "lane": "xlane."}.get(xq, "")
        if not x_tag:
            plan.update(uses_xq=True, xq_bytes=self.qmatvec_xq_bytes(nx * n_cols))
        return QMatvecKernel(f"qmatvec_packed.{QMATVEC_DTYPES[dtype]}.{x_tag}{reduce}.spv", spec, PUSH_QMATVEC,
                             **plan)

    # -- batches on cooperative matrices (shaders/qmatmul_coop.comp) -------------------------------
    #: formats qmatmul_coop.comp decodes (from the packed layout)
    QMATMUL_COOP_DTYPES = frozenset({DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K})
    #: the automatic choice takes the cooperative-matrix kernel from this many vectors (None: only
    #: where the ``coop`` knob asks for it)
    QMATMUL_COOP_MIN_VECS: int | None = None
    #: most vectors one dispatch takes (two B columns each)
    QMATMUL_COOP_MAX_VECS = 32
    #: (subgroups per workgroup, blocks of 32 per step): 32 rows a workgroup, 2 blocks a step, with B
    #: and one stage 6.9 KiB of shared memory, so that 4 workgroups share an H100 SM where round 7's
    #: 39 KiB left one (the fastest of the shapes timed: README, performance round 8)
    QMATMUL_COOP_SHAPE = (2, 2)
    #: each step's slice of x (the B operand) staged in shared memory beside the weights, not loaded
    #: into the matrices from global memory (the ``coop_bshared`` knob; loading B from global memory
    #: cost a third of the time on an H100: README, performance round 7)
    QMATMUL_COOP_B_SHARED = True
    #: shared-memory stages: 2 (the next step decoded while this one is multiplied, one barrier a step)
    #: or 1 (half the memory, so longer steps fit; two barriers a step) (the ``coop_stages`` knob)
    QMATMUL_COOP_STAGES = 1
    #: steps whose weight loads are in flight at once: 1 (the next step's, issued before this one is
    #: multiplied) or 2 (two register sets; the ``coop_depth`` knob; 2 saved 4-18% on the H100, round 8)
    QMATMUL_COOP_DEPTH = 2
    #: accumulators per 16-column tile: 1, 2 (the hi and lo planes' products apart) or 4 (even and odd
    #: k-slices apart too), so that a step's products are not one dependent chain (the ``coop_accs`` knob;
    #: 2 and 4 were no faster on the H100: README, performance round 8)
    QMATMUL_COOP_ACCS = 1
    #: splits along the rows until the grid has this many workgroups per compute unit (16 units
    #: where the device does not say how many it has), each split at least QMATMUL_COOP_MIN_STEPS steps
    #: long: under the 4 workgroups an H100 SM held of the default shape, so that none waits for a
    #: second wave (README, performance round 8)
    QMATMUL_COOP_GROUPS_PER_CU = 2.5
    QMATMUL_COOP_MIN_STEPS = 4

    def qmatmul_coop_unsupported(self, dtype: DType, n_vecs: int) -> str:
        """Why qmatmul_coop.comp cannot take this product here ("" when it can)."""
        if dtype not in self.QMATMUL_COOP_DTYPES:
            return f"qmatmul_coop has no {dtype.name} decoder (it takes {sorted(d.name for d in self.QMATMUL_COOP_DTYPES)})"
        if not 1 <= n_vecs <= self.QMATMUL_COOP_MAX_VECS:
            return f"qmatmul_coop takes 1 to {self.QMATMUL_COOP_MAX_VECS} vectors, not {n_vecs}"
        if self.coop_emulate:
            feats = self.props.get("features", {})
            ok = feats.get("subgroup_basic") and self.subgroup_size >= 8
            return "" if ok else "the emulated cooperative-matrix kernel needs subgroups of >= 8 invocations"
        return self.matmul_f16_unsupported("f16")

    def qmatmul_coop(self, dtype: DType, n_cols: int, n_rows: int, n_vecs: int) -> QMatmulCoopPlan | None:
        """The cooperative-matrix plan for a batch where the ``coop`` knob or the automatic choice
        (QMATMUL_COOP_MIN_VECS) takes it, else None.  ValueError where the knob asks for it and the
        device or the product cannot have it."""
        cfg = self.qmatvec_config
        want = cfg.get("coop")
        if want is None:
            want = (self.QMATMUL_COOP_MIN_VECS is not None and n_vecs >= self.QMATMUL_COOP_MIN_VECS
                    and self._qmatvec_layout(dtype, n_cols, n_rows, n_vecs) == "packed"
                    and not self.qmatmul_coop_unsupported(dtype, n_vecs))
            if not want:
                return None
        elif not want:
            return None
        why = self.qmatmul_coop_unsupported(dtype, n_vecs)
        if why:
            raise ValueError(f"quantized_matmul: coop=True: {why}")
        nsg = int(cfg.get("coop_subgroups") or self.QMATMUL_COOP_SHAPE[0])
        unroll = int(cfg.get("coop_unroll") or self.QMATMUL_COOP_SHAPE[1])
        tiles = _ceil_div(2 * n_vecs, 16)
        bshared = bool(cfg.get("coop_bshared", self.QMATMUL_COOP_B_SHARED))
        stages = int(cfg.get("coop_stages") or self.QMATMUL_COOP_STAGES)
        depth = int(cfg.get("coop_depth") or self.QMATMUL_COOP_DEPTH)
        accs = int(cfg.get("coop_accs") or self.QMATMUL_COOP_ACCS)

        def shared_bytes(nsg: int, unroll: int) -> int:
            """Bytes: the stages of hi and lo planes (and B's slice), or the C tiles and Q4_K's mins."""
            mins = _ceil_div(16 * nsg * unroll * n_vecs, 4) if dtype == DType.Q4_K else 0
            stage = (2 * 16 * nsg + bshared * 16 * tiles) * (4 * unroll + 1)
            return 16 * max(stages * stage, nsg * tiles * 64 + mins)

        # the automatic shape shrinks to the device: fewer rows per workgroup first, then shorter steps
        while "coop_subgroups" not in cfg and nsg > 1 and shared_bytes(nsg, unroll) > self.max_shared:
            nsg //= 2
        while "coop_unroll" not in cfg and unroll > 1 and shared_bytes(nsg, unroll) > self.max_shared:
            unroll -= 1
        wg = nsg * self.subgroup_size
        if wg > min(self.max_invocations, self.max_size[0]):
            raise ValueError(f"quantized_matmul: coop_subgroups={nsg} makes {wg} invocations, beyond the device's "
                             f"{min(self.max_invocations, self.max_size[0])}")
        bm = 16 * nsg
        shared = shared_bytes(nsg, unroll)
        if shared > self.max_shared:
            raise ValueError(f"quantized_matmul: qmatmul_coop with {nsg} subgroups, {unroll} blocks a step and "
                             f"{n_vecs} vectors needs {shared} bytes of shared memory; the device has {self.max_shared}")
        nb = n_cols // 32
        groups = _ceil_div(n_rows, bm)
        splits = cfg.get("coop_splits")
        if splits is None:
            cu = self.compute_units["count"] if self.compute_units else 16
            splits = max(1, min(math.ceil(self.QMATMUL_COOP_GROUPS_PER_CU * cu / groups),
                                nb // (unroll * self.QMATMUL_COOP_MIN_STEPS)))
        bps = _ceil_div(_ceil_div(nb, int(splits)), unroll) * unroll
        splits = _ceil_div(nb, bps)
        if groups > self.max_count[0] or splits > self.max_count[1]:
            raise ValueError(f"quantized_matmul: qmatmul_coop's {groups} x {splits} grid exceeds the device's limits")
        variant = "emulated" if self.coop_emulate else "khr"
        name = QMATVEC_DTYPES[dtype]
        io_wg = min(256, self.wg)
        return QMatmulCoopPlan(
            main=Kernel(f"qmatmul_coop.{name}.{variant}.spv",
                        (wg, nsg, unroll, tiles, n_vecs, int(bshared), stages, depth, accs), PUSH_QMATMUL_COOP),
            prep=Kernel("qmatmul_coop_io.x.spv", (io_wg, 1 if dtype == DType.Q4_0 else 0, int(dtype == DType.Q4_K)),
                        PUSH_QMATMUL_COOP_X),
            rows=bm, splits=splits, bps=bps, kp8=splits * bps * 4, tiles=tiles,
            packed_bytes=self.qmatvec_packed_bytes(dtype, n_rows, n_cols))

    def qmatvec_pack(self, dtype: DType) -> Kernel:
        """The kernel that repacks GGUF ``dtype`` weights for qmatvec_packed (one invocation per
        pair of blocks, K formats' blocks of 256 included)."""
        return Kernel(f"qmatvec_pack.{QMATVEC_DTYPES[dtype]}.spv", (self.wg,), PUSH_QMATVEC_PACK)

    @staticmethod
    def qmatvec_packed_bytes(dtype: DType, n_rows: int, n_cols: int) -> int:
        """Bytes of repacked weights: the GGUF quants 16-byte aligned, then the fp16 scales (a
        word per pair of blocks); Q4_K: 128 quant bytes, 16 bytes of 6-bit scales and mins
        unpacked to bytes and a d / dmin word per block (shaders/qmatvec_pack.comp)."""
        if dtype not in QMATVEC_PACKED_DTYPES:
            raise ValueError(f"quantized_matmul: {dtype.name} has no packed layout")
        blocks = n_rows * (n_cols // dtype.block_elems)
        if dtype == DType.Q4_K:
            return blocks * (128 + 16 + 4)
        return blocks * (dtype.block_bytes - 2) + 4 * _ceil_div(blocks, 2)

    @staticmethod
    def qmatvec_xwg_bytes(n_cols: int, x_bits: int = 16) -> int:
        """Shared memory of x quantized by each workgroup of qmatvec_packed.comp (variants xwg,
        xwg8): per block of 32, 32 lo and 32 hi bytes (x_bits 8: 32 bytes), the scale and two sums
        of q."""
        return (76 if x_bits == 16 else 44) * (n_cols // 32)

    @staticmethod
    def qmatvec_xq_bytes(n_cols: int) -> int:
        """Bytes of quantized x (shaders/qmatvec_xq.comp): 2 bytes per element, 4 per 32."""
        return 17 * 4 * (n_cols // 32)

    def qmatvec_xq(self) -> Kernel:
        """The kernel that quantizes x for the integer-dot variants (one invocation per 4 elements)."""
        return Kernel("qmatvec_xq.spv", (self.wg,), PUSH_QMATVEC_XQ)
    #: KiB of weights one workgroup of a staged qmatvec_fast kernel holds in shared memory
    QMATVEC_TILE_KIB = 16

    def qmatvec_chunk(self, dtype: DType, n_cols: int, group_rows: int, wg: int, rows: int,
                      chunk: int | None = None, tile_bytes: int = QMATVEC_TILE_KIB << 10) -> int | None:
        """Blocks per row of one staged chunk, or None where the staged kernel cannot run: its
        16-byte loads need chunks (hence rows) of a multiple of 16 bytes, it needs a whole
        number of chunks per row, and its tile must fit in shared memory beside the reduction's
        arrays. ``chunk`` (a request) is kept if valid; otherwise the largest chunk whose tile
        is at most ``tile_bytes`` (the smallest if none is)."""
        bb, be = dtype.block_bytes, dtype.block_elems
        nb = n_cols // be
        step = 16 // math.gcd(bb, 16)  # blocks per 16-byte-aligned chunk

        def fits(cb: int) -> bool:
            shared = group_rows * cb * bb + _qmatvec_reduce_bytes(wg, rows)
            return nb % cb == 0 and cb % step == 0 and shared <= self.max_shared

        if n_cols % be or nb == 0:
            return None
        if chunk is not None:
            return chunk if fits(chunk) else None
        best = None
        for cb in range(step, nb + 1, step):
            if fits(cb) and (best is None or group_rows * cb * bb <= tile_bytes):
                best = cb
        return best


def describe_policy(policy: KernelPolicy) -> dict[str, Any]:
    """The choices a policy made (for reports and debugging)."""
    return {
        "workgroup": policy.wg,
        "matmul_tile": policy.matmul_tile,
        "matmul_group_m": policy.matmul_group_m,
        "matmul_stages": policy.matmul_stages,
        "matmul_warp_n": policy.matmul_warp_n,
        "matmul_split": policy.matmul_split,
        "matmul_f16_tile": policy.matmul_f16_tile,
        "matmul_f16_path": policy.matmul_f16_path(),
        "subgroups": policy.use_subgroups,
        "subgroup_size": policy.subgroup_size,
        "single_group_limit": policy.single_group_limit,
        "max_grid": policy.max_count,
    }
