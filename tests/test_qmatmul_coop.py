"""quantized_matmul of a batch on cooperative matrices (shaders/qmatmul_coop.comp, the ``coop`` knob):
each vector's product against float64 at fp32's precision, not fp16's (weights and x as exact pairs of
fp16 halves), through row blocks cut by the matrix's edge, several splits along the rows, weights
small enough that their low halves are fp16 subnormals and x of any magnitude; nothing written past
the outputs; requests the kernel cannot take are refused before any GPU work.  On devices without
the KHR cooperative-matrix configuration the emulated variant (the same staging and epilogue, plain
arithmetic in place of the matrix operations) runs instead."""

from __future__ import annotations

import numpy as np
import pytest

from kbench import runtime as kp
from kbench.backend import VulkanBackend
from kbench.quant import DType, dequantize

from conftest import BATCH_GUARD_VALUE, batch_problem, run_batch

try:
    _DEVICES = kp.list_devices()
    _NO_DEVICE = None if _DEVICES else "the Vulkan loader finds no device"
except Exception as exc:  # no loader / no ICD
    _DEVICES, _NO_DEVICE = [], f"no Vulkan available here: {exc}"

pytestmark = pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")

#: fp16 weights or x would give about 1e-7 here; the exact halves leave fp32 accumulation, which on
#: tensor cores need not round to nearest: up to 1.2e-11 on an H100 (README, performance round 7)
NMSE_LIMIT = 3e-11
DTYPES = (DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K)

_backends: dict = {}


@pytest.fixture(scope="module", autouse=True)
def _close_backends():
    yield
    for be in _backends.values():
        be.close()
    _backends.clear()


def _backend(knobs: tuple) -> VulkanBackend:
    """A backend with the coop knob set; emulated where the device lacks the cooperative matrices."""
    if knobs not in _backends:
        be = VulkanBackend(qmatvec=dict(knobs))
        if be._policy.matmul_f16_unsupported("f16"):
            be._policy.coop_emulate = True
        _backends[knobs] = be
    return _backends[knobs]


def _check(out: np.ndarray, ref: np.ndarray, n_rows: int, n_vecs: int, what: str) -> None:
    y = out[:n_vecs * n_rows].reshape(n_vecs, n_rows).astype(np.float64)
    assert np.isfinite(y).all(), f"{what}: non-finite outputs at {np.argwhere(~np.isfinite(y))[:4].tolist()}"
    nmse = float(np.sum((y - ref) ** 2) / max(np.sum(ref ** 2), 1e-300))
    assert nmse < NMSE_LIMIT, f"{what}: NMSE {nmse:.3g} against float64, expected < {NMSE_LIMIT:g}"
    guard = out[n_vecs * n_rows:]
    assert (guard == BATCH_GUARD_VALUE).all(), f"{what}: wrote past its {n_vecs * n_rows} outputs: {guard[:4]}"


# n_rows, n_cols, n_vecs, knobs: rows that end a block part way, one and several splits (the last one
# short), odd counts of blocks per step, a vector count that needs a second column tile; B loaded
# from global memory (coop_bshared off) with one and two column tiles; two stages (coop_stages); loads
# two steps ahead (coop_depth) over odd, even and single steps; 2 and 4 accumulators per tile (coop_accs)
# with one and two column tiles and odd steps
CASES = [
    (17, 256, 3, ()),
    (64, 512, 8, (("coop_splits", 3),)),
    (40, 768, 1, (("coop_unroll", 5),)),
    (33, 1024, 9, (("coop_splits", 2), ("coop_subgroups", 2))),
    (16, 256, 2, (("coop_unroll", 1),)),
    (17, 256, 3, (("coop_bshared", False),)),
    (33, 1024, 9, (("coop_splits", 2), ("coop_unroll", 3), ("coop_bshared", False), ("coop_stages", 2))),
    (40, 768, 3, (("coop_stages", 2), ("coop_unroll", 2))),
    (24, 1280, 2, (("coop_depth", 2), ("coop_splits", 2))),
    (17, 256, 4, (("coop_depth", 2), ("coop_stages", 2), ("coop_unroll", 1), ("coop_bshared", False))),
    (16, 256, 1, (("coop_depth", 2), ("coop_splits", 2))),
    (33, 1024, 9, (("coop_accs", 4), ("coop_splits", 2), ("coop_unroll", 3))),
    (40, 768, 3, (("coop_accs", 2), ("coop_depth", 2), ("coop_subgroups", 2), ("coop_unroll", 2))),
]


