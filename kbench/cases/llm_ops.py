"""Case declarations of the LLM ops (elementwise, reductions, rope, matmul, quantized_matmul,
attention): inputs, float64 references (references.py), tolerances and model-like sizes; see
op_helpers.py for the shared tolerances and size tables."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import references as ref
from .base import Arrays, Case, Params
from .buffers import BackendBuffers
from .compare import GUARD_BYTES
from .op_helpers import (
    DEFAULT_MAX_ELEMS, ELEMENTWISE_TOL, EW_BENCH, EW_VALIDATE, MATMUL_TOL, MiB, QMATMUL_DTYPES,
    QMATMUL_MAIN_DTYPES, REDUCE_BENCH, REDUCE_VALIDATE, SOFTMAX_TOL, f32_elems, over_default, read_back, sizes,
    sync_read, teardown, uniform,
)


# --------------------------------------------------------------------------- elementwise

def _elementwise_case(name: str, description: str, generate, reference, setup, launch,
                      buffers: tuple[str, ...], flops_per: int, quick: Params | None = None) -> Case:
    """An op over ``size`` float32 elements of each of ``buffers`` (in place too)."""
    return Case(
        name=name, layer="backend", description=description,
        generate=generate, reference=reference, setup=setup, launch=launch,
        collect=read_back("out"), teardown=teardown,
        validate_sizes=sizes("size", EW_VALIDATE) + ({"size": 4097, "inplace": True},),
        bench_sizes=sizes("size", EW_BENCH), full_only=over_default("size", DEFAULT_MAX_ELEMS), quick=quick,
        ops=(name,), tolerance=ELEMENTWISE_TOL,
        buffers=lambda p: {b: f32_elems(p) for b in buffers},
        flops=lambda p: flops_per * int(p["size"]), peak="copy_bandwidth",
    )


def _unary(name: str, math_fn, flops_per: int, description: str) -> Case:
    def generate(p: Params, rng: np.random.Generator) -> Arrays:
        return {"x": uniform(rng, p["size"], p.get("scale", 1.0))}

    def reference(inp: Arrays, p: Params) -> Arrays:
        return {"out": math_fn(ref.f64(inp["x"]))}

    def setup(t: Any, inp: Arrays, p: Params) -> dict:
        bufs = BackendBuffers(t.backend)
        n = int(p["size"])
        if p.get("inplace"):
            out = bufs.guarded(4 * n, payload=inp["x"])
            return {"bufs": bufs, "x": out.handle, "out": out}
        return {"bufs": bufs, "x": bufs.upload(inp["x"]), "out": bufs.guarded(4 * n)}

    def launch(t: Any, s: dict, p: Params) -> None:
        getattr(t.backend, name)(s["x"], s["out"].handle, int(p["size"]))

    return _elementwise_case(name, description, generate, reference, setup, launch, ("input", "output"),
                             flops_per)


def _binary(name: str, math_fn, description: str, quick: Params | None = None) -> Case:
    def generate(p: Params, rng: np.random.Generator) -> Arrays:
        return {"a": uniform(rng, p["size"]), "b": uniform(rng, p["size"])}

    def reference(inp: Arrays, p: Params) -> Arrays:
        return {"out": math_fn(ref.f64(inp["a"]), ref.f64(inp["b"]))}

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

    return _elementwise_case(name, description, generate, reference, setup, launch, ("a", "b", "output"), 1,
                             quick)


SILU = _unary("silu", ref.silu, 4, "out = x * sigmoid(x)")
ADD = _binary("add", np.add, "out = a + b", quick={"size": DEFAULT_MAX_ELEMS})  # the headline elementwise op
ELEMENT_MUL = _binary("element_mul", np.multiply, "out = a * b")


# --------------------------------------------------------------------------- reductions

def _softmax_case(name: str, scales: tuple[float, ...], description: str, bench: bool) -> Case:
    base = _unary("softmax", ref.softmax, 5, description)
    table = sizes("size", REDUCE_VALIDATE) + ({"size": 4097, "inplace": True},)
    validate = tuple({**s, "scale": sc} for sc in scales for s in table)
    return Case(
        name=name, layer="backend", description=description,
        generate=base.generate, reference=base.reference, setup=base.setup, launch=base.launch,
        collect=base.collect, teardown=teardown,
        validate_sizes=validate,
        bench_sizes=sizes("size", REDUCE_BENCH, scale=scales[0]) if bench else (),
        full_only=over_default("size", DEFAULT_MAX_ELEMS), quick={"size": DEFAULT_MAX_ELEMS} if bench else None,
        ops=("softmax",), tolerance=SOFTMAX_TOL,
        buffers=base.buffers, flops=lambda p: 5 * int(p["size"]), peak="copy_bandwidth",
    )


SOFTMAX = _softmax_case("softmax", (1.0,), "out = exp(x - max x) / sum exp(x - max x)", bench=True)
# Large magnitudes: a naive exp(x) overflows float32 past 88; the stable form must not.
SOFTMAX_LARGE = _softmax_case(
    "softmax_large", (30.0, 1000.0), "softmax of inputs up to +-1000 (numerical stability)", bench=False)


def _rms_generate(p: Params, rng: np.random.Generator) -> Arrays:
    return {"x": uniform(rng, p["size"], float(p.get("scale", 1.0))), "w": uniform(rng, p["size"])}


def _rms_reference(inp: Arrays, p: Params) -> Arrays:
    return {"out": ref.rms_norm(inp["x"], inp["w"], p.get("eps", 1e-5))}


def _rms_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "x": bufs.upload(inp["x"]), "w": bufs.upload(inp["w"]),
            "out": bufs.guarded(4 * int(p["size"]))}


def _rms_launch(t: Any, s: dict, p: Params) -> None:
    t.backend.rms_norm(s["x"], s["w"], s["out"].handle, int(p["size"]), float(p.get("eps", 1e-5)))


RMS_NORM = Case(
    name="rms_norm", layer="backend", description="out = x * w / sqrt(mean(x^2) + eps)",
    generate=_rms_generate, reference=_rms_reference, setup=_rms_setup, launch=_rms_launch,
    collect=read_back("out"), teardown=teardown,
    # scale 3e19: x^2 overflows float32, so the kernels must scale by max |x| as the reference does
    validate_sizes=sizes("size", REDUCE_VALIDATE, eps=1e-5) + ({"size": 1000, "eps": 1e-2},)
    + tuple({"size": n, "eps": 1e-5, "scale": 3e19} for n in (5, 4097, 70001)),
    bench_sizes=sizes("size", REDUCE_BENCH, eps=1e-5),
    full_only=over_default("size", DEFAULT_MAX_ELEMS), quick={"size": DEFAULT_MAX_ELEMS},
    ops=("rms_norm",), tolerance=ELEMENTWISE_TOL,
    buffers=lambda p: {"input": f32_elems(p), "weight": f32_elems(p), "output": f32_elems(p)},
    flops=lambda p: 4 * int(p["size"]), peak="copy_bandwidth",
)


# --------------------------------------------------------------------------- rope

def _rope_generate(p: Params, rng: np.random.Generator) -> Arrays:
    hd = int(p["head_dim"])
    return {"q": uniform(rng, p["n_heads_q"] * hd), "k": uniform(rng, p["n_heads_k"] * hd)}


def _rope_reference(inp: Arrays, p: Params) -> Arrays:
    hd, pos, base = int(p["head_dim"]), int(p["pos"]), float(p.get("freq_base", 10000.0))
    return {"q": ref.rope(inp["q"], int(p["n_heads_q"]), hd, pos, base),
            "k": ref.rope(inp["k"], int(p["n_heads_k"]), hd, pos, base)}


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
    collect=read_back("q", "k"), teardown=teardown,
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
    return {"out": ref.matmul(inp["a"], inp["b"], int(p["m"]), int(p["n"]), int(p["k"]))}


def _mm_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "a": bufs.upload(inp["a"]), "b": bufs.upload(inp["b"]),
            "out": bufs.guarded(4 * int(p["m"]) * int(p["n"]))}


def _mm_launch(t: Any, s: dict, p: Params) -> None:
    t.backend.matmul(s["a"], s["b"], s["out"].handle, int(p["m"]), int(p["n"]), int(p["k"]))


def _mm_buffers(p: Params) -> dict[str, int]:
    m, n, k = int(p["m"]), int(p["n"]), int(p["k"])
    return {"a": 4 * m * k, "b": 4 * k * n, "out": 4 * m * n}


MATMUL = Case(
    name="matmul", layer="backend", description="out[m,n] = A[m,k] @ B[k,n], float32 row-major",
    generate=_mm_generate, reference=_mm_reference, setup=_mm_setup, launch=_mm_launch,
    collect=read_back("out"), teardown=teardown,
    validate_sizes=tuple({"m": m, "n": n, "k": k} for m, n, k in (
        (1, 1, 1), (1, 64, 33), (5, 3, 7), (33, 17, 65), (64, 64, 64), (100, 70, 130), (2, 300, 257))),
    bench_sizes=tuple({"m": s, "n": s, "k": s} for s in (1024, 4096, 8192)), quick={"m": 4096},
    ops=("matmul",), tolerance=MATMUL_TOL,
    buffers=_mm_buffers, flops=lambda p: 2 * int(p["m"]) * int(p["n"]) * int(p["k"]), peak="fp32_fma",
)


# --------------------------------------------------------------------------- quantized_matmul

def _qmm_generate(p: Params, rng: np.random.Generator) -> Arrays:
    from kbench import quant

    rows, cols = int(p["n_rows"]), int(p["n_cols"])
    w = uniform(rng, rows * cols).reshape(rows, cols)
    raw = quant.quantize(w, p["dtype"])
    return {"w": np.frombuffer(raw, dtype=np.uint8).copy(), "x": uniform(rng, _qmm_vecs(p) * cols)}


def _qmm_vecs(p: Params) -> int:
    """Vectors per call: a small-batch decode's tokens (1 where the instance does not say)."""
    return int(p.get("n_vecs", 1))


