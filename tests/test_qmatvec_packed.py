"""quantized_matmul with the qmatvec knob layout="packed": the backend's cache of repacked weights.

The packed kernels' arithmetic is checked per shape in test_qmatvec_kernels.py; here, that a
repacked copy is made once, remade whenever anything else used its weight buffer (a write may
have changed it), dropped with the buffer, bounded in bytes, and that bad configurations are
refused before any GPU work; and Q4_K's own packed layout (its 6-bit sub-block scales and mins
unpacked to bytes by the repack kernel) byte for byte, with a product in which every sub-block's
scale and min counts.
"""

from __future__ import annotations

import numpy as np
import pytest

from kbench.backend.kernels import QMATVEC_PACKED_AUTO_DTYPES, QMATVEC_PACKED_DTYPES, KernelPolicy
from kbench.quant import DType, _unpack_scales_k, dequantize, quantize

kp = pytest.importorskip("kbench.runtime")

try:
    _DEVICES = kp.list_devices()
    _NO_DEVICE = None if _DEVICES else "the Vulkan loader finds no device"
except Exception as exc:  # no loader / no ICD
    _DEVICES, _NO_DEVICE = [], f"no Vulkan available here: {exc}"
if _NO_DEVICE is None and not _DEVICES[0].get("features", {}).get("integer_dot_product"):
    _NO_DEVICE = "the device has no shaderIntegerDotProduct (the packed kernels need it)"
needs_device = pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")

# x quantized to 16 bits per element: NMSE about 2e-10 (test_qmatvec_kernels.py bounds it per row)
NMSE_LIMIT = 1e-8


@pytest.fixture
def be():
    from kbench.backend import VulkanBackend

    with VulkanBackend(qmatvec={"layout": "packed"}) as b:
        yield b


def _nmse(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sum((got.astype(np.float64) - ref) ** 2) / np.sum(ref ** 2))


class Problem:
    """Weights (on the device) and x for one quantized_matmul, with its float64 result."""

    def __init__(self, be, dtype: DType, n_rows: int, n_cols: int, seed: int):
        rng = np.random.default_rng(seed)
        self.be, self.dtype, self.n_rows, self.n_cols = be, dtype, n_rows, n_cols
        self.x = rng.uniform(-1, 1, n_cols).astype(np.float32)
        self.hx, self.hy = be.allocate(4 * n_cols), be.allocate(4 * n_rows)
        be.copy_to_device(self.x.tobytes(), self.hx)
        self.data = quantize(rng.uniform(-1, 1, (n_rows, n_cols)).astype(np.float32), dtype)
        self.hw = be.allocate(len(self.data))
        be.copy_to_device(self.data, self.hw)

    def reference(self, data: bytes | None = None) -> np.ndarray:
        w = dequantize(self.data if data is None else data, self.dtype, (self.n_rows, self.n_cols))
        return w.astype(np.float64) @ self.x.astype(np.float64)

    def run(self) -> np.ndarray:
        self.be.quantized_matmul(self.hw, self.hx, self.hy, self.n_rows, self.n_cols, self.dtype)
        out = np.empty(self.n_rows, np.float32)
        self.be.copy_from_device(self.hy, out)
        return out

    def check(self, what: str, data: bytes | None = None) -> None:
        err = _nmse(self.run(), self.reference(data))
        assert err <= NMSE_LIMIT, f"{what}: NMSE {err:.3e} > {NMSE_LIMIT:.0e}"

    def free(self) -> None:
        for h in (self.hw, self.hx, self.hy):
            self.be.free(h)


@needs_device
@pytest.mark.parametrize("dtype", [DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K], ids=lambda d: d.name)
def test_a_weight_buffer_is_repacked_once_and_reused(be, dtype):
    p = Problem(be, dtype, 37, 512, seed=1)
    p.check("first call (repacks)")
    stats = be.cache_stats()
    assert stats["derived_copies"] == 1, stats
    assert stats["derived_bytes"] == KernelPolicy.qmatvec_packed_bytes(dtype, 37, 512), stats
    buffers = stats["buffers"]
    for i in range(3):
        p.check(f"call {i + 2} (reuses the copy)")
    stats = be.cache_stats()
    assert (stats["derived_copies"], stats["buffers"]) == (1, buffers), f"expected one copy, no new buffer: {stats}"


@needs_device
def test_new_weights_written_by_a_transfer_are_repacked(be):
    p = Problem(be, DType.Q4_0, 20, 256, seed=2)
    p.check("old weights")
    other = quantize(np.random.default_rng(3).uniform(-2, 2, (20, 256)).astype(np.float32), DType.Q4_0)
    be.copy_to_device(other, p.hw)
    p.check("after copy_to_device of new weights", other)
    assert be.cache_stats()["derived_copies"] == 1


@needs_device
def test_new_weights_written_by_an_op_are_repacked(be):
    p = Problem(be, DType.Q8_0, 9, 1024, seed=4)
    p.check("old weights")
    other = quantize(np.random.default_rng(5).uniform(-1, 1, (9, 1024)).astype(np.float32), DType.Q8_0)
    src = be.allocate(len(other))
    be.copy_to_device(other, src)
    be.copy_buffer(src, p.hw, len(other))  # a GPU op, no host write
    p.check("after copy_buffer into the weights", other)


@needs_device
def test_the_same_buffer_read_as_another_shape_is_repacked_for_it(be):
    p = Problem(be, DType.Q4_0, 16, 512, seed=6)
    p.check("16 x 512")
    # the same 16 * 16 blocks as 32 rows of 256
    q = Problem(be, DType.Q4_0, 32, 256, seed=7)
    be.quantized_matmul(p.hw, q.hx, q.hy, 32, 256, DType.Q4_0)
    got = np.empty(32, np.float32)
    be.copy_from_device(q.hy, got)
    ref = dequantize(p.data, DType.Q4_0, (32, 256)).astype(np.float64) @ q.x.astype(np.float64)
    assert _nmse(got, ref) <= NMSE_LIMIT, f"32 x 256 view: NMSE {_nmse(got, ref):.3e}"


