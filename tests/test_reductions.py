"""Multi-workgroup softmax / rms_norm: the last workgroup of pass 1 merges the partials through
an atomic counter, which must be back at zero for the next call, whatever ran in between."""
from __future__ import annotations

import math

import numpy as np
import pytest

kp = pytest.importorskip("kbench.runtime")

try:
    _NO_DEVICE = None if kp.list_devices() else "the Vulkan loader finds no device"
except Exception as exc:  # noqa: BLE001
    _NO_DEVICE = f"no Vulkan available here: {exc}"
pytestmark = pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")


def _nmse(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert not np.isnan(out).any(), "output has NaN"
    return float(np.sum((out - ref) ** 2) / np.sum(ref * ref))


@pytest.fixture(scope="module")
def be():
    from kbench.backend import VulkanBackend

    # single_group_limit=1: every size takes the partial + normalize path
    backend = VulkanBackend(single_group_limit=1)
    yield backend
    backend.close()


def _softmax_ref(x):
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def _run_softmax(be, x):
    h = be.allocate(x.nbytes)
    be.copy_to_device(x, h)
    be.softmax(h, h, x.size)
    out = np.empty_like(x)
    be.copy_from_device(h, out)
    be.free(h)
    return out


@pytest.mark.parametrize("size", [5, 1023, 4097, 70001, 300_000])
def test_softmax_partial_path_matches_float64(be, size):
    rng = np.random.default_rng(size)
    x = (rng.uniform(-1, 1, size) * 20).astype(np.float32)
    err = _nmse(_run_softmax(be, x), _softmax_ref(x))
    assert err < 1e-6, f"softmax of {size} elements: NMSE {err:.3g}, expected < 1e-6"


def test_back_to_back_reductions_in_one_batch_each_see_a_reset_counter(be):
    """Softmax, rms_norm and attention (whose partial sums use another scratch buffer) issued
    without a wait between them: every result is right, so the counter returned to zero."""
    rng = np.random.default_rng(7)
    n = 50_000
    xs = [rng.uniform(-3, 3, n).astype(np.float32) for _ in range(3)]
    w = rng.uniform(-1, 1, n).astype(np.float32)
    hd, t = 64, 3000
    q = rng.uniform(-1, 1, hd).astype(np.float32)
    vc = rng.uniform(-1, 1, t * hd).astype(np.float32)
    hs = [be.allocate(4 * n) for _ in xs]
    ho = [be.allocate(4 * n) for _ in xs]
    hw, hq, hv = be.allocate(4 * n), be.allocate(4 * hd), be.allocate(vc.nbytes)
    hscores, hattn = be.allocate(4 * t), be.allocate(4 * hd)
    for h, x in zip(hs, xs):
        be.copy_to_device(x, h)
    be.copy_to_device(w, hw)
    be.copy_to_device(q, hq)
    be.copy_to_device(vc, hv)
    for i in range(3):
        be.softmax(hs[i], ho[i], n)
        be.attn_score(hq, hv, hscores, hd, t, 0, 0, hd)
        be.softmax(hscores, hscores, t)
        be.attn_value(hscores, hv, hattn, hd, t, 0, hd, 0)
        be.rms_norm(hs[i], hw, hs[i], n, 1e-5)
    got = [np.empty(n, np.float32) for _ in xs]
    for h, g in zip(ho, got):
        be.copy_from_device(h, g)
    normed = [np.empty(n, np.float32) for _ in xs]
    for h, g in zip(hs, normed):
        be.copy_from_device(h, g)
    attn = np.empty(hd, np.float32)
    be.copy_from_device(hattn, attn)
    for i, x in enumerate(xs):
        err = _nmse(got[i], _softmax_ref(x))
        assert err < 1e-6, f"softmax call {i}: NMSE {err:.3g}"
        x64 = x.astype(np.float64)
        ref = x64 * w / math.sqrt(float(np.mean(x64 * x64)) + float(np.float32(1e-5)))
        err = _nmse(normed[i], ref)
        assert err < 1e-7, f"rms_norm call {i}: NMSE {err:.3g}"
    k = vc.astype(np.float64).reshape(t, hd)
    p = _softmax_ref((k @ q.astype(np.float64) / math.sqrt(hd)).astype(np.float32))
    err = _nmse(attn, p @ k)
    assert err < 1e-6, f"attention after the reductions: NMSE {err:.3g}"
    for h in hs + ho + [hw, hq, hv, hscores, hattn]:
        be.free(h)
