"""Case declarations for the kbench.runtime operations a Kompute user depends on.

Each runs on a lane's Manager and queue (`lane.manager`, `lane.queue_index`, `lane.kp` is the
runtime module): tensor sync both ways, tensor copy, copy of byte regions, the built-in OpMult,
a user shader on typed tensors, explicit memory barriers, push constants, specialization
constants and timestamps. Tensors use the element types Kompute users use; 8/16/64-bit types
need the device feature, and a device without it reports the case unsupported.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Arrays, Case, CaseFailure, Params
from .compare import GUARD_BYTES, check_guards, guard_pattern
from kbench.shaders import load_spirv

DTYPES = ("float32", "float64", "int32", "uint32", "int64", "int16", "float16", "int8", "uint8")

#: device features a shader doing arithmetic on each element type needs
SHADER_FEATURES = {
    "float64": ("float64",), "int64": ("int64",),
    "int16": ("int16", "storage_buffer_16bit"), "float16": ("float16", "storage_buffer_16bit"),
    "int8": ("int8", "storage_buffer_8bit"), "uint8": ("int8", "storage_buffer_8bit"),
}

# value ranges small enough that products stay inside the type (no overflow semantics tested)
_INT_RANGE = {"int8": 11, "uint8": 15, "int16": 180, "int32": 40000, "uint32": 60000, "int64": 1 << 31}


def typed_values(rng: np.random.Generator, dtype: str, n: int) -> np.ndarray:
    """`n` random values of `dtype`: uniform [-1, 1] for floats, small integers otherwise."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.uniform(-1.0, 1.0, int(n)).astype(dt)
    hi = _INT_RANGE[dtype]
    lo = 0 if dt.kind == "u" else -hi
    return rng.integers(lo, hi, int(n), endpoint=True).astype(dt)


def _submit(seq: Any) -> None:
    """Submit `seq` without waiting (after finishing its previous run, for repeated launches)."""
    if seq.is_running():
        seq.eval_await()
    seq.eval_async()


def _wait(lane: Any, state: dict, params: Params) -> None:
    state["seq"].eval_await()


def _teardown(lane: Any, state: Any) -> None:
    if not isinstance(state, dict):
        return
    for key in ("seqs", "algos", "tensors"):
        for obj in reversed(state.get(key, [])):
            try:
                obj.destroy()
            except Exception:  # noqa: BLE001 - a lost device cannot destroy cleanly
                pass


class _State(dict):
    """Runtime objects of one shard, destroyed in teardown (sequences, algorithms, tensors)."""

    def __init__(self, lane: Any):
        super().__init__(seqs=[], algos=[], tensors=[])
        self.lane = lane

    def tensor(self, array: np.ndarray, kind: str = "device") -> Any:
        kp = self.lane.kp
        t = self.lane.manager.tensor_t(np.ascontiguousarray(array), getattr(kp.TensorTypes, kind))
        self["tensors"].append(t)
        return t

    def seq(self, *ops: Any, timestamps: int | None = None) -> Any:
        """A sequence on the lane's queue recording `ops`; with timestamps (ops + 1 by default) so
        the benchmark can take GPU time from them."""
        n = len(ops) + 1 if timestamps is None else timestamps
        s = self.lane.manager.sequence(self.lane.queue_index, n)
        self["seqs"].append(s)
        for op in ops:
            s.record(op)
        return s

    def algorithm(self, *args: Any, **kwargs: Any) -> Any:
        a = self.lane.manager.algorithm(*args, **kwargs)
        self["algos"].append(a)
        return a

    def read_back(self, *tensors: Any) -> list[np.ndarray]:
        """Clear the host views, sync the device data back, return copies: what the device holds."""
        kp = self.lane.kp
        for t in tensors:
            t.data()[:] = 0
        self.seq(kp.OpTensorSyncLocal(list(tensors))).eval()
        return [t.data().copy() for t in tensors]


def _not_f32(p: Params) -> bool:
    """full_only of the transfer cases: a transfer's bandwidth does not depend on the element type
    (validate checks every type), so the default bench moves float32; every type with --full."""
    return p["dtype"] != "float32"


def _size_axis(values: tuple[int, ...]) -> tuple[dict[str, int], ...]:
    return tuple({"size": v} for v in values)