@needs_device
def test_freeing_weights_frees_their_copy_and_nothing_leaks(be):
    base = be.cache_stats()
    for i in range(150):
        p = Problem(be, DType.Q8_0 if i % 2 else DType.Q4_0, 8, 64, seed=i)
        if i % 50 == 0:
            p.check(f"cycle {i}")
        else:
            be.quantized_matmul(p.hw, p.hx, p.hy, 8, 64, p.dtype)
        p.free()
    be.synchronize()
    stats = be.cache_stats()
    assert stats["derived_copies"] == 0 and stats["derived_bytes"] == 0, stats
    assert stats["buffers"] <= base["buffers"] + 2, f"buffers grew from {base['buffers']} to {stats['buffers']}"
    # (runtime_buffers also counts the runtime's idle staging pool, which is bounded on its own)
    for k in ("runtime_tensors", "runtime_algorithms", "runtime_descriptor_sets"):
        assert stats[k] <= base[k] + 2, f"{k}: {base[k]} before 150 cycles, {stats[k]} after"


@needs_device
def test_the_copies_stay_within_their_byte_budget(be):
    per = KernelPolicy.qmatvec_packed_bytes(DType.Q4_0, 64, 256)
    be.DERIVED_CACHE_BYTES = 3 * per
    probs = [Problem(be, DType.Q4_0, 64, 256, seed=10 + i) for i in range(6)]
    for rnd in range(2):
        for i, p in enumerate(probs):
            p.check(f"round {rnd}, weights {i}")
            stats = be.cache_stats()
            assert stats["derived_bytes"] <= 3 * per, f"{stats['derived_bytes']} bytes of copies, budget {3 * per}"


@needs_device
def test_formats_without_a_packed_kernel_keep_the_gguf_kernels(be):
    p = Problem(be, DType.Q5_K, 5, 512, seed=8)
    kernel = be._policy.qmatvec(DType.Q5_K, 512, 5)
    assert not kernel.packed, kernel
    p.check("Q5_K under layout=packed")
    assert be.cache_stats()["derived_copies"] == 0


@needs_device
def test_first_use_inside_a_replay_still_computes_the_product(be):
    p = Problem(be, DType.Q4_0, 24, 512, seed=9)
    got = be.replay_gpu_ns(lambda: be.quantized_matmul(p.hw, p.hx, p.hy, 24, 512, DType.Q4_0), 3)
    assert got is not None and len(got.gpu_ns) == 3, got
    out = np.empty(24, np.float32)
    be.copy_from_device(p.hy, out)
    assert _nmse(out, p.reference()) <= NMSE_LIMIT
    p.check("after the replay")


