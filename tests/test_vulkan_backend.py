"""VulkanBackend against float64 NumPy on the local Vulkan device (lavapipe in CI).

Every op is checked with NMSE = sum((out - ref)^2) / sum(ref^2) against a float64 reference
computed from the same float32 inputs, over edge sizes (1, not a multiple of any workgroup
size, beyond one workgroup), with guard bytes around every output range.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from kbench.backend import UnsupportedDTypeError
from kbench.backend.kernels import KernelPolicy, QMATVEC_DTYPES
from kbench.quant import DType, dequantize, quantize

kp = pytest.importorskip("kbench.runtime")


def _vulkan_device_or_reason() -> str | None:
    try:
        if not kp.list_devices():
            return "the Vulkan loader finds no device (install mesa-vulkan-drivers for lavapipe)"
    except Exception as exc:  # no loader / no ICD
        return f"no Vulkan available here: {exc}"
    return None


_NO_DEVICE = _vulkan_device_or_reason()
pytestmark = pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")

# thresholds (compute-backend.md); matmul-class ones are what kbench reaches plus margin:
# measured on lavapipe, fp32 accumulation gives NMSE around 1e-14 .. 1e-12 against float64
NMSE_ELEMENTWISE = 1e-7
NMSE_SOFTMAX = 1e-6
NMSE_MATMUL = 1e-10
# A one-row dot product's plain NMSE is (error / result)^2, which cancellation in the result can
# push anywhere (1e-10 .. 4e-7 seen for 1x32 and 1x256 over 60 seeds). Matmul-class outputs are
# therefore judged against the size of their terms, sum((out-ref)^2) / sum((|A| @ |B|)^2): fp32
# accumulation reaches at most 4.5e-14 here (every shape tested, 40 seeds, lavapipe).
NMSE_MATMUL_TERMS = 1e-12
GUARD_BYTES = 64
SENTINEL = np.frombuffer(bytes([0xA5, 0x5A, 0xC3, 0x3C]) * 4096, np.uint8)


@pytest.fixture(scope="module")
def be():
    from kbench.backend import VulkanBackend

    backend = VulkanBackend()
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def be_shared():
    """A backend forced onto the portable shared-memory reductions (no subgroup ops)."""
    from kbench.backend import VulkanBackend

    backend = VulkanBackend(use_subgroups=False)
    yield backend
    backend.close()


@pytest.fixture
def rng(request):
    # a different stream per test, the same in every process (str hash() is salted per process)
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


# -- helpers ------------------------------------------------------------------------------------

def nmse(out: np.ndarray, ref: np.ndarray) -> float:
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert not np.isnan(out).any(), f"output has {int(np.isnan(out).sum())} NaN values"
    denom = float(np.sum(ref * ref))
    err = float(np.sum((out - ref) ** 2))
    return err / denom if denom else err


def f64(x: np.ndarray) -> np.ndarray:
    """The float32 inputs as the float64 reference sees them."""
    return np.asarray(x, np.float32).astype(np.float64)


def upload(be, x) -> object:
    x = np.ascontiguousarray(x, np.float32)
    h = be.allocate(x.nbytes)
    be.copy_to_device(x, h)
    return h


def upload_bytes(be, data: bytes):
    h = be.allocate(len(data))
    be.copy_to_device(data, h)
    return h


class Guarded:
    """An output buffer of n float32 at element offset ``front``, surrounded by sentinel bytes."""

    def __init__(self, be, n: int, front: int = 0):
        self.be, self.n, self.front = be, n, front
        self.nbytes = (front + n) * 4 + GUARD_BYTES
        self.handle = be.allocate(self.nbytes)
        be.copy_to_device(np.resize(SENTINEL, self.nbytes), self.handle)

    def read(self) -> np.ndarray:
        raw = np.empty(self.nbytes, np.uint8)
        self.be.copy_from_device(self.handle, raw)
        lo, hi = self.front * 4, (self.front + self.n) * 4
        expected = np.resize(SENTINEL, self.nbytes)
        bad_front = np.flatnonzero(raw[:lo] != expected[:lo])
        bad_back = np.flatnonzero(raw[hi:] != expected[hi:])
        assert bad_front.size == 0, f"bytes before the output changed at offsets {bad_front[:8].tolist()}"
        assert bad_back.size == 0, f"bytes after the output changed at offsets {(bad_back[:8] + hi).tolist()}"
        return raw[lo:hi].view(np.float32).copy()


def download(be, h, n: int) -> np.ndarray:
    out = np.empty(n, np.float32)
    be.copy_from_device(h, out)
    return out


def assert_nmse(out, ref, limit, what):
    err = nmse(out, ref)
    assert err <= limit, f"{what}: NMSE {err:.3e} above {limit:.0e}"


def assert_product_close(out, a, b, what, limit: float = NMSE_MATMUL_TERMS) -> None:
    """``out`` against float64 ``a @ b``, its error measured against the magnitude of the terms."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ref, terms = a @ b, np.abs(a) @ np.abs(b)
    out = np.asarray(out, np.float64).reshape(ref.shape)
    assert not np.isnan(out).any(), f"{what}: output has {int(np.isnan(out).sum())} NaN values"
    sq_err = float(np.sum((out - ref) ** 2))
    err = sq_err / float(np.sum(terms * terms)) if terms.any() else sq_err
    assert err <= limit, (f"{what}: error {err:.3e} of the terms' size, above {limit:.0e} "
                          f"(plain NMSE {nmse(out, ref):.3e})")