def _nbytes(p: Params) -> int:
    return int(p["size"]) * np.dtype(p.get("dtype", "float32")).itemsize


# --------------------------------------------------------------------------- sync both ways

def _sync_setup(lane: Any, inp: Arrays, p: Params) -> _State:
    st = _State(lane)
    st["t"] = st.tensor(inp["data"].copy())
    st["seq"] = st.seq(lane.kp.OpTensorSyncDevice([st["t"]]))
    return st


def _sync_collect(lane: Any, st: _State, p: Params) -> Arrays:
    st["seq"].eval_await()
    (data,) = st.read_back(st["t"])
    return {"data": data}


KP_SYNC = Case(
    name="kp_sync", layer="runtime",
    description="OpTensorSyncDevice then OpTensorSyncLocal of a device tensor (host view cleared between)",
    generate=lambda p, rng: {"data": typed_values(rng, p["dtype"], p["size"])},
    reference=lambda inp, p: {"data": inp["data"]},
    setup=_sync_setup, launch=lambda lane, st, p: _submit(st["seq"]), collect=_sync_collect,
    wait=_wait, teardown=_teardown,
    validate_sizes=_size_axis((1, 1000, 65537)), bench_sizes=_size_axis((1 << 20, 16 << 20)),
    axes={"dtype": DTYPES}, full_only=_not_f32, ops=("OpTensorSyncDevice", "OpTensorSyncLocal"), comparison="exact",
    bytes_moved=_nbytes, footprint=lambda p: 2 * _nbytes(p), largest_buffer=_nbytes, peak="h2d",
)


# --------------------------------------------------------------------------- tensor copy

def _copy_setup(lane: Any, inp: Arrays, p: Params) -> _State:
    kp = lane.kp
    st = _State(lane)
    src = st.tensor(inp["data"].copy())
    zeros = np.zeros_like(inp["data"])
    st["dst"] = [st.tensor(zeros.copy()), st.tensor(zeros.copy())]
    st.seq(kp.OpTensorSyncDevice([src] + st["dst"])).eval()
    st["seq"] = st.seq(kp.OpTensorCopy([src] + st["dst"]))
    return st


def _copy_collect(lane: Any, st: _State, p: Params) -> Arrays:
    st["seq"].eval_await()
    host = [t.data().copy() for t in st["dst"]]
    a, b = st.read_back(*st["dst"])
    return {"dst1": a, "dst2": b, "host1": host[0], "host2": host[1]}


KP_COPY = Case(
    name="kp_copy", layer="runtime",
    description="OpTensorCopy of one tensor into two others: device data and host views agree",
    generate=lambda p, rng: {"data": typed_values(rng, p["dtype"], p["size"])},
    reference=lambda inp, p: {k: inp["data"] for k in ("dst1", "dst2", "host1", "host2")},
    setup=_copy_setup, launch=lambda lane, st, p: _submit(st["seq"]), collect=_copy_collect,
    wait=_wait, teardown=_teardown,
    validate_sizes=_size_axis((1, 1000, 65537)), bench_sizes=_size_axis((1 << 20, 16 << 20)),
    axes={"dtype": DTYPES}, full_only=_not_f32, ops=("OpTensorCopy",), comparison="exact",
    bytes_moved=lambda p: 4 * _nbytes(p), footprint=lambda p: 3 * _nbytes(p), largest_buffer=_nbytes,
    peak="buffer_copy",
)


# --------------------------------------------------------------------------- copy region

def _region_generate(p: Params, rng: np.random.Generator) -> Arrays:
    return {"src": rng.integers(0, 256, int(p["src_off"]) + int(p["size"]) + 16, dtype=np.uint8)}


def _region_setup(lane: Any, inp: Arrays, p: Params) -> _State:
    kp = lane.kp
    st = _State(lane)
    src = st.tensor(inp["src"].copy())
    st["dst"] = st.tensor(guard_pattern(int(p["dst_off"]) + int(p["size"]) + GUARD_BYTES))
    st.seq(kp.OpTensorSyncDevice([src, st["dst"]])).eval()
    st["seq"] = st.seq(kp.OpTensorCopyRegion(src, st["dst"], int(p["src_off"]), int(p["dst_off"]), int(p["size"])))
    return st


