"""Case declarations for every ComputeBackend op (see shared/reference/compute-backend.md).

Sizes count float32 elements for compute ops and bytes for allocate/copy cases. Validate sizes
are small (they run on lavapipe in CI) and include the edges: 1, sizes that are not a multiple of
a workgroup, sizes larger than one workgroup's reach. Bench sizes are model-like; the runner
reports those that do not fit the device as unsupported.

Tolerances: 1e-7 NMSE for elementwise ops, rms_norm and rope; 1e-6 for softmax (the values
used by llama.cpp's test-backend-ops). Matmul-class ops are held to 1e-8: float32 accumulation
against a float64 oracle measures about 1e-11 to 1e-10 at k = 8192 (the error grows like
k * eps^2), so 1e-8 leaves room for any summation order but catches TF32/fp16 accumulation.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .base import Arrays, Case, CaseFailure, Params
from .buffers import BackendBuffers
from .compare import GUARD_BYTES, check_guards, guard_pattern

MiB = 1 << 20

#: float32 tolerances (NMSE)
ELEMENTWISE_TOL = 1e-7
SOFTMAX_TOL = 1e-6
MATMUL_TOL = 1e-8

#: dtype axis of quantized_matmul
QMATMUL_DTYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")

EW_VALIDATE = (1, 3, 64, 1000, 4097, 65537)
EW_BENCH = (1 << 20, 16 << 20, 256 << 20)
REDUCE_VALIDATE = (1, 5, 256, 1000, 4097, 70001)
REDUCE_BENCH = (4096, 65536, 1 << 20, 16 << 20, 256 << 20)


def uniform(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    """float32 values uniform in [-scale, scale] (the suites' default input)."""
    return (rng.uniform(-1.0, 1.0, int(n)) * scale).astype(np.float32)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def _teardown(_target: Any, state: Any) -> None:
    if isinstance(state, dict) and "bufs" in state:
        state["bufs"].free_all()


def _sync_read(target: Any, state: dict, names: tuple[str, ...]) -> Arrays:
    target.backend.synchronize()
    bufs: BackendBuffers = state["bufs"]
    return {n: bufs.read_f32(state[n], n) for n in names}


def _sizes(key: str, values: tuple[int, ...], **extra: Any) -> tuple[dict[str, Any], ...]:
    return tuple({key: v, **extra} for v in values)


# --------------------------------------------------------------------------- elementwise

def _unary(name: str, ref, flops_per: int, description: str) -> Case:
    def generate(p: Params, rng: np.random.Generator) -> Arrays:
        return {"x": uniform(rng, p["size"], p.get("scale", 1.0))}

    def reference(inp: Arrays, p: Params) -> Arrays:
        return {"out": ref(_f64(inp["x"]))}

    def setup(t: Any, inp: Arrays, p: Params) -> dict:
        bufs = BackendBuffers(t.backend)
        n = int(p["size"])
        if p.get("inplace"):
            out = bufs.guarded(4 * n, payload=inp["x"])
            return {"bufs": bufs, "x": out.handle, "out": out}
        return {"bufs": bufs, "x": bufs.upload(inp["x"]), "out": bufs.guarded(4 * n)}

    def launch(t: Any, s: dict, p: Params) -> None:
        getattr(t.backend, name)(s["x"], s["out"].handle, int(p["size"]))

    return Case(
        name=name, layer="backend", description=description,
        generate=generate, reference=reference, setup=setup, launch=launch,
        collect=lambda t, s, p: _sync_read(t, s, ("out",)), teardown=_teardown,
        validate_sizes=_sizes("size", EW_VALIDATE) + ({"size": 4097, "inplace": True},),
        bench_sizes=_sizes("size", EW_BENCH),
        ops=(name,), tolerance=ELEMENTWISE_TOL,
        bytes_moved=lambda p: 8 * int(p["size"]), flops=lambda p: flops_per * int(p["size"]),
        footprint=lambda p: 8 * int(p["size"]), largest_buffer=lambda p: 4 * int(p["size"]),
        peak="copy_bandwidth",
    )


def _binary(name: str, ref, description: str) -> Case:
    def generate(p: Params, rng: np.random.Generator) -> Arrays:
        return {"a": uniform(rng, p["size"]), "b": uniform(rng, p["size"])}

    def reference(inp: Arrays, p: Params) -> Arrays:
        return {"out": ref(_f64(inp["a"]), _f64(inp["b"]))}

    def setup(t: Any, inp: Arrays, p: Params) -> dict:
        bufs = BackendBuffers(t.backend)
        n = int(p["size"])
        b = bufs.upload(inp["b"])
        if p.get("inplace"):
            out = bufs.guarded(4 * n, payload=inp["a"])
            return {"bufs": bufs, "a": out.handle, "b": b, "out": out}
        return {"bufs": bufs, "a": bufs.upload(inp["a"]), "b": b, "out": bufs.guarded(4 * n)}

    def launch(t: Any, s: dict, p: Params) -> None:
        getattr(t.backend, name)(s["a"], s["b"], s["out"].handle, int(p["size"]))

    return Case(
        name=name, layer="backend", description=description,
        generate=generate, reference=reference, setup=setup, launch=launch,
        collect=lambda t, s, p: _sync_read(t, s, ("out",)), teardown=_teardown,
        validate_sizes=_sizes("size", EW_VALIDATE) + ({"size": 4097, "inplace": True},),
        bench_sizes=_sizes("size", EW_BENCH),
        ops=(name,), tolerance=ELEMENTWISE_TOL,
        bytes_moved=lambda p: 12 * int(p["size"]), flops=lambda p: int(p["size"]),
        footprint=lambda p: 12 * int(p["size"]), largest_buffer=lambda p: 4 * int(p["size"]),
        peak="copy_bandwidth",
    )


def _silu_ref(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


SILU = _unary("silu", _silu_ref, 4, "out = x * sigmoid(x)")
ADD = _binary("add", np.add, "out = a + b")
ELEMENT_MUL = _binary("element_mul", np.multiply, "out = a * b")


# --------------------------------------------------------------------------- reductions

def _softmax_case(name: str, scales: tuple[float, ...], description: str, bench: bool) -> Case:
    base = _unary("softmax", _softmax_ref, 5, description)
    sizes = _sizes("size", REDUCE_VALIDATE) + ({"size": 4097, "inplace": True},)
    validate = tuple({**s, "scale": sc} for sc in scales for s in sizes)
    return Case(
        name=name, layer="backend", description=description,
        generate=base.generate, reference=base.reference, setup=base.setup, launch=base.launch,
        collect=base.collect, teardown=_teardown,
        validate_sizes=validate,
        bench_sizes=_sizes("size", REDUCE_BENCH, scale=scales[0]) if bench else (),
        ops=("softmax",), tolerance=SOFTMAX_TOL,
        bytes_moved=lambda p: 8 * int(p["size"]), flops=lambda p: 5 * int(p["size"]),
        footprint=base.footprint, largest_buffer=base.largest_buffer, peak="copy_bandwidth",
    )


SOFTMAX = _softmax_case("softmax", (1.0,), "out = exp(x - max x) / sum exp(x - max x)", bench=True)
# Large magnitudes: a naive exp(x) overflows float32 past 88; the stable form must not.
SOFTMAX_LARGE = _softmax_case(
    "softmax_large", (30.0, 1000.0), "softmax of inputs up to +-1000 (numerical stability)", bench=False)


def _rms_generate(p: Params, rng: np.random.Generator) -> Arrays:
    return {"x": uniform(rng, p["size"]), "w": uniform(rng, p["size"])}


def _rms_reference(inp: Arrays, p: Params) -> Arrays:
    x, w = _f64(inp["x"]), _f64(inp["w"])
    eps = float(np.float32(p.get("eps", 1e-5)))
    return {"out": x * w / math.sqrt(float(np.mean(x * x)) + eps)}


def _rms_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "x": bufs.upload(inp["x"]), "w": bufs.upload(inp["w"]),
            "out": bufs.guarded(4 * int(p["size"]))}


def _rms_launch(t: Any, s: dict, p: Params) -> None:
    t.backend.rms_norm(s["x"], s["w"], s["out"].handle, int(p["size"]), float(p.get("eps", 1e-5)))


RMS_NORM = Case(
    name="rms_norm", layer="backend", description="out = x * w / sqrt(mean(x^2) + eps)",
    generate=_rms_generate, reference=_rms_reference, setup=_rms_setup, launch=_rms_launch,
    collect=lambda t, s, p: _sync_read(t, s, ("out",)), teardown=_teardown,
    validate_sizes=_sizes("size", REDUCE_VALIDATE, eps=1e-5) + ({"size": 1000, "eps": 1e-2},),
    bench_sizes=_sizes("size", REDUCE_BENCH, eps=1e-5),
    ops=("rms_norm",), tolerance=ELEMENTWISE_TOL,
    bytes_moved=lambda p: 12 * int(p["size"]), flops=lambda p: 4 * int(p["size"]),
    footprint=lambda p: 12 * int(p["size"]), largest_buffer=lambda p: 4 * int(p["size"]),
    peak="copy_bandwidth",
)


# --------------------------------------------------------------------------- rope

def rope_reference(v: np.ndarray, n_heads: int, head_dim: int, pos: int, freq_base: float) -> np.ndarray:
    """Interleaved-pair rotation (GPT-J / ggml normal mode) with float64 angles."""
    x = _f64(v).reshape(n_heads, head_dim // 2, 2)
    i = np.arange(head_dim // 2, dtype=np.float64)
    theta = pos * float(np.float32(freq_base)) ** (-2.0 * i / head_dim)
    c, s = np.cos(theta), np.sin(theta)
    x0, x1 = x[..., 0], x[..., 1]
    return np.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1).reshape(-1)


def _rope_generate(p: Params, rng: np.random.Generator) -> Arrays:
    hd = int(p["head_dim"])
    return {"q": uniform(rng, p["n_heads_q"] * hd), "k": uniform(rng, p["n_heads_k"] * hd)}


def _rope_reference(inp: Arrays, p: Params) -> Arrays:
    hd, pos, base = int(p["head_dim"]), int(p["pos"]), float(p.get("freq_base", 10000.0))
    return {"q": rope_reference(inp["q"], int(p["n_heads_q"]), hd, pos, base),
            "k": rope_reference(inp["k"], int(p["n_heads_k"]), hd, pos, base)}


def _rope_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "q": bufs.guarded(inp["q"].nbytes, payload=inp["q"]),
            "k": bufs.guarded(inp["k"].nbytes, payload=inp["k"])}


def _rope_launch(t: Any, s: dict, p: Params) -> None:
    t.backend.rope(s["q"].handle, s["k"].handle, int(p["pos"]), int(p["head_dim"]),
                   float(p.get("freq_base", 10000.0)), int(p["n_heads_q"]), int(p["n_heads_k"]))


def _rope_bytes(p: Params) -> int:
    return 8 * int(p["head_dim"]) * (int(p["n_heads_q"]) + int(p["n_heads_k"]))


ROPE = Case(
    name="rope", layer="backend",
    description="rotary embedding in place on q and k (interleaved pairs), float64 angles in the reference",
    generate=_rope_generate, reference=_rope_reference, setup=_rope_setup, launch=_rope_launch,
    collect=lambda t, s, p: _sync_read(t, s, ("q", "k")), teardown=_teardown,
    # positions well past 512: float32 angles lose accuracy there unless range-reduced
    validate_sizes=tuple({"head_dim": 128, "n_heads_q": 4, "n_heads_k": 2, "pos": pos}
                         for pos in (0, 1, 700, 8191, 32767))
    + ({"head_dim": 64, "n_heads_q": 3, "n_heads_k": 1, "pos": 513, "freq_base": 500000.0},
       {"head_dim": 2, "n_heads_q": 1, "n_heads_k": 1, "pos": 5}),
    bench_sizes=({"head_dim": 128, "n_heads_q": 32, "n_heads_k": 8, "pos": 8191},),
    ops=("rope",), tolerance=ELEMENTWISE_TOL,
    bytes_moved=_rope_bytes,
    flops=lambda p: 3 * int(p["head_dim"]) * (int(p["n_heads_q"]) + int(p["n_heads_k"])),
    footprint=_rope_bytes, largest_buffer=lambda p: 4 * int(p["head_dim"]) * int(p["n_heads_q"]),
    peak="copy_bandwidth",
)


# --------------------------------------------------------------------------- matmul

def _mm_generate(p: Params, rng: np.random.Generator) -> Arrays:
    m, n, k = int(p["m"]), int(p["n"]), int(p["k"])
    return {"a": uniform(rng, m * k), "b": uniform(rng, k * n)}


def _mm_reference(inp: Arrays, p: Params) -> Arrays:
    m, n, k = int(p["m"]), int(p["n"]), int(p["k"])
    return {"out": (_f64(inp["a"]).reshape(m, k) @ _f64(inp["b"]).reshape(k, n)).ravel()}


def _mm_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "a": bufs.upload(inp["a"]), "b": bufs.upload(inp["b"]),
            "out": bufs.guarded(4 * int(p["m"]) * int(p["n"]))}


