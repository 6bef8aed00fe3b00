"""quantized_matmul with n_vecs > 1 (a small-batch decode: several token vectors against one weight
matrix): every backend gives each vector's product against float64, the packed kernel in one
dispatch for all vectors (x quantized by each workgroup or by a first dispatch, subgroup or tree
sums), the GGUF kernels once per vector; nothing is written past the n_vecs * n_rows outputs, and
bad batches are refused before any GPU work."""

from __future__ import annotations

import numpy as np
import pytest

from kbench import runtime as kp
from kbench.backend import NumpyBackend, VulkanBackend
from kbench.quant import DType, quantize

from conftest import BATCH_GUARD_VALUE, batch_problem, run_batch

try:
    _NO_DEVICE = None if kp.list_devices() else "the Vulkan loader finds no device"
except Exception as exc:  # no loader / no ICD
    _NO_DEVICE = f"no Vulkan available here: {exc}"

NMSE_LIMIT = 1e-8
X8_NMSE_LIMIT = 1e-4  # 8-bit x (x_bits=8): its int8 quantization alone gives about 3e-5

CONFIGS = {
    "auto": {},  # on a CPU driver: the GGUF kernels, one call per vector
    "packed-xwg": {"qmatvec": {"layout": "packed"}},
    "packed-xwg-teams": {"qmatvec": {"layout": "packed", "lanes": 8, "rows": 3, "teams": 4, "unroll": 2}},
    "packed-dispatch": {"qmatvec": {"layout": "packed", "xq": "dispatch", "lanes": 16, "rows": 2}},
    "packed-tree": {"qmatvec": {"layout": "packed", "reduce": "tree", "lanes": 8, "rows": 2, "teams": 2}},
    "packed-wide": {"qmatvec": {"layout": "packed", "lanes": 64, "rows": 1, "teams": 2, "groups": 2}},
    # every vector's x held in shared memory a chunk of columns at a time (as where it does not fit whole):
    # chunks of whole and partial lane steps, row groups revisiting chunk 0, 8-bit x, the tree
    "packed-chunks": {"qmatvec": {"layout": "packed", "lanes": 8, "rows": 2, "teams": 2, "x_chunk": 128}},
    "packed-chunks-odd-groups": {"qmatvec": {"layout": "packed", "lanes": 4, "rows": 3, "teams": 2, "groups": 2,
                                             "unroll": 2, "x_chunk": 192}},
    "packed-chunks-x8-tree": {"qmatvec": {"layout": "packed", "x_bits": 8, "reduce": "tree", "lanes": 8, "rows": 2,
                                          "x_chunk": 64}},
    # rows split over workgroups (grid z), the splits' partial sums of every vector added by a second dispatch
    "packed-splits": {"qmatvec": {"layout": "packed", "lanes": 8, "rows": 2, "teams": 2, "splits": 3}},
    "packed-splits-last": {"qmatvec": {"layout": "packed", "lanes": 8, "rows": 2, "teams": 2, "splits": 3,
                                       "split_sum": "last"}},
    "packed-splits-last-groups": {"qmatvec": {"layout": "packed", "lanes": 4, "rows": 3, "teams": 2, "groups": 2,
                                              "unroll": 2, "splits": 2, "split_sum": "last", "x_chunk": 64}},
    "packed-splits-chunks-dispatch": {"qmatvec": {"layout": "packed", "lanes": 4, "rows": 3, "teams": 2, "groups": 2,
                                                  "unroll": 2, "splits": 2, "xq": "dispatch"}},
    # every lane quantizing the blocks of x its units meet, for every vector (variants *.xlane.*)
    "packed-xlane": {"qmatvec": {"layout": "packed", "xq": "lane", "lanes": 8, "rows": 2, "teams": 3, "unroll": 2}},
}
SHAPES = [(7, 256, 2), (13, 512, 3), (33, 1024, 8), (5, 256, 40), (9, 96, 3)]  # n_rows, n_cols, n_vecs (40: more sums
# than lanes; 96 x 3: an odd count of x blocks per vector and in all)

