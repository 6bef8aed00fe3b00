"""The matmul kernels: fp32 SGEMM tiles (shaders/matmul.comp) and the fp16 cooperative-matrix
matmul (shaders/matmul_coop.comp), their KernelPolicy choices and errors, and matmul_f16 on the
NumPy reference.

On lavapipe (no cooperative matrices) the fp16 kernel runs as its `emulated` variant, which
replaces only the three cooperative-matrix operations: staging, edges, grouping and the epilogue
are the code the GPU runs.  Sizes stay small: the whole file runs in well under a minute there.
"""

from __future__ import annotations

import numpy as np
import pytest

from kbench.backend import NumpyBackend
from kbench.backend.base import check_matmul_f16, has_matmul_f16
from kbench.backend.kernels import KernelPolicy

kp = pytest.importorskip("kbench.runtime")

NMSE_MATMUL = 1e-10  # fp32 accumulation reaches 1e-14 .. 1e-12 at these sizes


from conftest import needs_device, nmse  # noqa: E402 - shared test helpers


def run_matmul(be, a: np.ndarray, b: np.ndarray, f16: bool = False) -> np.ndarray:
    m, k = a.shape
    n = b.shape[1]
    ha, hb, ho = be.allocate(a.nbytes), be.allocate(b.nbytes), be.allocate(4 * m * n + 64)
    try:
        be.copy_to_device(np.ascontiguousarray(a), ha)
        be.copy_to_device(np.ascontiguousarray(b), hb)
        be.copy_to_device(np.full(m * n + 16, 7.0, np.float32), ho)  # stale values and a guard tail
        (be.matmul_f16 if f16 else be.matmul)(ha, hb, ho, m, n, k)
        out = np.empty(m * n + 16, np.float32)
        be.copy_from_device(ho, out)
    finally:
        for h in (ha, hb, ho):
            be.free(h)
    assert np.all(out[m * n:] == 7.0), "matmul wrote past the end of out"
    return out[:m * n].reshape(m, n)


# shapes: vec4 path (n % 4 == 0 and k % 4 == 0) and the general path, single and multiple blocks,
# block rows that do not fill a GROUP_M group, and whole tiles (the unchecked path, VEC4 = 2)
FP32_SHAPES = [(1, 1, 1), (3, 5, 7), (130, 200, 52), (257, 129, 33), (300, 264, 40), (256, 256, 64)]


def _props(**over):
    p = {
        "device_name": "fake gpu", "device_type": "discrete_gpu", "api_version": "1.3.0",
        "max_work_group_invocations": 1024, "max_work_group_size": (1024, 1024, 64),
        "max_work_group_count": (2**31 - 1, 65535, 65535), "max_shared_memory": 49152,
        "subgroup_size": 32,
        "features": {"subgroup_basic": True, "subgroup_arithmetic": True, "float16": True,
                     "vulkan_memory_model": True, "cooperative_matrix": True},
        "cooperative_matrix_properties": [
            {"M": 16, "N": 16, "K": 16, "a": "f16", "b": "f16", "c": "f16", "result": "f16",
             "saturating": False, "scope": 3},
            {"M": 16, "N": 16, "K": 16, "a": "f16", "b": "f16", "c": "f32", "result": "f32",
             "saturating": False, "scope": 3},
        ],
    }
    p.update(over)
    return p


# -- fp32 on the device -----------------------------------------------------------------------------

@needs_device
@pytest.mark.parametrize("tile", [
    None,                        # whatever the policy picks here (lavapipe: the CPU tile)
    (128, 128, 16, 8, 8),        # the former GPU default (one stage within lavapipe's 32 KiB)
    (128, 128, 8, 8, 8, 2),      # 8x8 per invocation, double-buffered, GROUP_M 2
    (64, 64, 16, 4, 4),          # the CPU default
    (32, 32, 8, 4, 4, 3),        # the small-device fallback, GROUP_M 3
    (128, 256, 8, 8, 16),        # probe variants: 8x16 and 16x8 per invocation
    (256, 128, 8, 16, 8),
])
def test_fp32_tiles_match_float64(tile):
    from kbench.backend import VulkanBackend

    rng = np.random.default_rng(1)
    with VulkanBackend(matmul_tile=tile) as be:
        if tile is not None:
            assert be.kernel_policy()["matmul_tile"] == tile
        for m, n, k in FP32_SHAPES:
            a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
            b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
            err = nmse(run_matmul(be, a, b), a.astype(np.float64) @ b.astype(np.float64))
            assert err < NMSE_MATMUL, f"matmul {tile} {m}x{n}x{k}: NMSE {err:.2e}"