def _mm_launch(t: Any, s: dict, p: Params) -> None:
    t.backend.matmul(s["a"], s["b"], s["out"].handle, int(p["m"]), int(p["n"]), int(p["k"]))


def _mm_bytes(p: Params) -> int:
    m, n, k = int(p["m"]), int(p["n"]), int(p["k"])
    return 4 * (m * k + k * n + m * n)


MATMUL = Case(
    name="matmul", layer="backend", description="out[m,n] = A[m,k] @ B[k,n], float32 row-major",
    generate=_mm_generate, reference=_mm_reference, setup=_mm_setup, launch=_mm_launch,
    collect=lambda t, s, p: _sync_read(t, s, ("out",)), teardown=_teardown,
    validate_sizes=tuple({"m": m, "n": n, "k": k} for m, n, k in (
        (1, 1, 1), (1, 64, 33), (5, 3, 7), (33, 17, 65), (64, 64, 64), (100, 70, 130), (2, 300, 257))),
    bench_sizes=tuple({"m": s, "n": s, "k": s} for s in (1024, 4096, 8192)),
    ops=("matmul",), tolerance=MATMUL_TOL,
    bytes_moved=_mm_bytes, flops=lambda p: 2 * int(p["m"]) * int(p["n"]) * int(p["k"]),
    footprint=_mm_bytes,
    largest_buffer=lambda p: 4 * max(int(p["m"]) * int(p["k"]), int(p["k"]) * int(p["n"]), int(p["m"]) * int(p["n"])),
    peak="fp32_fma",
)