def _qmm_reference(inp: Arrays, p: Params) -> Arrays:
    return {"y": ref.quantized_matmul(inp["w"], inp["x"], p["dtype"], int(p["n_rows"]), int(p["n_cols"]),
                                      _qmm_vecs(p))}


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
            "y": bufs.guarded(4 * _qmm_vecs(p) * int(p["n_rows"]))}


def _qmm_launch(t: Any, s: dict, p: Params) -> None:
    from kbench.quant import DType

    w = s["ws"][s["next"]]
    s["next"] = (s["next"] + 1) % len(s["ws"])
    t.backend.quantized_matmul(w, s["x"], s["y"].handle, int(p["n_rows"]), int(p["n_cols"]),
                               DType.coerce(p["dtype"]), n_vecs=_qmm_vecs(p))


def _qmm_weight_bytes(p: Params) -> int:
    from kbench.quant import row_bytes

    return int(p["n_rows"]) * row_bytes(p["dtype"], int(p["n_cols"]))


def _qmm_buffers(p: Params) -> dict[str, int]:
    nv = _qmm_vecs(p)
    return {"weights": _qmm_weight_bytes(p), "input": 4 * nv * int(p["n_cols"]), "output": 4 * nv * int(p["n_rows"])}


QUANTIZED_MATMUL = Case(
    name="quantized_matmul", layer="backend",
    description="y[r] = sum_c dequant(W)[r,c] * x[c], W raw GGUF blocks",
    generate=_qmm_generate, reference=_qmm_reference, setup=_qmm_setup, launch=_qmm_launch,
    collect=read_back("y"), teardown=teardown,
    validate_sizes=tuple({"n_rows": r, "n_cols": c} for r, c in ((1, 256), (3, 512), (17, 768), (64, 1024)))
    + ({"n_rows": 17, "n_cols": 768, "n_vecs": 3},),
    # 1024 x 4096: a small model's projection (keeps CPU-driver benches quick); then Llama-3-8B's FFN shapes
    # (the model shapes rotate through >= 256 MiB of weight copies: cold L2, as in a model's layers); with
    # --full also the same shapes re-reading one matrix (rotate_mib=0), the way ggml's perf mode times them,
    # so that the ggml peer has a like-for-like row (a 33 MB matrix may stay in a 50 MB L2)
    # and (--full, the main weight types) batches of 2, 4 and 8 vectors at the model shapes: a small-batch decode,
    bench_sizes=({"n_rows": 1024, "n_cols": 4096}, {"n_rows": 4096, "n_cols": 14336, "rotate_mib": 256},
                 {"n_rows": 14336, "n_cols": 4096, "rotate_mib": 256},
                 {"n_rows": 4096, "n_cols": 14336, "rotate_mib": 0}, {"n_rows": 14336, "n_cols": 4096, "rotate_mib": 0})
    + tuple({"n_rows": r, "n_cols": c, "rotate_mib": 256, "n_vecs": nv}
            for nv in (2, 4, 8) for r, c in ((4096, 14336), (14336, 4096)))
    # (--full) 8 vectors re-reading one matrix: the ggml peer's like-for-like row for a small-batch decode
    + tuple({"n_rows": r, "n_cols": c, "rotate_mib": 0, "n_vecs": 8} for r, c in ((4096, 14336), (14336, 4096))),
    axes={"dtype": QMATMUL_DTYPES},
    full_only=lambda p: "rotate_mib" in p and (not p["rotate_mib"] or p["dtype"] not in QMATMUL_MAIN_DTYPES
                                               or _qmm_vecs(p) > 1),
    omit=lambda p: _qmm_vecs(p) > 1 and p["dtype"] not in QMATMUL_MAIN_DTYPES,
    quick={"n_rows": 14336, "n_cols": 4096, "dtype": QMATMUL_MAIN_DTYPES},
    ops=("quantized_matmul",), tolerance=MATMUL_TOL,
    buffers=_qmm_buffers, flops=lambda p: 2 * _qmm_vecs(p) * int(p["n_rows"]) * int(p["n_cols"]),
    # the weight copies the calls rotate through stay resident beside the one a call reads
    footprint=lambda p: sum(_qmm_buffers(p).values()) + (_qmm_copies(p) - 1) * _qmm_weight_bytes(p),
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
    return ref.attn_score(q, kc, h, _kv_head(h, nh, nkv), hd, t, nkv)


def _value_ref(w: np.ndarray, vc: np.ndarray, h: int, p: Params) -> np.ndarray:
    hd, t, nh, nkv = _attn_dims(p)
    return ref.attn_value(w, vc, _kv_head(h, nh, nkv), hd, t, nkv)


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


def _one_head_case(name: str, description: str, reference, setup, launch, output: str) -> Case:
    """attn_score and attn_value: one head's dot products over the cache (GQA layout), reading
    head_dim * (seq_len + 1) + seq_len floats."""
    return Case(
        name=name, layer="backend", description=description,
        generate=_attn_generate, reference=reference, setup=setup, launch=launch,
        collect=read_back(output), teardown=teardown,
        validate_sizes=ATTN_VALIDATE, bench_sizes=ATTN_BENCH,
        ops=(name,), tolerance=MATMUL_TOL,
        bytes_moved=lambda p: 4 * (int(p["head_dim"]) * (int(p["seq_len"]) + 1) + int(p["seq_len"])),
        flops=lambda p: 2 * int(p["head_dim"]) * int(p["seq_len"]),
        footprint=lambda p: 2 * _cache_bytes(p), largest_buffer=_cache_bytes, peak="copy_bandwidth",
    )


ATTN_SCORE = _one_head_case(
    "attn_score", "scores[t] = q_h . K[t, kv_head] / sqrt(head_dim) (one query head, GQA layout)",
    lambda inp, p: {"scores": _score_ref(inp["q"], inp["kc"], int(p["head"]), p)},
    _score_setup, _score_launch, "scores")


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


ATTN_VALUE = _one_head_case(
    "attn_value", "out[h*hd + d] = sum_t w[t] * V[t, kv_head, d] (one head, GQA layout)",
    lambda inp, p: {"out": _value_ref(inp["w"], inp["vc"], int(p["head"]), p)},
    _value_setup, _value_launch, "out")


def _chain_reference(inp: Arrays, p: Params) -> Arrays:
    hd, T, nh, nkv = _attn_dims(p)
    out = np.empty(nh * hd)
    for h in range(nh):
        out[h * hd:(h + 1) * hd] = _value_ref(ref.softmax(_score_ref(inp["q"], inp["kc"], h, p)), inp["vc"], h, p)
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
    out = sync_read(t, s, ("out",))
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
    collect=_chain_collect, teardown=teardown,
    validate_sizes=tuple({k: v for k, v in s.items() if k != "head"} for s in ATTN_VALIDATE[1:]),
    bench_sizes=({"head_dim": 128, "seq_len": 8192, "n_heads": 32, "n_kv_heads": 8},
                 {"head_dim": 128, "seq_len": 1024, "n_heads": 32, "n_kv_heads": 8}),
    ops=("attn_score", "softmax", "attn_value"), tolerance=SOFTMAX_TOL,
    bytes_moved=_chain_bytes,
    flops=lambda p: int(p["n_heads"]) * (4 * int(p["head_dim"]) * int(p["seq_len"]) + 5 * int(p["seq_len"])),
    footprint=lambda p: 2 * _cache_bytes(p), largest_buffer=_cache_bytes, peak="copy_bandwidth",
)


from .matmul_f16 import MATMUL_BF16, MATMUL_F16  # noqa: E402  (its own module: the fp16/bf16 cooperative-matrix ops)
from .attention_fused import ATTENTION_FUSED  # noqa: E402  (its own module: the fused attention extension op)

#: the LLM-op cases in report order; a new op's case goes here
LLM_OP_CASES: tuple[Case, ...] = (
    ADD, ELEMENT_MUL, SILU, SOFTMAX, SOFTMAX_LARGE, RMS_NORM, ROPE, MATMUL, MATMUL_F16, MATMUL_BF16, QUANTIZED_MATMUL,
    ATTN_SCORE, ATTN_VALUE, ATTENTION, ATTENTION_FUSED,
)
