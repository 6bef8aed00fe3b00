"""kbench.quant: GGUF block layouts checked against llama.cpp's own `gguf` package and
against straightforward one-element-at-a-time decoders written from the layout reference."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's) is the cross-check")
from gguf import GGMLQuantizationType, GGML_QUANT_SIZES  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402

from kbench.quant import DType, SUPPORTED_DTYPES, dequantize, quantize, row_bytes  # noqa: E402

# byte offsets of the half-float scale fields in one block (random bytes there could be NaN/inf)
_HALF_FIELDS = {
    DType.Q4_0: (0,), DType.Q4_1: (0, 2), DType.Q5_0: (0,), DType.Q5_1: (0, 2),
    DType.Q8_0: (0,), DType.Q8_1: (0, 2), DType.Q2_K: (80, 82), DType.Q3_K: (108,),
    DType.Q4_K: (0, 2), DType.Q5_K: (0, 2), DType.Q6_K: (208,),
}

# dtypes gguf 0.19 can dequantize (it has no decoder for Q8_1 and Q8_K, and its Q8_1 size is a
# legacy 40 bytes, whereas current ggml's block_q8_1 is {half d, half s, int8 qs[32]} = 36)
GGUF_DECODES = [d for d in DType if d not in (DType.Q8_1, DType.Q8_K)]
GGUF_ENCODES = [DType.F32, DType.F16, DType.BF16, DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0]


def random_blocks(dtype: DType, n_blocks: int, seed: int = 0) -> np.ndarray:
    """Random but valid encoded blocks: random code bytes, finite scales of either sign."""
    rng = np.random.default_rng(seed)
    if not dtype.is_quantized:
        values = rng.uniform(-4, 4, n_blocks).astype(np.float32)
        return np.frombuffer(quantize(values, dtype), dtype=np.uint8).reshape(n_blocks, -1).copy()
    blocks = rng.integers(0, 256, (n_blocks, dtype.block_bytes), dtype=np.uint8)
    if dtype == DType.Q8_K:
        blocks[:, 0:4] = rng.uniform(-0.1, 0.1, (n_blocks, 1)).astype("<f4").view(np.uint8)
    for off in _HALF_FIELDS.get(dtype, ()):
        blocks[:, off:off + 2] = rng.uniform(-0.1, 0.1, (n_blocks, 1)).astype("<f2").view(np.uint8)
    return blocks


def gguf_type(dtype: DType) -> GGMLQuantizationType:
    return GGMLQuantizationType[dtype.name]


# ---- independent scalar decoders, straight from the layout reference ---------------------------

def _half(block: bytes, off: int) -> float:
    return struct.unpack_from("<e", block, off)[0]


def _decode_block_scalar(dtype: DType, blk: bytes) -> list[float]:
    if dtype == DType.Q4_0:
        d, qs = _half(blk, 0), blk[2:18]
        return [((qs[j] & 15) - 8) * d for j in range(16)] + [((qs[j] >> 4) - 8) * d for j in range(16)]
    if dtype == DType.Q4_1:
        d, m, qs = _half(blk, 0), _half(blk, 2), blk[4:20]
        return [(qs[j] & 15) * d + m for j in range(16)] + [(qs[j] >> 4) * d + m for j in range(16)]
    if dtype in (DType.Q5_0, DType.Q5_1):
        d = _half(blk, 0)
        m = _half(blk, 2) if dtype == DType.Q5_1 else None
        base = 4 if dtype == DType.Q5_1 else 2
        qh = struct.unpack_from("<I", blk, base)[0]
        qs = blk[base + 4:base + 20]
        out = [0.0] * 32
        for j in range(16):
            for e, low in ((j, qs[j] & 15), (j + 16, qs[j] >> 4)):
                q = low | (((qh >> e) & 1) << 4)
                out[e] = (q - 16) * d if m is None else q * d + m
        return out
    if dtype == DType.Q8_0:
        d = _half(blk, 0)
        return [q * d for q in struct.unpack_from("<32b", blk, 2)]
    if dtype == DType.Q8_1:
        d = _half(blk, 0)
        return [q * d for q in struct.unpack_from("<32b", blk, 4)]
    if dtype == DType.Q8_K:
        d = struct.unpack_from("<f", blk, 0)[0]
        return [q * d for q in struct.unpack_from("<256b", blk, 4)]
    if dtype == DType.Q4_K:
        d, dmin, s, qs = _half(blk, 0), _half(blk, 2), blk[4:16], blk[16:144]
        sc, mn = [], []
        for j in range(8):
            if j < 4:
                sc.append(s[j] & 63)
                mn.append(s[j + 4] & 63)
            else:
                sc.append((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4))
                mn.append((s[j + 4] >> 4) | ((s[j] >> 6) << 4))
        y = [0.0] * 256
        for g in range(4):
            for l in range(32):
                q = qs[32 * g + l]
                y[64 * g + l] = d * sc[2 * g] * (q & 15) - dmin * mn[2 * g]
                y[64 * g + 32 + l] = d * sc[2 * g + 1] * (q >> 4) - dmin * mn[2 * g + 1]
        return y
    if dtype == DType.Q6_K:
        d = _half(blk, 208)
        sc = struct.unpack_from("<16b", blk, 192)
        y = [0.0] * 256
        for n in range(2):
            ql, qh, s, yo = blk[64 * n:], blk[128 + 32 * n:], sc[8 * n:], 128 * n
            for l in range(32):
                i = l // 16
                y[yo + l] = d * s[i] * (((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32)
                y[yo + l + 32] = d * s[i + 2] * (((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32)
                y[yo + l + 64] = d * s[i + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32)
                y[yo + l + 96] = d * s[i + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32)
        return y
    raise AssertionError(f"no scalar decoder for {dtype.name}")


SCALAR_DECODES = [DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1, DType.Q8_0, DType.Q8_1,
                  DType.Q8_K, DType.Q4_K, DType.Q6_K]


# ---- the dtype table ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_dtype_ids_and_block_sizes_match_ggml(dtype):
    assert int(gguf_type(dtype)) == int(dtype), f"{dtype.name}: id {int(dtype)} vs gguf {int(gguf_type(dtype))}"
    if dtype == DType.Q8_1:
        assert (dtype.block_elems, dtype.block_bytes) == (32, 2 + 2 + 32), "block_q8_1 is {half d, half s, qs[32]}"
    else:
        assert (dtype.block_elems, dtype.block_bytes) == GGML_QUANT_SIZES[gguf_type(dtype)]


def test_dtype_coerce_accepts_enum_int_and_name_and_rejects_others():
    assert DType.coerce(DType.Q4_K) is DType.Q4_K
    assert DType.coerce(12) is DType.Q4_K
    assert DType.coerce(np.uint8(12)) is DType.Q4_K
    assert DType.coerce("q4_k") is DType.Q4_K
    with pytest.raises(ValueError, match=r"unknown dtype id 5\b"):
        DType.coerce(5)
    with pytest.raises(ValueError, match=r"unknown dtype name 'Q9_9'"):
        DType.coerce("Q9_9")
    with pytest.raises(TypeError, match=r"dtype must be .* got float 2\.0"):
        DType.coerce(2.0)
    with pytest.raises(TypeError, match=r"got bool"):
        DType.coerce(True)


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_row_bytes_matches_gguf_byte_shape(dtype):
    n_cols = 4 * dtype.block_elems if dtype.is_quantized else 4096
    if dtype == DType.Q8_1:
        expected = n_cols // 32 * 36
    else:
        expected = gguf.quant_shape_to_byte_shape((n_cols,), gguf_type(dtype))[0]
    assert row_bytes(dtype, n_cols) == expected


def test_row_bytes_rejects_partial_blocks_and_bad_counts():
    with pytest.raises(ValueError, match=r"n_cols=100 is not a multiple of the Q4_K block size 256"):
        row_bytes(DType.Q4_K, 100)
    with pytest.raises(ValueError, match=r"n_cols must be positive, got 0"):
        row_bytes(DType.Q8_0, 0)
    with pytest.raises(TypeError, match=r"n_cols must be an integer"):
        row_bytes(DType.Q8_0, 32.0)


# ---- dequantize ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", GGUF_DECODES, ids=lambda d: d.name)
def test_dequantize_random_blocks_equals_gguf(dtype):
    n_blocks = 48 if dtype.is_quantized else 48 * 32
    blocks = random_blocks(dtype, n_blocks, seed=int(dtype))
    n_cols = 4 * dtype.block_elems if dtype.is_quantized else 128
    rows = blocks.reshape(-1, row_bytes(dtype, n_cols))
    ours = dequantize(rows.tobytes(), dtype, (rows.shape[0], n_cols))
    theirs = gguf_quants.dequantize(rows, gguf_type(dtype))
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    assert np.isfinite(ours).all(), f"{dtype.name}: NaN/inf from finite random blocks"
    mismatch = np.flatnonzero(ours.ravel() != theirs.ravel())
    assert mismatch.size == 0, (
        f"{dtype.name}: {mismatch.size} values differ from gguf, first at {mismatch[0]}: "
        f"{ours.ravel()[mismatch[0]]} vs {theirs.ravel()[mismatch[0]]}"
    )


@pytest.mark.parametrize("dtype", SCALAR_DECODES, ids=lambda d: d.name)
def test_dequantize_matches_scalar_decoder_from_layout_reference(dtype):
    blocks = random_blocks(dtype, 3, seed=100 + int(dtype))
    ours = dequantize(blocks, dtype, (3 * dtype.block_elems,))
    expected = np.array(
        [v for blk in blocks for v in _decode_block_scalar(dtype, blk.tobytes())], dtype=np.float64
    )
    # the reference formulas evaluate in double; ours rounds once more to float32
    np.testing.assert_allclose(ours, expected, rtol=2e-7, atol=1e-12, err_msg=f"{dtype.name} decode")


def test_q4_0_low_nibbles_are_first_half_of_block():
    blk = bytearray(18)
    blk[0:2] = struct.pack("<e", 1.0)
    blk[2] = 0x9A  # element 0 gets low nibble 0xA -> 2, element 16 gets high nibble 0x9 -> 1
    y = dequantize(bytes(blk), DType.Q4_0, 32)
    assert (y[0], y[16], y[1]) == (2.0, 1.0, -8.0), f"got elements 0, 16, 1 = {y[0]}, {y[16]}, {y[1]}"


def test_dequantize_accepts_bytes_bytearray_memoryview_and_arrays():
    data = quantize(np.linspace(-1, 1, 64, dtype=np.float32), DType.Q8_0)
    expected = dequantize(data, DType.Q8_0, 64)
    for form in (bytearray(data), memoryview(data), np.frombuffer(data, np.uint8),
                 np.frombuffer(data, np.uint8).reshape(2, 34)):
        np.testing.assert_array_equal(dequantize(form, DType.Q8_0, (64,)), expected, err_msg=type(form).__name__)
    assert dequantize(data, 8, (2, 32)).shape == (2, 32)


# ---- quantize --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", GGUF_ENCODES, ids=lambda d: d.name)
def test_gguf_quantized_blocks_dequantize_identically(dtype):
    rng = np.random.default_rng(7)
    x = rng.uniform(-2, 2, (8, 256)).astype(np.float32)
    encoded = np.ascontiguousarray(gguf_quants.quantize(x, gguf_type(dtype)))
    ours = dequantize(encoded.tobytes(), dtype, x.shape)
    theirs = np.asarray(gguf_quants.dequantize(encoded, gguf_type(dtype)), dtype=np.float32).reshape(x.shape)
    np.testing.assert_array_equal(ours, theirs, err_msg=f"{dtype.name}: decode of gguf's blocks")


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.BF16], ids=lambda d: d.name)
def test_float_formats_encode_bit_identically_to_gguf(dtype):
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(1000).astype(np.float32) * 100,
                        np.array([0.0, -0.0, 1e-40, 65504.0, np.inf, -np.inf], dtype=np.float32)])
    ours = quantize(x, dtype)
    theirs = np.ascontiguousarray(gguf_quants.quantize(x, gguf_type(dtype))).tobytes()
    assert ours == theirs, f"{dtype.name}: encoded bytes differ from gguf's"


def test_bf16_keeps_nan_nan():
    x = np.array([np.nan, 1.0], dtype=np.float32)
    y = dequantize(quantize(x, DType.BF16), DType.BF16, 2)
    assert np.isnan(y[0]) and y[1] == 1.0, f"got {y}"


# worst NMSE / max |error| measured over 20 seeds of uniform [-1, 1] 64x512 data, plus ~25%
_ROUND_TRIP_BOUNDS = {
    DType.F32: (0.0, 0.0), DType.F16: (4.5e-8, 2.5e-4), DType.BF16: (2.8e-6, 2.0e-3),
    DType.Q4_0: (5.4e-3, 0.16), DType.Q4_1: (4.7e-3, 0.084), DType.Q5_0: (1.25e-3, 0.079),
    DType.Q5_1: (1.1e-3, 0.041), DType.Q8_0: (1.8e-5, 4.9e-3), DType.Q8_1: (1.8e-5, 4.9e-3),
    DType.Q8_K: (1.95e-5, 4.9e-3), DType.Q2_K: (0.098, 0.42), DType.Q3_K: (0.023, 0.34),
    DType.Q4_K: (4.7e-3, 0.084), DType.Q5_K: (1.1e-3, 0.041), DType.Q6_K: (2.7e-4, 0.048),
}


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_round_trip_error_is_within_measured_bound(dtype):
    nmse_bound, max_bound = _ROUND_TRIP_BOUNDS[dtype]
    x = np.random.default_rng(11).uniform(-1, 1, (64, 512)).astype(np.float32)
    data = quantize(x, dtype)
    assert len(data) == 64 * row_bytes(dtype, 512)
    y = dequantize(data, dtype, x.shape).astype(np.float64)
    err = y - x
    nmse = float((err ** 2).sum() / (x.astype(np.float64) ** 2).sum())
    assert nmse <= nmse_bound, f"{dtype.name}: NMSE {nmse:.3e} > bound {nmse_bound:.3e}"
    assert np.abs(err).max() <= max_bound, f"{dtype.name}: max error {np.abs(err).max():.3e} > {max_bound}"


@pytest.mark.parametrize("dtype", [d for d in DType if d.is_quantized], ids=lambda d: d.name)
def test_special_blocks_round_trip(dtype):
    n = dtype.block_elems
    zeros = np.zeros((1, n), dtype=np.float32)
    y = dequantize(quantize(zeros, dtype), dtype, zeros.shape)
    assert np.array_equal(y, zeros), f"{dtype.name}: zeros came back as {y[y != 0][:4]}"
    # one outlier per block, the rest small: the outlier must survive almost exactly
    spike = np.full((1, n), 0.01, dtype=np.float32)
    spike[0, n // 3] = -50.0
    y = dequantize(quantize(spike, dtype), dtype, spike.shape)
    assert abs(y[0, n // 3] + 50.0) <= 50.0 * 0.02, f"{dtype.name}: outlier -50 came back as {y[0, n // 3]}"
    assert np.isfinite(y).all()


def test_quantize_handles_any_leading_shape():
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 64)).astype(np.float64)
    assert quantize(x, DType.Q8_0) == quantize(x.reshape(6, 64).astype(np.float32), DType.Q8_0)


# ---- errors ---------------------------------------------------------------------------------------

def test_quantize_rejects_rows_that_are_not_whole_blocks():
    with pytest.raises(ValueError, match=r"row length 48 .* not a multiple of the Q4_0 block size 32"):
        quantize(np.zeros(48, dtype=np.float32), DType.Q4_0)
    with pytest.raises(ValueError, match=r"row length 128 .* Q6_K block size 256"):
        quantize(np.zeros((2, 128), dtype=np.float32), DType.Q6_K)


def test_quantize_rejects_unknown_dtype_bad_values_and_empty_input():
    with pytest.raises(ValueError, match=r"unknown dtype id 4\b"):
        quantize(np.zeros(32, dtype=np.float32), 4)
    with pytest.raises(ValueError, match=r"NaN or infinity"):
        quantize(np.array([np.nan] + [0.0] * 31, dtype=np.float32), DType.Q8_0)
    with pytest.raises(ValueError, match=r"empty"):
        quantize(np.zeros((0, 32), dtype=np.float32), DType.Q8_0)
    with pytest.raises(ValueError, match=r"scalar"):
        quantize(np.float32(1.0), DType.F32)
    with pytest.raises(TypeError, match=r"real numbers"):
        quantize(np.array(["a"] * 32), DType.Q8_0)


def test_dequantize_rejects_wrong_data_length_and_shapes():
    data = quantize(np.zeros(64, dtype=np.float32), DType.Q4_0)  # 2 blocks, 36 bytes
    with pytest.raises(ValueError, match=r"data holds 36 bytes but shape \(96,\) in Q4_0 needs 54 bytes"):
        dequantize(data, DType.Q4_0, 96)
    with pytest.raises(ValueError, match=r"data holds 35 bytes .* needs 36 bytes"):
        dequantize(data[:35], DType.Q4_0, 64)
    with pytest.raises(ValueError, match=r"row length 16 .* Q4_0 block size 32"):
        dequantize(data, DType.Q4_0, (4, 16))
    with pytest.raises(ValueError, match=r"unknown dtype id 99"):
        dequantize(data, 99, 64)
    with pytest.raises(ValueError, match=r"not positive"):
        dequantize(data, DType.Q4_0, (0, 32))
    with pytest.raises(TypeError, match=r"non-integer dimension"):
        dequantize(data, DType.Q4_0, (2.0, 32))
    with pytest.raises(TypeError, match=r"bytes-like"):
        dequantize("abc", DType.Q4_0, 64)
    with pytest.raises(ValueError, match=r"C-contiguous"):
        dequantize(np.zeros((36, 2), np.uint8)[:, 0], DType.Q4_0, 64)


@pytest.mark.slow
def test_dequantize_full_size_ffn_weight_is_vectorized():
    """A 4096 x 14336 Q4_K matrix (229k blocks) decodes in seconds: no Python loop per block."""
    rows, cols = 4096, 14336
    blocks = random_blocks(DType.Q4_K, rows * cols // 256, seed=5)
    start = time.perf_counter()
    y = dequantize(blocks, DType.Q4_K, (rows, cols))
    elapsed = time.perf_counter() - start
    assert y.shape == (rows, cols)
    probe = blocks.reshape(rows, -1)[[0, 2047, 4095]]
    np.testing.assert_array_equal(y[[0, 2047, 4095]], gguf_quants.dequantize(probe, GGMLQuantizationType.Q4_K))
    assert elapsed < 30, f"dequantize took {elapsed:.1f} s for {rows}x{cols}"


def test_every_dtype_is_supported():
    assert set(SUPPORTED_DTYPES) == set(DType)