@needs_device
@pytest.mark.parametrize("xq", ["dispatch", "workgroup"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nan_or_inf_in_x_makes_its_rows_nan(xq, bad):
    from kbench.backend import VulkanBackend

    with VulkanBackend(qmatvec={"layout": "packed", "xq": xq}) as b:
        p = Problem(b, DType.Q8_0, 6, 256, seed=11)
        x = p.x.copy()
        x[40] = bad
        b.copy_to_device(x.tobytes(), p.hx)
        out = p.run()
    assert np.isnan(out).all(), f"x[40] = {bad}, xq={xq}: expected NaN in every row, got {out}"


def _props(**features):
    return {
        "device_name": "fake", "device_type": "discrete_gpu", "api_version": "1.3",
        "max_work_group_invocations": 1024, "max_work_group_size": [1024, 1024, 64],
        "max_work_group_count": [2**31 - 1, 65535, 65535], "max_shared_memory": 49152,
        "subgroup_size": 32,
        "features": {"subgroup_basic": True, "subgroup_arithmetic": True, "subgroup_shuffle": True, **features},
    }


@pytest.mark.parametrize("knobs,message", [
    ({"layout": "tiled"}, "layout must be gguf or packed"),
    ({"layout": "packed", "kernel": "generic"}, "cannot take kernel='generic'"),
    ({"layout": "packed", "staged": True}, "cannot take staged=True"),
    ({"layout": "packed", "dot": False}, "cannot take dot=False"),
    ({"layout": "packed", "xq": "lane", "x_bits": 8}, "x_bits=8 quantizes x in each workgroup; it cannot take "
                                                      "xq='lane'"),
    ({"layout": "packed", "xq": "lane", "x_chunk": 64}, "x_chunk is the chunk of x each workgroup holds; it cannot "
                                                        "take xq='lane'"),
    ({"unroll": 2}, "unroll is a choice of layout='packed'"),
    ({"per_cu": 2}, "per_cu is a choice of layout='packed'"),
    ({"layout": "packed", "per_cu": -1}, "per_cu must be an int >= 0"),
    ({"layout": "packed", "groups": 0}, "groups must be a positive int"),
    ({"layout": "packed", "prefetch": 1}, "prefetch must be True or False"),
    ({"xq": "workgroup"}, "xq='workgroup' is a choice of layout='packed'"),
    ({"layout": "packed", "xq": "shared"}, "xq must be lane, dispatch or workgroup"),
    ({"layout": "packed", "x_bits": 12}, "x_bits must be 8 or 16"),
    ({"layout": "packed", "x_bits": True}, "x_bits must be 8 or 16"),
    ({"layout": "packed", "x_bits": 8, "xq": "dispatch"}, "cannot take xq='dispatch'"),
    ({"x_bits": 8}, "x_bits is a choice of layout='packed'"),
    ({"balance": True}, "balance is a choice of layout='packed'"),
    ({"layout": "packed", "stagger": 1}, "stagger must be True or False"),
    ({"stagger": True}, "stagger is a choice of layout='packed'"),
    ({"layout": "packed", "balance": 0}, "balance must be True, False or a number of compute units > 0"),
    ({"layout": "packed", "balance": "yes"}, "balance must be True, False or a number of compute units > 0"),
])
def test_bad_packed_configurations_are_refused(knobs, message):
    pol = KernelPolicy(_props(integer_dot_product=True))
    with pytest.raises(ValueError, match=message):
        pol.configure_qmatvec(knobs)


def test_eight_bit_x_takes_its_own_kernel_and_less_shared_memory():
    pol = KernelPolicy(_props(integer_dot_product=True, subgroup_shuffle=True))
    pol.configure_qmatvec(layout="packed", x_bits=8)
    k = pol.qmatvec(DType.Q4_0, 4096, 14336)
    assert k.spv == "qmatvec_packed.q4_0.xwg8.sg.spv" and not k.uses_xq, k
    assert KernelPolicy.qmatvec_xwg_bytes(4096, 8) == 44 * 128 < KernelPolicy.qmatvec_xwg_bytes(4096), \
        "8-bit x: 32 bytes, a scale and two sums per block of 32"


def test_packed_layout_needs_integer_dot_products():
    with pytest.raises(ValueError, match="needs shaderIntegerDotProduct"):
        KernelPolicy(_props()).configure_qmatvec(layout="packed")


def test_packed_bytes_are_the_gguf_bytes_with_the_scales_apart():
    # 14336 x 4096: 1,835,008 Q4_0 blocks of 16 quant bytes + 2 scale bytes; 229,376 Q6_K blocks of 208 + 2
    assert KernelPolicy.qmatvec_packed_bytes(DType.Q4_0, 14336, 4096) == 1_835_008 * 18
    assert KernelPolicy.qmatvec_packed_bytes(DType.Q6_K, 14336, 4096) == 229_376 * 210
    assert KernelPolicy.qmatvec_packed_bytes(DType.Q8_0, 1, 32) == 32 + 4, "an odd block count rounds its scale word up"


def test_q4_k_packed_bytes_hold_quants_unpacked_scales_and_a_d_dmin_word_per_block():
    # per 256-weight block: 128 quant bytes (8 uvec4), 16 bytes of sub-block scales and mins as
    # bytes (GGUF's 12 bytes of 6-bit fields unpacked), d and dmin (one word): 148, GGUF's 144 + 4
    assert KernelPolicy.qmatvec_packed_bytes(DType.Q4_K, 14336, 4096) == 229_376 * 148
    assert KernelPolicy.qmatvec_packed_bytes(DType.Q4_K, 1, 256) == 148, "one block: no rounding"
    assert KernelPolicy.qmatvec_packed_bytes(DType.Q4_K, 3, 768) == 9 * 148
    with pytest.raises(ValueError, match="Q5_K has no packed layout"):
        KernelPolicy.qmatvec_packed_bytes(DType.Q5_K, 1, 256)


def test_packed_launch_shape_takes_the_knobs_and_the_automatic_shape():
    pol = KernelPolicy(_props(integer_dot_product=True))
    pol.configure_qmatvec(layout="packed")
    auto = KernelPolicy.QMATVEC_PACKED_SHAPE
    rows, unroll = KernelPolicy.QMATVEC_PACKED_ROWS["short"]
    k = pol.qmatvec(DType.Q4_0, 4096, 14336)
    # spec: workgroup size, rows per team, x blocks held per vector, lanes per team, units loaded
    # ahead, first loads before x is quantized, vectors, floats of the reduction's shared array (1:
    # one-subgroup teams sum by shuffles alone), units per split (0: whole rows); x quantized by each workgroup
    assert k.spv == "qmatvec_packed.q4_0.xwg.sg.spv" and not k.uses_xq, k
    assert k.spec[1:] == (rows, 128, auto["lanes"], unroll, 1, 1, 1, 0, 0), k
    assert k.rows == rows * k.spec[0] // auto["lanes"], "the grid covers rows per team x teams per workgroup"
    assert k.spec[0] == 32 * auto["teams"], f"a large matrix keeps every team, got {k.spec}"
    rows, unroll = KernelPolicy.QMATVEC_PACKED_ROWS["long"]
    k = pol.qmatvec(DType.Q4_0, 14336, 4096)
    assert k.spec[1:] == (rows, 448, auto["lanes"], unroll, 1, 1, 1, 0, 0), "long rows: their own rows per team and unroll"
    # Q8_0's short rows quantize x before their first loads (QMATVEC_PACKED_NO_PREFETCH); its long
    # rows and batches of vectors load first
    assert pol.qmatvec(DType.Q8_0, 4096, 14336).spec[5] == 0, "Q8_0, short rows: no loads before x"
    assert pol.qmatvec(DType.Q8_0, 14336, 4096).spec[5] == 1, "Q8_0, long rows: first loads before x"
    assert pol.qmatvec(DType.Q8_0, 4096, 14336, 2).spec[5] == 1, "Q8_0, 2 vectors: first loads before x"
    assert pol.qmatvec(DType.Q6_K, 4096, 14336).spec[5] == 1, "Q6_K, short rows: first loads before x"
    k = pol.qmatvec(DType.Q8_0, 65536, 64)  # 2048 blocks of x: 152 KiB, more than the device's 48
    assert ".xwg." in k.spv and not k.uses_xq and k.spec[2] == 640, f"x held in chunks of 640 blocks, got {k}"
    pol.configure_qmatvec(layout="packed", lanes=64, rows=2, teams=2, unroll=4, xq="dispatch", prefetch=False)
    k = pol.qmatvec(DType.Q8_0, 14336, 4096)
    # teams of two subgroups: their sums meet in shared memory, 2 rows x 2 subgroups per team x 2 teams
    assert k.spec == (128, 2, 448, 64, 4, 0, 1, 8, 0, 0) and k.rows == 4 and k.uses_xq, k
    pol.configure_qmatvec(layout="packed", lanes=8, rows=16, teams=1)
    k = pol.qmatvec(DType.Q4_0, 64, 7)
    assert k.spec[0] % 32 == 0, f"whole subgroups per workgroup, got {k.spec}"
    assert k.spec[1] == 8, f"a team writes at most one row per lane, got {k.spec}"
    small = KernelPolicy(_props(integer_dot_product=True))
    small.configure_qmatvec(layout="packed")
    assert small.qmatvec(DType.Q4_0, 4096, 512).groups(512) >= 64, "a small matrix: fewer teams, 64 workgroups"
    cu = KernelPolicy({**_props(integer_dot_product=True), "compute_units": {"count": 132, "threads": 2048}})
    cu.configure_qmatvec(layout="packed")
    assert cu.qmatvec(DType.Q4_0, 4096, 1024).groups(1024) >= 66, "half a workgroup per compute unit at least"
    # the H200's fastest probed shapes: 16 teams for both model shapes (224 and 128 workgroups)
    assert cu.qmatvec(DType.Q4_0, 4096, 14336).spec[0] == 32 * auto["teams"], "large: all the teams"
    assert cu.qmatvec(DType.Q4_0, 14336, 4096).spec[0] == 32 * auto["teams"], "long rows: all the teams"


def test_packed_sums_rows_by_shuffles_only_where_the_device_has_them():
    pol = KernelPolicy({**_props(integer_dot_product=True), "features": {
        "subgroup_basic": True, "subgroup_arithmetic": True, "integer_dot_product": True}})
    pol.configure_qmatvec(layout="packed")
    assert pol.qmatvec(DType.Q4_0, 4096, 14336).spv.endswith(".tree.spv")
    pol.configure_qmatvec(layout="packed", reduce="subgroup")
    with pytest.raises(ValueError, match="needs subgroup shuffles"):
        pol.qmatvec(DType.Q4_0, 4096, 14336)


def test_packed_launch_in_whole_waves_where_the_device_reports_its_compute_units():
    props = {**_props(integer_dot_product=True), "compute_units": {"count": 132, "threads": 2048}}
    pol = KernelPolicy(props)
    pol.configure_qmatvec(layout="packed", lanes=32, rows=4, teams=8, per_cu=3)  # 256 lanes: 8 fit a unit
    k = pol.qmatvec(DType.Q4_0, 4096, 14336)
    assert k.max_groups == 132 * 3 and k.groups(14336) == 396, k
    assert k.groups(64) == 2, "never more workgroups than row groups"
    pol.configure_qmatvec(layout="packed", lanes=32, rows=4, teams=32, per_cu=4)  # 1024 lanes: 2 fit
    assert pol.qmatvec(DType.Q4_0, 4096, 14336).max_groups == 264
    pol.configure_qmatvec(layout="packed", per_cu=0)
    assert pol.qmatvec(DType.Q4_0, 4096, 14336).max_groups == 0
    unknown = KernelPolicy(_props(integer_dot_product=True))
    unknown.configure_qmatvec(layout="packed", per_cu=3)
    assert unknown.qmatvec(DType.Q4_0, 4096, 14336).max_groups == 0, "no compute unit count: one per row group"


def test_a_balanced_grid_is_a_whole_number_of_workgroups_per_compute_unit_covering_every_row():
    props = {**_props(integer_dot_product=True, subgroup_shuffle=True),
             "compute_units": {"count": 132, "threads": 2048}}
    pol = KernelPolicy(props)
    pol.configure_qmatvec(layout="packed", teams=16, rows=4, balance=True)
    k = pol.qmatvec(DType.Q4_0, 4096, 14336)  # 3584 blocks of 4 rows: 224 workgroups of 16 teams at least
    assert k.balanced_groups == 264 and k.groups(14336) == 264 and k.spec[9] == 1, k
    pol.configure_qmatvec(layout="packed", teams=16, rows=2, balance=True)
    assert pol.qmatvec(DType.Q4_0, 14336, 4096).balanced_groups == 132, "2048 blocks: 128 groups, one a unit"
    pol.configure_qmatvec(layout="packed", teams=8, rows=4, balance=True)
    assert pol.qmatvec(DType.Q4_K, 4096, 14336).balanced_groups == 528, "448 groups of 8 teams: 4 a unit"
    pol.configure_qmatvec(layout="packed", teams=16, rows=4, balance=True)
    assert pol.qmatvec(DType.Q4_0, 4096, 40).balanced_groups == 10, "never more workgroups than blocks"
    pol.configure_qmatvec(layout="packed", teams=2, rows=2, balance=3)  # 3 pretended units
    assert pol.qmatvec(DType.Q4_0, 64, 13).balanced_groups == 6, "7 blocks, 4 groups: 2 a unit"
    pol.configure_qmatvec(layout="packed", teams=16, rows=4)  # the default: one vector, not batches
    assert pol.qmatvec(DType.Q4_0, 4096, 14336).balanced_groups == 264, "one vector: balanced by default"
    k = pol.qmatvec(DType.Q4_0, 4096, 14336, 8)
    assert k.balanced_groups == 0 and k.groups(14336) == -(-14336 // k.rows), f"8 vectors: row groups, got {k}"
    pol.configure_qmatvec(layout="packed", teams=16, rows=4, balance=False)
    k = pol.qmatvec(DType.Q4_0, 4096, 14336)
    assert k.balanced_groups == 0 and k.groups(14336) == 224 and k.spec[9] == 0, "balance=False: row groups"
    pol.configure_qmatvec(layout="packed", splits=2)
    assert pol.qmatvec(DType.Q4_0, 4096, 14336).balanced_groups == 0, "the default gives way to splits"
    for knobs, why in (({"splits": 2}, "split"), ({"groups": 8}, "caps the grid"), ({"per_cu": 2}, "caps the grid")):
        pol.configure_qmatvec(layout="packed", balance=True, **knobs)
        with pytest.raises(ValueError, match=f"balance=True cannot be had here: .*{why}"):
            pol.qmatvec(DType.Q4_0, 4096, 14336)
    # 2^20 rows: blocks x workgroups past the shader's 32-bit products: refused when asked, row groups by default
    pol.configure_qmatvec(layout="packed", teams=16, rows=4, balance=True)
    with pytest.raises(ValueError, match="262144 blocks of rows x 16500 workgroups overflow"):
        pol.qmatvec(DType.Q4_0, 32, 1 << 20)
    pol.configure_qmatvec(layout="packed", teams=16, rows=4)
    assert pol.qmatvec(DType.Q4_0, 32, 1 << 20).balanced_groups == 0, "too many rows: row groups by default"
    unknown = KernelPolicy(_props(integer_dot_product=True, subgroup_shuffle=True))
    unknown.configure_qmatvec(layout="packed")
    assert unknown.qmatvec(DType.Q4_0, 4096, 14336).balanced_groups == 0, "no unit count: row groups by default"
    unknown.configure_qmatvec(layout="packed", balance=True)
    with pytest.raises(ValueError, match="does not report its compute units"):
        unknown.qmatvec(DType.Q4_0, 4096, 14336)


def test_each_lane_quantizing_its_x_is_a_variant_of_its_own_on_request_only():
    pol = KernelPolicy({**_props(integer_dot_product=True, subgroup_shuffle=True),
                        "compute_units": {"count": 132, "threads": 2048}})
    pol.configure_qmatvec(layout="packed")
    for dtype in (DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K):
        for nx in (1, 2, 8):
            assert ".xlane." not in pol.qmatvec(dtype, 4096, 14336, nx).spv, f"{dtype.name} x{nx}: automatic"
    pol.configure_qmatvec(layout="packed", xq="lane")
    k = pol.qmatvec(DType.Q4_K, 14336, 4096)
    assert k.spv == "qmatvec_packed.q4_k.xlane.sg.spv" and not k.uses_xq and k.balanced_groups, \
        f"x bound as floats, no qmatvec_xq dispatch, the balanced grid: got {k}"
    assert k.spec[2] == 14336 // 32, f"BLOCKS is every block of x (none held in shared memory): got {k.spec}"
    pol.configure_qmatvec(layout="packed", xq="lane", reduce="tree")
    assert pol.qmatvec(DType.Q6_K, 4096, 4096, 3).spv == "qmatvec_packed.q6_k.xlane.tree.spv"
    for knobs, message in (({"stagger": True}, "stagger has variants"),
                           ({"splits": 2, "split_sum": "last"}, "split_sum='last' has variants")):
        pol.configure_qmatvec(layout="packed", xq="lane", **knobs)
        with pytest.raises(ValueError, match=message):
            pol.qmatvec(DType.Q4_0, 4096, 14336)


def test_staggered_first_loads_are_variants_for_16_bit_x_held_by_each_workgroup():
    pol = KernelPolicy({**_props(integer_dot_product=True, subgroup_shuffle=True),
                        "compute_units": {"count": 132, "threads": 2048}})
    pol.configure_qmatvec(layout="packed")
    for dtype in (DType.Q4_0, DType.Q8_0, DType.Q6_K, DType.Q4_K):
        for n_cols, n_rows in ((4096, 14336), (14336, 4096)):
            for nx in (1, 2):
                k = pol.qmatvec(dtype, n_cols, n_rows, nx)
                row_class = "long" if n_cols // 32 >= KernelPolicy.QMATVEC_PACKED_LONG_ROW_UNITS else "short"
                auto = (dtype, row_class, "one" if nx == 1 else "batch") in KernelPolicy.QMATVEC_PACKED_STAGGER
                assert (".stagger." in k.spv) == auto, (f"{dtype.name} {n_rows}x{n_cols} x{nx}: "
                                                        f"QMATVEC_PACKED_STAGGER says {auto}, got {k.spv}")
    pol.configure_qmatvec(layout="packed", stagger=True)
    k = pol.qmatvec(DType.Q6_K, 4096, 14336)
    assert k.spv == "qmatvec_packed.q6_k.xwg.stagger.sg.spv" and k.balanced_groups, f"staggered and balanced, got {k}"
    for knobs in ({"reduce": "tree"}, {"x_bits": 8}, {"xq": "dispatch"}, {"splits": 2, "split_sum": "last"}):
        pol.configure_qmatvec(layout="packed", stagger=True, **knobs)
        with pytest.raises(ValueError, match="stagger has variants for 16-bit x held by each workgroup"):
            pol.qmatvec(DType.Q4_0, 4096, 14336)
    pol.configure_qmatvec(layout="packed", stagger=True)
    with pytest.raises(ValueError, match="stagger has variants"):  # 8 vectors: x from a first dispatch
        pol.qmatvec(DType.Q4_0, 4096, 14336, 8)
    pol.configure_qmatvec(layout="packed", stagger=False)
    assert ".stagger." not in pol.qmatvec(DType.Q4_0, 4096, 14336).spv


def test_x_that_does_not_fit_whole_is_held_in_chunks_and_a_knob_sets_the_chunk():
    pol = KernelPolicy({**_props(integer_dot_product=True), "max_shared_memory": 16384})
    pol.configure_qmatvec(layout="packed", xq="workgroup")
    k = pol.qmatvec(DType.Q4_0, 4096, 14336)  # 128 blocks: 9.5 KiB of x
    assert ".xwg." in k.spv and k.spec[2] == 128 and not k.uses_xq, k
    k = pol.qmatvec(DType.Q4_0, 14336, 4096)  # 448 blocks: 33 KiB; 215 fit, whole steps of 2 x 32 lanes
    assert ".xwg." in k.spv and k.spec[2] == 192 and k.spec[4] == 2, f"chunks of 192 blocks of x, got {k}"
    q4k = pol.qmatvec(DType.Q4_K, 14336, 4096)  # units of 64 weights: 2 blocks of x each
    assert q4k.spec[2] % 2 == 0 and 76 * q4k.spec[2] <= 16384, q4k
    pol.configure_qmatvec(layout="packed", xq="workgroup", x_chunk=1024)
    assert pol.qmatvec(DType.Q4_0, 14336, 4096).spec[2] == 32
    assert pol.qmatvec(DType.Q4_0, 512, 4096).spec[2] == 16, "x shorter than the chunk: all of it"
    pol.configure_qmatvec(layout="packed", xq="workgroup", x_chunk=96)
    with pytest.raises(ValueError, match=r"x_chunk=96 is not a positive multiple of 64 columns \(the Q4_K kernel's unit\)"):
        pol.qmatvec(DType.Q4_K, 14336, 4096)
    pol.configure_qmatvec(layout="packed", xq="workgroup", x_chunk=8192)
    with pytest.raises(ValueError, match=r"x_chunk=8192 columns of 1 vector\(s\) do not fit.*at most 6880"):
        pol.qmatvec(DType.Q4_0, 14336, 8192)
    with pytest.raises(ValueError, match="x_chunk is the chunk of x each workgroup holds"):
        pol.configure_qmatvec(layout="packed", xq="dispatch", x_chunk=64)
    small = KernelPolicy({**_props(integer_dot_product=True), "max_shared_memory": 4096})
    small.configure_qmatvec(layout="packed", xq="workgroup", reduce="tree", lanes=32, teams=32)
    with pytest.raises(ValueError, match=r"1024 lanes x \d+ sums need 4096 bytes of shared memory beside one unit of "
                                         r"x \(1 vector\(s\)\); the device has 4096"):
        small.qmatvec(DType.Q4_0, 14336, 4096)  # the tree's slot per lane leaves no room for x


def test_x_in_shared_memory_counts_every_array_of_the_shader():
    # lo and hi bytes (64), the scale (4) and the two sums of q (8) per block of 32: leaving out
    # the sums let a 512-lane, 8-row workgroup over 448 blocks ask for 50 KiB on a 48 KiB device
    # (a lost device on the H200, no error anywhere before it); the reduction's array is the
    # shader's PART (spec[7]) floats
    assert KernelPolicy.qmatvec_xwg_bytes(14336) == 448 * 76
    for reduce, lanes in (("subgroup", 32), ("subgroup", 64), ("tree", 32)):
        pol = KernelPolicy({**_props(integer_dot_product=True), "max_shared_memory": 49152})
        pol.configure_qmatvec(layout="packed", xq="workgroup", lanes=lanes, teams=16 * 32 // lanes, rows=8,
                              reduce=reduce)
        k = pol.qmatvec(DType.Q4_0, 14336, 4096)
        wg, rows = k.spec[0], k.spec[1]
        part = wg if reduce == "tree" else (rows * wg // 32 if lanes > 32 else 1)
        assert k.spec[7] == part, f"{reduce}, {lanes} lanes: PART {k.spec[7]}, expected {part}"
        shared = KernelPolicy.qmatvec_xwg_bytes(32 * k.spec[2]) + 4 * k.spec[7]
        assert shared <= 49152, f"{reduce}, {lanes} lanes: spec {k.spec} needs {shared} bytes"


def test_the_automatic_layout_packs_only_large_products_on_gpus(monkeypatch):
    monkeypatch.setattr(KernelPolicy, "QMATVEC_LAYOUT", "packed")
    gpu = KernelPolicy(_props(integer_dot_product=True))
    assert gpu.qmatvec(DType.Q8_0, 4096, 14336).packed
    assert not gpu.qmatvec(DType.Q8_0, 64, 7).packed, "small products stay exact"
    assert gpu.qmatvec(DType.Q4_K, 4096, 14336).packed, "Q4_K's packed kernel (its one-vector shapes) is timed faster"
    no_dot = KernelPolicy(_props())
    assert not no_dot.qmatvec(DType.Q8_0, 4096, 14336).packed
    cpu = KernelPolicy({**_props(integer_dot_product=True), "device_type": "cpu"})
    assert not cpu.qmatvec(DType.Q8_0, 4096, 14336).packed, "CPU devices keep GGUF"
    gpu.configure_qmatvec(dot=False)
    assert not gpu.qmatvec(DType.Q8_0, 4096, 14336).packed, "dot=False asks for GGUF"
    gpu.configure_qmatvec(layout="gguf")
    assert not gpu.qmatvec(DType.Q8_0, 4096, 14336).packed
    monkeypatch.setattr(KernelPolicy, "QMATVEC_LAYOUT", "gguf")
    shipped = KernelPolicy(_props(integer_dot_product=True))
    assert not shipped.qmatvec(DType.Q8_0, 4096, 14336).packed


@needs_device
@pytest.mark.parametrize("xq", ["dispatch", "workgroup"])
def test_repack_and_product_spread_their_grids_past_the_x_limit(xq):
    from kbench.backend import VulkanBackend

    # 3 workgroups at most along x: 4000 pairs of blocks and 250 row groups need y > 1
    with VulkanBackend(grid_limit=3, qmatvec={"layout": "packed", "xq": xq}) as b:
        p = Problem(b, DType.Q4_0, 1000, 256, seed=12)
        p.check(f"1000 x 256 on a spread grid, xq={xq}")


def test_the_automatic_choice_packs_every_packed_format_for_one_vector_and_for_batches(monkeypatch):
    # Q4_K joined the automatic set with its one-vector shapes (QMATVEC_PACKED_FORMAT_SHAPES); before
    # them its packed kernel tied GGUF's and GGUF's was kept
    assert QMATVEC_PACKED_AUTO_DTYPES == QMATVEC_PACKED_DTYPES
    monkeypatch.setattr(KernelPolicy, "QMATVEC_LAYOUT", "packed")
    gpu = KernelPolicy(_props(integer_dot_product=True))
    for n_rows, n_cols in ((14336, 4096), (4096, 14336)):
        for dtype in sorted(QMATVEC_PACKED_DTYPES, key=lambda d: d.name):
            k = gpu.qmatvec(dtype, n_cols, n_rows)
            assert k.packed and k.spv.startswith(f"qmatvec_packed.{dtype.name.lower()}."), f"{dtype.name} {n_rows} x {n_cols}: {k}"
            batch = gpu.qmatvec(dtype, n_cols, n_rows, 4)
            assert batch.packed and batch.vectors == 4, f"a batch takes the packed kernel, all vectors at once: {batch}"
    monkeypatch.setattr(KernelPolicy, "QMATVEC_LAYOUT", "gguf")
    k = KernelPolicy(_props(integer_dot_product=True)).qmatvec(DType.Q4_K, 4096, 14336)
    assert not k.packed and k.spv.startswith("qmatvec_fast.q4_k."), f"layout gguf keeps GGUF's kernel: {k}"
    gpu.configure_qmatvec(layout="packed")
    k = gpu.qmatvec(DType.Q4_K, 4096, 14336)
    assert k.packed and k.spv == "qmatvec_packed.q4_k.xwg.sg.spv", k
    assert k.packed_bytes == KernelPolicy.qmatvec_packed_bytes(DType.Q4_K, 14336, 4096), k
    assert k.spec[2] == 4096 // 32, "the x blocks of 32 the workgroup holds, as for the other formats"


def _q4_k_weights(n_rows: int, n_cols: int, seed: int) -> np.ndarray:
    """Weights whose sub-blocks each have a range of their own: Q4_K scales from 0 to 63 and mins
    from 1 to 63 that differ between neighbouring sub-blocks (the pairs one unit of the kernel
    takes), and sub-blocks 4..7 with scales of 16 and more (their 6-bit fields' top bits)."""
    rng = np.random.default_rng(seed)
    off = np.array([0.1, 1.0, 0.5, 2.0, 0.05, 1.5, 0.8, 0.3])
    span = np.array([0.5, 3.0, 1.0, 0.2, 2.5, 0.7, 1.8, 0.05])
    f = rng.uniform(0.5, 2.0, (n_rows, n_cols // 256, 8, 1))
    u = rng.uniform(0, 1, (n_rows, n_cols // 256, 8, 32))
    return ((u * span[:, None] - off[:, None]) * f).reshape(n_rows, n_cols).astype(np.float32)


def _q4_k_fields(data: bytes):
    """GGUF Q4_K blocks -> d, dmin (float64, (n, 1)), sc, m ((n, 8)), q ((n, 8, 32) nibbles)."""
    b = np.frombuffer(data, np.uint8).reshape(-1, 144)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float64)
    sc, m = _unpack_scales_k(b[:, 4:16])
    qs = b[:, 16:].reshape(-1, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)  # sub-block 2g: low nibbles of group g
    return d, dmin, sc.astype(np.float64), m.astype(np.float64), q.astype(np.float64)


def _q4_k_packed_layout(data: bytes) -> np.ndarray:
    """The words shaders/qmatvec_pack.comp should write for these GGUF Q4_K blocks."""
    b = np.frombuffer(data, np.uint8).reshape(-1, 144)
    n = len(b)
    _, _, sc, m, _ = _q4_k_fields(data)
    quants = b[:, 16:].copy().view(np.uint32).ravel()
    # word u of block i: sc[2u], sc[2u + 1], m[2u], m[2u + 1] as bytes
    unit = np.stack([sc[:, 0::2], sc[:, 1::2], m[:, 0::2], m[:, 1::2]], axis=2).astype(np.uint8)
    scales = unit.reshape(n, 16).copy().view(np.uint32).ravel()
    d_dmin = b[:, 0:4].copy().view(np.uint32).ravel()
    return np.concatenate([quants, scales, d_dmin])


@needs_device
def test_q4_k_repack_unpacks_the_6_bit_scales_and_mins_to_bytes():
    from kbench.shaders import load_spirv

    n_blocks = 7  # an odd count: the last invocation has one block, the d/dmin words end mid-uvec4
    data = quantize(_q4_k_weights(n_blocks, 256, seed=30), DType.Q4_K)
    _, _, sc, m, _ = _q4_k_fields(data)
    assert sc[:, 4:].max() >= 16 and m[:, 4:].max() >= 16, "the top bits of sub-blocks 4..7 are exercised"
    words = KernelPolicy.qmatvec_packed_bytes(DType.Q4_K, n_blocks, 256) // 4
    with kp.Manager() as mgr:
        src = mgr.tensor_t(np.frombuffer(data, np.uint32).copy())
        dst = mgr.tensor_t(np.full(words, 0xDEADBEEF, np.uint32))
        wg = 2  # 4 pairs of blocks: two workgroups
        algo = mgr.algorithm([src, dst], load_spirv("qmatvec_pack.q4_k.spv"), (2, 1, 1), np.array([wg], np.uint32),
                             np.array([n_blocks], np.uint32))
        mgr.sequence().record(kp.OpTensorSyncDevice([src, dst])).record(kp.OpAlgoDispatch(algo)) \
            .record(kp.OpTensorSyncLocal([dst])).eval()
        got = dst.data().copy()
    want = _q4_k_packed_layout(data)
    assert len(want) == words, f"the expected layout has {len(want)} words, qmatvec_packed_bytes says {words}"
    bad = np.flatnonzero(got != want)
    parts = {"quants": 8 * 4 * n_blocks, "scales/mins": 4 * n_blocks + 8 * 4 * n_blocks}
    where = [next((name for name, end in parts.items() if i < end), "d/dmin") for i in bad[:5]]
    assert bad.size == 0, (f"{bad.size} words differ, first at {bad[:5].tolist()} ({where}): "
                           f"expected {[hex(w) for w in want[bad[:5]]]}, got {[hex(w) for w in got[bad[:5]]]}")


def _x_bound(W: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per-row bound of the packed kernels' error: x's 16-bit quantization (|x - q s| <= s / 2, s
    = max|x| / 32639 per block of 32) through |W|, plus fp32 rounding."""
    s = np.repeat(np.abs(x).reshape(-1, 32).max(1) / 32639, 32)
    return 0.5 * (np.abs(W) @ s) * 1.001 + 1e-6 * (np.abs(W) @ np.abs(x))


@needs_device
@pytest.mark.parametrize("knobs", [{}, {"xq": "dispatch", "reduce": "tree", "lanes": 4, "rows": 2}],
                         ids=["xwg-auto", "dispatch-tree-l4r2"])
def test_q4_k_product_counts_every_sub_block_scale_and_min(knobs):
    from kbench.backend import VulkanBackend

    n_rows, n_cols = 6, 512
    data = quantize(_q4_k_weights(n_rows, n_cols, seed=31), DType.Q4_K)
    # x >= 0: every sub-block's sum of x is large, so its min term dmin * m * sum(x) is too
    x = np.random.default_rng(32).uniform(0, 1, n_cols).astype(np.float32)
    x64 = x.astype(np.float64)
    d, dmin, sc, m, q = _q4_k_fields(data)

    def product(sc, m):
        W = (d[:, :, None] * sc[:, :, None] * q - (dmin * m)[:, :, None]).reshape(n_rows, n_cols)
        return W, W @ x64

    W, ref = product(sc, m)
    np.testing.assert_allclose(W, dequantize(data, DType.Q4_K, (n_rows, n_cols)), rtol=1e-6, atol=1e-6,
                               err_msg="the test's own decoding of Q4_K")
    bound = _x_bound(W, x64)
    pair = np.arange(8) ^ 1  # sub-blocks 2u <-> 2u + 1: the two halves of one unit
    wrong = {"no min term": product(sc, 0 * m)[1], "the pair's scales swapped": product(sc[:, pair], m)[1],
             "the pair's mins swapped": product(sc, m[:, pair])[1], "both halves with sub-block 2u's scale":
             product(sc[:, np.arange(8) & ~1], m)[1]}
    for name, y in wrong.items():  # the bound is tight enough to tell each of these from the product
        assert np.any(np.abs(y - ref) > 100 * bound), f"{name}: within 100x the bound of the right product"
    with VulkanBackend(qmatvec={"layout": "packed", **knobs}) as be:
        kernel = be._policy.qmatvec(DType.Q4_K, n_cols, n_rows)
        assert kernel.packed and ".q4_k." in kernel.spv, kernel
        hw, hx, hy = be.allocate(len(data)), be.allocate(4 * n_cols), be.allocate(4 * n_rows)
        be.copy_to_device(data, hw)
        be.copy_to_device(x.tobytes(), hx)
        be.quantized_matmul(hw, hx, hy, n_rows, n_cols, DType.Q4_K)
        got = np.empty(n_rows, np.float32)
        be.copy_from_device(hy, got)
    err = np.abs(got.astype(np.float64) - ref)
    worst = int(np.argmax(err / bound))
    assert np.all(err <= bound), (f"{kernel.spv}: row {worst} off by {err[worst]:.3e} (bound {bound[worst]:.3e}), "
                                  f"expected {ref[worst]:.6f}, got {got[worst]:.6f}")


def test_vectors_whose_x_does_not_fit_whole_keep_their_rows_and_take_x_in_long_chunks_or_from_a_dispatch(monkeypatch):
    pol = KernelPolicy(_props(integer_dot_product=True))
    k = pol.qmatvec(DType.Q4_0, 4096, 14336, 4)  # 4 x 9.5 KiB of x: fits whole
    assert ".xwg." in k.spv and k.spec[2] == 128 and k.spec[1] == 4, f"x whole in shared memory, 4 rows: {k}"
    k = pol.qmatvec(DType.Q4_0, 14336, 4096, 4)  # 4 x 33 KiB: chunks of 4096 columns (2 x 32-lane steps of units)
    assert ".xwg." in k.spv and k.spec[2] == 128 and k.spec[1] == 2, f"chunks of 128 blocks, 2 rows: {k}"
    k = pol.qmatvec(DType.Q4_0, 4096, 14336, 8)  # 8 x 9.5 KiB: chunks of 2048 columns would be too short
    assert ".xwg" not in k.spv and k.uses_xq and k.spec[1] == 4, f"x from a first dispatch, 4 rows a team: {k}"
    monkeypatch.setattr(KernelPolicy, "QMATVEC_PACKED_MIN_X_CHUNK", 0)
    k = KernelPolicy(_props(integer_dot_product=True)).qmatvec(DType.Q4_0, 4096, 14336, 8)
    assert ".xwg." in k.spv and k.spec[2] == 64 and k.spec[1] == 4, f"any chunk: 64 blocks, 4 rows: {k}"


def test_eight_bit_x_of_many_vectors_or_long_rows_is_held_in_chunks():
    pol = KernelPolicy(_props(integer_dot_product=True))
    pol.configure_qmatvec(layout="packed", x_bits=8)
    k = pol.qmatvec(DType.Q4_0, 4096, 14336, 8)  # 8 x 5.5 KiB of 8-bit x: whole
    assert ".xwg8." in k.spv and k.spec[2] == 128, k
    k = pol.qmatvec(DType.Q4_0, 14336, 4096, 8)  # 8 x 19 KiB: chunks
    assert ".xwg8." in k.spv and k.spec[2] < 448 and 8 * 44 * k.spec[2] + 4 * k.spec[7] <= 49152, k


def test_a_splits_knob_splits_each_row_into_whole_team_steps_and_no_split_is_empty():
    pol = KernelPolicy(_props(integer_dot_product=True))
    pol.configure_qmatvec(layout="packed", splits=2)
    k = pol.qmatvec(DType.Q4_0, 14336, 4096)  # 448 units a row; long rows: 32 lanes x 2 units a step
    assert (k.splits, k.spec[8]) == (2, 256), f"2 splits of 256 units (4 steps of 64), got {k.splits} x {k.spec[8]}"
    assert k.spec[2] == 256, f"each workgroup holds its split's 256 blocks of x, got {k.spec[2]}"
    pol.configure_qmatvec(layout="packed", splits=3)
    k = pol.qmatvec(DType.Q4_0, 14336, 4096)
    assert (k.splits, k.spec[8]) == (3, 192), f"150 units rounded up to 3 steps: 192, 192, 64; got {k.splits} x {k.spec[8]}"
    pol.configure_qmatvec(layout="packed", splits=64)
    k = pol.qmatvec(DType.Q4_0, 256, 16)  # 8 units a row: at most 8 splits of one unit
    assert (k.splits, k.spec[8]) == (8, 1), (k.splits, k.spec[8])
    pol.configure_qmatvec(layout="packed")
    k = pol.qmatvec(DType.Q4_0, 14336, 4096)
    assert k.splits == 1 and k.spec[8] == 0, "no knob, no compute-unit count: whole rows"
    with pytest.raises(ValueError, match="splits is a choice of layout='packed'"):
        pol.configure_qmatvec(splits=2)
    with pytest.raises(ValueError, match="splits must be a positive int, got 0"):
        pol.configure_qmatvec(layout="packed", splits=0)