_backends: dict = {}


def _assert_same_bits(a: np.ndarray, b: np.ndarray, what: str, a_name: str, b_name: str) -> None:
    """``a`` and ``b`` equal bit for bit; else how many floats differ, and the first with both values."""
    diff = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
    assert diff.size == 0, (f"{what}: {diff.size} floats differ, first at {diff[0]}: "
                            f"{a.flat[diff[0]]!r} ({a_name}) vs {b.flat[diff[0]]!r} ({b_name})")


def _products_under(configs: dict, dtype: DType, vecs: int, n_rows: int, n_cols: int, seed: int, *,
                    wide_x: bool = True, check=None) -> dict:
    """One random problem's products under each named qmatvec config (``check(kernel, name)`` asserts
    the kernel each chose); x over six decades where ``wide_x``, so that every block's scale differs."""
    if not kp.list_devices()[0].get("features", {}).get("integer_dot_product"):
        pytest.skip("the device has no shaderIntegerDotProduct")
    rng = np.random.default_rng(seed)
    raw = quantize(rng.uniform(-1, 1, (n_rows, n_cols)).astype(np.float32), dtype)
    x = rng.uniform(-1, 1, (vecs, n_cols))
    if wide_x:
        x = x * 10.0 ** rng.uniform(-3, 3, (vecs, n_cols))
    x = x.astype(np.float32)
    x[0, 64:96] = 0.0  # a block of zeros: scale 0
    got = {}
    for name, cfg in configs.items():
        with VulkanBackend(qmatvec=cfg) as be:
            if check is not None:
                check(be._policy.qmatvec(dtype, n_cols, n_rows, vecs), name)
            got[name] = run_batch(be, dtype, raw, x, n_rows, n_cols, vecs)
    return got


@pytest.fixture(scope="module")
def backends():
    yield _backends
    for be in _backends.values():
        be.close()


def _backend(cfg: str) -> VulkanBackend:
    if cfg not in _backends:
        feats = kp.list_devices()[0].get("features", {})
        if "packed" in cfg and not feats.get("integer_dot_product"):
            pytest.skip("the device has no shaderIntegerDotProduct")
        _backends[cfg] = VulkanBackend(**CONFIGS[cfg])
    return _backends[cfg]


def _check(got: np.ndarray, ref: np.ndarray, what: str, limit: float = NMSE_LIMIT) -> None:
    n_vecs, n_rows = ref.shape
    assert np.all(got[n_vecs * n_rows:] == BATCH_GUARD_VALUE), f"{what}: wrote past the {n_vecs} x {n_rows} outputs"
    y = got[:n_vecs * n_rows].reshape(n_vecs, n_rows).astype(np.float64)
    if limit > NMSE_LIMIT:  # 8-bit x: over a few rows one vector's NMSE is noise, the batch's is not
        e = float(np.sum((y - ref) ** 2) / np.sum(ref ** 2))
        assert e <= limit, f"{what}: the batch's NMSE {e:.3e} > {limit:.0e}"
        return
    for v in range(n_vecs):
        e = float(np.sum((y[v] - ref[v]) ** 2) / np.sum(ref[v] ** 2))
        assert e <= limit, f"{what}: vector {v} NMSE {e:.3e} > {limit:.0e}"


@pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")
@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K])
def test_each_vector_of_a_batch_matches_float64(backends, cfg, dtype):
    be = _backend(cfg)
    for n_rows, n_cols, n_vecs in SHAPES:
        if n_cols % dtype.block_elems:
            continue
        raw, x, ref = batch_problem(dtype, n_rows, n_cols, n_vecs, seed=n_rows * 7 + int(dtype))
        kernel = be._policy.qmatvec(dtype, n_cols, n_rows, n_vecs)
        if "packed" in cfg:  # every format here has a packed kernel (Q4_K's: units of 64 weights)
            assert kernel.packed and kernel.vectors == n_vecs, f"the packed kernel takes all {n_vecs} vectors at once, got {kernel}"
        chunk = CONFIGS[cfg].get("qmatvec", {}).get("x_chunk")
        if chunk:  # x blocks per vector held at a time: the chunk, fewer where x is shorter
            assert kernel.spec[2] == min(chunk, n_cols) // 32, f"x held {chunk} columns at a time, got {kernel}"
        x8 = CONFIGS[cfg].get("qmatvec", {}).get("x_bits") == 8  # x's own error: about 3e-5 (8 bits)
        _check(run_batch(be, dtype, raw, x, n_rows, n_cols, n_vecs), ref, f"{cfg} {dtype.name} {n_rows}x{n_cols}x{n_vecs}",
               X8_NMSE_LIMIT if x8 else NMSE_LIMIT)


