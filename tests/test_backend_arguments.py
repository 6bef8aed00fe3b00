"""Argument checking of the ComputeBackend API, run against every backend kind.

Every bad call must raise a clear exception naming the argument (and the numbers) and must not
touch any buffer: the checks live in ComputeBackend's public methods, so NumPy and Vulkan
reject the same input the same way before any GPU work.  The Vulkan parametrization is skipped
(with the reason) where no Vulkan backend can be opened.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest

from kbench.backend import (
    BackendClosedError,
    BufferHandle,
    ComputeBackend,
    DType,
    InvalidHandleError,
    NumpyBackend,
    create_backend,
)
from kbench.quant import quantize

KINDS = ["numpy", "vulkan"]


def make_backend(kind: str) -> ComputeBackend:
    """Open a backend of ``kind``, or skip the test saying why it cannot be opened here."""
    try:
        return create_backend(kind)
    except (ImportError, RuntimeError, OSError) as exc:
        pytest.skip(f"{kind} backend unavailable: {type(exc).__name__}: {exc}")


@pytest.fixture(scope="module", params=KINDS)
def backend(request):
    be = make_backend(request.param)
    yield be
    be.close()


@pytest.fixture
def B(backend):
    """A set of buffers filled with known values; freed after the test."""
    rng = np.random.default_rng(0)
    made = {}

    def buf(name, nbytes):
        h = backend.allocate(nbytes)
        backend.copy_to_device(rng.integers(0, 256, nbytes, dtype=np.uint8), h)
        made[name] = h
        return h

    for name in ("a", "b", "out"):
        buf(name, 64)  # 16 float32 elements
    buf("small", 16)  # 4 elements
    buf("x", 128)  # 32 elements: one Q4_0 row's worth of input
    buf("odd", 10)  # 2 whole elements and 2 spare bytes
    w = backend.allocate(200)  # room for Q4_0 weights of a few 32-column rows
    backend.copy_to_device(quantize(np.linspace(-1, 1, 5 * 32, dtype=np.float32), DType.Q4_0), w)
    made["w"] = w
    ns = SimpleNamespace(**made)
    yield ns
    for h in made.values():
        if h in backend.live_buffers():
            backend.free(h)


def snapshot(be: ComputeBackend, handles) -> list[bytes]:
    out = []
    for h in handles:
        raw = bytearray(h.size_bytes)
        be.copy_from_device(h, raw)
        out.append(bytes(raw))
    return out


def check_rejected(be, B, call: Callable, exc: type, match: str) -> None:
    """``call`` raises ``exc`` matching ``match`` and leaves every buffer as it was."""
    handles = [h for h in vars(B).values() if h in be.live_buffers()]
    before = snapshot(be, handles)
    with pytest.raises(exc, match=match):
        call(be, B)
    be.synchronize()
    after = snapshot(be, handles)
    changed = [h.id for h, x, y in zip(handles, before, after) if x != y]
    assert not changed, f"a rejected call modified buffers {changed}"


# (id, call, exception, message regex)
BAD_CALLS = [
    # -- handles that are not handles
    ("matmul-a-int", lambda be, B: be.matmul(3, B.b, B.out, 1, 1, 1), TypeError,
     r"matmul: a must be a BufferHandle, got int 3"),
    ("softmax-output-none", lambda be, B: be.softmax(B.a, None, 1), TypeError,
     r"softmax: output must be a BufferHandle, got NoneType None"),
    ("add-b-unknown", lambda be, B: be.add(B.a, BufferHandle(10**12, 64), B.out, 4), KeyError,
     r"add: b is buffer #1000000000000, which is unknown to this \w+ backend"),
    ("silu-forged-size", lambda be, B: be.silu(BufferHandle(B.a.id, 1 << 20), B.out, 4), KeyError,
     r"silu: input is buffer #\d+, which is unknown"),
    # -- sizes zero or negative
    ("allocate-0", lambda be, B: be.allocate(0), ValueError, r"allocate: size_bytes must be positive, got 0"),
    ("allocate-neg", lambda be, B: be.allocate(-8), ValueError, r"allocate: size_bytes must be positive, got -8"),
    ("softmax-size-0", lambda be, B: be.softmax(B.a, B.out, 0), ValueError, r"softmax: size must be positive, got 0"),
    ("rms_norm-size-neg", lambda be, B: be.rms_norm(B.a, B.b, B.out, -1, 1e-5), ValueError,
     r"rms_norm: size must be positive, got -1"),
    ("silu-size-0", lambda be, B: be.silu(B.a, B.out, 0), ValueError, r"silu: size must be positive, got 0"),
    ("add-size-0", lambda be, B: be.add(B.a, B.b, B.out, 0), ValueError, r"add: size must be positive, got 0"),
    ("mul-size-0", lambda be, B: be.element_mul(B.a, B.b, B.out, 0), ValueError,
     r"element_mul: size must be positive, got 0"),
    ("matmul-m-0", lambda be, B: be.matmul(B.a, B.b, B.out, 0, 2, 2), ValueError, r"matmul: m must be positive, got 0"),
    ("matmul-k-neg", lambda be, B: be.matmul(B.a, B.b, B.out, 2, 2, -2), ValueError, r"matmul: k must be positive, got -2"),
    ("copy_buffer-size-0", lambda be, B: be.copy_buffer(B.a, B.b, 0), ValueError,
     r"copy_buffer: size must be positive, got 0"),
    ("copy_offset-size-0", lambda be, B: be.copy_buffer_offset(B.a, B.b, 0, 0, 0), ValueError,
     r"copy_buffer_offset: size must be positive, got 0"),
    ("attn_score-seq-0", lambda be, B: be.attn_score(B.a, B.b, B.out, 4, 0, 0, 0, 4), ValueError,
     r"attn_score: seq_len must be positive, got 0"),
    ("attn_value-hd-0", lambda be, B: be.attn_value(B.a, B.b, B.out, 0, 2, 0, 4, 0), ValueError,
     r"attn_value: head_dim must be positive, got 0"),
    ("qmm-rows-0", lambda be, B: be.quantized_matmul(B.w, B.a, B.out, 0, 32, DType.Q4_0), ValueError,
     r"quantized_matmul: n_rows must be positive, got 0"),
    ("copy_to_device-empty", lambda be, B: be.copy_to_device(b"", B.a), ValueError,
     r"copy_to_device: data is empty \(0 bytes\)"),
    ("copy_from_device-empty", lambda be, B: be.copy_from_device(B.a, bytearray()), ValueError,
     r"copy_from_device: data is empty"),
    # -- negative offsets, u32 overflow
    ("attn_score-head_offset-neg", lambda be, B: be.attn_score(B.a, B.b, B.out, 4, 1, -1, 0, 4), ValueError,
     r"attn_score: head_offset must be >= 0, got -1"),
    ("attn_value-out_offset-neg", lambda be, B: be.attn_value(B.a, B.b, B.out, 4, 1, 0, 4, -4), ValueError,
     r"attn_value: out_offset must be >= 0, got -4"),
    ("copy_offset-src-neg", lambda be, B: be.copy_buffer_offset(B.a, B.b, -4, 0, 4), ValueError,
     r"copy_buffer_offset: src_offset must be >= 0, got -4"),
    ("rope-pos-neg", lambda be, B: be.rope(B.a, B.b, -1, 4, 10000.0, 1, 1), ValueError,
     r"rope: pos must be >= 0, got -1"),
    ("matmul-n-u32", lambda be, B: be.matmul(B.a, B.b, B.out, 1, 2**32, 1), ValueError,
     r"matmul: n must be <= 4294967295 \(u32\), got 4294967296"),
    # -- non-integer arguments
    ("matmul-m-float", lambda be, B: be.matmul(B.a, B.b, B.out, 2.0, 2, 2), TypeError,
     r"matmul: m must be an integer, got float 2\.0"),
    ("softmax-size-str", lambda be, B: be.softmax(B.a, B.out, "4"), TypeError,
     r"softmax: size must be an integer, got str '4'"),
    ("allocate-float", lambda be, B: be.allocate(64.0), TypeError, r"allocate: size_bytes must be an integer, got float"),
    ("allocate-bool", lambda be, B: be.allocate(True), TypeError, r"allocate: size_bytes must be an integer, got bool"),
    ("rope-head_dim-float", lambda be, B: be.rope(B.a, B.b, 0, 4.0, 10000.0, 1, 1), TypeError,
     r"rope: head_dim must be an integer, got float 4\.0"),
    ("attn_score-stride-none", lambda be, B: be.attn_score(B.a, B.b, B.out, 4, 1, 0, 0, None), TypeError,
     r"attn_score: kv_stride must be an integer, got NoneType"),
    ("copy_buffer-size-float", lambda be, B: be.copy_buffer(B.a, B.b, 1.5), TypeError,
     r"copy_buffer: size must be an integer, got float 1\.5"),
    ("rms_norm-eps-str", lambda be, B: be.rms_norm(B.a, B.b, B.out, 4, "1e-5"), TypeError,
     r"rms_norm: eps must be a real number, got str"),
    ("rms_norm-eps-neg", lambda be, B: be.rms_norm(B.a, B.b, B.out, 4, -1e-5), ValueError,
     r"rms_norm: eps must be >= 0, got -1e-05"),
    ("rms_norm-eps-nan", lambda be, B: be.rms_norm(B.a, B.b, B.out, 4, float("nan")), ValueError,
     r"rms_norm: eps must be finite in float32, got nan"),
    ("rope-base-0", lambda be, B: be.rope(B.a, B.b, 1, 4, 0.0, 1, 1), ValueError,
     r"rope: freq_base must be > 0, got 0\.0"),
    ("rope-base-huge", lambda be, B: be.rope(B.a, B.b, 1, 4, 1e39, 1, 1), ValueError,
     r"rope: freq_base must be finite in float32"),
    # -- head_dim
    ("rope-head_dim-odd", lambda be, B: be.rope(B.a, B.b, 1, 7, 10000.0, 1, 1), ValueError,
     r"rope: head_dim must be even \(rope rotates pairs\), got 7"),
    ("rope-head_dim-0", lambda be, B: be.rope(B.a, B.b, 1, 0, 10000.0, 1, 1), ValueError,
     r"rope: head_dim must be positive, got 0"),
    ("rope-heads-0", lambda be, B: be.rope(B.a, B.b, 1, 4, 10000.0, 1, 0), ValueError,
     r"rope: n_heads_k must be positive, got 0"),
    # -- element ranges outside a buffer
    ("matmul-a-range", lambda be, B: be.matmul(B.a, B.b, B.out, 4, 4, 5), ValueError,
     r"matmul: a needs float32 elements \[0, 20\) \(m\*k = 4\*5\) but buffer #\d+ holds 16 elements \(64 bytes\)"),
    ("matmul-b-range", lambda be, B: be.matmul(B.a, B.b, B.out, 1, 5, 4), ValueError,
     r"matmul: b needs float32 elements \[0, 20\) \(k\*n = 4\*5\)"),
    ("matmul-out-range", lambda be, B: be.matmul(B.a, B.b, B.out, 5, 4, 2), ValueError,
     r"matmul: out needs float32 elements \[0, 20\) \(m\*n = 5\*4\)"),
    ("softmax-input-range", lambda be, B: be.softmax(B.a, B.out, 17), ValueError,
     r"softmax: input needs float32 elements \[0, 17\) \(size\) but buffer #\d+ holds 16 elements"),
    ("softmax-output-range", lambda be, B: be.softmax(B.a, B.small, 5), ValueError,
     r"softmax: output needs float32 elements \[0, 5\) \(size\) but buffer #\d+ holds 4 elements \(16 bytes\)"),
    ("softmax-odd-bytes", lambda be, B: be.softmax(B.odd, B.out, 3), ValueError,
     r"softmax: input needs float32 elements \[0, 3\) \(size\) but buffer #\d+ holds 2 elements \(10 bytes\)"),
    ("rms_norm-weight-range", lambda be, B: be.rms_norm(B.a, B.small, B.out, 8, 1e-5), ValueError,
     r"rms_norm: weight needs float32 elements \[0, 8\)"),
    ("rope-q-range", lambda be, B: be.rope(B.a, B.b, 1, 8, 10000.0, 3, 1), ValueError,
     r"rope: q needs float32 elements \[0, 24\) \(n_heads_q\*head_dim = 3\*8\) but buffer #\d+ holds 16"),
    ("rope-k-range", lambda be, B: be.rope(B.a, B.small, 1, 8, 10000.0, 2, 1), ValueError,
     r"rope: k needs float32 elements \[0, 8\) \(n_heads_k\*head_dim = 1\*8\) but buffer #\d+ holds 4"),
    ("silu-output-range", lambda be, B: be.silu(B.a, B.small, 6), ValueError, r"silu: output needs float32 elements \[0, 6\)"),
    ("mul-b-range", lambda be, B: be.element_mul(B.a, B.small, B.out, 6), ValueError,
     r"element_mul: b needs float32 elements \[0, 6\)"),
    ("add-output-range", lambda be, B: be.add(B.a, B.b, B.small, 6), ValueError, r"add: output needs float32 elements \[0, 6\)"),
    ("attn_score-q-range", lambda be, B: be.attn_score(B.a, B.b, B.out, 8, 1, 12, 0, 8), ValueError,
     r"attn_score: q needs float32 elements \[12, 20\) \(head_offset \+ head_dim\)"),
    ("attn_score-k-range", lambda be, B: be.attn_score(B.a, B.b, B.out, 4, 3, 0, 1, 8), ValueError,
     r"attn_score: k_cache needs float32 elements \[1, 21\) \(\(seq_len-1\)\*kv_stride \+ kv_offset \+ head_dim\)"),
    ("attn_score-scores-range", lambda be, B: be.attn_score(B.a, B.b, B.small, 2, 5, 0, 0, 2), ValueError,
     r"attn_score: scores needs float32 elements \[0, 5\) \(seq_len\)"),
    ("attn_value-weights-range", lambda be, B: be.attn_value(B.small, B.b, B.out, 2, 5, 0, 2, 0), ValueError,
     r"attn_value: weights needs float32 elements \[0, 5\) \(seq_len\)"),
    ("attn_value-v-range", lambda be, B: be.attn_value(B.a, B.b, B.out, 4, 2, 9, 4, 0), ValueError,
     r"attn_value: v_cache needs float32 elements \[9, 17\)"),
    ("attn_value-out-range", lambda be, B: be.attn_value(B.a, B.b, B.out, 4, 1, 0, 4, 14), ValueError,
     r"attn_value: output needs float32 elements \[14, 18\) \(out_offset \+ head_dim\)"),
    ("qmm-weights-range", lambda be, B: be.quantized_matmul(B.w, B.a, B.out, 12, 32, DType.Q4_0), ValueError,
     r"quantized_matmul: weights needs bytes \[0, 216\) \(n_rows\*row_bytes = 12\*18\) but buffer #\d+ holds 200 bytes"),
    ("qmm-input-range", lambda be, B: be.quantized_matmul(B.w, B.a, B.out, 1, 64, DType.Q4_0), ValueError,
     r"quantized_matmul: input needs float32 elements \[0, 64\) \(n_cols\)"),
    ("qmm-output-range", lambda be, B: be.quantized_matmul(B.w, B.x, B.small, 5, 32, DType.Q4_0), ValueError,
     r"quantized_matmul: output needs float32 elements \[0, 5\) \(n_rows\)"),
    # -- byte ranges outside a buffer
    ("copy_buffer-src-range", lambda be, B: be.copy_buffer(B.a, B.b, 65), ValueError,
     r"copy_buffer: src needs bytes \[0, 65\) \(size\) but buffer #\d+ holds 64 bytes"),
    ("copy_buffer-dst-range", lambda be, B: be.copy_buffer(B.a, B.small, 20), ValueError,
     r"copy_buffer: dst needs bytes \[0, 20\) \(size\) but buffer #\d+ holds 16 bytes"),
    ("copy_offset-src-range", lambda be, B: be.copy_buffer_offset(B.a, B.b, 60, 0, 8), ValueError,
     r"copy_buffer_offset: src needs bytes \[60, 68\)"),
    ("copy_offset-dst-range", lambda be, B: be.copy_buffer_offset(B.a, B.small, 0, 9, 8), ValueError,
     r"copy_buffer_offset: dst needs bytes \[9, 17\) \(size\) but buffer #\d+ holds 16 bytes"),
    ("copy_to_device-too-long", lambda be, B: be.copy_to_device(bytes(65), B.a), ValueError,
     r"copy_to_device: data is 65 bytes but buffer #\d+ holds 64 bytes"),
    ("copy_from_device-too-long", lambda be, B: be.copy_from_device(B.small, np.zeros(5, np.float32)), ValueError,
     r"copy_from_device: data is 20 bytes but buffer #\d+ holds 16 bytes"),
    # -- quantized_matmul dtype and block size
    ("qmm-dtype-unknown", lambda be, B: be.quantized_matmul(B.w, B.a, B.out, 1, 32, 5), ValueError,
     r"quantized_matmul: unknown dtype id 5; known: F32=0"),
    ("qmm-dtype-huge", lambda be, B: be.quantized_matmul(B.w, B.a, B.out, 1, 32, 1000), ValueError,
     r"quantized_matmul: unknown dtype id 1000"),
    ("qmm-dtype-str", lambda be, B: be.quantized_matmul(B.w, B.a, B.out, 1, 32, "Q4_0"), TypeError,
     r"quantized_matmul: dtype must be a DType or an integer GGUF type id, got str 'Q4_0'"),
    ("qmm-dtype-float", lambda be, B: be.quantized_matmul(B.w, B.a, B.out, 1, 32, 2.0), TypeError,
     r"quantized_matmul: dtype must be .* got float 2\.0"),
    ("qmm-cols-partial-block", lambda be, B: be.quantized_matmul(B.w, B.a, B.out, 1, 48, DType.Q4_0), ValueError,
     r"quantized_matmul: n_cols=48 is not a multiple of the Q4_0 block size 32"),
    ("qmm-cols-partial-kblock", lambda be, B: be.quantized_matmul(B.w, B.a, B.out, 1, 300, 12), ValueError,
     r"quantized_matmul: n_cols=300 is not a multiple of the Q4_K block size 256"),
    # -- host data of the wrong kind
    ("copy_to_device-str", lambda be, B: be.copy_to_device("abcd", B.a), TypeError,
     r"copy_to_device: data must be a bytes-like object or a numpy array, got str"),
    ("copy_to_device-list", lambda be, B: be.copy_to_device([1.0, 2.0], B.a), TypeError,
     r"copy_to_device: data must be a bytes-like object or a numpy array, got list"),
    ("copy_to_device-strided", lambda be, B: be.copy_to_device(np.zeros(8, np.float32)[::2], B.a), ValueError,
     r"copy_to_device: data must be C-contiguous"),
    ("copy_to_device-objects", lambda be, B: be.copy_to_device(np.array([1, None]), B.a), TypeError,
     r"copy_to_device: data must hold plain numbers"),
    ("copy_from_device-bytes", lambda be, B: be.copy_from_device(B.a, bytes(8)), TypeError,
     r"copy_from_device: data must be writable, got a read-only bytes"),
    ("copy_from_device-readonly-array",
     lambda be, B: be.copy_from_device(B.a, np.frombuffer(bytes(8), np.uint8)), TypeError,
     r"copy_from_device: data must be writable, got a read-only numpy array"),
    ("copy_from_device-strided", lambda be, B: be.copy_from_device(B.a, np.zeros(8, np.float32)[::2]), ValueError,
     r"copy_from_device: data must be C-contiguous"),
    ("copy_from_device-str", lambda be, B: be.copy_from_device(B.a, "abcd"), TypeError,
     r"copy_from_device: data must be a writable bytes-like object"),
    # -- outputs that alias inputs where the op cannot work in place
    ("matmul-out-is-a", lambda be, B: be.matmul(B.a, B.b, B.a, 2, 2, 2), ValueError,
     r"matmul: out and a are the same buffer #\d+"),
    ("rope-q-is-k", lambda be, B: be.rope(B.a, B.a, 1, 4, 10000.0, 1, 1), ValueError,
     r"rope: q and k are the same buffer"),
    ("attn_score-scores-is-q", lambda be, B: be.attn_score(B.a, B.b, B.a, 4, 1, 0, 0, 4), ValueError,
     r"attn_score: scores and q are the same buffer"),
    ("attn_value-output-is-v", lambda be, B: be.attn_value(B.a, B.b, B.b, 4, 1, 0, 4, 0), ValueError,
     r"attn_value: output and v_cache are the same buffer"),
    ("qmm-output-is-input", lambda be, B: be.quantized_matmul(B.w, B.a, B.a, 1, 32, DType.Q4_0), ValueError,
     r"quantized_matmul: output and input are the same buffer"),
    ("copy_buffer-same", lambda be, B: be.copy_buffer(B.a, B.a, 4), ValueError,
     r"copy_buffer: src and dst are the same buffer #\d+"),
    ("copy_offset-overlap", lambda be, B: be.copy_buffer_offset(B.a, B.a, 0, 4, 8), ValueError,
     r"copy_buffer_offset: source bytes \[0, 8\) and destination bytes \[4, 12\) overlap in the same buffer"),
]


@pytest.mark.parametrize("call,exc,match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_call_is_rejected_and_changes_nothing(backend, B, call, exc, match):
    check_rejected(backend, B, call, exc, match)


# one call per op with a given handle in its first buffer position (all other arguments valid)
FIRST_HANDLE_CALLS: dict[str, Callable] = {
    "free": lambda be, B, h: be.free(h),
    "matmul": lambda be, B, h: be.matmul(h, B.b, B.out, 2, 2, 2),
    "softmax": lambda be, B, h: be.softmax(h, B.out, 4),
    "rms_norm": lambda be, B, h: be.rms_norm(h, B.b, B.out, 4, 1e-5),
    "rope": lambda be, B, h: be.rope(h, B.b, 1, 4, 10000.0, 1, 1),
    "silu": lambda be, B, h: be.silu(h, B.out, 4),
    "element_mul": lambda be, B, h: be.element_mul(h, B.b, B.out, 4),
    "add": lambda be, B, h: be.add(h, B.b, B.out, 4),
    "copy_to_device": lambda be, B, h: be.copy_to_device(bytes(4), h),
    "copy_from_device": lambda be, B, h: be.copy_from_device(h, bytearray(4)),
    "copy_buffer": lambda be, B, h: be.copy_buffer(h, B.b, 4),
    "copy_buffer_offset": lambda be, B, h: be.copy_buffer_offset(h, B.b, 0, 0, 4),
    "attn_score": lambda be, B, h: be.attn_score(h, B.b, B.out, 4, 1, 0, 0, 4),
    "attn_value": lambda be, B, h: be.attn_value(h, B.b, B.out, 4, 1, 0, 4, 0),
    "quantized_matmul": lambda be, B, h: be.quantized_matmul(h, B.a, B.out, 1, 32, DType.Q4_0),
}


@pytest.mark.parametrize("op", list(FIRST_HANDLE_CALLS))
def test_freed_handle_is_rejected_by_every_op(backend, B, op):
    h = backend.allocate(256)
    backend.free(h)
    check_rejected(backend, B, lambda be, B: FIRST_HANDLE_CALLS[op](be, B, h), InvalidHandleError,
                   rf"{op}: \w+ is buffer #{h.id}, which was already freed")


@pytest.mark.parametrize("op", list(FIRST_HANDLE_CALLS))
def test_handle_of_another_backend_is_rejected_by_every_op(backend, B, op):
    with NumpyBackend() as other:
        foreign = other.allocate(256)
        check_rejected(backend, B, lambda be, B: FIRST_HANDLE_CALLS[op](be, B, foreign), InvalidHandleError,
                       rf"{op}: \w+ is buffer #{foreign.id}, which is unknown to this {backend.name()} backend")


def test_handle_in_a_later_position_is_checked_too(backend, B):
    h = backend.allocate(64)
    backend.free(h)
    check_rejected(backend, B, lambda be, B: be.matmul(B.a, B.b, h, 2, 2, 2), KeyError,
                   r"matmul: out is buffer #\d+, which was already freed")
    check_rejected(backend, B, lambda be, B: be.copy_buffer_offset(B.a, h, 0, 0, 4), KeyError,
                   r"copy_buffer_offset: dst is buffer #\d+, which was already freed")


def test_invalid_handle_error_message_is_not_quoted(backend):
    h = backend.allocate(8)
    backend.free(h)
    with pytest.raises(InvalidHandleError) as info:
        backend.free(h)
    assert str(info.value).startswith("free: handle is buffer #"), str(info.value)


# ---- what must be accepted ---------------------------------------------------------------------

@pytest.mark.parametrize("form", ["bytes", "bytearray", "memoryview", "memoryview-f32", "float32", "int16-2d", "uint8"])
def test_copy_to_device_accepts_bytes_like_and_arrays(backend, form):
    values = np.arange(8, dtype=np.float32) - 3.5
    raw = values.tobytes()
    data = {
        "bytes": raw,
        "bytearray": bytearray(raw),
        "memoryview": memoryview(raw),
        "memoryview-f32": memoryview(values),
        "float32": values,
        "int16-2d": np.frombuffer(raw, dtype=np.int16).reshape(4, 4),
        "uint8": np.frombuffer(raw, dtype=np.uint8),
    }[form]
    h = backend.allocate(64)
    try:
        backend.copy_to_device(data, h)
        back = bytearray(32)
        backend.copy_from_device(h, back)
        assert bytes(back) == raw, f"{form}: read back {bytes(back)!r}"
    finally:
        backend.free(h)


@pytest.mark.parametrize("form", ["bytearray", "memoryview", "float32", "uint8-2d"])
def test_copy_from_device_accepts_writable_buffers(backend, form):
    values = np.linspace(-1, 1, 8, dtype=np.float32)
    h = backend.allocate(32)
    try:
        backend.copy_to_device(values, h)
        target = {
            "bytearray": bytearray(32),
            "memoryview": memoryview(bytearray(32)),
            "float32": np.zeros(8, np.float32),
            "uint8-2d": np.zeros((4, 8), np.uint8),
        }[form]
        backend.copy_from_device(h, target)
        assert bytes(memoryview(target).cast("B")) == values.tobytes(), form
    finally:
        backend.free(h)


def test_numpy_integer_arguments_are_accepted(backend, B):
    backend.copy_to_device(np.zeros(16, np.float32), B.a)
    backend.softmax(B.a, B.out, np.int64(4))
    out = np.zeros(4, np.float32)
    backend.copy_from_device(B.out, out)
    np.testing.assert_allclose(out, 0.25, rtol=1e-6)


def test_dtype_as_int_or_dtype_gives_the_same_result(backend, B):
    dtype = DType.Q4_0 if DType.Q4_0 in backend.quantized_dtypes() else min(backend.quantized_dtypes())
    n_cols = max(32, dtype.block_elems)
    w = quantize(np.linspace(-1, 1, 2 * n_cols, dtype=np.float32).reshape(2, n_cols), dtype)
    hw = backend.allocate(len(w))
    hx = backend.allocate(n_cols * 4)
    try:
        backend.copy_to_device(w, hw)
        backend.copy_to_device(np.ones(n_cols, np.float32), hx)
        results = []
        for form in (dtype, int(dtype), np.int32(dtype)):
            backend.quantized_matmul(hw, hx, B.out, 2, n_cols, form)
            out = np.zeros(2, np.float32)
            backend.copy_from_device(B.out, out)
            results.append(out)
        np.testing.assert_array_equal(results[0], results[1])
        np.testing.assert_array_equal(results[0], results[2])
    finally:
        backend.free(hw)
        backend.free(hx)


# ---- lifetime --------------------------------------------------------------------------------------

def test_double_free_is_an_error(backend):
    h = backend.allocate(16)
    backend.free(h)
    with pytest.raises(KeyError, match=r"free: handle is buffer #\d+, which was already freed"):
        backend.free(h)


def test_closed_backend_rejects_every_call(backend):
    kind = backend.name()
    other = make_backend(kind)
    keep = other.allocate(64)
    with other:
        pass  # __exit__ closes it
    assert other.closed and other.live_buffers() == ()
    assert other.name() == kind
    calls = {
        "allocate": lambda: other.allocate(8),
        "free": lambda: other.free(keep),
        "softmax": lambda: other.softmax(keep, keep, 1),
        "copy_to_device": lambda: other.copy_to_device(b"1234", keep),
        "copy_from_device": lambda: other.copy_from_device(keep, bytearray(4)),
        "synchronize": other.synchronize,
    }
    for op, call in calls.items():
        with pytest.raises(BackendClosedError, match=rf"{op}: the {kind} backend is closed"):
            call()
    other.close()  # closing again is harmless