@needs_device
@pytest.mark.parametrize("tile,warp_n", [
    ((128, 128, 8, 8, 8, 2), 8),   # 16 x 16 invocations as 4 x 8 patches
    ((128, 128, 8, 8, 8, 1), 4),   # 8 x 4 patches
    ((128, 128, 8, 8, 16, 3), 4),  # 16 x 8 invocations (128 acc each)
    ((64, 64, 8, 4, 4, 1), 16),    # 2 x 16 patches over 16 x 16
])
def test_fp32_warp_patches_match_float64(tile, warp_n):
    from kbench.backend import VulkanBackend

    rng = np.random.default_rng(3)
    with VulkanBackend(matmul_tile=tile, matmul_warp_n=warp_n) as be:
        assert be.kernel_policy()["matmul_warp_n"] == warp_n
        for m, n, k in FP32_SHAPES:
            a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
            b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
            err = nmse(run_matmul(be, a, b), a.astype(np.float64) @ b.astype(np.float64))
            assert err < NMSE_MATMUL, f"matmul {tile} warp_n {warp_n} {m}x{n}x{k}: NMSE {err:.2e}"


@needs_device
@pytest.mark.parametrize("tile,warp_n", [
    ((128, 128, 8, 8, 8, 8), 4),    # staggered fetch, BK 8
    ((64, 64, 16, 4, 4, 2), 0),     # BK 16, 4x4 per invocation
    ((128, 64, 32, 8, 8, 1), 0),    # one stage on lavapipe's 32 KiB: SPLIT has no effect
])
def test_fp32_split_fetch_matches_float64(tile, warp_n):
    from kbench.backend import VulkanBackend

    rng = np.random.default_rng(4)
    with VulkanBackend(matmul_tile=tile, matmul_warp_n=warp_n) as be:
        be._policy.matmul_split = True  # noqa: SLF001 - the probe's switch, before any matmul kernel is made
        for m, n, k in FP32_SHAPES:
            a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
            b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
            err = nmse(run_matmul(be, a, b), a.astype(np.float64) @ b.astype(np.float64))
            assert err < NMSE_MATMUL, f"matmul {tile} split {m}x{n}x{k}: NMSE {err:.2e}"
        assert be._policy.matmul(2).spec[-1] == 1  # noqa: SLF001


@needs_device
def test_fp32_validation_layer_is_quiet():
    from kbench.backend import VulkanBackend
    from kbench.runtime.device import VALIDATION_LAYER, layer_available

    if not layer_available(VALIDATION_LAYER):
        pytest.skip(f"{VALIDATION_LAYER} is not installed (Debian: vulkan-validationlayers)")

    rng = np.random.default_rng(2)
    with VulkanBackend(validation=True, matmul_tile=(64, 64, 8, 4, 4, 2)) as be:
        at_start = len(be.manager.validation_messages())
        for m, n, k in [(70, 68, 36), (33, 17, 9)]:  # vec4 and general paths
            a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
            b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
            assert nmse(run_matmul(be, a, b), a.astype(np.float64) @ b.astype(np.float64)) < NMSE_MATMUL
        msgs = be.manager.validation_messages()[at_start:]
        assert msgs == [], msgs[:3]


# -- fp32 policy (no device) ------------------------------------------------------------------------

def test_gpu_policy_double_buffers_and_groups():
    pol = KernelPolicy(_props())
    assert pol.matmul_tile == (128, 128, 8, 8, 8)
    assert pol.matmul_stages == 2 and pol.matmul_group_m == 8
    k = pol.matmul(True)
    assert k.spv == "matmul.spv" and k.spec == (256, 128, 128, 8, 8, 8, 1, 2, 8, KernelPolicy.MATMUL_GPU_WARP_N,
                                                   int(KernelPolicy.MATMUL_GPU_SPLIT))
    assert pol.matmul(False).spec[6] == 0
    assert pol.matmul_vec4(4096, 4096) and not pol.matmul_vec4(4096, 4095) and not pol.matmul_vec4(6, 8)
    assert pol.matmul_grid(4096, 8192) == (64, 32, 1)