# rows of a few blocks of 32 (not whole Q6_K blocks of 256): the 32-element formats only
SHORT_CASES = [(40, 96, 1, (("coop_unroll", 2),)), (16, 160, 2, (("coop_unroll", 3), ("coop_splits", 2)))]
PARAMS = [(d, *c) for d in DTYPES for c in CASES] + [(d, *c) for d in (DType.Q4_0, DType.Q8_0) for c in SHORT_CASES]


@pytest.mark.parametrize("dtype,n_rows,n_cols,n_vecs,knobs", PARAMS,
                         ids=[f"{d.name}-{r}x{c}x{v}" + "".join(f"-{k}{n}" for k, n in kn) for d, r, c, v, kn in PARAMS])
def test_coop_batch_matches_float64_at_fp32_precision(dtype, n_rows, n_cols, n_vecs, knobs):
    be = _backend((("coop", True),) + knobs)
    raw, x, ref = batch_problem(dtype, n_rows, n_cols, n_vecs, seed=n_rows * 31 + n_vecs)
    _check(run_batch(be, dtype, raw, x, n_rows, n_cols, n_vecs), ref, n_rows, n_vecs, f"{dtype.name} {knobs}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("w_scale,x_scale", [(1e-3, 1.0), (1.0, 1e-6), (1.0, 3e4), (2e-5, 1e3)],
                         ids=["small-weights", "tiny-x", "huge-x", "tiny-weights-big-x"])
def test_coop_batch_keeps_precision_for_any_magnitude(dtype, w_scale, x_scale):
    """Small weights put the low halves among fp16's subnormals; x far from 1 is scaled by a power of two
    per vector so that neither of its halves overflows or loses bits."""
    be = _backend((("coop", True),))
    raw, x, ref = batch_problem(dtype, 24, 256, 4, seed=5, w_scale=w_scale, x_scale=x_scale)
    _check(run_batch(be, dtype, raw, x, 24, 256, 4), ref, 24, 4, f"{dtype.name} w*{w_scale:g} x*{x_scale:g}")


def test_coop_batch_gives_zeros_for_zero_x_and_keeps_vectors_apart():
    """A vector of zeros (its scale stays 1) beside a vector of ones: each gets its own product."""
    be = _backend((("coop", True),))
    raw, _, _ = batch_problem(DType.Q4_0, 20, 128, 2, seed=9)
    x = np.zeros((2, 128), np.float32)
    x[1] = 1.0
    w = dequantize(raw, DType.Q4_0, (20, 128)).astype(np.float64)
    ref = x.astype(np.float64) @ w.T
    out = run_batch(be, DType.Q4_0, raw, x, 20, 128, 2)
    assert (out[:20] == 0.0).all(), f"zero x gave {out[:4]}"
    _check(out, ref, 20, 2, "zeros and ones")


@pytest.mark.parametrize("knobs,message", [
    ({"coop": "yes"}, "coop must be True or False"),
    ({"coop_splits": 2}, "coop_splits is a choice of coop=True"),
    ({"coop": True, "coop_unroll": 0}, "coop_unroll must be a positive int"),
    ({"coop": True, "coop_bshared": 1}, "coop_bshared must be True or False"),
    ({"coop_bshared": True}, "coop_bshared is a choice of coop=True"),
    ({"coop": True, "coop_stages": 3}, "coop_stages must be 1 or 2"),
    ({"coop": True, "coop_depth": True}, "coop_depth must be 1 or 2"),
    ({"coop": True, "coop_accs": 3}, "coop_accs must be 1, 2 or 4"),
    ({"coop_accs": 2}, "coop_accs is a choice of coop=True"),
])
def test_coop_knobs_are_checked(knobs, message):
    be = _backend((("coop", True),))
    with pytest.raises(ValueError, match=message):
        be._policy.configure_qmatvec(knobs)
    be._policy.configure_qmatvec({"coop": True})


@pytest.mark.parametrize("dtype,n_vecs,message", [
    (DType.Q5_0, 4, "qmatmul_coop has no Q5_0 decoder"),
    (DType.F16, 4, "qmatmul_coop has no F16 decoder"),
    (DType.Q4_0, 33, "takes 1 to 32 vectors"),
])
def test_coop_refuses_what_it_cannot_take_before_gpu_work(dtype, n_vecs, message):
    be = _backend((("coop", True),))
    before = be.cache_stats()
    with pytest.raises(ValueError, match=message):
        be._policy.qmatmul_coop(dtype, 256, 16, n_vecs)
    assert be.cache_stats() == before


