"""GGUF/ggml tensor block formats: the dtype table, quantize and dequantize (NumPy only).

Every format is handled a whole array of blocks at a time (no Python loop per block), in
chunks so that a 4096 x 14336 weight matrix does not need several copies of itself in memory.

Dequantizers reproduce ggml's layouts exactly and compute in float32 in the same order as
ggml's reference decoders, so their output is the exact "dequant(W)" that the float64 oracle
multiplies with.  Quantizers are plain round-to-nearest with per-(sub)block scales: they make
valid blocks that dequantize close to the input, but do not reproduce ggml's search-based
K-quant quantizers bit for bit.
"""

from __future__ import annotations

import math
from enum import IntEnum
from typing import Callable, Union

import numpy as np

__all__ = ["DType", "quantize", "dequantize", "row_bytes", "SUPPORTED_DTYPES"]


class DType(IntEnum):
    """ggml tensor types; the values are the GGUF type ids."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    BF16 = 30

    @property
    def block_elems(self) -> int:
        """Number of values one block encodes."""
        return _BLOCK_LAYOUT[self][0]

    @property
    def block_bytes(self) -> int:
        """Size of one encoded block in bytes."""
        return _BLOCK_LAYOUT[self][1]

    @property
    def is_quantized(self) -> bool:
        """True for the block formats (everything except F32, F16 and BF16)."""
        return self.block_elems > 1

    @classmethod
    def coerce(cls, value: Union["DType", int, str]) -> "DType":
        """Return the DType for a DType, an integer GGUF id or a name such as ``"Q4_K"``.

        Raises TypeError for other kinds of value and ValueError for unknown ids or names.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                raise ValueError(f"unknown dtype name {value!r}; known: {_known()}") from None
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(
                f"dtype must be a DType, an integer GGUF type id or a name, "
                f"got {type(value).__name__} {value!r}"
            )
        try:
            return cls(int(value))
        except ValueError:
            raise ValueError(f"unknown dtype id {int(value)}; known: {_known()}") from None


# (elements per block, bytes per block), as in ggml's type traits.
_BLOCK_LAYOUT: dict[DType, tuple[int, int]] = {
    DType.F32: (1, 4),
    DType.F16: (1, 2),
    DType.Q4_0: (32, 18),
    DType.Q4_1: (32, 20),
    DType.Q5_0: (32, 22),
    DType.Q5_1: (32, 24),
    DType.Q8_0: (32, 34),
    DType.Q8_1: (32, 36),
    DType.Q2_K: (256, 84),
    DType.Q3_K: (256, 110),
    DType.Q4_K: (256, 144),
    DType.Q5_K: (256, 176),
    DType.Q6_K: (256, 210),
    DType.Q8_K: (256, 292),
    DType.BF16: (1, 2),
}


def _known() -> str:
    return ", ".join(f"{d.name}={d.value}" for d in DType)


def row_bytes(dtype: Union[DType, int, str], n_cols: int) -> int:
    """Bytes taken by one row of ``n_cols`` values stored as ``dtype``."""
    dt = DType.coerce(dtype)
    if isinstance(n_cols, (bool, np.bool_)) or not isinstance(n_cols, (int, np.integer)):
        raise TypeError(f"n_cols must be an integer, got {type(n_cols).__name__} {n_cols!r}")
    if n_cols <= 0:
        raise ValueError(f"n_cols must be positive, got {n_cols}")
    if n_cols % dt.block_elems:
        raise ValueError(
            f"n_cols={n_cols} is not a multiple of the {dt.name} block size {dt.block_elems}"
        )
    return int(n_cols) // dt.block_elems * dt.block_bytes


# ---------------------------------------------------------------------------------------------
# small helpers shared by the codecs