def _region_collect(lane: Any, st: _State, p: Params) -> Arrays:
    st["seq"].eval_await()
    (raw,) = st.read_back(st["dst"])
    lo = int(p["dst_off"])
    check_guards(raw, lo, lo + int(p["size"]), "OpTensorCopyRegion destination")
    return {"dst": raw[lo:lo + int(p["size"])]}


KP_COPY_REGION = Case(
    name="kp_copy_region", layer="runtime",
    description="OpTensorCopyRegion between byte offsets; bytes around the target stay",
    generate=_region_generate,
    reference=lambda inp, p: {"dst": inp["src"][int(p["src_off"]):int(p["src_off"]) + int(p["size"])]},
    setup=_region_setup, launch=lambda lane, st, p: _submit(st["seq"]), collect=_region_collect,
    wait=_wait, teardown=_teardown,
    validate_sizes=tuple({"src_off": a, "dst_off": b, "size": n} for a, b, n in (
        (0, 0, 4), (4, 12, 400), (3, 5, 17), (4096, 8, 65536))),
    ops=("OpTensorCopyRegion",), comparison="exact",
    bytes_moved=lambda p: 2 * int(p["size"]),
)


# --------------------------------------------------------------------------- OpMult

def _mult_setup(lane: Any, inp: Arrays, p: Params) -> _State:
    kp = lane.kp
    st = _State(lane)
    a, b = st.tensor(inp["a"]), st.tensor(inp["b"])
    st["out"] = st.tensor(np.zeros_like(inp["a"]))
    st.seq(kp.OpTensorSyncDevice([a, b])).eval()
    st["seq"] = st.seq(kp.OpMult([a, b, st["out"]], st.algorithm()))
    return st


def _out_collect(lane: Any, st: _State, p: Params) -> Arrays:
    st["seq"].eval_await()
    (out,) = st.read_back(st["out"])
    return {"out": out}


def _f32_pair(p: Params, rng: np.random.Generator) -> Arrays:
    n = int(p["size"])
    return {"a": rng.uniform(-1, 1, n).astype(np.float32), "b": rng.uniform(-1, 1, n).astype(np.float32)}


KP_MULT = Case(
    name="kp_mult", layer="runtime", description="Kompute's built-in OpMult: out = a * b (float32)",
    generate=_f32_pair,
    # IEEE float32 multiplication is correctly rounded on Vulkan, so the product must be exact
    reference=lambda inp, p: {"out": inp["a"] * inp["b"]},
    setup=_mult_setup, launch=lambda lane, st, p: _submit(st["seq"]), collect=_out_collect,
    wait=_wait, teardown=_teardown,
    validate_sizes=_size_axis((1, 63, 64, 65, 100000)), bench_sizes=_size_axis((1 << 20, 16 << 20)),
    ops=("OpMult", "OpAlgoDispatch"), comparison="exact",
    bytes_moved=lambda p: 12 * int(p["size"]), flops=lambda p: int(p["size"]),
    footprint=lambda p: 12 * int(p["size"]), largest_buffer=lambda p: 4 * int(p["size"]),
    peak="copy_bandwidth",
)


# --------------------------------------------------------------------------- typed user shader

def _mul_generate(p: Params, rng: np.random.Generator) -> Arrays:
    return {"a": typed_values(rng, p["dtype"], p["size"]), "b": typed_values(rng, p["dtype"], p["size"])}