# --------------------------------------------------------------------------- quantized_matmul

def _qmm_generate(p: Params, rng: np.random.Generator) -> Arrays:
    from kbench import quant

    rows, cols = int(p["n_rows"]), int(p["n_cols"])
    w = uniform(rng, rows * cols).reshape(rows, cols)
    raw = quant.quantize(w, p["dtype"])
    return {"w": np.frombuffer(raw, dtype=np.uint8).copy(), "x": uniform(rng, cols)}


def _qmm_reference(inp: Arrays, p: Params) -> Arrays:
    from kbench import quant

    rows, cols = int(p["n_rows"]), int(p["n_cols"])
    w = _f64(quant.dequantize(inp["w"].tobytes(), p["dtype"], (rows, cols)))
    return {"y": w @ _f64(inp["x"])}


def _qmm_copies(p: Params) -> int:
    """Weight copies the calls rotate through: together at least `rotate_mib` MiB, so that
    repeated calls stream their weights from memory rather than from a 50-60 MB L2 cache
    (a 14336 x 4096 Q4_0 matrix is 33 MB)."""
    mib = int(p.get("rotate_mib", 0))
    return max(1, -(-(mib * MiB) // _qmm_weight_bytes(p))) if mib else 1


def _qmm_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    ws = [bufs.upload(inp["w"]) for _ in range(_qmm_copies(p))]
    return {"bufs": bufs, "ws": ws, "next": 0, "x": bufs.upload(inp["x"]),
            "y": bufs.guarded(4 * int(p["n_rows"]))}


def _qmm_launch(t: Any, s: dict, p: Params) -> None:
    from kbench.quant import DType

    w = s["ws"][s["next"]]
    s["next"] = (s["next"] + 1) % len(s["ws"])
    t.backend.quantized_matmul(w, s["x"], s["y"].handle, int(p["n_rows"]), int(p["n_cols"]),
                               DType.coerce(p["dtype"]))


def _qmm_weight_bytes(p: Params) -> int:
    from kbench.quant import row_bytes

    return int(p["n_rows"]) * row_bytes(p["dtype"], int(p["n_cols"]))


def _qmm_bytes(p: Params) -> int:
    return _qmm_weight_bytes(p) + 4 * (int(p["n_cols"]) + int(p["n_rows"]))


QUANTIZED_MATMUL = Case(
    name="quantized_matmul", layer="backend",
    description="y[r] = sum_c dequant(W)[r,c] * x[c], W raw GGUF blocks",
    generate=_qmm_generate, reference=_qmm_reference, setup=_qmm_setup, launch=_qmm_launch,
    collect=lambda t, s, p: _sync_read(t, s, ("y",)), teardown=_teardown,
    validate_sizes=tuple({"n_rows": r, "n_cols": c} for r, c in ((1, 256), (3, 512), (17, 768), (64, 1024))),
    # 1024 x 4096: a small model's projection (keeps CPU-driver benches quick); then Llama-3-8B's FFN shapes
    # (the model shapes rotate through >= 256 MiB of weight copies: cold L2, as in a model's layers)
    bench_sizes=({"n_rows": 1024, "n_cols": 4096}, {"n_rows": 4096, "n_cols": 14336, "rotate_mib": 256},
                 {"n_rows": 14336, "n_cols": 4096, "rotate_mib": 256}),
    axes={"dtype": QMATMUL_DTYPES},
    ops=("quantized_matmul",), tolerance=MATMUL_TOL,
    bytes_moved=_qmm_bytes, flops=lambda p: 2 * int(p["n_rows"]) * int(p["n_cols"]),
    footprint=lambda p: _qmm_bytes(p) + (_qmm_copies(p) - 1) * _qmm_weight_bytes(p),
    largest_buffer=_qmm_weight_bytes,
    peak="copy_bandwidth", cycle=_qmm_copies,
)


# --------------------------------------------------------------------------- attention

def _attn_dims(p: Params) -> tuple[int, int, int, int]:
    return int(p["head_dim"]), int(p["seq_len"]), int(p["n_heads"]), int(p["n_kv_heads"])


def _kv_head(h: int, n_heads: int, n_kv: int) -> int:
    return h // (n_heads // n_kv)


def _attn_generate(p: Params, rng: np.random.Generator) -> Arrays:
    hd, t, nh, nkv = _attn_dims(p)
    return {"q": uniform(rng, nh * hd), "kc": uniform(rng, t * nkv * hd),
            "w": uniform(rng, t), "vc": uniform(rng, t * nkv * hd)}


def _score_ref(q: np.ndarray, kc: np.ndarray, h: int, p: Params) -> np.ndarray:
    hd, t, nh, nkv = _attn_dims(p)
    kvh = _kv_head(h, nh, nkv)
    k = _f64(kc).reshape(t, nkv, hd)[:, kvh, :]
    return k @ _f64(q)[h * hd:(h + 1) * hd] / math.sqrt(hd)


def _value_ref(w: np.ndarray, vc: np.ndarray, h: int, p: Params) -> np.ndarray:
    hd, t, nh, nkv = _attn_dims(p)
    v = _f64(vc).reshape(t, nkv, hd)[:, _kv_head(h, nh, nkv), :]
    return _f64(w) @ v


ATTN_VALIDATE = tuple(
    {"head_dim": hd, "seq_len": t, "n_heads": nh, "n_kv_heads": nkv, "head": h}
    for hd, t, nh, nkv, h in ((64, 1, 4, 2, 3), (64, 17, 4, 2, 1), (128, 300, 8, 2, 5), (32, 1025, 2, 2, 0)))
ATTN_BENCH = ({"head_dim": 128, "seq_len": 8192, "n_heads": 32, "n_kv_heads": 8, "head": 31},)


def _cache_bytes(p: Params) -> int:
    hd, t, nh, nkv = _attn_dims(p)
    return 4 * t * nkv * hd


def _score_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "q": bufs.upload(inp["q"]), "kc": bufs.upload(inp["kc"]),
            "scores": bufs.guarded(4 * int(p["seq_len"]))}


def _score_launch(t: Any, s: dict, p: Params) -> None:
    hd, T, nh, nkv = _attn_dims(p)
    h = int(p["head"])
    t.backend.attn_score(s["q"], s["kc"], s["scores"].handle, hd, T, h * hd,
                         _kv_head(h, nh, nkv) * hd, nkv * hd)


ATTN_SCORE = Case(
    name="attn_score", layer="backend",
    description="scores[t] = q_h . K[t, kv_head] / sqrt(head_dim) (one query head, GQA layout)",
    generate=_attn_generate,
    reference=lambda inp, p: {"scores": _score_ref(inp["q"], inp["kc"], int(p["head"]), p)},
    setup=_score_setup, launch=_score_launch,
    collect=lambda t, s, p: _sync_read(t, s, ("scores",)), teardown=_teardown,
    validate_sizes=ATTN_VALIDATE, bench_sizes=ATTN_BENCH,
    ops=("attn_score",), tolerance=MATMUL_TOL,
    bytes_moved=lambda p: 4 * (int(p["head_dim"]) * (int(p["seq_len"]) + 1) + int(p["seq_len"])),
    flops=lambda p: 2 * int(p["head_dim"]) * int(p["seq_len"]),
    footprint=lambda p: 2 * _cache_bytes(p), largest_buffer=_cache_bytes, peak="copy_bandwidth",
)


def _value_setup(t: Any, inp: Arrays, p: Params) -> dict:
    hd, T, nh, nkv = _attn_dims(p)
    h = int(p["head"])
    bufs = BackendBuffers(t.backend)
    # out holds every head; only head h's slice may change
    out = bufs.guarded(4 * hd, lead=4 * h * hd, trail=4 * (nh - h - 1) * hd + GUARD_BYTES)
    return {"bufs": bufs, "w": bufs.upload(inp["w"]), "vc": bufs.upload(inp["vc"]), "out": out}


def _value_launch(t: Any, s: dict, p: Params) -> None:
    hd, T, nh, nkv = _attn_dims(p)
    h = int(p["head"])
    t.backend.attn_value(s["w"], s["vc"], s["out"].handle, hd, T, _kv_head(h, nh, nkv) * hd, nkv * hd, h * hd)


ATTN_VALUE = Case(
    name="attn_value", layer="backend",
    description="out[h*hd + d] = sum_t w[t] * V[t, kv_head, d] (one head, GQA layout)",
    generate=_attn_generate,
    reference=lambda inp, p: {"out": _value_ref(inp["w"], inp["vc"], int(p["head"]), p)},
    setup=_value_setup, launch=_value_launch,
    collect=lambda t, s, p: _sync_read(t, s, ("out",)), teardown=_teardown,
    validate_sizes=ATTN_VALIDATE, bench_sizes=ATTN_BENCH,
    ops=("attn_value",), tolerance=MATMUL_TOL,
    bytes_moved=lambda p: 4 * (int(p["head_dim"]) * (int(p["seq_len"]) + 1) + int(p["seq_len"])),
    flops=lambda p: 2 * int(p["head_dim"]) * int(p["seq_len"]),
    footprint=lambda p: 2 * _cache_bytes(p), largest_buffer=_cache_bytes, peak="copy_bandwidth",
)


def _chain_reference(inp: Arrays, p: Params) -> Arrays:
    hd, T, nh, nkv = _attn_dims(p)
    out = np.empty(nh * hd)
    for h in range(nh):
        out[h * hd:(h + 1) * hd] = _value_ref(_softmax_ref(_score_ref(inp["q"], inp["kc"], h, p)), inp["vc"], h, p)
    return {"out": out}


def _chain_setup(t: Any, inp: Arrays, p: Params) -> dict:
    hd, T, nh, nkv = _attn_dims(p)
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "q": bufs.upload(inp["q"]), "kc": bufs.upload(inp["kc"]),
            "vc": bufs.upload(inp["vc"]), "scores": bufs.guarded(4 * T), "out": bufs.guarded(4 * nh * hd)}