def _half_at(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The IEEE half at byte ``offset`` of every block, as float32 of shape (n_blocks, 1)."""
    return np.ascontiguousarray(blocks[:, offset:offset + 2]).view(np.float16).astype(np.float32)


def _as_half_bytes(values: np.ndarray) -> np.ndarray:
    """float values of shape (n_blocks, 1) -> their half-float bytes, shape (n_blocks, 2)."""
    return np.ascontiguousarray(values.astype(np.float16)).view(np.uint8)


def _reciprocal(d: np.ndarray) -> np.ndarray:
    """1/d with 0 where d == 0 (an all-zero block has scale 0 and quantizes to zeros)."""
    out = np.zeros_like(d, dtype=np.float32)
    np.divide(np.float32(1), d, out=out, where=d != 0)
    return out


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """The element of largest magnitude along the last axis, with its sign, keepdims."""
    idx = np.abs(x).argmax(axis=-1)[..., None]
    return np.take_along_axis(x, idx, axis=-1)


def _pack_nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return ((lo & 0x0F) | ((hi & 0x0F) << 4)).astype(np.uint8)


def _pack_bits(bits: np.ndarray, bit_of: np.ndarray) -> np.ndarray:
    """OR ``bits[..., i, :] << bit_of[i]`` over axis -2 (values already masked)."""
    shifted = bits.astype(np.uint8) << bit_of.astype(np.uint8)[:, None]
    return np.bitwise_or.reduce(shifted, axis=-2).astype(np.uint8)


_NIBBLE_SHIFT = np.array([0, 4], dtype=np.uint8)[:, None]
_CRUMB_SHIFT = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
_BIT_SHIFT = np.arange(8, dtype=np.uint8)[:, None]


# ---------------------------------------------------------------------------------------------
# float formats (block of one element)

def _enc_f32(x: np.ndarray) -> np.ndarray:
    return x.astype("<f4").view(np.uint8)


def _dec_f32(b: np.ndarray) -> np.ndarray:
    return b.view("<f4").astype(np.float32)


def _enc_f16(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").view(np.uint8)


def _dec_f16(b: np.ndarray) -> np.ndarray:
    return b.view("<f2").astype(np.float32)


def _enc_bf16(x: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(x, dtype="<f4").view(np.uint32).astype(np.uint64)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    # round to nearest, ties to even, on the 16 bits that are dropped
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    # keep NaNs NaN (rounding could carry a NaN payload into infinity): force a quiet NaN
    quiet_nan = (bits >> 16) | 0x40
    out = np.where(is_nan, quiet_nan, rounded).astype("<u2")
    return out.view(np.uint8)


def _dec_bf16(b: np.ndarray) -> np.ndarray:
    return (b.view("<u2").astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------------------------
# 32-element formats

def _enc_q4_0(x: np.ndarray) -> np.ndarray:
    # the largest-magnitude value maps exactly to the code 0 (i.e. -8 * d)
    d = (_signed_absmax(x) / -8).astype(np.float16).astype(np.float32)
    q = np.clip(np.rint(x * _reciprocal(d)) + 8, 0, 15).astype(np.uint8)
    return np.concatenate([_as_half_bytes(d), _pack_nibbles(q[:, :16], q[:, 16:])], axis=1)


def _dec_q4_0(b: np.ndarray) -> np.ndarray:
    d = _half_at(b, 0)
    qs = b[:, 2:18]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int8) - np.int8(8)
    return q.astype(np.float32) * d


def _enc_q4_1(x: np.ndarray) -> np.ndarray:
    lo = x.min(axis=1, keepdims=True)
    hi = x.max(axis=1, keepdims=True)
    d = ((hi - lo) / 15).astype(np.float16).astype(np.float32)
    m = lo.astype(np.float16).astype(np.float32)
    q = np.clip(np.rint((x - m) * _reciprocal(d)), 0, 15).astype(np.uint8)
    return np.concatenate(
        [_as_half_bytes(d), _as_half_bytes(m), _pack_nibbles(q[:, :16], q[:, 16:])], axis=1
    )


def _dec_q4_1(b: np.ndarray) -> np.ndarray:
    d = _half_at(b, 0)
    m = _half_at(b, 2)
    qs = b[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    return q.astype(np.float32) * d + m


def _qh_bytes(q: np.ndarray) -> np.ndarray:
    """Bit 4 of each of the 32 codes as a little-endian uint32 (bit j = element j)."""
    return np.packbits((q >> 4) & 1, axis=1, bitorder="little")


def _q5_codes(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    high = np.unpackbits(qh, axis=1, bitorder="little")
    return low | (high << 4)


def _enc_q5_0(x: np.ndarray) -> np.ndarray:
    d = (_signed_absmax(x) / -16).astype(np.float16).astype(np.float32)
    q = np.clip(np.rint(x * _reciprocal(d)) + 16, 0, 31).astype(np.uint8)
    return np.concatenate(
        [_as_half_bytes(d), _qh_bytes(q), _pack_nibbles(q[:, :16], q[:, 16:])], axis=1
    )


def _dec_q5_0(b: np.ndarray) -> np.ndarray:
    d = _half_at(b, 0)
    q = _q5_codes(b[:, 2:6], b[:, 6:22]).astype(np.int8) - np.int8(16)
    return q.astype(np.float32) * d


def _enc_q5_1(x: np.ndarray) -> np.ndarray:
    lo = x.min(axis=1, keepdims=True)
    hi = x.max(axis=1, keepdims=True)
    d = ((hi - lo) / 31).astype(np.float16).astype(np.float32)
    m = lo.astype(np.float16).astype(np.float32)
    q = np.clip(np.rint((x - m) * _reciprocal(d)), 0, 31).astype(np.uint8)
    return np.concatenate(
        [_as_half_bytes(d), _as_half_bytes(m), _qh_bytes(q), _pack_nibbles(q[:, :16], q[:, 16:])],
        axis=1,
    )


def _dec_q5_1(b: np.ndarray) -> np.ndarray:
    d = _half_at(b, 0)
    m = _half_at(b, 2)
    q = _q5_codes(b[:, 4:8], b[:, 8:24])
    return q.astype(np.float32) * d + m


def _int8_codes(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x * _reciprocal(d)), -127, 127).astype(np.int8)


def _enc_q8_0(x: np.ndarray) -> np.ndarray:
    d = (np.abs(x).max(axis=1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    q = _int8_codes(x, d)
    return np.concatenate([_as_half_bytes(d), q.view(np.uint8)], axis=1)


def _dec_q8_0(b: np.ndarray) -> np.ndarray:
    d = _half_at(b, 0)
    return b[:, 2:34].view(np.int8).astype(np.float32) * d


def _enc_q8_1(x: np.ndarray) -> np.ndarray:
    # block_q8_1 = {half d, half s = d * sum(qs), int8 qs[32]} (36 bytes in current ggml)
    d = (np.abs(x).max(axis=1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    q = _int8_codes(x, d)
    s = d * q.astype(np.float32).sum(axis=1, keepdims=True)
    return np.concatenate([_as_half_bytes(d), _as_half_bytes(s), q.view(np.uint8)], axis=1)


def _dec_q8_1(b: np.ndarray) -> np.ndarray:
    d = _half_at(b, 0)
    return b[:, 4:36].view(np.int8).astype(np.float32) * d


# ---------------------------------------------------------------------------------------------
# 256-element "K" formats.  In all of them the sub-block scales apply to consecutive runs of
# elements (16 or 32); only the bit packing of the codes is interleaved.

def _min_scale_split(x: np.ndarray, levels: int, scale_bits: int):
    """Shared part of the "d * sc * q - dmin * m" quantizers (Q2_K, Q4_K, Q5_K).

    x: (n_blocks, n_sub, sub_len). Returns (d, dmin, sc, m, q) with d/dmin half-rounded
    float32 of shape (n_blocks, 1), sc/m integer codes (n_blocks, n_sub), q codes like x.
    """
    top = (1 << scale_bits) - 1
    lo = np.minimum(x.min(axis=2), 0)  # the offset is subtracted, so it cannot be positive
    hi = x.max(axis=2)
    sub_scale = (hi - lo) / levels
    sub_min = -lo
    d = (sub_scale.max(axis=1, keepdims=True) / top).astype(np.float16).astype(np.float32)
    dmin = (sub_min.max(axis=1, keepdims=True) / top).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(sub_scale * _reciprocal(d)), 0, top)
    m = np.clip(np.rint(sub_min * _reciprocal(dmin)), 0, top)
    step = (d * sc)[:, :, None]
    offset = (dmin * m)[:, :, None]
    q = np.clip(np.rint((x + offset) * _reciprocal(step)), 0, levels).astype(np.uint8)
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q


def _signed_scale_split(x: np.ndarray, qmax_neg: int, qmax_pos: int, scale_neg: int, scale_pos: int):
    """Shared part of the "d * sc * q" quantizers with signed scales (Q3_K, Q6_K).

    Each sub-block's largest-magnitude value maps to the code ``-qmax_neg``; the block scale d
    maps the largest sub-block scale to ``-scale_neg``.  Returns (d, sc, q) with signed codes.
    """
    sub = _signed_absmax(x)[:, :, 0] / -qmax_neg
    d = (_signed_absmax(sub) / -scale_neg).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(sub * _reciprocal(d)), -scale_neg, scale_pos)
    step = (d * sc)[:, :, None]
    q = np.clip(np.rint(x * _reciprocal(step)), -qmax_neg, qmax_pos)
    return d, sc.astype(np.int16), q.astype(np.int16)


def _enc_q2_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    d, dmin, sc, m, q = _min_scale_split(x.reshape(n, 16, 16), levels=3, scale_bits=4)
    scales = sc | (m << 4)
    # element 128h + 32j + l lives in bits 2j..2j+1 of qs[32h + l]
    qs = _pack_bits(q.reshape(n, 2, 4, 32), _CRUMB_SHIFT[:, 0]).reshape(n, 64)
    return np.concatenate([scales, qs, _as_half_bytes(d), _as_half_bytes(dmin)], axis=1)


def _dec_q2_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    scales = b[:, 0:16]
    qs = b[:, 16:80]
    d = _half_at(b, 80)
    dmin = _half_at(b, 82)
    step = (d * (scales & 0x0F).astype(np.float32))[:, :, None]
    offset = (dmin * (scales >> 4).astype(np.float32))[:, :, None]
    q = (qs.reshape(n, 2, 1, 32) >> _CRUMB_SHIFT) & 3
    q = q.reshape(n, 16, 16).astype(np.float32)
    return (step * q - offset).reshape(n, 256)


def _pack_scales_q3_k(s: np.ndarray) -> np.ndarray:
    """16 six-bit values -> 12 bytes: low nibbles in bytes 0..7, top two bits in bytes 8..11."""
    n = s.shape[0]
    low = _pack_nibbles(s[:, 0:8], s[:, 8:16])
    # bits 2k..2k+1 of byte 8+i hold the top bits of value 4k+i
    high = _pack_bits((s.reshape(n, 4, 4) >> 4) & 3, _CRUMB_SHIFT[:, 0])
    return np.concatenate([low, high], axis=1)


def _unpack_scales_q3_k(raw: np.ndarray) -> np.ndarray:
    n = raw.shape[0]
    low = (raw[:, None, 0:8] >> _NIBBLE_SHIFT) & 0x0F  # (n, 2, 8): value 8k + i
    high = (raw[:, None, 8:12] >> _CRUMB_SHIFT) & 3  # (n, 4, 4): value 4k + i
    return low.reshape(n, 16) | (high.reshape(n, 16) << 4)


def _enc_q3_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    d, sc, q = _signed_scale_split(x.reshape(n, 16, 16), 4, 3, 32, 31)
    u = (q + 4).astype(np.uint8).reshape(n, 256)  # 3-bit code, 0..7
    # high bit set means "no -4 offset": element 32b + l -> bit b of hmask[l]
    hmask = _pack_bits((u >> 2).reshape(n, 8, 32), _BIT_SHIFT[:, 0])
    qs = _pack_bits((u & 3).reshape(n, 2, 4, 32), _CRUMB_SHIFT[:, 0]).reshape(n, 64)
    scales = _pack_scales_q3_k((sc + 32).astype(np.uint8))
    return np.concatenate([hmask, qs, scales, _as_half_bytes(d)], axis=1)


def _dec_q3_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    hmask = b[:, 0:32]
    qs = b[:, 32:96]
    d = _half_at(b, 108)
    sc = _unpack_scales_q3_k(b[:, 96:108]).astype(np.float32) - 32
    step = (d * sc)[:, :, None]
    low = ((qs.reshape(n, 2, 1, 32) >> _CRUMB_SHIFT) & 3).reshape(n, 256).astype(np.int8)
    high = ((hmask[:, None, :] >> _BIT_SHIFT) & 1).reshape(n, 256).astype(np.int8)
    q = low - np.int8(4) * (np.int8(1) - high)
    return (step * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


def _pack_scales_k(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit mins -> the 12-byte field of Q4_K / Q5_K."""
    b0 = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    b4 = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    b8 = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    return np.concatenate([b0, b4, b8], axis=1).astype(np.uint8)


def _unpack_scales_k(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def _nibble_codes_k(qs: np.ndarray) -> np.ndarray:
    """qs[128] -> 256 codes: element 64g + 32s + l is nibble s of qs[32g + l]."""
    n = qs.shape[0]
    return ((qs.reshape(n, 4, 1, 32) >> _NIBBLE_SHIFT) & 0x0F).reshape(n, 256)


def _pack_nibbles_k(q: np.ndarray) -> np.ndarray:
    n = q.shape[0]
    g = q.reshape(n, 4, 2, 32)
    return _pack_nibbles(g[:, :, 0, :], g[:, :, 1, :]).reshape(n, 128)


def _dec_min_scaled(d, dmin, sc, m, q, n_sub) -> np.ndarray:
    n = q.shape[0]
    step = (d * sc.astype(np.float32))[:, :, None]
    offset = (dmin * m.astype(np.float32))[:, :, None]
    return (step * q.reshape(n, n_sub, -1).astype(np.float32) - offset).reshape(n, 256)


def _enc_q4_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    d, dmin, sc, m, q = _min_scale_split(x.reshape(n, 8, 32), levels=15, scale_bits=6)
    return np.concatenate(
        [_as_half_bytes(d), _as_half_bytes(dmin), _pack_scales_k(sc, m),
         _pack_nibbles_k(q.reshape(n, 256))],
        axis=1,
    )


def _dec_q4_k(b: np.ndarray) -> np.ndarray:
    sc, m = _unpack_scales_k(b[:, 4:16])
    q = _nibble_codes_k(b[:, 16:144])
    return _dec_min_scaled(_half_at(b, 0), _half_at(b, 2), sc, m, q, 8)


def _enc_q5_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    d, dmin, sc, m, q = _min_scale_split(x.reshape(n, 8, 32), levels=31, scale_bits=6)
    q = q.reshape(n, 256)
    # 5th bit of element 32b + l -> bit b of qh[l]
    qh = _pack_bits((q >> 4).reshape(n, 8, 32), _BIT_SHIFT[:, 0])
    return np.concatenate(
        [_as_half_bytes(d), _as_half_bytes(dmin), _pack_scales_k(sc, m), qh,
         _pack_nibbles_k(q & 0x0F)],
        axis=1,
    )


def _dec_q5_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    sc, m = _unpack_scales_k(b[:, 4:16])
    high = ((b[:, None, 16:48] >> _BIT_SHIFT) & 1).reshape(n, 256)
    q = _nibble_codes_k(b[:, 48:176]) | (high << 4)
    return _dec_min_scaled(_half_at(b, 0), _half_at(b, 2), sc, m, q, 8)


def _enc_q6_k(x: np.ndarray) -> np.ndarray:
    n = x.shape[0]
    d, sc, q = _signed_scale_split(x.reshape(n, 16, 16), 32, 31, 128, 127)
    u = (q + 32).astype(np.uint8).reshape(n, 2, 128)  # two halves of 128
    # half h: element 64s + c -> nibble s of ql[64h + c]
    lo = u.reshape(n, 2, 2, 64)
    ql = _pack_nibbles(lo[:, :, 0, :], lo[:, :, 1, :]).reshape(n, 128)
    # half h: element 32j + l -> bits 2j..2j+1 of qh[32h + l]
    qh = _pack_bits((u >> 4).reshape(n, 2, 4, 32), _CRUMB_SHIFT[:, 0]).reshape(n, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), _as_half_bytes(d)], axis=1)


