"""The Vulkan kernel table: which shipped SPIR-V runs each op, with which local sizes.

Every shader in ``shaders/`` takes its local size from specialization constant 0 (and 1 for a
second dimension), so one SPIR-V serves every device; :class:`KernelPolicy` picks the sizes,
tile shapes and work splits from the device's properties (max invocations, shared memory,
subgroup support, grid limits).  The push-constant layouts here mirror the shaders' blocks
member by member.  Nothing here touches a device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from kbench.quant import DType

SPV_DIR = Path(__file__).resolve().parent.parent / "spv"


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
PUSH_QMATVEC = _push(("n_rows", "u"), ("n_cols", "u"), ("row_bytes", "u"))
PUSH_COPY = _push(("src_off", "u"), ("dst_off", "u"), ("count", "u"))

#: quantized_matmul weight formats with a Vulkan kernel (qmatvec.<name>.*.spv)
QMATVEC_DTYPES: Mapping[DType, str] = {
    DType.F32: "f32", DType.F16: "f16", DType.BF16: "bf16",
    DType.Q4_0: "q4_0", DType.Q4_1: "q4_1", DType.Q5_0: "q5_0", DType.Q5_1: "q5_1",
    DType.Q8_0: "q8_0", DType.Q4_K: "q4_k", DType.Q5_K: "q5_k", DType.Q6_K: "q6_k",
}

_K_FORMATS = frozenset({DType.Q4_K, DType.Q5_K, DType.Q6_K})


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

    def spirv(self) -> bytes:
        return load_spirv(self.spv)

    def push_record(self, *values: Any) -> np.ndarray:
        """A one-record structured array holding ``values`` in block order."""
        return np.array([tuple(values)], dtype=self.push)


@functools.lru_cache(maxsize=None)
def load_spirv(name: str) -> bytes:
    """Bytes of kbench/spv/<name>; a clear error when the shaders were never built."""
    path = SPV_DIR / name
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shipped SPIR-V {path} is missing; run `python scripts/build_shaders.py`"
        ) from None


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ReductionPlan:
    """How softmax / rms_norm split a vector: one workgroup, or partial + combine + normalize."""

    single: bool
    chunk: int  # elements per partial workgroup
    n_parts: int  # partial workgroups


@dataclass(frozen=True)
class AttnValuePlan:
    kernel: Kernel
    chunk: int  # keys per workgroup row
    n_chunks: int


class KernelPolicy:
    """Chooses kernels and launch shapes from a device's properties (``get_device_properties``).

    Options: ``use_subgroups`` (None: when the device has subgroup arithmetic),
    ``matmul_tile`` = (BM, BN, BK, TM, TN), ``single_group_limit`` (largest softmax/rms_norm
    size done by one workgroup), ``grid_limit`` (cap on the grid's x dimension, below the
    device's maxComputeWorkGroupCount[0]; exercises the spread-over-y path in tests).
    """

    def __init__(self, props: Mapping[str, Any], *, use_subgroups: bool | None = None,
                 matmul_tile: tuple[int, int, int, int, int] | None = None,
                 single_group_limit: int = 8192, grid_limit: int | None = None):
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
        has_subgroups = bool(feats.get("subgroup_basic")) and bool(feats.get("subgroup_arithmetic")) \
            and str(props.get("api_version", "1.0")) >= "1.1"
        if use_subgroups and not has_subgroups:
            from kbench.runtime import UnsupportedFeatureError

            raise UnsupportedFeatureError(
                f"use_subgroups=True but {props.get('device_name')} lacks subgroup arithmetic in compute "
                "shaders (or Vulkan 1.1)", "subgroup arithmetic operations")
        self.use_subgroups = has_subgroups if use_subgroups is None else bool(use_subgroups)
        # the default 1-D workgroup: 256 invocations where allowed (Vulkan guarantees 128)
        self.wg = _pow2_floor(min(256, self.max_invocations, self.max_size[0]))
        self.single_group_limit = int(single_group_limit)
        self.matmul_tile = self._pick_matmul_tile(matmul_tile)
        # the ops ask for the same few kernels over and over: memoize per instance
        for name in ("elementwise", "copy", "reduction", "reduction_plan", "matmul", "rope", "attn_score",
                     "attn_value", "attn_combine", "qmatvec", "grid_1d"):
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
    def _pick_matmul_tile(self, tile) -> tuple[int, int, int, int, int]:
        if tile is None:
            # 128x128 tiles with 8x8 outputs per invocation on GPUs; smaller on CPU drivers,
            # where large register tiles only spill
            big = (128, 128, 16, 8, 8)
            small = (64, 64, 16, 4, 4)
            tile = small if self.is_cpu else big
            if not self._tile_fits(tile):
                tile = small
            if not self._tile_fits(tile):
                tile = (32, 32, 8, 4, 4)
        tile = tuple(int(v) for v in tile)
        if len(tile) != 5 or not self._tile_fits(tile):
            raise ValueError(
                f"matmul_tile {tile!r} does not fit this device (TM divides BM, TN divides BN, "
                f"(BM/TM)*(BN/TN) <= {self.max_invocations} invocations, "
                f"4*BK*(BM+BN) <= {self.max_shared} bytes of shared memory)"
            )
        return tile  # type: ignore[return-value]

    def _tile_fits(self, tile) -> bool:
        """The constraints of shaders/matmul.comp and the device's limits."""
        bm, bn, bk, tm, tn = tile
        if min(tile) <= 0 or bm % tm or bn % tn:
            return False
        threads = (bm // tm) * (bn // tn)
        return threads <= min(self.max_invocations, self.max_size[0]) and 4 * bk * (bm + bn) <= self.max_shared

    def matmul(self) -> Kernel:
        bm, bn, bk, tm, tn = self.matmul_tile
        return Kernel("matmul.spv", ((bm // tm) * (bn // tn), bm, bn, bk, tm, tn), PUSH_MATMUL)

    def matmul_grid(self, m: int, n: int) -> tuple[int, int, int]:
        bm, bn = self.matmul_tile[:2]
        gx, gy = _ceil_div(n, bn), _ceil_div(m, bm)
        if gx > self.max_count[0] or gy > self.max_count[1]:
            raise ValueError(f"matmul: m={m}, n={n} need a {gx} x {gy} grid of {bm}x{bn} tiles, beyond the "
                             f"device's limit {self.max_count[0]} x {self.max_count[1]}")
        return (gx, gy, 1)

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

    # -- quantized matrix-vector -------------------------------------------------------------------
    def qmatvec(self, dtype: DType, n_cols: int) -> Kernel:
        name = QMATVEC_DTYPES[dtype]
        units = n_cols // qmatvec_unit(dtype)
        # measured on an H200 (GPU timestamps, 14336 x 4096): 4 rows per workgroup, 32
        # invocations for the 32-element formats, 64 for the K formats, 128 for F16/BF16/F32
        cap = 128 if dtype.block_elems == 1 else 64 if dtype in _K_FORMATS else 32
        wg = min(self.wg, cap, max(32, _pow2_ceil(units)))
        wg = _pow2_floor(min(wg, self.max_invocations))
        rows = 4
        variant = "subgroup" if self.use_subgroups else "shared"
        while rows > 1 and 4 * wg * rows > self.max_shared:
            rows //= 2
        return Kernel(f"qmatvec.{name}.{variant}.spv", (wg, rows), PUSH_QMATVEC)

    @staticmethod
    def qmatvec_rows(kernel: Kernel) -> int:
        return kernel.spec[1]


def describe_policy(policy: KernelPolicy) -> dict[str, Any]:
    """The choices a policy made (for reports and debugging)."""
    return {
        "workgroup": policy.wg,
        "matmul_tile": policy.matmul_tile,
        "subgroups": policy.use_subgroups,
        "subgroup_size": policy.subgroup_size,
        "single_group_limit": policy.single_group_limit,
        "max_grid": policy.max_count,
    }