def _chain_launch(t: Any, s: dict, p: Params) -> None:
    hd, T, nh, nkv = _attn_dims(p)
    b = t.backend
    scores = s["scores"].handle
    # one scores buffer reused by every head: the backend's issue order must keep heads apart
    for h in range(nh):
        kvh = _kv_head(h, nh, nkv)
        b.attn_score(s["q"], s["kc"], scores, hd, T, h * hd, kvh * hd, nkv * hd)
        b.softmax(scores, scores, T)
        b.attn_value(scores, s["vc"], s["out"].handle, hd, T, kvh * hd, nkv * hd, h * hd)


def _chain_collect(t: Any, s: dict, p: Params) -> Arrays:
    out = _sync_read(t, s, ("out",))
    s["bufs"].read_f32(s["scores"], "scores")  # guard check only
    return out


def _chain_bytes(p: Params) -> int:
    hd, T, nh, nkv = _attn_dims(p)
    per_head = hd + T * hd + T + 2 * T + T + T * hd + hd
    return 4 * nh * per_head


ATTENTION = Case(
    name="attention", layer="backend",
    description="attn_score -> softmax -> attn_value for every query head (GQA), scores buffer reused",
    generate=_attn_generate, reference=_chain_reference, setup=_chain_setup, launch=_chain_launch,
    collect=_chain_collect, teardown=_teardown,
    validate_sizes=tuple({k: v for k, v in s.items() if k != "head"} for s in ATTN_VALIDATE[1:]),
    bench_sizes=({"head_dim": 128, "seq_len": 8192, "n_heads": 32, "n_kv_heads": 8},
                 {"head_dim": 128, "seq_len": 1024, "n_heads": 32, "n_kv_heads": 8}),
    ops=("attn_score", "softmax", "attn_value"), tolerance=SOFTMAX_TOL,
    bytes_moved=_chain_bytes,
    flops=lambda p: int(p["n_heads"]) * (4 * int(p["head_dim"]) * int(p["seq_len"]) + 5 * int(p["seq_len"])),
    footprint=lambda p: 2 * _cache_bytes(p), largest_buffer=_cache_bytes, peak="copy_bandwidth",
)