def test_numpy_backend_batches_against_float64():
    be = NumpyBackend()
    try:
        raw, x, ref = batch_problem(DType.Q4_0, 9, 256, 4, seed=3)
        _check(run_batch(be, DType.Q4_0, raw, x, 9, 256, 4), ref, "numpy")
    finally:
        be.close()


def test_a_batch_is_refused_before_any_gpu_work_when_buffers_are_short():
    be = NumpyBackend()
    try:
        hw, hx, hy = be.allocate(18 * 8 * 4), be.allocate(4 * 256 * 2), be.allocate(4 * 4 * 3)
        with pytest.raises(ValueError, match="n_vecs"):
            be.quantized_matmul(hw, hx, hy, 4, 256, DType.Q4_0, n_vecs=3)  # x holds 2 vectors
        with pytest.raises(ValueError, match="n_vecs must be positive"):
            be.quantized_matmul(hw, hx, hy, 4, 256, DType.Q4_0, n_vecs=0)
        with pytest.raises(TypeError, match="n_vecs must be an integer"):
            be.quantized_matmul(hw, hx, hy, 4, 256, DType.Q4_0, n_vecs=2.0)
        with pytest.raises(ValueError, match=r"n_vecs must be <= 64"):
            be.quantized_matmul(hw, hx, hy, 4, 256, DType.Q4_0, n_vecs=65)
    finally:
        be.close()


@pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K], ids=lambda d: d.name)
@pytest.mark.parametrize("reduce,x_chunk", [("subgroup", None), ("subgroup", 512), ("tree", None)])
def test_x_quantized_by_each_workgroup_gives_the_products_of_x_quantized_by_a_first_dispatch(dtype, reduce, x_chunk):
    # The same integer sums in the same order: bit for bit, whether a lane quantizes a block of x
    # (tree) or the 4 lanes of a quad a quarter each (subgroup), x whole or in chunks of whole lane
    # steps; x's magnitudes spread over 6 decades so each block's scale and rounding differ
    if reduce == "subgroup" and not kp.list_devices()[0].get("features", {}).get("subgroup_shuffle"):
        pytest.skip("the device has no subgroup shuffles")
    knobs = {"layout": "packed", "lanes": 8, "rows": 2, "teams": 4, "unroll": 2, "reduce": reduce}
    chunk = {"x_chunk": x_chunk} if x_chunk else {}
    got = _products_under({"workgroup": {**knobs, "xq": "workgroup", **chunk}, "dispatch": {**knobs, "xq": "dispatch"}},
                          dtype, 3, 19, 2048, int(dtype))
    _assert_same_bits(got["workgroup"], got["dispatch"], f"{dtype.name} {reduce} chunk {x_chunk}", "workgroup",
                      "dispatch")


@pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K], ids=lambda d: d.name)
@pytest.mark.parametrize("vecs,knobs", [
    (1, {"lanes": 8, "rows": 3, "teams": 4, "unroll": 2}),                 # x whole, a ragged last batch
    (3, {"lanes": 4, "rows": 2, "teams": 2, "unroll": 1, "x_chunk": 512}),  # x in chunks
    (3, {"lanes": 8, "rows": 2, "teams": 3, "unroll": 3, "xq": "dispatch"}),
    (1, {"lanes": 64, "rows": 4, "teams": 2, "unroll": 1}),  # teams wider than a subgroup (on lavapipe: 8 lanes)
    (3, {"lanes": 8, "rows": 2, "teams": 4, "reduce": "tree"}),
], ids=["whole-1", "chunks-3", "dispatch-3", "wide-teams-1", "tree-3"])
def test_a_balanced_grid_gives_the_bits_of_the_grid_of_row_groups(dtype, vecs, knobs):
    # the balanced grid moves blocks of rows between workgroups (and leaves some teams idle); each row
    # is still one team's sums in the same order, so the products must match bit for bit
    def check(kernel, balance):
        assert bool(kernel.balanced_groups) == bool(balance), kernel

    # 47 x 2304: 72 blocks of 32, so lane steps end part way through a batch, and a ragged last team
    got = _products_under({balance: {"layout": "packed", **knobs, "balance": balance} for balance in (False, 5)},
                          dtype, vecs, 47, 2304, 40 + int(dtype) + vecs, wide_x=False, check=check)  # 5 units
    _assert_same_bits(got[5], got[False], f"{dtype.name} {knobs}", "balanced", "row groups")


@pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K], ids=lambda d: d.name)
@pytest.mark.parametrize("vecs,knobs", [
    (1, {"lanes": 8, "rows": 3, "teams": 4, "unroll": 2}),                # a ragged last batch
    (1, {"lanes": 4, "rows": 2, "teams": 2, "unroll": 1, "x_chunk": 512}),  # x in chunks
    (1, {"lanes": 8, "rows": 2, "teams": 4, "balance": 5}),
    (3, {"lanes": 8, "rows": 2, "teams": 3, "unroll": 2}),
], ids=["ragged-1", "chunks-1", "balanced-1", "ragged-3"])
def test_staggered_first_loads_give_the_bits_of_every_team_loading_first(dtype, vecs, knobs):
    # the staggered variants change when the odd teams' first words are loaded, not which, nor the order
    # of any sum: the products must match the kernel without them bit for bit
    def check(kernel, stagger):
        assert (".stagger." in kernel.spv) == stagger and kernel.vectors == vecs, kernel

    got = _products_under({s: {"layout": "packed", **knobs, "prefetch": True, "stagger": s} for s in (False, True)},
                          dtype, vecs, 47, 2304, 80 + int(dtype) + vecs, check=check)
    _assert_same_bits(got[True], got[False], f"{dtype.name} x{vecs} {knobs}", "staggered", "every team first")


@pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K], ids=lambda d: d.name)
@pytest.mark.parametrize("vecs,knobs", [
    (1, {"lanes": 8, "rows": 3, "teams": 4, "unroll": 2}),
    (3, {"lanes": 8, "rows": 2, "teams": 3, "unroll": 2, "reduce": "tree"}),
], ids=["ragged-1", "tree-3"])
def test_each_lane_quantizing_its_x_gives_the_bits_of_x_quantized_by_a_dispatch(dtype, vecs, knobs):
    # the lane variants round x * (1 / scale) by an add of 1.5 * 2^23 where qmatvec_xq.comp takes roundEven:
    # the same bytes, scales and sums, so the products must match bit for bit (x over six decades, with a
    # block of zeros, whose scale is 0)
    def check(kernel, xq):
        assert (".xlane." in kernel.spv) == (xq == "lane") and kernel.uses_xq == (xq == "dispatch"), kernel

    got = _products_under({xq: {"layout": "packed", **knobs, "xq": xq} for xq in ("dispatch", "lane")},
                          dtype, vecs, 29, 1536, 90 + int(dtype) + vecs, check=check)
    _assert_same_bits(got["lane"], got["dispatch"], f"{dtype.name} x{vecs} {knobs}", "each lane", "a dispatch")


@pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")
def test_the_packed_kernel_takes_each_formats_shape_for_one_vector_and_for_batches_and_a_knob_wins():
    """QMATVEC_PACKED_BATCH_TEAMS and the per-format exceptions (QMATVEC_PACKED_FORMAT_SHAPES): 8 vectors
    of a model-sized matrix run 8 teams of 32 lanes a workgroup, 4 vectors keep 16 teams, and a format's
    exception sets the teams, rows and units ahead of one vector or of a batch (each timed faster on the
    H100), and of nothing between; a knob wins over all of them."""
    from kbench.backend.kernels import KernelPolicy

    be = _backend("packed-xwg")
    pol = be._policy
    from_vecs, teams = KernelPolicy.QMATVEC_PACKED_BATCH_TEAMS
    lanes = KernelPolicy.QMATVEC_PACKED_SHAPE["lanes"]
    shapes = {"short": (4096, 14336), "long": (14336, 4096)}  # (columns, rows)
    assert not any(k[0] == DType.Q8_0 for k in KernelPolicy.QMATVEC_PACKED_FORMAT_SHAPES), "the test needs a format without one"
    wg = {nv: pol.qmatvec(DType.Q8_0, *shapes["short"], nv).spec[0] for nv in (from_vecs - 4, from_vecs)}
    assert wg == {from_vecs - 4: lanes * KernelPolicy.QMATVEC_PACKED_SHAPE["teams"], from_vecs: lanes * teams}, wg

    def shape_of(dtype: DType, row_class: str, nv: int) -> dict:
        spec = pol.qmatvec(dtype, *shapes[row_class], nv).spec
        return {"teams": spec[0] // lanes, "rows": spec[1], "unroll": spec[4]}

    for (dtype, row_class, vec_class), shape in KernelPolicy.QMATVEC_PACKED_FORMAT_SHAPES.items():
        got = shape_of(dtype, row_class, 1 if vec_class == "one" else from_vecs)
        assert all(got[k] == v for k, v in shape.items()), f"{dtype.name} {row_class} {vec_class}: {shape} expected, got {got}"
        between = shape_of(dtype, row_class, 2)
        assert any(between[k] != v for k, v in shape.items()), \
            f"{dtype.name} {row_class}: 2 vectors took the {vec_class} exception {shape}"
    pol.configure_qmatvec({"layout": "packed", "teams": 2})
    try:
        assert pol.qmatvec(DType.Q4_0, *shapes["short"], from_vecs).spec[0] == 2 * lanes, "the teams knob was overruled"
    finally:
        pol.configure_qmatvec({"layout": "packed"})


@pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K], ids=lambda d: d.name)
def test_splits_summed_by_their_last_workgroup_give_the_bits_of_the_second_dispatch_call_after_call(dtype):
    # split_sum="last" adds the partial sums in split order, as the sum dispatch does: the same bits.
    # Three calls in a row on one backend: each row group's count must be back at zero for the next
    # call, else its last split never comes and y keeps the guard values run_batch wrote there
    feats = kp.list_devices()[0].get("features", {})
    if not (feats.get("integer_dot_product") and feats.get("subgroup_shuffle")):
        pytest.skip("the device has no shaderIntegerDotProduct or no subgroup shuffles")
    n_rows, n_cols, n_vecs = 21, 1536, 2
    rng = np.random.default_rng(7 + int(dtype))
    raw = quantize(rng.uniform(-1, 1, (n_rows, n_cols)).astype(np.float32), dtype)
    xs = [rng.uniform(-1, 1, (n_vecs, n_cols)).astype(np.float32) for _ in range(3)]
    knobs = {"layout": "packed", "lanes": 8, "rows": 2, "teams": 2, "splits": 3}
    got = {}
    for how in ("last", "dispatch"):
        with VulkanBackend(qmatvec={**knobs, "split_sum": how}) as be:
            kernel = be._policy.qmatvec(dtype, n_cols, n_rows, n_vecs)  # noqa: SLF001
            assert kernel.splits == 3 and kernel.split_last == (how == "last"), kernel
            got[how] = [run_batch(be, dtype, raw, x, n_rows, n_cols, n_vecs) for x in xs]
    for call, (a, b) in enumerate(zip(got["last"], got["dispatch"])):
        _assert_same_bits(a, b, f"{dtype.name} call {call}", "last split", "sum dispatch")