def _dec_q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql = b[:, 0:128].reshape(n, 2, 1, 64)
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _half_at(b, 208)
    low = ((ql >> _NIBBLE_SHIFT) & 0x0F).reshape(n, 256)
    high = ((qh >> _CRUMB_SHIFT) & 3).reshape(n, 256)
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    step = (d * sc)[:, :, None]
    return (step * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)


def _enc_q8_k(x: np.ndarray) -> np.ndarray:
    # block_q8_K = {float d, int8 qs[256], int16 bsums[16]} (bsums: sums of 16 consecutive qs)
    n = x.shape[0]
    d = (np.abs(x).max(axis=1, keepdims=True) / 127).astype(np.float32)
    q = _int8_codes(x, d)
    bsums = q.reshape(n, 16, 16).astype(np.int16).sum(axis=2, dtype=np.int16)
    return np.concatenate(
        [d.astype("<f4").view(np.uint8), q.view(np.uint8), bsums.astype("<i2").view(np.uint8)],
        axis=1,
    )


def _dec_q8_k(b: np.ndarray) -> np.ndarray:
    d = np.ascontiguousarray(b[:, 0:4]).view("<f4").astype(np.float32)
    return b[:, 4:260].view(np.int8).astype(np.float32) * d


_Codec = tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]