# --------------------------------------------------------------------------- copies and memory

def _bytes_generate(key: str):
    def generate(p: Params, rng: np.random.Generator) -> Arrays:
        return {"src": rng.integers(0, 256, int(p[key]), dtype=np.uint8)}
    return generate


def _copy_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "src": bufs.upload(inp["src"]), "dst": bufs.guarded(int(p["size"]))}


def _copy_collect(t: Any, s: dict, p: Params) -> Arrays:
    t.backend.synchronize()
    return {"dst": s["bufs"].read_guarded(s["dst"], "dst")}


COPY_SIZES_VALIDATE = (1, 4, 13, 4096, (1 << 20) + 3)
COPY_SIZES_BENCH = (4 * MiB, 64 * MiB, 1024 * MiB)

COPY_BUFFER = Case(
    name="copy_buffer", layer="backend", description="device copy of `size` bytes, offset 0 to 0",
    generate=_bytes_generate("size"), reference=lambda inp, p: {"dst": inp["src"]},
    setup=_copy_setup,
    launch=lambda t, s, p: t.backend.copy_buffer(s["src"], s["dst"].handle, int(p["size"])),
    collect=_copy_collect, teardown=_teardown,
    validate_sizes=_sizes("size", COPY_SIZES_VALIDATE), bench_sizes=_sizes("size", COPY_SIZES_BENCH),
    ops=("copy_buffer",), comparison="exact",
    bytes_moved=lambda p: 2 * int(p["size"]), footprint=lambda p: 2 * int(p["size"]),
    largest_buffer=lambda p: int(p["size"]), peak="buffer_copy",
)