# -- device and buffers -------------------------------------------------------------------------

def test_device_info_names_vulkan_and_device_local_memory(be):
    info = be.device_info()
    assert info.backend == "vulkan" and be.name() == "vulkan"
    heaps = be.device_properties["memory_heaps"]
    assert info.memory_bytes == sum(h["size"] for h in heaps if h["device_local"]) > 0
    assert info.compute_units == 0
    assert info.name == be.device_properties["device_name"]


@pytest.mark.parametrize("nbytes", [1, 3, 17, 4096 + 5])
def test_buffers_round_trip_and_start_zeroed(be, rng, nbytes):
    h = be.allocate(nbytes)
    got = bytearray(nbytes)
    be.copy_from_device(h, got)
    assert got == bytearray(nbytes), "a new buffer must be zero-filled"
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    be.copy_to_device(data, h)
    back = np.empty(nbytes, np.uint8)
    be.copy_from_device(h, back)
    assert np.array_equal(back, data)
    be.free(h)


@pytest.mark.parametrize("src_off,dst_off,size", [(0, 0, 4096), (16, 32, 1600), (4, 8, 1000), (13, 101, 333),
                                              (0, 16, 1), (3, 0, 4)])
def test_copy_buffer_offset_aligned_and_unaligned(be, rng, src_off, dst_off, size):
    """16-byte and 4-byte aligned copies run as a shader, the rest as a transfer copy."""
    src_data = rng.integers(0, 256, src_off + size + 7, dtype=np.uint8)
    src = upload_bytes(be, src_data.tobytes())
    dst_len = dst_off + size + GUARD_BYTES
    dst_init = np.resize(SENTINEL, dst_len)
    dst = upload_bytes(be, dst_init.tobytes())
    be.copy_buffer_offset(src, dst, src_off, dst_off, size)
    got = np.empty(dst_len, np.uint8)
    be.copy_from_device(dst, got)
    want = dst_init.copy()
    want[dst_off:dst_off + size] = src_data[src_off:src_off + size]
    assert np.array_equal(got, want), f"first differing byte at {int(np.argmax(got != want))}"


def test_copy_within_one_buffer_to_a_disjoint_range(be, rng):
    data = rng.integers(0, 256, 4096, dtype=np.uint8)
    h = upload_bytes(be, data.tobytes())
    be.copy_buffer_offset(h, h, 0, 2048, 1024)
    got = np.empty(4096, np.uint8)
    be.copy_from_device(h, got)
    want = data.copy()
    want[2048:3072] = data[:1024]
    assert np.array_equal(got, want)


def test_copy_buffer_offset_writes_only_its_range(be, rng):
    src_data = rng.integers(0, 256, 1000, dtype=np.uint8)
    src = upload_bytes(be, src_data.tobytes())
    dst_len = 777
    dst_init = np.resize(SENTINEL, dst_len)
    dst = upload_bytes(be, dst_init.tobytes())
    be.copy_buffer_offset(src, dst, 13, 101, 333)
    be.copy_buffer(src, dst, 7)
    got = np.empty(dst_len, np.uint8)
    be.copy_from_device(dst, got)
    want = dst_init.copy()
    want[101:434] = src_data[13:346]
    want[:7] = src_data[:7]
    assert np.array_equal(got, want), f"first differing byte at {int(np.argmax(got != want))}"


# -- elementwise ---------------------------------------------------------------------------------

ELEMENTWISE_SIZES = [1, 3, 4, 5, 1023, 4099, 300_001]