_CODECS: dict[DType, _Codec] = {
    DType.F32: (_enc_f32, _dec_f32),
    DType.F16: (_enc_f16, _dec_f16),
    DType.BF16: (_enc_bf16, _dec_bf16),
    DType.Q4_0: (_enc_q4_0, _dec_q4_0),
    DType.Q4_1: (_enc_q4_1, _dec_q4_1),
    DType.Q5_0: (_enc_q5_0, _dec_q5_0),
    DType.Q5_1: (_enc_q5_1, _dec_q5_1),
    DType.Q8_0: (_enc_q8_0, _dec_q8_0),
    DType.Q8_1: (_enc_q8_1, _dec_q8_1),
    DType.Q2_K: (_enc_q2_k, _dec_q2_k),
    DType.Q3_K: (_enc_q3_k, _dec_q3_k),
    DType.Q4_K: (_enc_q4_k, _dec_q4_k),
    DType.Q5_K: (_enc_q5_k, _dec_q5_k),
    DType.Q6_K: (_enc_q6_k, _dec_q6_k),
    DType.Q8_K: (_enc_q8_k, _dec_q8_k),
}

#: dtypes that quantize() and dequantize() handle (all of DType)
SUPPORTED_DTYPES: tuple[DType, ...] = tuple(_CODECS)