def _cbo_generate(p: Params, rng: np.random.Generator) -> Arrays:
    return {"src": rng.integers(0, 256, int(p["src_off"]) + int(p["size"]) + 64, dtype=np.uint8)}


def _cbo_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "src": bufs.upload(inp["src"]),
            "dst": bufs.guarded(int(p["size"]), lead=int(p["dst_off"]))}


def _cbo_launch(t: Any, s: dict, p: Params) -> None:
    t.backend.copy_buffer_offset(s["src"], s["dst"].handle, int(p["src_off"]), int(p["dst_off"]), int(p["size"]))


COPY_BUFFER_OFFSET = Case(
    name="copy_buffer_offset", layer="backend",
    description="device copy between byte offsets (KV-cache writes); bytes around the target stay",
    generate=_cbo_generate,
    reference=lambda inp, p: {"dst": inp["src"][int(p["src_off"]):int(p["src_off"]) + int(p["size"])]},
    setup=_cbo_setup, launch=_cbo_launch, collect=_copy_collect, teardown=_teardown,
    validate_sizes=tuple({"src_off": a, "dst_off": b, "size": n} for a, b, n in (
        (0, 0, 4), (4, 12, 400), (3, 5, 17), (4096, 8, 65536), (0, 1024, 1))),
    bench_sizes=({"src_off": 4096, "dst_off": 8192, "size": 64 * MiB},
                 {"src_off": 0, "dst_off": 4096 * 16, "size": 8 * 128 * 4}),
    ops=("copy_buffer_offset",), comparison="exact",
    bytes_moved=lambda p: 2 * int(p["size"]), footprint=lambda p: 2 * int(p["size"]) + int(p["src_off"]) + int(p["dst_off"]),
    largest_buffer=lambda p: int(p["size"]) + max(int(p["src_off"]), int(p["dst_off"])) + GUARD_BYTES,
    peak="buffer_copy",
)


