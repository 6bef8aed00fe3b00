"""The float64 references of the LLM ops: what each op computes, in plain NumPy.

The cases (llm_ops.py) compare every backend's float32 output with these; inputs are widened
to float64 first, scalars the trait passes as f32 are rounded to float32 as a device gets them.
"""

from __future__ import annotations

import math

import numpy as np


def f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x, w = f64(x), f64(w)
    return x * w / math.sqrt(float(np.mean(x * x)) + float(np.float32(eps)))


def rope(v: np.ndarray, n_heads: int, head_dim: int, pos: int, freq_base: float) -> np.ndarray:
    """Interleaved-pair rotation (GPT-J / ggml normal mode) with float64 angles."""
    x = f64(v).reshape(n_heads, head_dim // 2, 2)
    i = np.arange(head_dim // 2, dtype=np.float64)
    theta = pos * float(np.float32(freq_base)) ** (-2.0 * i / head_dim)
    c, s = np.cos(theta), np.sin(theta)
    x0, x1 = x[..., 0], x[..., 1]
    return np.stack([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1).reshape(-1)


def matmul(a: np.ndarray, b: np.ndarray, m: int, n: int, k: int) -> np.ndarray:
    return (f64(a).reshape(m, k) @ f64(b).reshape(k, n)).ravel()


def quantized_matmul(w_raw: np.ndarray, x: np.ndarray, dtype: str, rows: int, cols: int, n_vecs: int = 1) -> np.ndarray:
    """W x for each of the n_vecs vectors of x (back to back): the products back to back."""
    from kbench import quant

    w = f64(quant.dequantize(w_raw.tobytes(), dtype, (rows, cols)))
    return (f64(x).reshape(n_vecs, cols) @ w.T).reshape(-1)


def attn_score(q: np.ndarray, k_cache: np.ndarray, head: int, kv_head: int, head_dim: int, seq_len: int,
               n_kv_heads: int) -> np.ndarray:
    """One query head against its kv head's keys (GQA layout [t, kv_head, d]), scaled by 1/sqrt(hd)."""
    k = f64(k_cache).reshape(seq_len, n_kv_heads, head_dim)[:, kv_head, :]
    return k @ f64(q)[head * head_dim:(head + 1) * head_dim] / math.sqrt(head_dim)


def attn_value(w: np.ndarray, v_cache: np.ndarray, kv_head: int, head_dim: int, seq_len: int,
               n_kv_heads: int) -> np.ndarray:
    """Weights over the kv head's values (GQA layout [t, kv_head, d])."""
    return f64(w) @ f64(v_cache).reshape(seq_len, n_kv_heads, head_dim)[:, kv_head, :]