def test_coop_is_not_chosen_without_the_knob_until_timed():
    """The automatic choice takes the cooperative-matrix kernel only from QMATMUL_COOP_MIN_VECS vectors."""
    be = _backend(())
    pol = be._policy
    if pol.QMATMUL_COOP_MIN_VECS is None:
        assert pol.qmatmul_coop(DType.Q4_0, 4096, 4096, 8) is None
    else:
        below = pol.QMATMUL_COOP_MIN_VECS - 1
        assert below < 1 or pol.qmatmul_coop(DType.Q4_0, 4096, 4096, below) is None


def test_coop_probe_twins_are_compiled_from_the_cut_defines_and_run():
    """kbench probe qmatvec --cut on the cooperative-matrix kernel: each twin (no weight reads, no
    decoding, no matrix products) is the shipped source with its define, handed out in the plan by the
    policy until restored, and runs to completion; with no products every output is zero."""
    from kbench.probes.qmatvec import cut_kernel, restore_kernel
    from kbench.shaders.build import CompilerTooOld

    be = _backend((("coop", True),))
    pol = be._policy
    plan = pol.qmatmul_coop(DType.Q4_0, 256, 32, 2)
    raw, x, _ = batch_problem(DType.Q4_0, 32, 256, 2, seed=3)
    codes = {plan.main.spirv()}
    try:
        for cut in (("loads",), ("decode",), ("dots",)):
            try:
                twin = cut_kernel(be, plan.main, cut, plan)
            except CompilerTooOld as exc:
                pytest.skip(f"the twins are compiled here: {exc}")
            got = pol.qmatmul_coop(DType.Q4_0, 256, 32, 2)
            assert got.main is twin and got.prep == plan.prep, f"the policy does not hand out the {cut} twin"
            codes.add(twin.spirv())
            out = run_batch(be, DType.Q4_0, raw, x, 32, 256, 2)
            assert (out[64:] == BATCH_GUARD_VALUE).all(), f"the {cut} twin wrote past its outputs"
            if cut == ("dots",):
                assert (out[:64] == 0.0).all(), f"no products should leave zeros, got {out[:4]}"
    finally:
        restore_kernel(be)
    assert pol.qmatmul_coop(DType.Q4_0, 256, 32, 2) == plan, "restore_kernel left a twin in place"
    assert len(codes) == 4, "a cut twin compiled to the shipped SPIR-V or to another twin's: the defines did nothing"


@pytest.mark.parametrize("splits", [1, 3])
def test_coop_timeline_twin_records_each_workgroup_its_clocks_and_steps(splits):
    """kbench probe qmatvec --cut timeline: the twin runs the whole kernel and leaves, per workgroup,
    its start and end on the device clock (the end not before the start, all within the call) and the
    steps its split took, in y (one split) or the splits' scratch; the probe's summary reads them."""
    from kbench.probes import timeline
    from kbench.probes.qmatvec import cut_kernel, restore_kernel, twin_timeline
    from kbench.shaders.build import CompilerTooOld

    be = _backend((("coop", True), ("coop_splits", splits), ("coop_unroll", 2)))
    why = timeline.unsupported(be.device_properties["features"])
    if why:
        pytest.skip(why)
    n_rows, n_cols, nv = 40, 1024, 2
    plan = be._policy.qmatmul_coop(DType.Q4_0, n_cols, n_rows, nv)
    assert plan.splits == splits
    try:
        try:
            cut_kernel(be, plan.main, ("timeline",), plan)
        except CompilerTooOld as exc:
            pytest.skip(f"the twins are compiled here: {exc}")
        raw, x, _ = batch_problem(DType.Q4_0, n_rows, n_cols, nv, seed=5)
        hw, hx, hy = be.allocate(len(raw)), be.allocate(x.nbytes), be.allocate(4 * nv * n_rows)
        be.copy_to_device(raw, hw)
        be.copy_to_device(x.tobytes(), hx)
        be.quantized_matmul(hw, hx, hy, n_rows, n_cols, DType.Q4_0, n_vecs=nv)
        t = twin_timeline(be, hy, n_rows, plan=plan)
        groups = plan.grid(n_rows)
        n = groups[0] * groups[1]
        line = timeline.summarize(t)
        for h in (hw, hx, hy):
            be.free(h)
    finally:
        restore_kernel(be)
    nb = n_cols // 32
    want = [min(plan.bps, nb - s * plan.bps) // 2 for s in range(plan.splits) for _ in range(groups[0])]
    assert t.steps.tolist() == want, f"steps per workgroup: expected {want}, got {t.steps.tolist()}"
    assert (t.end_ns >= t.start_ns).all() and t.end_ns.max() < 10e9, f"implausible times: {t}"
    assert line.startswith(f"{n} workgroups over "), f"summary does not count {n} workgroups: {line}"