def _roundtrip_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    n = int(p["size"])
    dev = bufs.guarded(n)  # guard after: copy_to_device of n bytes must not write past them
    host = guard_pattern(n + 2 * GUARD_BYTES)  # host guards: copy_from_device must stay in its view
    return {"bufs": bufs, "dev": dev, "host": host}


def _roundtrip_collect(t: Any, s: dict, p: Params) -> Arrays:
    bufs: BackendBuffers = s["bufs"]
    n = int(p["size"])
    t.backend.synchronize()
    host = s["host"]
    t.backend.copy_from_device(s["dev"].handle, host[GUARD_BYTES:GUARD_BYTES + n])
    check_guards(host, GUARD_BYTES, GUARD_BYTES + n, "host buffer of copy_from_device")
    bufs.read_guarded(s["dev"], "device buffer of copy_to_device")
    return {"data": host[GUARD_BYTES:GUARD_BYTES + n].copy()}


def _roundtrip_setup_with_upload(t: Any, inp: Arrays, p: Params) -> dict:
    s = _roundtrip_setup(t, inp, p)
    s["src"] = inp["src"]
    return s


COPY_ROUNDTRIP = Case(
    name="copy_roundtrip", layer="backend",
    description="copy_to_device then copy_from_device of random bytes; guards on device and host",
    generate=_bytes_generate("size"), reference=lambda inp, p: {"data": inp["src"]},
    setup=_roundtrip_setup_with_upload,
    launch=lambda t, s, p: t.backend.copy_to_device(s["src"], s["dev"].handle),
    collect=_roundtrip_collect, teardown=_teardown,
    validate_sizes=_sizes("size", COPY_SIZES_VALIDATE), bench_sizes=_sizes("size", (4 * MiB, 64 * MiB, 512 * MiB)),
    ops=("copy_to_device", "copy_from_device"), comparison="exact",
    bytes_moved=lambda p: int(p["size"]), footprint=lambda p: int(p["size"]),
    largest_buffer=lambda p: int(p["size"]), peak="h2d",
)


def _alloc_setup(t: Any, inp: Arrays, p: Params) -> dict:
    return {"bufs": BackendBuffers(t.backend)}


def _alloc_launch(t: Any, s: dict, p: Params) -> None:
    s["h"] = s["bufs"].alloc(int(p["size"]))


def _alloc_collect(t: Any, s: dict, p: Params) -> Arrays:
    t.backend.synchronize()
    return {"data": s["bufs"].read(s["h"], int(p["size"]))}


ALLOCATE = Case(
    name="allocate", layer="backend", description="a new buffer reads back as zeros",
    generate=lambda p, rng: {}, reference=lambda inp, p: {"data": np.zeros(int(p["size"]), np.uint8)},
    setup=_alloc_setup, launch=_alloc_launch, collect=_alloc_collect, teardown=_teardown,
    validate_sizes=_sizes("size", (1, 3, 4096, (1 << 20) + 1)),
    ops=("allocate",), comparison="exact",
    footprint=lambda p: int(p["size"]), largest_buffer=lambda p: int(p["size"]),
)


def _expect_raises(what: str, fn) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - any clear Python exception is the expected behaviour
        return
    raise CaseFailure(f"{what} did not raise")


def _free_collect(t: Any, s: dict, p: Params) -> Arrays:
    b = t.backend
    bufs: BackendBuffers = s["bufs"]
    h = bufs.alloc(64)
    b.free(h)
    bufs.forget(h)
    _expect_raises("copy_from_device on a freed buffer", lambda: b.copy_from_device(h, np.zeros(64, np.uint8)))
    _expect_raises("free of an already freed buffer", lambda: b.free(h))
    _expect_raises("silu on a freed buffer", lambda: b.silu(h, h, 4))
    # the backend still works after the errors
    h2 = bufs.upload(np.arange(4, dtype=np.float32))
    got = bufs.read(h2, 16).view(np.float32)
    if not np.array_equal(got, np.arange(4, dtype=np.float32)):
        raise CaseFailure(f"backend unusable after rejected calls: read back {got}")
    return {}


