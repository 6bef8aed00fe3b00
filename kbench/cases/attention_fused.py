"""The attention_fused case: decode attention of one query position over every query head (GQA)
as the one extension op ``attention`` (VulkanBackend: a split-sequence partial pass and one
combine, shaders/attention.comp; the torch peer: scaled_dot_product_attention).

Beside the ``attention`` case, not instead of it: that case runs the trait's three ops per head
(attn_score, softmax, attn_value) and checks them; this one times what a decoder would call.  A
backend without the op (a foreign kernel set, a backend of the trait alone) reports it unsupported.

Reference: the float64 chain per head (references.py); inputs uniform in [-1, 1] as for the chain.
Tolerance ATTENTION_FUSED_TOL = 1e-9 NMSE: fp32 scores, exp and sums measure 1e-14 .. 1e-13 on
lavapipe (3e-14 at the validate sizes, 3.6e-14 at seq 8192, 6.2e-14 at seq 32768) and at most
6e-13 with scores of std ~13 (tests/test_attention_fused.py); a GPU's exp, a few ulp off, stays
orders below 1e-9, which still fails fp16 arithmetic (~1e-7).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kbench.backend.base import has_attention

from . import references as ref
from .base import Arrays, Case, Params, UnsupportedCase
from .buffers import BackendBuffers
from .op_helpers import read_back, teardown, uniform

#: NMSE threshold of attention_fused (see the module docstring)
ATTENTION_FUSED_TOL = 1e-9


def _dims(p: Params) -> tuple[int, int, int, int]:
    return int(p["head_dim"]), int(p["seq_len"]), int(p["n_heads"]), int(p["n_kv_heads"])


def _generate(p: Params, rng: np.random.Generator) -> Arrays:
    hd, t, nh, nkv = _dims(p)
    return {"q": uniform(rng, nh * hd), "kc": uniform(rng, t * nkv * hd), "vc": uniform(rng, t * nkv * hd)}


def _reference(inp: Arrays, p: Params) -> Arrays:
    hd, t, nh, nkv = _dims(p)
    out = np.empty(nh * hd)
    for h in range(nh):
        kvh = h // (nh // nkv)
        w = ref.softmax(ref.attn_score(inp["q"], inp["kc"], h, kvh, hd, t, nkv))
        out[h * hd:(h + 1) * hd] = ref.attn_value(w, inp["vc"], kvh, hd, t, nkv)
    return {"out": out}


def _setup(t: Any, inp: Arrays, p: Params) -> dict:
    if not has_attention(t.backend):
        raise UnsupportedCase(f"the {t.backend.name()} backend has no fused attention op")
    hd, _, nh, _ = _dims(p)
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "q": bufs.upload(inp["q"]), "kc": bufs.upload(inp["kc"]),
            "vc": bufs.upload(inp["vc"]), "out": bufs.guarded(4 * nh * hd)}


def _launch(t: Any, s: dict, p: Params) -> None:
    t.backend.attention(s["q"], s["kc"], s["vc"], s["out"].handle, *_dims(p))


def _buffers(p: Params) -> dict[str, int]:
    """What one call reads and writes: q, K and V once each, out."""
    hd, t, nh, nkv = _dims(p)
    return {"q": 4 * nh * hd, "k_cache": 4 * t * nkv * hd, "v_cache": 4 * t * nkv * hd, "out": 4 * nh * hd}


def _footprint(p: Params) -> int:
    # + the VulkanBackend's partials: per head and chunk head_dim + 2 floats; the split pass's
    # chunks hold >= 64 keys, the streaming pass makes at most about 1024 of them
    hd, t, nh, _ = _dims(p)
    return sum(_buffers(p).values()) + 4 * nh * (hd + 2) * max(-(-t // 64), min(t, 1025))


ATTENTION_FUSED = Case(
    name="attention_fused", layer="backend",
    description="decode attention over every query head (GQA) as one fused op: split-sequence partial "
                "softmax per chunk, one combine (VulkanBackend: 2 dispatches; torch peer: SDPA)",
    generate=_generate, reference=_reference, setup=_setup, launch=_launch,
    collect=read_back("out"), teardown=teardown,
    # seq_len 1, not a multiple of the chunk (64 keys at these sizes), head_dim 32..256, groups of
    # 1, 2, 4 and 6 query heads per kv head
    validate_sizes=tuple({"head_dim": hd, "seq_len": t, "n_heads": nh, "n_kv_heads": nkv}
                         for hd, t, nh, nkv in ((64, 1, 4, 2), (64, 17, 4, 2), (128, 300, 8, 2), (32, 1025, 2, 2),
                                                (256, 100, 4, 1), (96, 200, 12, 2), (128, 1000, 32, 8))),
    bench_sizes=({"head_dim": 128, "seq_len": 8192, "n_heads": 32, "n_kv_heads": 8},
                 {"head_dim": 128, "seq_len": 32768, "n_heads": 32, "n_kv_heads": 8}),
    quick={"seq_len": 8192},
    ops=("attention",), tolerance=ATTENTION_FUSED_TOL,
    buffers=_buffers, footprint=_footprint,
    flops=lambda p: int(p["n_heads"]) * (4 * int(p["head_dim"]) * int(p["seq_len"]) + 5 * int(p["seq_len"])),
    peak="copy_bandwidth",
)