@pytest.mark.parametrize("size", ELEMENTWISE_SIZES)
@pytest.mark.parametrize("op", ["add", "element_mul", "silu"])
def test_elementwise_matches_float64(be, rng, op, size):
    a = rng.uniform(-1, 1, size).astype(np.float32)
    b = rng.uniform(-1, 1, size).astype(np.float32)
    ha, hb = upload(be, a), upload(be, b)
    out = Guarded(be, size)
    if op == "add":
        be.add(ha, hb, out.handle, size)
        ref = f64(a) + f64(b)
    elif op == "element_mul":
        be.element_mul(ha, hb, out.handle, size)
        ref = f64(a) * f64(b)
    else:
        be.silu(ha, out.handle, size)
        ref = f64(a) / (1.0 + np.exp(-f64(a)))
    assert_nmse(out.read(), ref, NMSE_ELEMENTWISE, f"{op}[{size}]")


def test_elementwise_in_place_and_large_silu_inputs(be, rng):
    n = 1001
    a = (rng.uniform(-1, 1, n) * 100).astype(np.float32)  # exp(-x) overflows for x < -88
    b = rng.uniform(-1, 1, n).astype(np.float32)
    ha, hb = upload(be, a), upload(be, b)
    be.add(ha, hb, ha, n)  # a += b
    be.element_mul(ha, hb, hb, n)  # b = a * b
    be.silu(hb, hb, n)
    s = (f64(np.float32(f64(a) + f64(b))) * f64(b)).astype(np.float32)
    ref = f64(s) / (1.0 + np.exp(-f64(s)))
    assert_nmse(download(be, hb, n), ref, NMSE_ELEMENTWISE, "in-place add, mul, silu")


# -- softmax and rms_norm ----------------------------------------------------------------------

REDUCE_SIZES = [1, 2, 255, 8192, 8193, 40_000, 300_000]


@pytest.mark.parametrize("size", REDUCE_SIZES)
def test_softmax_matches_float64(be, rng, size):
    x = rng.uniform(-1, 1, size).astype(np.float32)
    hx = upload(be, x)
    out = Guarded(be, size)
    be.softmax(hx, out.handle, size)
    e = np.exp(f64(x) - f64(x).max())
    got = out.read()
    assert_nmse(got, e / e.sum(), NMSE_SOFTMAX, f"softmax[{size}]")
    assert abs(float(np.sum(got, dtype=np.float64)) - 1.0) < 1e-4


@pytest.mark.parametrize("size", [7, 9000, 100_003])
def test_softmax_in_place_with_large_magnitudes(be, rng, size):
    x = (rng.uniform(-1, 1, size) * 1000).astype(np.float32)
    x[size // 3] = 2000.0  # one dominant value: exp of everything else underflows
    hx = upload(be, x)
    be.softmax(hx, hx, size)
    e = np.exp(f64(x) - f64(x).max())
    assert_nmse(download(be, hx, size), e / e.sum(), NMSE_SOFTMAX, f"in-place softmax[{size}]")


@pytest.mark.parametrize("size", REDUCE_SIZES)
def test_rms_norm_matches_float64(be, rng, size):
    x = rng.uniform(-1, 1, size).astype(np.float32)
    w = rng.uniform(-1, 1, size).astype(np.float32)
    eps = 1e-5
    hx, hw = upload(be, x), upload(be, w)
    out = Guarded(be, size)
    be.rms_norm(hx, hw, out.handle, size, eps)
    ref = f64(x) * f64(w) / np.sqrt(np.mean(f64(x) ** 2) + np.float64(np.float32(eps)))
    assert_nmse(out.read(), ref, NMSE_ELEMENTWISE, f"rms_norm[{size}]")


def test_rms_norm_in_place_with_zero_eps(be, rng):
    size = 12_345
    x = (rng.uniform(-1, 1, size) * 50).astype(np.float32)
    w = rng.uniform(0.5, 1.5, size).astype(np.float32)
    hx, hw = upload(be, x), upload(be, w)
    be.rms_norm(hx, hw, hx, size, 0.0)
    ref = f64(x) * f64(w) / np.sqrt(np.mean(f64(x) ** 2))
    assert_nmse(download(be, hx, size), ref, NMSE_ELEMENTWISE, "in-place rms_norm")


# -- matmul ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (1, 300, 77), (77, 1, 300), (3, 5, 7), (65, 67, 129),
                                   (128, 64, 256), (130, 200, 50)])
def test_matmul_matches_float64(be, rng, m, n, k):
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    ha, hb = upload(be, a), upload(be, b)
    out = Guarded(be, m * n)
    be.matmul(ha, hb, out.handle, m, n, k)
    assert_product_close(out.read(), f64(a), f64(b), f"matmul {m}x{n}x{k}")