FREE = Case(
    name="free", layer="backend",
    description="free releases a buffer; using or freeing it again raises a clear error",
    generate=lambda p, rng: {}, reference=lambda inp, p: {},
    setup=_alloc_setup, launch=lambda t, s, p: None, collect=_free_collect, teardown=_teardown,
    validate_sizes=({},), ops=("free",), comparison="check",
)


def _info_collect(t: Any, s: dict, p: Params) -> Arrays:
    b = t.backend
    name = b.name()
    if not isinstance(name, str) or not name:
        raise CaseFailure(f"name() must be a non-empty string, got {name!r}")
    info = b.device_info()
    fields = info if isinstance(info, dict) else getattr(info, "__dict__", {}) or {
        k: getattr(info, k) for k in dir(info) if not k.startswith("_")}
    if not fields:
        raise CaseFailure(f"device_info() returned nothing usable: {info!r}")
    memory = [v for k, v in fields.items() if "memory" in k and isinstance(v, (int, np.integer))]
    if memory and min(memory) < 0:
        raise CaseFailure(f"device_info() memory must be >= 0, got {memory}")
    b.synchronize()  # with nothing issued it returns at once
    return {}


DEVICE_INFO = Case(
    name="device_info", layer="backend", description="name(), device_info() and an idle synchronize()",
    generate=lambda p, rng: {}, reference=lambda inp, p: {},
    setup=lambda t, inp, p: {}, launch=lambda t, s, p: None, collect=_info_collect,
    validate_sizes=({},), ops=("name", "device_info", "synchronize"), comparison="check",
)


def _order_generate(p: Params, rng: np.random.Generator) -> Arrays:
    return {"a": uniform(rng, p["size"]), "b": uniform(rng, p["size"])}


def _order_reference(inp: Arrays, p: Params) -> Arrays:
    a, b = inp["a"].copy(), inp["b"]
    for _ in range(int(p["repeats"])):  # float32 steps, as the device does them
        a = (a + b).astype(np.float32)
    return {"out": a}


def _order_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "b": bufs.upload(inp["b"]), "out": bufs.guarded(inp["a"].nbytes, payload=inp["a"])}


def _order_launch(t: Any, s: dict, p: Params) -> None:
    out = s["out"].handle
    for _ in range(int(p["repeats"])):
        t.backend.add(out, s["b"], out, int(p["size"]))


ORDERING = Case(
    name="ordering", layer="backend",
    description="a chain of dependent in-place adds sees every earlier result (issue order, synchronize)",
    generate=_order_generate, reference=_order_reference, setup=_order_setup, launch=_order_launch,
    collect=lambda t, s, p: _sync_read(t, s, ("out",)), teardown=_teardown,
    validate_sizes=({"size": 1000, "repeats": 8}, {"size": 70001, "repeats": 3}),
    ops=("add", "synchronize"), tolerance=0.0, comparison="exact",
    bytes_moved=lambda p: 12 * int(p["size"]) * int(p["repeats"]),
    footprint=lambda p: 8 * int(p["size"]), largest_buffer=lambda p: 4 * int(p["size"]),
)


def _issue_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "a": bufs.upload(inp["a"]), "b": bufs.upload(inp["b"]), "out": bufs.guarded(4 * int(p["size"]))}


def _issue_launch(t: Any, s: dict, p: Params) -> None:
    add, a, b, out, n = t.backend.add, s["a"], s["b"], s["out"].handle, int(p["size"])
    for _ in range(int(p["ops"])):
        add(a, b, out, n)


ISSUE_RATE = Case(
    name="issue_rate", layer="backend",
    description="host cost of issuing ops through the Python API: `ops` tiny independent adds per call "
                "(ops per second = ops / time per call)",
    generate=lambda p, rng: {"a": uniform(rng, p["size"]), "b": uniform(rng, p["size"])},
    reference=lambda inp, p: {"out": _f64(inp["a"]) + _f64(inp["b"])},
    setup=_issue_setup, launch=_issue_launch,
    collect=lambda t, s, p: _sync_read(t, s, ("out",)), teardown=_teardown,
    validate_sizes=({"size": 64, "ops": 16},), bench_sizes=({"size": 64, "ops": 1000},),
    ops=("add",), tolerance=ELEMENTWISE_TOL,
    bytes_moved=lambda p: 12 * int(p["size"]) * int(p["ops"]),
    footprint=lambda p: 12 * int(p["size"]), largest_buffer=lambda p: 4 * int(p["size"]),
)


from .matmul_f16 import MATMUL_F16  # noqa: E402  (its own module; the fp16 cooperative-matrix op)

BACKEND_CASES: tuple[Case, ...] = (
    ADD, ELEMENT_MUL, SILU, SOFTMAX, SOFTMAX_LARGE, RMS_NORM, ROPE, MATMUL, MATMUL_F16, QUANTIZED_MATMUL,
    ATTN_SCORE, ATTN_VALUE, ATTENTION, COPY_BUFFER, COPY_BUFFER_OFFSET, COPY_ROUNDTRIP,
    ALLOCATE, FREE, DEVICE_INFO, ORDERING, ISSUE_RATE,
)