def _mul_setup(lane: Any, inp: Arrays, p: Params) -> _State:
    kp = lane.kp
    st = _State(lane)
    n = int(p["size"])
    a, b = st.tensor(inp["a"]), st.tensor(inp["b"])
    st["out"] = st.tensor(np.zeros_like(inp["a"]))
    algo = st.algorithm([a, b, st["out"]], load_spirv(f"case_mul.{p['dtype']}"), ((n + 63) // 64, 1, 1),
                        [], np.array([n], dtype=np.uint32))
    st["seq"] = st.seq(kp.OpTensorSyncDevice([a, b]), kp.OpAlgoDispatch(algo))
    return st


KP_MUL = Case(
    name="kp_mul", layer="runtime",
    description="a user shader multiplying typed tensors (OpAlgoDispatch, push constant n)",
    generate=_mul_generate,
    reference=lambda inp, p: {"out": (inp["a"] * inp["b"]).astype(inp["a"].dtype)},
    setup=_mul_setup, launch=lambda lane, st, p: _submit(st["seq"]), collect=_out_collect,
    wait=_wait, teardown=_teardown,
    validate_sizes=_size_axis((1, 65, 4097)), axes={"dtype": DTYPES},
    ops=("OpAlgoDispatch",),
    # float16: the device may multiply in float16 or in float32 and round once; allow an ulp
    comparison=lambda p: "nmse" if p["dtype"] == "float16" else "exact",
    tolerance=lambda p: 1e-6 if p["dtype"] == "float16" else 0.0,
    features=lambda p: SHADER_FEATURES.get(p["dtype"], ()),
    bytes_moved=lambda p: 3 * _nbytes(p),
)


# --------------------------------------------------------------------------- memory barrier

def _barrier_setup(lane: Any, inp: Arrays, p: Params) -> _State:
    kp = lane.kp
    st = _State(lane)
    n = int(p["size"])
    a = st.tensor(inp["a"])
    b = st.tensor(np.zeros_like(inp["a"]), "storage")
    st["out"] = st.tensor(np.zeros_like(inp["a"]))
    spv = load_spirv("case_mul.float32")
    grid = ((n + 63) // 64, 1, 1)
    push = np.array([n], dtype=np.uint32)
    square = st.algorithm([a, a, b], spv, grid, [], push)
    cube = st.algorithm([b, a, st["out"]], spv, grid, [], push)
    barrier = kp.OpMemoryBarrier([b], kp.AccessFlags.shader_write, kp.AccessFlags.shader_read,
                                 kp.PipelineStageFlags.compute_shader, kp.PipelineStageFlags.compute_shader)
    st["seq"] = st.seq(kp.OpTensorSyncDevice([a]), kp.OpAlgoDispatch(square), barrier, kp.OpAlgoDispatch(cube))
    return st


KP_BARRIER = Case(
    name="kp_barrier", layer="runtime",
    description="b = a*a; OpMemoryBarrier(shader write -> read); out = b*a through a storage tensor",
    generate=lambda p, rng: {"a": rng.uniform(-1, 1, int(p["size"])).astype(np.float32)},
    reference=lambda inp, p: {"out": (inp["a"] * inp["a"]) * inp["a"]},
    setup=_barrier_setup, launch=lambda lane, st, p: _submit(st["seq"]), collect=_out_collect,
    wait=_wait, teardown=_teardown,
    validate_sizes=_size_axis((1, 1000, 100000)), ops=("OpMemoryBarrier", "OpAlgoDispatch"),
    comparison="exact", bytes_moved=lambda p: 20 * int(p["size"]),
)


# --------------------------------------------------------------------------- push constants

_PUSH = {  # first push, then the override used twice (Kompute's own test values for float32)
    "float32": ([0.1, 0.2, 0.3], [0.3, 0.2, 0.1]),
    "int32": ([1, 2, 3], [-1, -1, -1]),
    "uint32": ([1, 2, 3], [10, 20, 30]),
}


def _push_reference(inp: Arrays, p: Params) -> Arrays:
    dt = np.dtype(p["dtype"])
    first, again = (np.array(v, dtype=dt) for v in _PUSH[p["dtype"]])
    acc = np.zeros(3, dtype=dt)
    for push in (first, again, again):  # in the element type, as the shader adds
        acc = (acc + push).astype(dt)
    return {"out": acc}


def _push_setup(lane: Any, inp: Arrays, p: Params) -> _State:
    kp = lane.kp
    st = _State(lane)
    dt = np.dtype(p["dtype"])
    first, again = (np.array(v, dtype=dt) for v in _PUSH[p["dtype"]])
    st["out"] = st.tensor(np.zeros(3, dtype=dt))
    algo = st.algorithm([st["out"]], load_spirv(f"case_push.{p['dtype']}"), (1, 1, 1), [], first)
    st["seq"] = st.seq(kp.OpTensorSyncDevice([st["out"]]), kp.OpAlgoDispatch(algo),
                       kp.OpAlgoDispatch(algo, again), kp.OpAlgoDispatch(algo, again))
    return st


KP_PUSH_CONSTS = Case(
    name="kp_push_consts", layer="runtime",
    description="push constants x,y,z added to elements 0..2 by three dispatches (two overrides)",
    generate=lambda p, rng: {}, reference=_push_reference,
    setup=_push_setup, launch=lambda lane, st, p: _submit(st["seq"]), collect=_out_collect,
    wait=_wait, teardown=_teardown,
    validate_sizes=({},), axes={"dtype": tuple(_PUSH)}, ops=("OpAlgoDispatch",), comparison="exact",
)


# --------------------------------------------------------------------------- spec constants

_SCALE, _BIAS, _OFFSET = 2.5, -0.75, 0.125


def _spec_setup(lane: Any, inp: Arrays, p: Params) -> _State:
    kp = lane.kp
    st = _State(lane)
    n = int(p["size"])
    a = st.tensor(inp["a"])
    st["out"] = st.tensor(np.zeros_like(inp["a"]))
    push = np.array([(_OFFSET, n)], dtype=[("offset", "<f4"), ("n", "<u4")])
    algo = st.algorithm([a, st["out"]], load_spirv("case_spec"), ((n + 63) // 64, 1, 1), [_SCALE, _BIAS], push)
    st["seq"] = st.seq(kp.OpTensorSyncDevice([a]), kp.OpAlgoDispatch(algo))
    return st


KP_SPEC_CONSTS = Case(
    name="kp_spec_consts", layer="runtime",
    description="two float specialization constants and a mixed float/uint push-constant block",
    generate=lambda p, rng: {"a": rng.uniform(-1, 1, int(p["size"])).astype(np.float32)},
    reference=lambda inp, p: {"out": inp["a"].astype(np.float64) * _SCALE + _BIAS + _OFFSET},
    setup=_spec_setup, launch=lambda lane, st, p: _submit(st["seq"]), collect=_out_collect,
    wait=_wait, teardown=_teardown,
    validate_sizes=_size_axis((1, 100, 4097)), ops=("OpAlgoDispatch",),
    # float32 rounding of a*s+b+o (the compiler may fuse a*s+b): a few ulp, far below 1e-12
    tolerance=1e-12,
)


# --------------------------------------------------------------------------- timestamps

def _ts_setup(lane: Any, inp: Arrays, p: Params) -> _State:
    kp = lane.kp
    st = _State(lane)
    n = int(p["size"])
    a = st.tensor(inp["a"])
    st["out"] = st.tensor(np.zeros_like(inp["a"]))
    algo = st.algorithm([a, a, st["out"]], load_spirv("case_mul.float32"), ((n + 63) // 64, 1, 1), [],
                        np.array([n], dtype=np.uint32))
    st["seq"] = st.seq(kp.OpTensorSyncDevice([a]), kp.OpAlgoDispatch(algo), kp.OpTensorSyncLocal([st["out"]]),
                       timestamps=8)
    return st


def _ts_collect(lane: Any, st: _State, p: Params) -> Arrays:
    st["seq"].eval_await()
    ts = st["seq"].get_timestamps()
    if len(ts) != 4:
        raise CaseFailure(f"get_timestamps() gave {len(ts)} values for 3 ops, expected 4 (ops + 1)")
    if any(b < a for a, b in zip(ts, ts[1:])):
        raise CaseFailure(f"timestamps go backwards: {ts}")
    out = st["out"].data().copy()
    return {"out": out}


KP_TIMESTAMPS = Case(
    name="kp_timestamps", layer="runtime",
    description="a sequence with timestamps returns ops + 1 non-decreasing nanosecond values",
    generate=lambda p, rng: {"a": rng.uniform(-1, 1, int(p["size"])).astype(np.float32)},
    reference=lambda inp, p: {"out": inp["a"] * inp["a"]},
    setup=_ts_setup, launch=lambda lane, st, p: _submit(st["seq"]), collect=_ts_collect,
    wait=_wait, teardown=_teardown,
    validate_sizes=_size_axis((4096,)), ops=("Sequence.get_timestamps",), comparison="exact",
    features=lambda p: ("timestamps",),
)


RUNTIME_CASES: tuple[Case, ...] = (
    KP_SYNC, KP_COPY, KP_COPY_REGION, KP_MULT, KP_MUL, KP_BARRIER, KP_PUSH_CONSTS, KP_SPEC_CONSTS,
    KP_TIMESTAMPS,
)