@pytest.mark.parametrize("tile", [(128, 128, 16, 8, 8), (64, 128, 8, 4, 8), (32, 32, 8, 4, 4)])
def test_matmul_tile_shapes_a_gpu_may_pick(rng, tile):
    from kbench.backend import VulkanBackend

    with VulkanBackend(matmul_tile=tile) as b:
        assert b.kernel_policy()["matmul_tile"] == tile
        for m, n, k in [(1, 1, 1), (130, 200, 50), (257, 129, 33)]:
            a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
            bb = rng.uniform(-1, 1, (k, n)).astype(np.float32)
            out = Guarded(b, m * n)
            b.matmul(upload(b, a), upload(b, bb), out.handle, m, n, k)
            assert_product_close(out.read(), f64(a), f64(bb), f"matmul {tile} {m}x{n}x{k}")


def test_matmul_overwrites_previous_output(be, rng):
    m, n, k = 33, 20, 10
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    ha, hb = upload(be, a), upload(be, b)
    ho = upload(be, np.full(m * n, 7.0, np.float32))
    be.matmul(ha, hb, ho, m, n, k)
    be.matmul(ha, hb, ho, m, n, k)
    assert_product_close(download(be, ho, m * n), f64(a), f64(b), "matmul twice")


# -- rope --------------------------------------------------------------------------------------