def test_cpu_policy_keeps_small_tiles():
    pol = KernelPolicy(_props(device_type="cpu", max_shared_memory=32768))
    assert pol.matmul_tile == (64, 64, 16, 4, 4)
    assert pol.matmul_group_m == 1 and pol.matmul_stages == 2


def test_single_stage_when_two_do_not_fit():
    pol = KernelPolicy(_props(), matmul_tile=(128, 128, 32, 8, 8))
    assert pol.matmul_stages == 1
    assert KernelPolicy(_props(max_shared_memory=32768), matmul_tile=(128, 128, 16, 8, 8)).matmul_stages == 1


@pytest.mark.parametrize("tile,match", [
    ((128, 128, 16, 6, 8), r"TM=6 must be a multiple of 4"),
    ((128, 128, 14, 8, 8), r"BK=14 must be a multiple of 4"),
    ((128, 100, 16, 8, 8), r"TN=8 must divide BN=100"),
    ((256, 256, 8, 4, 4), r"4096 invocations exceed the device's 1024"),
    ((128, 128, 64, 8, 8), r"shared memory exceed the device's 49152"),
    ((128, 128, 16, 8, 8, 0), r"GROUP_M=0 must be >= 1"),
    ((128, 128, 16, 0, 8), r"every size must be positive"),
    ((128, 128, 16), r"matmul_tile must be a tuple of 5 or 6 ints"),
    ((128, 128, 16, 8.0, 8), r"matmul_tile must be a tuple of 5 or 6 ints"),
    (128, r"matmul_tile must be a tuple"),
])
def test_bad_fp32_tiles_are_rejected_clearly(tile, match):
    with pytest.raises(ValueError, match=match):
        KernelPolicy(_props(), matmul_tile=tile)


@pytest.mark.parametrize("tile,warp_n,match", [
    ((128, 128, 8, 8, 8), 3, r"WARP_N must be 0 or divide 32"),
    ((128, 128, 8, 8, 8), 32, r"a 1 x 32 patch must tile the 16 x 16 invocations"),
    ((128, 64, 8, 8, 8), 16, r"a 2 x 16 patch must tile the 16 x 8 invocations"),
    ((128, 128, 8, 8, 8), True, r"matmul_warp_n must be an int"),
])
def test_bad_warp_patches_are_rejected_clearly(tile, warp_n, match):
    with pytest.raises(ValueError, match=match):
        KernelPolicy(_props(), matmul_tile=tile, matmul_warp_n=warp_n)


def test_unchecked_path_only_for_whole_tiles():
    pol = KernelPolicy(_props(), matmul_tile=(128, 64, 16, 8, 8))
    assert pol.matmul_path(256, 128, 64) == 2
    assert pol.matmul_path(256, 128, 72) == 1      # k not whole BK slices
    assert pol.matmul_path(200, 128, 64) == 1      # m not whole BM blocks
    assert pol.matmul_path(256, 130, 64) == 0      # n % 4: element-wise
    assert pol.matmul(2).spec[6] == 2
    pol.matmul_unchecked = False
    assert pol.matmul_path(256, 128, 64) == 1
    with pytest.raises(ValueError, match=r"VEC4 must be 0, 1 or 2, got 3"):
        pol.matmul(3)


def test_warp_patch_spec_constant():
    pol = KernelPolicy(_props(), matmul_tile=(128, 128, 8, 8, 16), matmul_warp_n=4)
    assert pol.matmul(True).spec[:10] == (128, 128, 128, 8, 8, 16, 1, 2, 8, 4)
    assert KernelPolicy(_props(device_type="cpu")).matmul_warp_n == 0


@needs_device
def test_backend_rejects_a_bad_tile_before_opening_work():
    from kbench.backend import VulkanBackend

    with pytest.raises(ValueError, match=r"matmul_tile .* TM=3 must be a multiple of 4"):
        VulkanBackend(matmul_tile=(96, 96, 8, 3, 4))


# -- fp16 cooperative-matrix policy (no device) -------------------------------------------------------

