"""The torch peer's quantized weights (kbench.backend.torch_backend): dequantized once per weight
buffer, and a buffer holding the same bytes as the last weights dequantized (the bench's rotating
copies) gets its own device copy of them instead of another dequantization on the host.  Needs
PyTorch with CUDA (the device machine); skipped elsewhere."""
from __future__ import annotations

import numpy as np
import pytest

import kbench.quant
from kbench.backend.torch_backend import TorchBackend, availability
from kbench.quant import DType, quantize

_OK, _WHY = availability()
pytestmark = pytest.mark.skipif(not _OK, reason=f"the torch peer is unavailable here: {_WHY}")

N_ROWS, N_COLS = 64, 512


@pytest.fixture
def counted(monkeypatch):
    calls: list[tuple] = []
    real = kbench.quant.dequantize

    def dequantize(raw, dtype, shape):
        calls.append((dtype, shape))
        return real(raw, dtype, shape)

    monkeypatch.setattr(kbench.quant, "dequantize", dequantize)
    be = TorchBackend(0)
    yield be, calls
    be.close()


def _upload(be, data: bytes):
    h = be.allocate(len(data))
    be.copy_to_device(data, h)
    return h


def _product(be, hw, x: np.ndarray) -> np.ndarray:
    hx, hy = _upload(be, x.tobytes()), be.allocate(4 * N_ROWS)
    be.quantized_matmul(hw, hx, hy, N_ROWS, N_COLS, DType.Q4_0)
    out = bytearray(4 * N_ROWS)
    be.copy_from_device(hy, out)
    be.free(hx), be.free(hy)
    return np.frombuffer(bytes(out), np.float32)


def test_copies_of_the_same_weights_are_dequantized_once_and_give_the_same_products(counted):
    be, calls = counted
    rng = np.random.default_rng(7)
    raw = quantize(rng.uniform(-1, 1, (N_ROWS, N_COLS)).astype(np.float32), DType.Q4_0)
    x = rng.uniform(-1, 1, N_COLS).astype(np.float32)
    copies = [_upload(be, raw) for _ in range(3)]
    got = [_product(be, h, x) for h in copies]
    assert len(calls) == 1, f"three copies of one matrix: expected one dequantization, got {len(calls)}"
    for i, g in enumerate(got[1:], 1):
        assert np.array_equal(g.view(np.uint32), got[0].view(np.uint32)), f"copy {i}'s product differs from copy 0's"
    ptrs = {be._dequant[(h.id, int(DType.Q4_0), N_ROWS, N_COLS)][1].data_ptr() for h in copies}
    assert len(ptrs) == 3, "each copy has float32 weights of its own (a rotation reads distinct memory)"


def test_other_bytes_or_a_rewritten_buffer_are_dequantized_again(counted):
    be, calls = counted
    rng = np.random.default_rng(8)
    a = quantize(rng.uniform(-1, 1, (N_ROWS, N_COLS)).astype(np.float32), DType.Q4_0)
    b = quantize(rng.uniform(-1, 1, (N_ROWS, N_COLS)).astype(np.float32), DType.Q4_0)
    x = rng.uniform(-1, 1, N_COLS).astype(np.float32)
    ha, hb = _upload(be, a), _upload(be, b)
    ya, yb = _product(be, ha, x), _product(be, hb, x)
    assert len(calls) == 2, f"two different matrices: expected two dequantizations, got {len(calls)}"
    assert not np.array_equal(ya, yb), "different weights gave the same product"
    be.copy_to_device(b, ha)  # ha now holds b's bytes: the last dequantized, so a device copy
    assert np.array_equal(_product(be, ha, x).view(np.uint32), yb.view(np.uint32)), \
        "a buffer rewritten with b's bytes must give b's product"
    assert len(calls) == 2, f"b's bytes again: expected no new dequantization, got {len(calls) - 2}"
    be.copy_to_device(a, ha)  # a's bytes are no longer the last dequantized: dequantized again
    assert np.array_equal(_product(be, ha, x).view(np.uint32), ya.view(np.uint32)), \
        "a buffer rewritten with a's bytes must give a's product"
    assert len(calls) == 3, f"a's bytes after b's: expected a third dequantization, got {len(calls)}"