# Values per chunk: bounds the temporaries of one codec call to a few tens of MiB.
_CHUNK_ELEMS = 1 << 20


def quantize(array, dtype: Union[DType, int, str]) -> bytes:
    """Encode ``array`` (any shape; rows along the last axis) as GGUF blocks of ``dtype``.

    The last dimension must be a multiple of the block size (blocks never span rows).
    Returns the encoded bytes, rows one after another.
    """
    dt = DType.coerce(dtype)
    x = np.asarray(array)
    if x.dtype.kind not in "fiub":
        raise TypeError(f"array must hold real numbers, got dtype {x.dtype}")
    if x.ndim == 0:
        raise ValueError("array must have at least one dimension, got a scalar")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.size == 0:
        raise ValueError(f"array is empty (shape {x.shape})")
    if x.shape[-1] % dt.block_elems:
        raise ValueError(
            f"row length {x.shape[-1]} (last dimension of shape {x.shape}) is not a multiple "
            f"of the {dt.name} block size {dt.block_elems}"
        )
    if dt.is_quantized and not np.isfinite(x).all():
        raise ValueError(f"array contains NaN or infinity; {dt.name} blocks cannot encode them")
    encode = _CODECS[dt][0]
    flat = x.reshape(-1, dt.block_elems)
    out = np.empty((flat.shape[0], dt.block_bytes), dtype=np.uint8)
    step = max(1, _CHUNK_ELEMS // dt.block_elems)
    with np.errstate(over="ignore"):  # float16 overflow gives inf, as ggml's conversion does
        for start in range(0, flat.shape[0], step):
            out[start:start + step] = encode(flat[start:start + step])
    return out.tobytes()


def dequantize(data, dtype: Union[DType, int, str], shape) -> np.ndarray:
    """Decode GGUF blocks of ``dtype`` into a float32 array of ``shape``.

    ``data`` is any bytes-like object or a C-contiguous numpy array (read as raw bytes); its
    length must be exactly what ``shape`` takes in ``dtype``.
    """
    dt = DType.coerce(dtype)
    shape = _normalize_shape(shape)
    raw = _as_byte_array(data)
    n_cols = shape[-1]
    if n_cols % dt.block_elems:
        raise ValueError(
            f"row length {n_cols} (last dimension of shape {shape}) is not a multiple "
            f"of the {dt.name} block size {dt.block_elems}"
        )
    n_elems = math.prod(shape)
    expected = n_elems // dt.block_elems * dt.block_bytes
    if raw.size != expected:
        raise ValueError(
            f"data holds {raw.size} bytes but shape {shape} in {dt.name} needs {expected} bytes"
        )
    decode = _CODECS[dt][1]
    blocks = raw.reshape(-1, dt.block_bytes)
    out = np.empty((blocks.shape[0], dt.block_elems), dtype=np.float32)
    step = max(1, _CHUNK_ELEMS // dt.block_elems)
    for start in range(0, blocks.shape[0], step):
        out[start:start + step] = decode(blocks[start:start + step])
    return out.reshape(shape)


def _normalize_shape(shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (int(shape),)
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    if not dims:
        raise ValueError("shape must have at least one dimension")
    for dim in dims:
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"shape {shape!r} has a non-integer dimension {dim!r}")
        if dim <= 0:
            raise ValueError(f"shape {dims} has a dimension that is not positive")
    return tuple(int(d) for d in dims)


def _as_byte_array(data) -> np.ndarray:
    """A flat uint8 view of a bytes-like object or C-contiguous numpy array (no copy)."""
    if isinstance(data, np.ndarray):
        if not data.flags.c_contiguous:
            raise ValueError("data must be a C-contiguous array")
        return data.reshape(-1).view(np.uint8)
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(
            f"data must be bytes-like or a numpy array, got {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ValueError("data must be C-contiguous")
    return np.frombuffer(view.cast("B") if view.ndim != 1 or view.format != "B" else view,
                         dtype=np.uint8)