def test_coop_policy_on_a_capable_gpu():
    pol = KernelPolicy(_props())
    assert pol.matmul_f16_unsupported() == ""
    # 128x256 blocks of 8 subgroups of 64x64: two stages would need 54 KiB, so one
    assert pol.matmul_f16_tile == (2, 4, 4, 4, 32) and pol.matmul_f16_stages == 1
    k = pol.matmul_f16(True)
    assert k.spv == "matmul_coop.khr.spv" and k.spec == (256, 2, 4, 4, 4, 32, 1, 1, 8)
    assert pol.matmul_f16_grid(4096, 8192) == (32, 32, 1)
    assert pol.matmul_f16_vec(4096, 4096) and not pol.matmul_f16_vec(4100, 4096)
    mid = KernelPolicy(_props(), matmul_f16_tile=(2, 4, 4, 2, 32, 4))
    assert mid.matmul_f16_stages == 2 and mid.matmul_f16(False).spec[-3:] == (0, 2, 4)
    assert mid.matmul_f16_grid(100, 300) == (3, 1, 1)
    # a device with 24 KiB of shared memory: the 128x256 tile (27 KiB) does not fit, the 128x128 one does
    small = KernelPolicy(_props(max_shared_memory=24576))
    assert small.matmul_f16_tile == (2, 4, 4, 2, 32), small.matmul_f16_tile


@pytest.mark.parametrize("over,match", [
    ({"features": {"subgroup_basic": True, "float16": True}}, r"lacks VK_KHR_cooperative_matrix"),
    ({"cooperative_matrix_properties": [{"M": 16, "N": 16, "K": 16, "a": "f16", "b": "f16", "c": "f16",
                                         "result": "f16", "scope": 3}]},
     r"no 16x16x16 f16 x f16 -> f32 subgroup-scope"),
    ({"features": {"cooperative_matrix": True, "subgroup_basic": True, "vulkan_memory_model": True}},
     r"lacks shaderFloat16"),
])
def test_coop_policy_says_what_a_device_lacks(over, match):
    pol = KernelPolicy(_props(**over))
    assert pol.matmul_f16_unsupported()
    with pytest.raises(kp.UnsupportedFeatureError, match=match):
        pol.matmul_f16(True)


@pytest.mark.parametrize("tile,match", [
    ((2, 4, 4, 2, 24), r"BK=24 must be a multiple of 16"),
    ((8, 8, 1, 1, 16), r"8\*8\*32 = 2048 invocations exceed"),
    ((2, 4, 8, 8, 32), r"64 accumulators per subgroup|shared memory"),
    ((4, 4, 4, 4, 64), r"bytes of shared memory exceed the device's 49152"),
    ((2, 4, 4, 2, 32, 0), r"GROUP_M=0 must be >= 1"),
    ((2, 4, 4, 2), r"matmul_f16_tile must be a tuple of 5 or 6 ints"),
])
def test_bad_coop_tiles_are_rejected_clearly(tile, match):
    with pytest.raises(ValueError, match=match):
        KernelPolicy(_props(), matmul_f16_tile=tile)


# -- fp16 on the device ------------------------------------------------------------------------------

@needs_device
def test_matmul_f16_is_unsupported_without_cooperative_matrices():
    from kbench.backend import VulkanBackend

    with VulkanBackend() as be:
        if not KernelPolicy(be.device_properties).matmul_f16_unsupported():
            pytest.skip(f"{be.device_properties['device_name']} has cooperative matrices")
        ha, hb, ho = be.allocate(32), be.allocate(32), be.allocate(64)
        before = be.cache_stats()["cached_algorithms"]
        with pytest.raises(kp.UnsupportedFeatureError, match=r"matmul_f16: .*cooperative_matrix"):
            be.matmul_f16(ha, hb, ho, 4, 4, 4)
        assert be.cache_stats()["cached_algorithms"] == before  # nothing was built or recorded
        with pytest.raises(ValueError, match=r"matmul_f16: a needs bytes \[0, 50\)"):
            be.matmul_f16(ha, hb, ho, 5, 4, 5)  # argument checks come first, as for every op


