"""NumpyBackend, the float64 oracle: every op against straightforward float64 formulas
written element by element (small shapes, edge sizes), plus the GQA attention chain."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from kbench.backend import (
    BackendClosedError,
    BufferHandle,
    ComputeBackend,
    DType,
    NumpyBackend,
    create_backend,
)
from kbench.quant import dequantize, quantize, row_bytes

GUARD = 16  # float32 guard elements after every output
SENTINEL = np.float32(-1234.5)


@pytest.fixture
def be():
    with NumpyBackend() as backend:
        yield backend


def upload(be: ComputeBackend, values, extra: int = 0) -> BufferHandle:
    arr = np.ascontiguousarray(values, dtype=np.float32).ravel()
    h = be.allocate((arr.size + extra) * 4)
    be.copy_to_device(arr, h)
    return h


def output(be: ComputeBackend, n: int) -> BufferHandle:
    """An output buffer of n elements followed by GUARD sentinel elements."""
    h = be.allocate((n + GUARD) * 4)
    be.copy_to_device(np.full(n + GUARD, SENTINEL, dtype=np.float32), h)
    return h


def download(be: ComputeBackend, h: BufferHandle, n: int | None = None) -> np.ndarray:
    out = np.empty(h.size_elems if n is None else n, dtype=np.float32)
    be.copy_from_device(h, out)
    return out


def read_output(be: ComputeBackend, h: BufferHandle, n: int) -> np.ndarray:
    """The first n elements, after checking that the guard elements were not written."""
    full = download(be, h)
    guard = full[n:]
    assert np.all(guard == SENTINEL), f"guard elements after the {n} outputs were overwritten: {guard[guard != SENTINEL][:4]}"
    assert not np.isnan(full[:n]).any(), "output contains NaN"
    return full[:n]


def assert_rounded_from(out: np.ndarray, ref, what: str) -> None:
    """out must be the float64 reference rounded once to float32 (within float64 noise)."""
    ref = np.asarray(ref, dtype=np.float64)
    np.testing.assert_allclose(out, ref, rtol=1e-7, atol=1e-12, err_msg=what)


def rand(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


# ---- identity and lifetime ----------------------------------------------------------------------

def test_name_and_device_info_describe_the_host():
    be = NumpyBackend()
    info = be.device_info()
    assert be.name() == "numpy" and info.backend == "numpy"
    assert info.compute_units == os.cpu_count()
    assert info.memory_bytes > 0 and isinstance(info.name, str) and info.name
    be.close()


def test_create_backend_numpy_and_unknown_kind():
    be = create_backend("numpy")
    assert isinstance(be, NumpyBackend)
    be.close()
    with pytest.raises(ValueError, match=r"unknown backend kind 'cuda'; known kinds: vulkan, numpy"):
        create_backend("cuda")
    with pytest.raises(TypeError, match=r"takes no options"):
        create_backend("numpy", fast=True)


def test_importing_the_backend_package_does_not_load_vulkan():
    code = "import sys, kbench.backend; print('vulkan' in sys.modules, 'kbench.backend.vulkan_backend' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.stdout.split() == ["False", "False"], result.stdout + result.stderr


def test_compute_backend_is_abstract():
    with pytest.raises(TypeError, match=r"abstract"):
        ComputeBackend()  # type: ignore[abstract]


def test_allocate_gives_zero_filled_distinct_hashable_handles(be):
    a, b = be.allocate(10), be.allocate(10)
    assert a != b and len({a, b}) == 2 and a.size_bytes == 10
    raw = bytearray(10)
    raw[:] = b"\xff" * 10
    be.copy_from_device(a, raw)
    assert raw == bytearray(10)
    assert set(be.live_buffers()) == {a, b}
    be.free(a)
    assert be.live_buffers() == (b,)


def test_close_frees_everything_and_later_calls_fail():
    be = NumpyBackend()
    h = be.allocate(8)
    be.close()
    assert be.closed and be.live_buffers() == ()
    be.close()  # idempotent
    with pytest.raises(BackendClosedError, match=r"allocate: the numpy backend is closed"):
        be.allocate(8)
    with pytest.raises(BackendClosedError, match=r"softmax: .* closed"):
        be.softmax(h, h, 1)


# ---- copies -----------------------------------------------------------------------------------

def test_copy_to_device_writes_prefix_and_leaves_rest(be):
    h = be.allocate(12)
    be.copy_to_device(b"\x01\x02\x03", h)
    be.copy_to_device(np.array([0x0504], dtype="<u2"), h)  # any dtype, counted in bytes
    raw = bytearray(12)
    be.copy_from_device(h, raw)
    assert raw == bytearray(b"\x04\x05\x03" + b"\x00" * 9)


def test_copy_from_device_reads_only_len_data(be):
    h = upload(be, [1.0, 2.0, 3.0])
    two = np.zeros(2, dtype=np.float32)
    be.copy_from_device(h, two)
    assert two.tolist() == [1.0, 2.0]
    mv = memoryview(bytearray(4))
    be.copy_from_device(h, mv)
    assert np.frombuffer(mv, np.float32)[0] == 1.0


def test_copy_buffer_and_copy_buffer_offset_move_bytes(be):
    src = be.allocate(10)
    be.copy_to_device(bytes(range(10)), src)
    dst = be.allocate(10)
    be.copy_buffer(src, dst, 4)
    be.copy_buffer_offset(src, dst, 5, 7, 3)  # odd byte offsets are fine for byte copies
    raw = bytearray(10)
    be.copy_from_device(dst, raw)
    assert list(raw) == [0, 1, 2, 3, 0, 0, 0, 5, 6, 7]
    be.copy_buffer_offset(src, src, 0, 6, 4)  # same buffer, disjoint ranges
    be.copy_from_device(src, raw)
    assert list(raw) == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]


# ---- elementwise and reductions -----------------------------------------------------------------

SIZES = [1, 2, 7, 33, 257, 1000]


@pytest.mark.parametrize("size", SIZES)
def test_add_and_element_mul(be, size):
    rng = np.random.default_rng(size)
    a, b = rand(rng, size), rand(rng, size)
    ha, hb = upload(be, a), upload(be, b)
    hs, hm = output(be, size), output(be, size)
    be.add(ha, hb, hs, size)
    be.element_mul(ha, hb, hm, size)
    assert_rounded_from(read_output(be, hs, size), [float(x) + float(y) for x, y in zip(a, b)], "add")
    assert_rounded_from(read_output(be, hm, size), [float(x) * float(y) for x, y in zip(a, b)], "element_mul")


@pytest.mark.parametrize("size", SIZES)
def test_silu(be, size):
    x = rand(np.random.default_rng(size), size, lo=-8, hi=8)
    x[0] = -100.0 if size > 1 else x[0]
    h, o = upload(be, x), output(be, size)
    be.silu(h, o, size)
    expected = [float(v) / (1.0 + math.exp(-float(v))) for v in x]
    assert_rounded_from(read_output(be, o, size), expected, "silu")


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("scale", [1.0, 1000.0])
def test_softmax(be, size, scale):
    x = rand(np.random.default_rng(size), size) * np.float32(scale)
    h, o = upload(be, x), output(be, size)
    be.softmax(h, o, size)
    peak = max(float(v) for v in x)
    exps = [math.exp(float(v) - peak) for v in x]
    total = math.fsum(exps)
    out = read_output(be, o, size)
    assert_rounded_from(out, [e / total for e in exps], f"softmax size {size} scale {scale}")
    if size == 1:
        assert out[0] == 1.0


def test_softmax_in_place(be):
    x = rand(np.random.default_rng(0), 50, lo=-5, hi=5)
    h = upload(be, x)
    be.softmax(h, h, 50)
    e = np.exp(x.astype(np.float64) - x.max())
    assert_rounded_from(download(be, h), e / e.sum(), "in-place softmax")


def test_softmax_only_touches_size_elements(be):
    x = rand(np.random.default_rng(1), 10)
    h = upload(be, x)
    be.softmax(h, h, 4)
    out = download(be, h)
    np.testing.assert_array_equal(out[4:], x[4:], err_msg="elements past size changed")
    assert abs(out[:4].sum() - 1.0) < 1e-6


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("eps", [1e-5, 1e-6])
def test_rms_norm(be, size, eps):
    rng = np.random.default_rng(size)
    x, w = rand(rng, size), rand(rng, size, lo=0.5, hi=1.5)
    hx, hw, o = upload(be, x), upload(be, w), output(be, size)
    be.rms_norm(hx, hw, o, size, eps)
    eps32 = float(np.float32(eps))
    mean_sq = math.fsum(float(v) ** 2 for v in x) / size
    expected = [float(v) * float(g) / math.sqrt(mean_sq + eps32) for v, g in zip(x, w)]
    assert_rounded_from(read_output(be, o, size), expected, f"rms_norm size {size}")


def test_rms_norm_of_zeros_is_zero_not_nan(be):
    hx, hw, o = upload(be, np.zeros(8)), upload(be, np.ones(8)), output(be, 8)
    be.rms_norm(hx, hw, o, 8, 1e-6)
    assert read_output(be, o, 8).tolist() == [0.0] * 8


def test_rms_norm_in_place(be):
    x = rand(np.random.default_rng(2), 16)
    h, w = upload(be, x), upload(be, np.ones(16))
    be.rms_norm(h, w, h, 16, 0.0)
    x64 = x.astype(np.float64)
    assert_rounded_from(download(be, h), x64 / np.sqrt(np.mean(x64 ** 2)), "in-place rms_norm")


# ---- matmul ------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 5, 7), (4, 1, 9), (1, 6, 2), (2, 3, 1), (17, 13, 33)])
def test_matmul(be, m, n, k):
    rng = np.random.default_rng(m * 100 + n * 10 + k)
    a, b = rand(rng, m, k), rand(rng, k, n)
    ha, hb, o = upload(be, a), upload(be, b), output(be, m * n)
    be.matmul(ha, hb, o, m, n, k)
    expected = [[math.fsum(float(a[i, p]) * float(b[p, j]) for p in range(k)) for j in range(n)] for i in range(m)]
    assert_rounded_from(read_output(be, o, m * n).reshape(m, n), expected, f"matmul {m}x{n}x{k}")


def test_matmul_reads_only_its_ranges_of_larger_buffers(be):
    a = np.arange(1, 9, dtype=np.float32)  # 2x2 uses the first 4
    b = np.arange(1, 9, dtype=np.float32)[::-1].copy()
    ha, hb, o = upload(be, a), upload(be, b), output(be, 4)
    be.matmul(ha, hb, o, 2, 2, 2)
    assert read_output(be, o, 4).tolist() == [1 * 8 + 2 * 6, 1 * 7 + 2 * 5, 3 * 8 + 4 * 6, 3 * 7 + 4 * 5]


# ---- rope ----------------------------------------------------------------------------------------

def rope_reference(v: np.ndarray, n_heads: int, head_dim: int, pos: int, base: float) -> list[float]:
    out = [float(x) for x in v[: n_heads * head_dim]]
    base = float(np.float32(base))
    for h in range(n_heads):
        for i in range(head_dim // 2):
            theta = pos * base ** (-2.0 * i / head_dim)
            c, s = math.cos(theta), math.sin(theta)
            j = h * head_dim + 2 * i
            x0, x1 = float(v[j]), float(v[j + 1])
            out[j], out[j + 1] = x0 * c - x1 * s, x0 * s + x1 * c
    return out


@pytest.mark.parametrize("pos", [0, 1, 7, 511, 513, 4097, 32767, 131071])
@pytest.mark.parametrize("head_dim,n_heads_q,n_heads_k", [(2, 1, 1), (8, 4, 2), (64, 4, 1), (128, 2, 2)])
def test_rope_gqa_positions(be, pos, head_dim, n_heads_q, n_heads_k):
    rng = np.random.default_rng(pos + head_dim)
    q, k = rand(rng, n_heads_q * head_dim), rand(rng, n_heads_k * head_dim)
    hq, hk = upload(be, q), upload(be, k)
    be.rope(hq, hk, pos, head_dim, 10000.0, n_heads_q, n_heads_k)
    assert_rounded_from(download(be, hq), rope_reference(q, n_heads_q, head_dim, pos, 10000.0), f"rope q pos {pos}")
    assert_rounded_from(download(be, hk), rope_reference(k, n_heads_k, head_dim, pos, 10000.0), f"rope k pos {pos}")


def test_rope_other_base_and_untouched_tail(be):
    q = rand(np.random.default_rng(9), 40)
    k = rand(np.random.default_rng(10), 24)
    hq, hk = upload(be, q), upload(be, k)
    be.rope(hq, hk, 3000, 16, 500000.0, 2, 1)  # uses 32 of q and 16 of k
    out_q, out_k = download(be, hq), download(be, hk)
    assert_rounded_from(out_q[:32], rope_reference(q, 2, 16, 3000, 500000.0), "rope q base 5e5")
    assert_rounded_from(out_k[:16], rope_reference(k, 1, 16, 3000, 500000.0), "rope k base 5e5")
    np.testing.assert_array_equal(out_q[32:], q[32:], err_msg="q past n_heads_q*head_dim changed")
    np.testing.assert_array_equal(out_k[16:], k[16:], err_msg="k past n_heads_k*head_dim changed")


def test_rope_at_position_zero_is_identity(be):
    q = rand(np.random.default_rng(4), 16)
    hq, hk = upload(be, q), upload(be, q)
    be.rope(hq, hk, 0, 8, 10000.0, 2, 2)
    np.testing.assert_array_equal(download(be, hq), q)


# ---- attention -------------------------------------------------------------------------------------

def test_attn_score_with_offsets_and_stride(be):
    rng = np.random.default_rng(5)
    hd, T, stride, kv_off, head_off = 6, 5, 20, 7, 3
    q = rand(rng, head_off + hd + 2)
    kc = rand(rng, (T - 1) * stride + kv_off + hd)
    hq, hk, s = upload(be, q), upload(be, kc), output(be, T)
    be.attn_score(hq, hk, s, hd, T, head_off, kv_off, stride)
    expected = [math.fsum(float(q[head_off + d]) * float(kc[t * stride + kv_off + d]) for d in range(hd)) / math.sqrt(hd)
                for t in range(T)]
    assert_rounded_from(read_output(be, s, T), expected, "attn_score")


def test_attn_value_with_offsets_and_stride(be):
    rng = np.random.default_rng(6)
    hd, T, stride, kv_off, out_off = 6, 5, 20, 7, 4
    w = rand(rng, T, lo=0, hi=1)
    vc = rand(rng, (T - 1) * stride + kv_off + hd)
    hw, hv = upload(be, w), upload(be, vc)
    o = be.allocate((out_off + hd + GUARD) * 4)
    be.copy_to_device(np.full(out_off + hd + GUARD, SENTINEL, np.float32), o)
    be.attn_value(hw, hv, o, hd, T, kv_off, stride, out_off)
    full = download(be, o)
    assert np.all(full[:out_off] == SENTINEL) and np.all(full[out_off + hd:] == SENTINEL), "wrote outside its range"
    expected = [math.fsum(float(w[t]) * float(vc[t * stride + kv_off + d]) for t in range(T)) for d in range(hd)]
    assert_rounded_from(full[out_off:out_off + hd], expected, "attn_value")


@pytest.mark.parametrize("seq_len", [1, 9])
def test_attention_chain_gqa_matches_direct_attention(be, seq_len):
    rng = np.random.default_rng(seq_len)
    n_heads, n_kv, hd = 4, 2, 8
    q = rand(rng, n_heads * hd)
    K = rand(rng, seq_len, n_kv * hd)
    V = rand(rng, seq_len, n_kv * hd)
    hq, hK, hV = upload(be, q), upload(be, K), upload(be, V)
    scores, out = be.allocate(seq_len * 4), output(be, n_heads * hd)
    for h in range(n_heads):
        kvh = h // (n_heads // n_kv)
        be.attn_score(hq, hK, scores, hd, seq_len, h * hd, kvh * hd, n_kv * hd)
        be.softmax(scores, scores, seq_len)
        be.attn_value(scores, hV, out, hd, seq_len, kvh * hd, n_kv * hd, h * hd)
    be.synchronize()
    got = read_output(be, out, n_heads * hd).reshape(n_heads, hd)
    q64, K64, V64 = (a.astype(np.float64) for a in (q.reshape(n_heads, hd), K.reshape(seq_len, n_kv, hd), V.reshape(seq_len, n_kv, hd)))
    for h in range(n_heads):
        kvh = h * n_kv // n_heads
        logits = K64[:, kvh, :] @ q64[h] / math.sqrt(hd)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        expected = p @ V64[:, kvh, :]
        # the chain rounds scores and probabilities to float32 in between
        np.testing.assert_allclose(got[h], expected, rtol=2e-6, atol=1e-7, err_msg=f"head {h}")


# ---- quantized_matmul -------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_quantized_matmul_every_dtype(be, dtype):
    rng = np.random.default_rng(int(dtype))
    n_rows = 3
    n_cols = 2 * dtype.block_elems if dtype.is_quantized else 40
    W = rand(rng, n_rows, n_cols)
    data = quantize(W, dtype)
    x = rand(rng, n_cols)
    hw = be.allocate(len(data) + 5)  # larger than needed: only n_rows rows are read
    be.copy_to_device(data, hw)
    hx, o = upload(be, x), output(be, n_rows)
    be.quantized_matmul(hw, hx, o, n_rows, n_cols, dtype)
    Wd = dequantize(data, dtype, (n_rows, n_cols))
    expected = [math.fsum(float(Wd[r, c]) * float(x[c]) for c in range(n_cols)) for r in range(n_rows)]
    assert_rounded_from(read_output(be, o, n_rows), expected, f"quantized_matmul {dtype.name}")


def test_quantized_matmul_accepts_int_dtype_and_reads_rows_at_row_stride(be):
    rng = np.random.default_rng(12)
    W = rand(rng, 5, 64)
    data = quantize(W, DType.Q4_0)
    assert len(data) == 5 * row_bytes(DType.Q4_0, 64)
    hw = be.allocate(len(data))
    be.copy_to_device(data, hw)
    hx = upload(be, np.eye(64, dtype=np.float32)[10])  # picks column 10
    o1, o2 = output(be, 5), output(be, 5)
    be.quantized_matmul(hw, hx, o1, 5, 64, 2)
    be.quantized_matmul(hw, hx, o2, 5, 64, DType.Q4_0)
    col = dequantize(data, DType.Q4_0, (5, 64))[:, 10]
    np.testing.assert_array_equal(read_output(be, o1, 5), col)
    np.testing.assert_array_equal(read_output(be, o2, 5), col)