def rope_ref(v: np.ndarray, n_heads: int, head_dim: int, pos: int, base: float) -> np.ndarray:
    x = f64(v).reshape(n_heads, head_dim // 2, 2)
    i = np.arange(head_dim // 2, dtype=np.float64)
    theta = pos * np.power(np.float64(np.float32(base)), -2.0 * i / head_dim)
    c, s = np.cos(theta), np.sin(theta)
    return np.stack([x[..., 0] * c - x[..., 1] * s, x[..., 0] * s + x[..., 1] * c], -1).reshape(-1)


@pytest.mark.parametrize("pos", [0, 1, 17, 513, 4000, 8191])
@pytest.mark.parametrize("head_dim,n_q,n_k,base", [(128, 8, 2, 10000.0), (6, 3, 1, 500000.0), (2, 1, 1, 10000.0)])
def test_rope_gqa_matches_float64(be, rng, pos, head_dim, n_q, n_k, base):
    q = rng.uniform(-1, 1, n_q * head_dim).astype(np.float32)
    k = rng.uniform(-1, 1, n_k * head_dim).astype(np.float32)
    hq, hk = Guarded(be, q.size), Guarded(be, k.size)
    be.copy_buffer(upload(be, q), hq.handle, q.nbytes)
    be.copy_buffer(upload(be, k), hk.handle, k.nbytes)
    be.rope(hq.handle, hk.handle, pos, head_dim, base, n_q, n_k)
    assert_nmse(hq.read(), rope_ref(q, n_q, head_dim, pos, base), NMSE_ELEMENTWISE, f"rope q pos {pos}")
    assert_nmse(hk.read(), rope_ref(k, n_k, head_dim, pos, base), NMSE_ELEMENTWISE, f"rope k pos {pos}")


@pytest.mark.parametrize("pos", [4000, 100_000, 2_000_000])
def test_rope_angles_stay_exact_at_large_positions(be, rng, pos):
    """A plain fp32 pos*freq and built-in sin/cos give NMSE ~1e-6..1e-3 here; kbench's
    range-reduced angles stay near fp32 rounding."""
    head_dim, n = 128, 4
    q = rng.uniform(-1, 1, n * head_dim).astype(np.float32)
    k = rng.uniform(-1, 1, head_dim).astype(np.float32)
    hq, hk = upload(be, q), upload(be, k)
    be.rope(hq, hk, pos, head_dim, 10000.0, n, 1)
    assert_nmse(download(be, hq, q.size), rope_ref(q, n, head_dim, pos, 10000.0), 1e-11, f"rope pos {pos}")


def test_rope_rejects_positions_beyond_the_kernel_range(be):
    hq, hk = be.allocate(64), be.allocate(64)
    with pytest.raises(ValueError, match="pos"):
        be.rope(hq, hk, 1 << 24, 16, 10000.0, 1, 1)


# -- attention -----------------------------------------------------------------------------------

@pytest.mark.parametrize("seq_len", [1, 7, 300, 3000])
def test_attention_chain_matches_numpy_attention(be, rng, seq_len):
    head_dim, n_heads, n_kv = 64, 4, 2
    K = rng.uniform(-1, 1, (seq_len, n_kv * head_dim)).astype(np.float32)
    V = rng.uniform(-1, 1, (seq_len, n_kv * head_dim)).astype(np.float32)
    q = rng.uniform(-1, 1, n_heads * head_dim).astype(np.float32)
    hK, hV, hq = upload(be, K), upload(be, V), upload(be, q)
    scores = be.allocate(4 * seq_len)
    out = Guarded(be, n_heads * head_dim)
    ref = np.zeros(n_heads * head_dim)
    group = n_heads // n_kv
    for h in range(n_heads):
        kvh = h // group
        be.attn_score(hq, hK, scores, head_dim, seq_len, h * head_dim, kvh * head_dim, n_kv * head_dim)
        be.softmax(scores, scores, seq_len)
        be.attn_value(scores, hV, out.handle, head_dim, seq_len, kvh * head_dim, n_kv * head_dim, h * head_dim)
        cols = slice(kvh * head_dim, (kvh + 1) * head_dim)
        s = f64(K[:, cols]) @ f64(q[h * head_dim:(h + 1) * head_dim]) / math.sqrt(head_dim)
        w = np.exp(s - s.max())
        ref[h * head_dim:(h + 1) * head_dim] = (w / w.sum()) @ f64(V[:, cols])
    assert_nmse(out.read(), ref, NMSE_MATMUL, f"attention seq_len {seq_len}")


@pytest.mark.parametrize("head_dim,seq_len", [(1, 1), (5, 33), (128, 1000), (96, 5000)])
def test_attn_score_and_value_with_offsets(be, rng, head_dim, seq_len):
    kv_off, kv_stride, head_off, out_off = 3, head_dim + 5, 2, 9
    cache = rng.uniform(-1, 1, (seq_len - 1) * kv_stride + kv_off + head_dim).astype(np.float32)
    q = rng.uniform(-1, 1, head_off + head_dim).astype(np.float32)
    w = rng.uniform(0, 1, seq_len).astype(np.float32)
    hc, hq, hw = upload(be, cache), upload(be, q), upload(be, w)
    scores = Guarded(be, seq_len)
    out = Guarded(be, head_dim, front=out_off)
    be.attn_score(hq, hc, scores.handle, head_dim, seq_len, head_off, kv_off, kv_stride)
    be.attn_value(hw, hc, out.handle, head_dim, seq_len, kv_off, kv_stride, out_off)
    rows = np.stack([f64(cache[t * kv_stride + kv_off: t * kv_stride + kv_off + head_dim]) for t in range(seq_len)])
    assert_product_close(scores.read(), rows, f64(q[head_off:head_off + head_dim]) / math.sqrt(head_dim),
                         "attn_score")
    assert_product_close(out.read(), f64(w), rows, "attn_value")


# -- quantized matmul ------------------------------------------------------------------------------

def _reference_dequant(data: bytes, dtype: DType, shape: tuple[int, int]) -> np.ndarray:
    """Dequantize with llama.cpp's own gguf package where present (independent of kbench.quant)."""
    try:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize as gguf_dequantize
    except ImportError:
        return dequantize(data, dtype, shape).astype(np.float64)
    raw = np.frombuffer(data, np.uint8)
    if dtype == DType.F32:
        return raw.view(np.float32).astype(np.float64).reshape(shape)
    if dtype == DType.F16:
        return raw.view(np.float16).astype(np.float64).reshape(shape)
    out = gguf_dequantize(raw.reshape(shape[0], -1), GGMLQuantizationType(int(dtype)))
    return np.asarray(out, np.float64).reshape(shape)


QMATVEC_SHAPES = {
    1: [(1, 1), (3, 33), (1, 256), (64, 512)],
    32: [(1, 32), (5, 96), (64, 512)],
    256: [(1, 256), (3, 768), (64, 512)],
}


def _qmatvec_cases():
    for dt in QMATVEC_DTYPES:
        for shape in QMATVEC_SHAPES[dt.block_elems]:
            yield pytest.param(dt, shape, id=f"{dt.name}-{shape[0]}x{shape[1]}")


@pytest.mark.parametrize("dtype,shape", list(_qmatvec_cases()))
def test_quantized_matmul_matches_float64(be, rng, dtype, shape):
    n_rows, n_cols = shape
    W = rng.uniform(-1, 1, shape).astype(np.float32)
    x = rng.uniform(-1, 1, n_cols).astype(np.float32)
    data = quantize(W, dtype)
    hw, hx = upload_bytes(be, data), upload(be, x)
    out = Guarded(be, n_rows)
    be.quantized_matmul(hw, hx, out.handle, n_rows, n_cols, dtype)
    assert_product_close(out.read(), _reference_dequant(data, dtype, shape), f64(x),
                         f"quantized_matmul {dtype.name} {shape}")


@pytest.mark.parametrize("dtype", list(QMATVEC_DTYPES), ids=lambda d: d.name)
def test_quantized_matmul_shared_memory_variant(be_shared, rng, dtype):
    n_rows, n_cols = 9, 512
    W = rng.uniform(-1, 1, (n_rows, n_cols)).astype(np.float32)
    x = rng.uniform(-1, 1, n_cols).astype(np.float32)
    data = quantize(W, dtype)
    hw, hx = upload_bytes(be_shared, data), upload(be_shared, x)
    out = Guarded(be_shared, n_rows)
    be_shared.quantized_matmul(hw, hx, out.handle, n_rows, n_cols, dtype)
    assert be_shared.kernel_policy()["subgroups"] is False
    assert_product_close(out.read(), _reference_dequant(data, dtype, (n_rows, n_cols)), f64(x),
                         f"shared-memory quantized_matmul {dtype.name}")


def test_quantized_matmul_unsupported_dtype_is_refused_before_gpu_work(be):
    hw, hx, hy = be.allocate(84 * 4), be.allocate(256 * 4), be.allocate(4)
    before = be.cache_stats()["cached_algorithms"]
    with pytest.raises(UnsupportedDTypeError, match="Q2_K"):
        be.quantized_matmul(hw, hx, hy, 1, 256, DType.Q2_K)
    assert be.cache_stats()["cached_algorithms"] == before


# -- large grids -------------------------------------------------------------------------------

def test_quantized_matmul_grid_beyond_65535_workgroups(be, rng):
    n_rows, n_cols = 140_002, 32  # 70,001 workgroups of two rows
    W = rng.uniform(-1, 1, (n_rows, n_cols)).astype(np.float32)
    x = rng.uniform(-1, 1, n_cols).astype(np.float32)
    data = quantize(W, DType.Q8_0)
    deq = dequantize(data, DType.Q8_0, (n_rows, n_cols)).astype(np.float64)
    ref = deq @ f64(x)
    hw, hx = upload_bytes(be, data), upload(be, x)
    out = Guarded(be, n_rows)
    be.quantized_matmul(hw, hx, out.handle, n_rows, n_cols, DType.Q8_0)
    got = out.read()
    assert_product_close(got, deq, f64(x), "quantized_matmul over 70,001 workgroups")
    assert abs(got[-1] - ref[-1]) < 1e-4 * max(1.0, abs(ref[-1])), "the last row (in the grid's y > 0 part)"


def test_every_op_spreads_grids_over_y_past_the_x_limit(rng):
    """With the grid's x dimension capped at 3 workgroups every op needs y > 1."""
    from kbench.backend import VulkanBackend

    with VulkanBackend(grid_limit=3) as b:
        n = 10_001
        a = rng.uniform(-1, 1, n).astype(np.float32)
        c = rng.uniform(-1, 1, n).astype(np.float32)
        ha, hc = upload(b, a), upload(b, c)
        out = Guarded(b, n)
        b.add(ha, hc, out.handle, n)
        assert_nmse(out.read(), f64(a) + f64(c), NMSE_ELEMENTWISE, "add on a spread grid")
        b.softmax(ha, out.handle, n)
        e = np.exp(f64(a) - f64(a).max())
        assert_nmse(out.read(), e / e.sum(), NMSE_SOFTMAX, "softmax on a spread grid")
        b.rms_norm(ha, hc, out.handle, n, 1e-6)
        ref = f64(a) * f64(c) / np.sqrt(np.mean(f64(a) ** 2) + np.float64(np.float32(1e-6)))
        assert_nmse(out.read(), ref, NMSE_ELEMENTWISE, "rms_norm on a spread grid")
        hd, nq = 64, 40
        q = rng.uniform(-1, 1, hd * nq).astype(np.float32)
        hq, hk = upload(b, q), b.allocate(4 * hd)
        b.rope(hq, hk, 900, hd, 10000.0, nq, 1)
        assert_nmse(download(b, hq, q.size), rope_ref(q, nq, hd, 900, 10000.0), NMSE_ELEMENTWISE, "rope")
        T = 2000
        b.attn_score(ha, hc, out.handle, 4, T, 0, 0, 4)
        rows = f64(c[: 4 * T]).reshape(T, 4)
        assert_nmse(out.read()[:T], rows @ f64(a[:4]) / 2.0, NMSE_MATMUL, "attn_score on a spread grid")
        W = rng.uniform(-1, 1, (50, 64)).astype(np.float32)
        data = quantize(W, DType.Q4_0)
        y = Guarded(b, 50)
        b.quantized_matmul(upload_bytes(b, data), ha, y.handle, 50, 64, DType.Q4_0)
        deq = dequantize(data, DType.Q4_0, (50, 64)).astype(np.float64)
        assert_product_close(y.read(), deq, f64(a[:64]), "quantized_matmul on a spread grid")


# -- batching, caches and lifetime ------------------------------------------------------------

def test_long_op_loop_keeps_caches_and_runtime_objects_bounded(rng):
    """3,000 op calls over 40 buffers with a 16-entry algorithm cache: evictions happen,
    nothing grows and the results are right."""
    from kbench.backend import VulkanBackend

    n = 64
    with VulkanBackend(algorithm_cache_size=16, batch_ops=32) as b:
        data = [rng.uniform(-1, 1, n).astype(np.float32) for _ in range(40)]
        bufs = [upload(b, d) for d in data]
        acc = upload(b, np.zeros(n, np.float32))
        ref = np.zeros(n)
        snapshots = []
        calls = 3000
        for i in range(calls):
            j = i % 40
            b.add(acc, bufs[j], acc, n) if i % 3 else b.element_mul(bufs[j], bufs[(j + 1) % 40], bufs[j], n)
            if i % 3:
                ref = ref + f64(data[j])
            else:
                data[j] = (f64(data[j]) * f64(data[(j + 1) % 40])).astype(np.float32)
            ref = f64(ref.astype(np.float32))
            if i in (999, 2999):
                b.synchronize()
                snapshots.append(b.cache_stats())
        first, last = snapshots
        for key in ("cached_algorithms", "runtime_algorithms", "runtime_descriptor_sets", "runtime_tensors",
                    "runtime_buffers", "runtime_pipelines", "runtime_sequences", "graveyard"):
            assert last[key] <= first[key], f"{key} grew from {first[key]} to {last[key]} between call 1000 and 3000"
        assert last["cached_algorithms"] <= 16
        assert last["runtime_descriptor_sets"] <= 16 + 1
        assert_nmse(download(b, acc, n), ref, 1e-10, "accumulated sum after 3,000 ops")


def test_ops_are_submitted_in_batches_not_one_by_one(rng):
    from kbench.backend import VulkanBackend

    n, calls, batch = 256, 1000, 50
    with VulkanBackend(batch_ops=batch) as b:
        x = rng.uniform(-1, 1, n).astype(np.float32)
        hx, hy = upload(b, x), upload(b, np.zeros(n, np.float32))
        start = b.cache_stats()["submissions"]
        for _ in range(calls):
            b.add(hy, hx, hy, n)
        got = download(b, hy, n)
        submitted = b.cache_stats()["submissions"] - start
        assert submitted <= calls // batch + 2, f"{submitted} submissions for {calls} ops in batches of {batch}"
        ref = np.zeros(n, np.float32)
        for _ in range(calls):
            ref = ref + x
        assert_nmse(got, f64(ref), 1e-12, "1,000 accumulated adds")


@pytest.mark.parametrize("ring_size,ops", [(1, 5), (2, 4), (3, 3), (3, 7)])
def test_ring_wraps_onto_batches_still_in_flight(rng, ring_size, ops):
    """Every op fills a batch, so the ring comes round to slots that are still running."""
    from kbench.backend import VulkanBackend

    with VulkanBackend(batch_ops=1, ring_size=ring_size) as b:
        x = rng.uniform(-1, 1, 100).astype(np.float32)
        hx, hy = upload(b, x), upload(b, np.zeros(100, np.float32))
        for _ in range(ops):
            b.add(hy, hx, hy, 100)
        b.synchronize()
        ref = np.zeros(100, np.float32)
        for _ in range(ops):
            ref = ref + x
        assert_nmse(download(b, hy, 100), f64(ref), 1e-12, f"{ops} adds over a ring of {ring_size}")


def test_free_while_batched_work_is_pending(rng):
    from kbench.backend import InvalidHandleError, VulkanBackend

    with VulkanBackend(batch_ops=1000) as b:
        n = 1000
        x = rng.uniform(-1, 1, n).astype(np.float32)
        hx, ho = upload(b, x), b.allocate(4 * n)
        b.silu(hx, ho, n)
        b.free(hx)  # the silu is still only recorded
        assert b.cache_stats()["graveyard"] >= 1, "a buffer in a pending batch must outlive its handle"
        got = download(b, ho, n)
        assert_nmse(got, f64(x) / (1 + np.exp(-f64(x))), NMSE_ELEMENTWISE, "silu of a freed input")
        assert b.cache_stats()["graveyard"] == 0
        with pytest.raises(InvalidHandleError, match="freed"):
            b.silu(hx, ho, n)


def test_close_releases_the_device_and_refuses_more_work(rng):
    from kbench.backend import BackendClosedError, VulkanBackend

    b = VulkanBackend()
    h = upload(b, rng.uniform(-1, 1, 10))
    b.silu(h, h, 10)
    b.close()
    assert b.closed
    with pytest.raises(BackendClosedError):
        b.allocate(4)
    b.close()  # idempotent


def test_validation_layer_reports_nothing_for_every_op(rng):
    """Every op (multi-pass paths included) under the Khronos validation layer with
    synchronization validation: no missing barrier, no bad descriptor, no error.  Messages
    from creating the device (e.g. a layer older than the driver's extensions) are the
    runtime's business and are not counted here."""
    from kbench.backend import VulkanBackend

    try:
        b = VulkanBackend(validation=True)
    except RuntimeError as exc:
        if "not installed" in str(exc):
            pytest.skip(f"validation layer unavailable: {exc}")
        raise
    with b:
        at_creation = len(b.manager.validation_messages())
        n = 20_001
        a, c = upload(b, rng.uniform(-1, 1, n)), upload(b, rng.uniform(-1, 1, n))
        o = b.allocate(4 * n)
        b.add(a, c, o, n)
        b.element_mul(o, c, o, n)
        b.silu(o, o, n)
        b.softmax(a, o, n)
        b.softmax(o, o, 100)
        b.rms_norm(a, c, o, n, 1e-5)
        b.matmul(a, c, o, 33, 45, 67)
        b.rope(a, c, 4000, 64, 10000.0, 4, 2)
        b.attn_score(a, c, o, 64, 300, 0, 0, 64)
        b.attn_value(o, c, a, 16, 1000, 0, 16, 0)
        b.attn_value(o, c, a, 64, 30, 0, 64, 64)
        for dt in (DType.Q4_0, DType.Q5_1, DType.Q8_0, DType.Q4_K, DType.Q5_K, DType.Q6_K, DType.F16, DType.BF16):
            w = upload_bytes(b, quantize(rng.uniform(-1, 1, (4, 512)).astype(np.float32), dt))
            b.quantized_matmul(w, a, o, 4, 512, dt)
            b.free(w)
        b.copy_buffer_offset(a, c, 16, 160, 4000)
        b.copy_buffer_offset(a, c, 3, 100, 401)
        out = np.empty(n, np.float32)
        b.copy_from_device(o, out)
        b.synchronize()
        messages = b.manager.validation_messages()[at_creation:]
        assert messages == [], f"{len(messages)} validation message(s), first: {messages[:3]}"


# -- kernel policy (no device needed) --------------------------------------------------------------

def _props(**over):
    p = {
        "device_name": "fake", "device_type": "discrete_gpu", "api_version": "1.3.0",
        "max_work_group_invocations": 1024, "max_work_group_size": (1024, 1024, 64),
        "max_work_group_count": (2**31 - 1, 65535, 65535), "max_shared_memory": 49152,
        "subgroup_size": 32, "features": {"subgroup_basic": True, "subgroup_arithmetic": True},
    }
    p.update(over)
    return p


def test_policy_uses_large_tiles_and_subgroups_on_a_gpu():
    pol = KernelPolicy(_props())
    assert pol.matmul_tile == (128, 128, 8, 8, 8)
    assert pol.qmatvec(DType.Q4_K, 4096).spv == "qmatvec_fast.q4_k.sg.spv"
    assert pol.grid_1d(10**6) == (10**6, 1, 1)


def test_policy_falls_back_on_small_devices():
    pol = KernelPolicy(_props(max_work_group_invocations=128, max_work_group_size=(128, 128, 64),
                              max_shared_memory=16384, max_work_group_count=(65535, 65535, 65535),
                              features={}))
    bm, bn, bk, tm, tn = pol.matmul_tile
    assert (bm // tm) * (bn // tn) <= 128 and 4 * bk * (bm + bn) <= 16384
    assert pol.wg == 128
    assert pol.qmatvec(DType.Q8_0, 4096).spv == "qmatvec.q8_0.shared.spv"
    assert pol.grid_1d(70_000) == (35_000, 2, 1)


def test_policy_refuses_forced_subgroups_without_support():
    with pytest.raises(kp.UnsupportedFeatureError, match="subgroup arithmetic"):
        KernelPolicy(_props(features={"subgroup_basic": True}), use_subgroups=True)


def test_policy_rejects_a_matmul_tile_that_does_not_fit():
    with pytest.raises(ValueError, match="matmul_tile"):
        KernelPolicy(_props(), matmul_tile=(256, 256, 32, 3, 2))


def test_reduction_plan_splits_large_vectors_over_many_workgroups():
    pol = KernelPolicy(_props())
    assert pol.reduction_plan(4096).single
    plan = pol.reduction_plan(16 * 2**20)
    assert not plan.single and plan.n_parts >= 1024 and plan.chunk * plan.n_parts >= 16 * 2**20
    av = pol.attn_value(128, 8192)
    assert av.n_chunks > 1 and av.chunk * av.n_chunks >= 8192