@needs_device
@pytest.mark.parametrize("tile", [(1, 2, 2, 1, 16, 1), (2, 2, 2, 2, 32, 2)])
def test_matmul_f16_kernel_matches_float64(tile):
    from kbench.backend import VulkanBackend

    rng = np.random.default_rng(3)
    with VulkanBackend(matmul_f16_tile=tile) as be:
        pol = be._policy  # noqa: SLF001
        if pol.matmul_f16_unsupported():
            if pol.subgroup_size < 8:
                pytest.skip("the emulated kernel needs subgroups of >= 8 invocations")
            pol.coop_emulate = True
        # k % 8 == 0 and n % 8 == 0 (uvec4 loads) and not; full and partial 16x16 tiles;
        # n % 4 != 0 (no direct matrix stores); several block rows and columns
        for m, n, k in [(1, 1, 1), (16, 16, 16), (33, 17, 65), (70, 136, 40), (130, 66, 24)]:
            a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
            b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
            err = nmse(run_matmul(be, a, b, f16=True), a.astype(np.float64) @ b.astype(np.float64))
            assert err < NMSE_MATMUL, f"matmul_f16 {tile} {m}x{n}x{k}: NMSE {err:.2e}"


# -- matmul_f16 on the NumPy reference ---------------------------------------------------------------

def test_numpy_matmul_f16_is_the_float64_product_of_the_halves():
    rng = np.random.default_rng(4)
    m, n, k = 7, 5, 9
    a = rng.uniform(-2, 2, (m, k)).astype(np.float16)
    b = rng.uniform(-2, 2, (k, n)).astype(np.float16)
    with NumpyBackend() as be:
        assert has_matmul_f16(be)
        out = run_matmul(be, a, b, f16=True)
    ref = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(out, ref)


def test_matmul_f16_argument_checks():
    with NumpyBackend() as be:
        a, b, out = be.allocate(2 * 12), be.allocate(2 * 12), be.allocate(4 * 9)
        with pytest.raises(ValueError, match=r"matmul_f16: a needs bytes \[0, 32\) \(float16 m\*k = 4\*4\)"):
            be.matmul_f16(a, b, out, 4, 3, 4)
        with pytest.raises(ValueError, match=r"matmul_f16: out needs float32 elements \[0, 12\)"):
            be.matmul_f16(a, b, out, 3, 4, 3)
        with pytest.raises(ValueError, match=r"matmul_f16: out and a are the same buffer"):
            be.matmul_f16(a, b, a, 1, 1, 1)
        with pytest.raises(ValueError, match=r"matmul_f16: k must be positive"):
            be.matmul_f16(a, b, out, 3, 3, 0)
        with pytest.raises(TypeError, match=r"matmul_f16: m must be an integer"):
            be.matmul_f16(a, b, out, 3.0, 3, 3)
        be.free(a)
        with pytest.raises(KeyError, match=r"matmul_f16: a is buffer #\d+, which was already freed"):
            be.matmul_f16(a, b, out, 3, 3, 3)
        assert check_matmul_f16(be, b, b, out, 2, 2, 3)[3:] == (2, 2, 3)  # inputs may alias


def test_matmul_f16_case_declaration():
    from kbench.cases import get_case

    case = get_case("matmul_f16")
    inst = next(i for i in case.instances("bench") if i.params["m"] == 4096)
    assert inst.flops == 2 * 4096 ** 3
    assert inst.bytes_moved == 2 * 2 * 4096 * 4096 + 4 * 4096 * 4096
    assert case.peak == "coopmat_fp16" and case.tolerance_for(inst.params) == 1e-6  # issue 21: the matrix-unit peak
    sizes = [(i.params["m"], i.params["n"], i.params["k"]) for i in case.instances("validate")]
    assert any(any(v % 16 for v in s) for s in sizes)
    inp = case.generate({"m": 3, "n": 2, "k": 5}, np.random.default_rng(0))
    assert inp["a"].dtype == np.float16 and inp["b"].dtype == np.float16


@needs_device
def test_matmul_f16_case_is_unsupported_on_a_device_without_cooperative_matrices():
    from kbench.bench.execute import run_instance
    from kbench.bench.targets import Lane, Target
    from kbench.backend import VulkanBackend
    from kbench.cases import get_case

    with VulkanBackend() as be:
        props = be.device_properties
        if not KernelPolicy(props).matmul_f16_unsupported():
            pytest.skip("this device has cooperative matrices")
        t = Target("vulkan", 0, props, "single", [Lane(backend=be)])
        rec = run_instance(get_case("matmul_f16").instances("validate")[3], t)
        assert rec["status"] == "unsupported", rec
        assert "cooperative_matrix" in rec["reason"], rec["reason"]
        assert be.live_buffers() == ()
