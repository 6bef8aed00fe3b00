"""matmul_f16 / matmul_bf16 beyond the KHR kernel: the choice between VK_NV_cooperative_matrix2
(shaders/matmul_coop2.comp), VK_KHR_cooperative_matrix and nothing from a device's properties
(synthetic property dicts: no device here has either), the bf16 variants and reference, the
runtime's structs for the extensions the `vulkan` bindings predate, and the build step's
per-variant compiler requirement.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from kbench.backend import NumpyBackend
from kbench.backend.kernels import KernelPolicy

kp = pytest.importorskip("kbench.runtime")

from conftest import needs_device, nmse  # noqa: E402 - shared test helpers

CM2_FEATURES = {
    "cooperative_matrix2_workgroup_scope": True, "cooperative_matrix2_flexible_dimensions": True,
    "cooperative_matrix2_tensor_addressing": True, "storage_buffer_16bit": True,
}
BF16_FEATURES = {"bfloat16": True, "bfloat16_cooperative_matrix": True}


def _khr(a: str) -> dict:
    return {"M": 16, "N": 16, "K": 16, "a": a, "b": a, "c": "f32", "result": "f32", "saturating": False, "scope": 3}


def _flex(a: str, threads: int, gran: int = 16) -> dict:
    return {"M": gran, "N": gran, "K": gran, "a": a, "b": a, "c": "f32", "result": "f32", "saturating": False,
            "scope": 2, "workgroup_invocations": threads}


def _props(features=(), khr=("f16",), flex=(), **over) -> dict:
    p = {
        "device_name": "fake gpu", "device_type": "discrete_gpu", "api_version": "1.3.0",
        "max_work_group_invocations": 1024, "max_work_group_size": (1024, 1024, 64),
        "max_work_group_count": (2**31 - 1, 65535, 65535), "max_shared_memory": 49152,
        "subgroup_size": 32,
        "features": {"subgroup_basic": True, "subgroup_arithmetic": True, "float16": True,
                     "vulkan_memory_model": True, "cooperative_matrix": True},
        "cooperative_matrix_properties": [_khr(a) for a in khr],
        "cooperative_matrix2_properties": {
            "workgroup_scope_max_workgroup_size": 1024, "flexible_dimensions_max_dimension": 4096,
            "workgroup_scope_reserved_shared_memory": 0, "flexible_dimensions": list(flex)} if flex else {},
    }
    for f in features:
        p["features"].update(f)
    p.update(over)
    return p


# -- path choice from properties ----------------------------------------------------------------------

def test_coopmat2_is_chosen_where_the_device_lists_workgroup_scope_configurations():
    # coopmat2 and no KHR configuration for f16 -> f32: coopmat2
    pol = KernelPolicy(_props([CM2_FEATURES], khr=(), flex=[_flex("f16", 128), _flex("f16", 256)]))
    assert pol.matmul_f16_path("f16") == "coopmat2"
    kernel, grid = pol.matmul_f16_plan(4096, 8192, 4096)
    bm, bn, bk, threads = KernelPolicy.MATMUL_CM2_TILES[0]
    assert kernel.spv == "matmul_coop2.f16.spv"
    # aligned: no clamping, 16-byte rows
    assert kernel.spec == (threads, bm, bn, bk, KernelPolicy.MATMUL_CM2_GROUP_M, 0, KernelPolicy.MATMUL_CM2_UNROLL, 1)
    assert grid == (8192 // bn, 4096 // bm, 1)
    edge, edge_grid = pol.matmul_f16_plan(333, 517, 259)
    assert edge.spec[5] == 1, "a shape that is not a multiple of the tile needs clamped loads"
    assert edge.spec[7] == 0, "rows of 259 halves do not start on 16-byte boundaries"
    assert edge_grid == (-(-517 // bn), -(-333 // bm), 1)
    mine = KernelPolicy(_props([CM2_FEATURES], flex=[_flex("f16", 128)]), matmul_f16_cm2_tile=(64, 64, 32, 128, 2, 4),
                        matmul_f16_path="coopmat2")
    assert mine.matmul_f16_plan(64, 64, 64)[0].spec == (128, 64, 64, 32, 2, 0, 4, 1)


def test_the_coopmat2_kernel_reads_b_transposed_only_when_asked_and_only_on_coopmat2():
    flex = [_flex("f16", 256), _flex("bf16", 256)]
    props = _props([CM2_FEATURES, BF16_FEATURES], khr=("f16", "bf16"), flex=flex)
    auto = KernelPolicy(props)
    assert auto.matmul_f16_cm2_b == KernelPolicy.MATMUL_CM2_B
    rows = KernelPolicy(props, matmul_f16_cm2_b="rows")
    assert not rows.matmul_f16_b_transposed("f16")
    assert rows.matmul_f16_plan(4096, 4096, 4096)[0].spv == "matmul_coop2.f16.spv"
    bt = KernelPolicy(props, matmul_f16_cm2_b="transposed")
    for dtype in ("f16", "bf16"):
        assert bt.matmul_f16_b_transposed(dtype), dtype
        kernel, grid = bt.matmul_f16_plan(4096, 8192, 2048, dtype)
        assert kernel.spv == f"matmul_coop2.{dtype}.bt.spv"
        assert kernel.spec == rows.matmul_f16_plan(4096, 8192, 2048, dtype)[0].spec, "the same tile either way"
    # the pass: B (k rows of n) in 32 x 32 tiles, x along n
    kernel, grid = bt.transpose16(2048, 8192)
    assert (kernel.spv, grid) == ("transpose16.spv", (8192 // 32, 2048 // 32, 1))
    assert kernel.push_record(2048, 8192).dtype.names == ("rows", "cols")
    with pytest.raises(ValueError, match=r"65536 x 65536 elements are beyond"):
        bt.transpose16(65536, 65536)
    # the KHR kernel reads B as given whatever the option says
    khr = KernelPolicy(props, matmul_f16_cm2_b="transposed", matmul_f16_path="khr")
    assert not khr.matmul_f16_b_transposed("f16")
    assert khr.matmul_f16_plan(256, 256, 256)[0].spv.startswith("matmul_coop.khr")
    with pytest.raises(ValueError, match=r"matmul_f16_cm2_b must be None \(automatic\), 'rows' or 'transposed', got 'cols'"):
        KernelPolicy(props, matmul_f16_cm2_b="cols")


def test_with_both_paths_the_measured_order_decides():
    props = _props([CM2_FEATURES], flex=[_flex("f16", 256)])
    pol = KernelPolicy(props)
    assert pol.matmul_f16_path("f16") == KernelPolicy.MATMUL_F16_PATHS[0]
    pol.MATMUL_F16_PATHS = ("coopmat2", "khr")
    assert pol.matmul_f16_path("f16") == "coopmat2"
    pol.MATMUL_F16_PATHS = ("khr", "coopmat2")
    assert pol.matmul_f16_path("f16") == "khr"


def test_khr_is_chosen_without_coopmat2_and_nothing_without_either():
    khr = KernelPolicy(_props())
    assert khr.matmul_f16_path("f16") == "khr"
    assert khr.matmul_f16_plan(64, 64, 64)[0].spv == "matmul_coop.khr.spv"
    assert "lacks VK_NV_cooperative_matrix2" in khr.matmul_f16_cm2_unsupported("f16")
    # the extension's features but no flexible-dimension configuration for f16 -> f32
    listed_other = KernelPolicy(_props([CM2_FEATURES], flex=[_flex("s8", 256)]), matmul_f16_path="coopmat2")
    assert listed_other.matmul_f16_path("f16") == ""
    assert "lists no workgroup-scope f16" in listed_other.matmul_f16_cm2_unsupported("f16")
    none = KernelPolicy(_props(features=[{"cooperative_matrix": False}]))
    assert none.matmul_f16_path("f16") == ""
    with pytest.raises(kp.UnsupportedFeatureError, match=r"matmul_f16: fake gpu lacks VK_KHR_cooperative_matrix"):
        none.matmul_f16_plan(16, 16, 16)


def test_tiles_follow_the_listed_workgroup_sizes_and_granularities():
    # only 128-invocation workgroups of granularity 32: the first default that fits is taken
    pol = KernelPolicy(_props([CM2_FEATURES], flex=[_flex("f16", 128, gran=32)]))
    bm, bn, bk, threads, group, unroll = pol.matmul_f16_cm2_tile("f16")
    assert threads == 128 and bm % 32 == 0 and bn % 32 == 0 and bk % 32 == 0
    assert (bm, bn, bk, threads) in KernelPolicy.MATMUL_CM2_TILES
    # a requested tile is checked against the list
    with pytest.raises(ValueError, match=r"matmul_f16_cm2_tile .* 256 invocations matches none .*\(32, 32, 32, 128\)"):
        KernelPolicy(_props([CM2_FEATURES], flex=[_flex("f16", 128, gran=32)]),
                     matmul_f16_cm2_tile=(64, 64, 32, 256), matmul_f16_path="coopmat2").matmul_f16_plan(64, 64, 64)
    # none of the defaults fits: coopmat2 is not chosen, and says why
    odd = KernelPolicy(_props([CM2_FEATURES], khr=(), flex=[_flex("f16", 96)]))
    assert odd.matmul_f16_path("f16") == ""
    assert "no matmul_coop2 tile fits" in odd.matmul_f16_cm2_unsupported("f16")
    with pytest.raises(ValueError, match=r"UNROLL=0 must be >= 1"):
        KernelPolicy(_props(), matmul_f16_cm2_tile=(64, 64, 32, 128, 1, 0))
    with pytest.raises(ValueError, match=r"matmul_f16_cm2_tile must be a tuple of 4 or 5 or 6 ints"):
        KernelPolicy(_props(), matmul_f16_cm2_tile=(64, 64, 32))
    with pytest.raises(ValueError, match=r"matmul_f16_path must be None .* got 'nv'"):
        KernelPolicy(_props(), matmul_f16_path="nv")


def test_a_forced_path_is_kept_or_refused_with_the_reason():
    props = _props([CM2_FEATURES], flex=[_flex("f16", 256)])
    assert KernelPolicy(props, matmul_f16_path="khr").matmul_f16_plan(64, 64, 64)[0].spv == "matmul_coop.khr.spv"
    no_cm2 = KernelPolicy(_props(), matmul_f16_path="coopmat2")
    with pytest.raises(kp.UnsupportedFeatureError, match=r"matmul_f16: .*lacks VK_NV_cooperative_matrix2"):
        no_cm2.matmul_f16_plan(64, 64, 64)


def test_bf16_needs_the_bfloat16_features_and_configurations():
    # f16 only: bf16 has no path, and says which feature is missing
    f16_only = KernelPolicy(_props([CM2_FEATURES], flex=[_flex("f16", 256)]))
    assert f16_only.matmul_f16_path("bf16") == ""
    with pytest.raises(kp.UnsupportedFeatureError, match=r"matmul_bf16: .*shaderBFloat16"):
        f16_only.matmul_f16_plan(64, 64, 64, "bf16")
    # KHR bf16 configuration and features, no coopmat2 bf16 entry: the KHR bf16 kernel
    khr = KernelPolicy(_props([CM2_FEATURES, BF16_FEATURES], khr=("f16", "bf16"), flex=[_flex("f16", 256)]))
    assert khr.matmul_f16_path("bf16") == "khr"
    assert khr.matmul_f16_plan(64, 64, 64, "bf16")[0].spv == "matmul_coop.khr.bf16.spv"
    # both, coopmat2 asked for
    cm2 = KernelPolicy(_props([CM2_FEATURES, BF16_FEATURES], khr=("f16", "bf16"),
                              flex=[_flex("f16", 256), _flex("bf16", 256)]), matmul_f16_path="coopmat2")
    assert cm2.matmul_f16_plan(64, 64, 64, "bf16")[0].spv == "matmul_coop2.bf16.spv"
    with pytest.raises(ValueError, match=r"dtype must be one of \('f16', 'bf16'\), got 'f8'"):
        cm2.matmul_f16_plan(64, 64, 64, "f8")


def test_coop2_shaders_declare_what_the_policy_checks():
    """The shipped coopmat2 SPIR-V needs exactly features the policy checks before choosing it."""
    from kbench.runtime.spirv import reflect
    from kbench.shaders import load_spirv

    checked = {key for key, _ in KernelPolicy._CM2_FEATURES} | {"float16"}
    for dtype, extra in (("f16", set()), ("bf16", {key for key, _ in KernelPolicy._BF16_FEATURES})):
        for name in (f"matmul_coop2.{dtype}.spv", f"matmul_coop2.{dtype}.bt.spv"):
            info = reflect(load_spirv(name))
            needed = {key for key, _ in info.required_features()}
            assert needed <= checked | extra, f"{name}: unchecked {needed - checked - extra}"
            assert [s.spec_id for s in sorted(info.spec_constants.values(), key=lambda s: s.spec_id)] == list(range(8))
    # the transpose pass before the *.bt kernels needs nothing the coopmat2 path has not checked
    needed = {key for key, _ in reflect(load_spirv("transpose16.spv")).required_features()}
    assert needed <= checked, f"transpose16.spv: unchecked {needed - checked}"


# -- bf16 numbers -----------------------------------------------------------------------------------

def test_bf16_rounding_is_nearest_even_and_the_reference_uses_the_exact_values():
    from kbench.cases.matmul_f16 import bf16_bits, bf16_values

    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, 1.0 + 2**-9], np.float32)
    bits = bf16_bits(x)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0)
    assert list(bits) == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x3F80]
    assert list(bf16_values(bits)) == [1.0, 1.0, 1.0 + 2**-6, -2.5, 1.0]


def test_numpy_matmul_bf16_is_the_float64_product_of_the_bf16_values():
    from kbench.cases.matmul_f16 import bf16_bits, bf16_values

    rng = np.random.default_rng(5)
    m, n, k = 6, 5, 9
    a = bf16_bits(rng.uniform(-2, 2, m * k).astype(np.float32))
    b = bf16_bits(rng.uniform(-2, 2, k * n).astype(np.float32))
    with NumpyBackend() as be:
        ha, hb, ho = be.allocate(a.nbytes), be.allocate(b.nbytes), be.allocate(4 * m * n)
        be.copy_to_device(a, ha)
        be.copy_to_device(b, hb)
        be.matmul_bf16(ha, hb, ho, m, n, k)
        out = np.empty(m * n, np.float32)
        be.copy_from_device(ho, out)
        with pytest.raises(ValueError, match=r"matmul_bf16: a needs bytes \[0, 200\) \(bfloat16 m\*k = 10\*10\)"):
            be.matmul_bf16(ha, hb, ho, 10, 1, 10)
    ref = (bf16_values(a).reshape(m, k) @ bf16_values(b).reshape(k, n)).astype(np.float32)
    np.testing.assert_array_equal(out.reshape(m, n), ref)


def test_matmul_bf16_case_declaration():
    from kbench.cases import get_case

    case = get_case("matmul_bf16")
    inp = case.generate({"m": 3, "n": 2, "k": 5}, np.random.default_rng(0))
    assert inp["a"].dtype == np.uint16 and inp["a"].size == 15
    ref = case.reference(inp, {"m": 3, "n": 2, "k": 5})["out"]
    a = (inp["a"].astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(3, 5)
    b = (inp["b"].astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(5, 2)
    np.testing.assert_array_equal(ref, (a @ b).ravel())
    assert case.tolerance_for({"m": 4096, "n": 4096, "k": 4096}) == 2e-5


@needs_device
def test_matmul_bf16_case_runs_or_says_why_on_this_device():
    from kbench.backend import VulkanBackend
    from kbench.bench.execute import run_instance
    from kbench.bench.targets import Lane, Target
    from kbench.cases import get_case

    with VulkanBackend() as be:
        props = be.device_properties
        t = Target("vulkan", 0, props, "single", [Lane(backend=be)])
        rec = run_instance(get_case("matmul_bf16").instances("validate")[3], t)
        if KernelPolicy(props).matmul_f16_path("bf16"):
            assert rec["status"] == "ok", rec
        else:
            assert rec["status"] == "unsupported", rec
            assert "matmul_bf16" in rec["reason"] and "lacks" in rec["reason"], rec["reason"]
        assert be.live_buffers() == ()


@needs_device
@pytest.mark.parametrize("tile", [(1, 2, 2, 1, 16, 1), (2, 2, 2, 2, 32, 2)])
def test_matmul_bf16_kernel_matches_float64(tile):
    """The bf16 KHR kernel's staging and edges (its emulated variant where the device lacks
    bfloat16 cooperative matrices)."""
    from kbench.backend import VulkanBackend
    from kbench.cases.matmul_f16 import bf16_bits, bf16_values

    rng = np.random.default_rng(6)
    with VulkanBackend(matmul_f16_tile=tile, matmul_f16_path="khr") as be:
        pol = be._policy  # noqa: SLF001
        if pol.matmul_f16_unsupported("bf16"):
            if pol.subgroup_size < 8:
                pytest.skip("the emulated kernel needs subgroups of >= 8 invocations")
            pol.coop_emulate = True
        for m, n, k in [(1, 1, 1), (33, 17, 65), (70, 136, 40)]:
            a = bf16_bits(rng.uniform(-1, 1, m * k).astype(np.float32))
            b = bf16_bits(rng.uniform(-1, 1, k * n).astype(np.float32))
            ha, hb, ho = be.allocate(a.nbytes), be.allocate(b.nbytes), be.allocate(4 * m * n)
            try:
                be.copy_to_device(a, ha)
                be.copy_to_device(b, hb)
                be.matmul_bf16(ha, hb, ho, m, n, k)
                out = np.empty(m * n, np.float32)
                be.copy_from_device(ho, out)
            finally:
                for h in (ha, hb, ho):
                    be.free(h)
            ref = bf16_values(a).reshape(m, k) @ bf16_values(b).reshape(k, n)
            err = nmse(out.reshape(m, n), ref)
            assert err < 1e-10, f"matmul_bf16 {tile} {m}x{n}x{k}: NMSE {err:.2e}"


@needs_device
@pytest.mark.parametrize("rows,cols", [(1, 1), (1, 77), (77, 1), (32, 32), (33, 65), (100, 37), (64, 300)])
def test_the_transpose_pass_moves_every_16bit_element_and_writes_nothing_past_b_transposed(rows, cols):
    """shaders/transpose16.comp (the pass before the coopmat2 kernel that reads B transposed) on
    this device: every 16-bit pattern lands at its transposed place, whole and partial tiles, and
    the guard words after the output keep their value."""
    from kbench.backend import VulkanBackend

    rng = np.random.default_rng(rows * 1000 + cols)
    src = rng.integers(0, 1 << 16, rows * cols, dtype=np.uint16)
    guard = 64
    with VulkanBackend() as be:
        hs, hd = be.allocate(src.nbytes), be.allocate(src.nbytes + 2 * guard)
        try:
            be.copy_to_device(src, hs)
            be.copy_to_device(np.full(rows * cols + guard, 0xA5A5, np.uint16), hd)
            be._transpose16(hs.id, hd.id, rows, cols)  # noqa: SLF001 - the pass alone
            got = np.empty(rows * cols + guard, np.uint16)
            be.copy_from_device(hd, got)
        finally:
            be.free(hs)
            be.free(hd)
    want = src.reshape(rows, cols).T.ravel()
    wrong = np.flatnonzero(got[:rows * cols] != want)
    assert wrong.size == 0, (f"{rows}x{cols}: {wrong.size} elements misplaced, first at {wrong[0]}: "
                             f"expected {want[wrong[0]]:#06x}, got {got[wrong[0]]:#06x}")
    assert (got[rows * cols:] == 0xA5A5).all(), f"{rows}x{cols}: the pass wrote past its {rows * cols} elements"


@needs_device
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_the_coopmat2_kernel_reading_b_transposed_matches_float64_and_keeps_b_transposed(dtype):
    """matmul_f16 / matmul_bf16 with the transpose pass and the *.bt kernel (devices with coopmat2):
    against float64 on aligned and ragged shapes, B itself unchanged; B^T made once and reused by
    the next call on the same B (one dispatch), made again once B is written."""
    from kbench.backend import VulkanBackend
    from kbench.probes.matmul import half_inputs

    rng = np.random.default_rng(9)
    with VulkanBackend(matmul_f16_path="coopmat2", matmul_f16_cm2_b="transposed") as be:
        why = be._policy.matmul_f16_cm2_unsupported(dtype)  # noqa: SLF001
        if why:
            pytest.skip(f"no coopmat2 {dtype} kernel here: {why}")
        op = be.matmul_f16 if dtype == "f16" else be.matmul_bf16
        for m, n, k in [(256, 512, 256), (333, 517, 259), (1, 9, 17)]:
            (a, va), (b, vb) = half_inputs(dtype, (m, k), rng), half_inputs(dtype, (k, n), rng)
            ha, hb, ho = be.allocate(a.nbytes), be.allocate(b.nbytes), be.allocate(4 * m * n)
            out, after = np.empty(m * n, np.float32), np.empty(b.shape, b.dtype)
            try:
                be.copy_to_device(a, ha)
                be.copy_to_device(b, hb)
                op(ha, hb, ho, m, n, k)
                be.copy_from_device(ho, out)
                err = nmse(out.reshape(m, n), va.astype(np.float64) @ vb.astype(np.float64))
                assert err < 1e-10, f"matmul_{dtype} with B transposed {m}x{n}x{k}: NMSE {err:.2e}"
                assert be.cache_stats()["derived_copies"] == 1, be.cache_stats()
                before = be.cache_stats()["dispatches"]
                op(ha, hb, ho, m, n, k)
                calls = be.cache_stats()["dispatches"] - before
                assert calls == 1, f"the second call on the same B recorded {calls} dispatches, expected 1 (B^T kept)"
                b2, vb2 = half_inputs(dtype, (k, n), rng)
                be.copy_to_device(b2, hb)
                op(ha, hb, ho, m, n, k)
                be.copy_from_device(ho, out)
                err = nmse(out.reshape(m, n), va.astype(np.float64) @ vb2.astype(np.float64))
                assert err < 1e-10, f"after a new B was written {m}x{n}x{k}: NMSE {err:.2e} (a stale B^T?)"
                be.copy_from_device(hb, after)
                assert (after == b2).all(), "the transpose pass changed B itself"
            finally:
                for h in (ha, hb, ho):
                    be.free(h)
        assert be.cache_stats()["derived_copies"] == 0, "freeing B freed its transposed copy"


# -- runtime: structs the bindings lack ------------------------------------------------------------------

@needs_device
def test_raw_structs_read_features_like_the_bindings_do():
    """RawStruct's layout (sType, pNext at 8, members from 16), checked on a struct the bindings
    do have: VkPhysicalDeviceVulkan11Features read both ways agrees member by member."""
    from kbench.runtime._vk import vk
    from kbench.runtime.device import Instance, RawStruct

    members = ["storageBuffer16BitAccess", "uniformAndStorageBuffer16BitAccess", "storagePushConstant16",
               "storageInputOutput16", "multiview", "multiviewGeometryShader", "multiviewTessellationShader",
               "variablePointersStorageBuffer", "variablePointers", "protectedMemory", "samplerYcbcrConversion",
               "shaderDrawParameters"]
    inst = Instance.acquire()
    try:
        pd = inst.physical_devices()[0]
        if vk.vkGetPhysicalDeviceProperties(pd).apiVersion < vk.VK_MAKE_VERSION(1, 2, 0):
            pytest.skip("Vulkan 1.2 features struct needs a 1.2 device")
        theirs = vk.VkPhysicalDeviceVulkan11Features()
        vk.vkGetPhysicalDeviceFeatures2(pd, vk.VkPhysicalDeviceFeatures2(pNext=theirs))
        ours = RawStruct(vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, members)
        vk.vkGetPhysicalDeviceFeatures2(pd, vk.VkPhysicalDeviceFeatures2(pNext=ours.ptr))
        assert {m: ours[m] for m in members} == {m: int(getattr(theirs, m)) for m in members}
        assert any(ours[m] for m in members), "the device reported no Vulkan 1.1 feature at all"
    finally:
        inst.release()


@needs_device
def test_device_properties_list_the_new_features_and_coopmat2_properties():
    from kbench.runtime.device import BFLOAT16_FEATURES, COOPMAT2_EXT, COOPMAT2_FEATURES

    mgr = kp.Manager()
    try:
        props = mgr.get_device_properties()
        for key in list(COOPMAT2_FEATURES.values()) + list(BFLOAT16_FEATURES.values()):
            assert key in props["features"], key
        c2 = props["cooperative_matrix2_properties"]
        assert (c2 == {}) == (COOPMAT2_EXT not in props["extensions"])
    finally:
        mgr.destroy()


# -- build step: per-variant compiler requirement -------------------------------------------------------

def _tree(tmp_path, requires: str):
    from kbench.shaders import build

    src = tmp_path / "shaders"
    src.mkdir(parents=True)
    (src / "demo.comp").write_text(
        "#version 450\n"
        "// kbench: variant old\n"
        f"// kbench: variant new NEW {requires}\n"
        "layout(local_size_x = 1) in;\nvoid main() {}\n", encoding="utf-8")
    return build, build.declared_outputs(src)


def test_a_variant_can_require_a_newer_glslang_than_its_file(tmp_path):
    build, outs = _tree(tmp_path, "requires=glslang>=16.2")
    assert {o.name: o.min_glslang for o in outs} == {"demo.new.spv": (16, 2), "demo.old.spv": (0, 0)}
    with pytest.raises(ValueError, match=r"bad requirement 'glslang>16'"):
        _tree(tmp_path / "x", "requires=glslang>16")


def test_an_output_needing_a_newer_glslang_keeps_its_committed_spirv(tmp_path, monkeypatch, capsys):
    build, outs = _tree(tmp_path, "requires=glslang>=99")
    spv = tmp_path / "spv"
    spv.mkdir()
    new = next(o for o in outs if o.name == "demo.new.spv")
    committed = b"\x03\x02\x23\x07" + bytes(60)
    (spv / new.name).write_bytes(committed)
    entry = {"source": "shaders/demo.comp", "defines": ["NEW"], "target": "vulkan1.0", "min_glslang": "99.0",
             "glslang": "99.0.0", "input_sha256": "stale", "spv_sha256": build.file_sha256(spv / new.name)}
    (spv / "manifest.json").write_text(json.dumps({"version": 1, "outputs": {new.name: entry}}), encoding="utf-8")
    compiled = []
    monkeypatch.setattr(build, "find_compilers", lambda: [build.Compiler("/old/glslangValidator", (12, 0, 0))])
    monkeypatch.setattr(build, "compile_output", lambda out, comp, dest: (compiled.append(out.name),
                                                                          dest.write_bytes(committed)))
    assert build.build(outs, spv_dir=spv, verbose=False) == 1
    assert compiled == ["demo.old.spv"]
    assert (spv / new.name).read_bytes() == committed
    manifest = json.loads((spv / "manifest.json").read_text(encoding="utf-8"))["outputs"]
    assert manifest[new.name] == entry
    err = capsys.readouterr().err
    assert "kept demo.new.spv: demo.new.spv: needs glslang >= 99.0; found /old/glslangValidator (12.0.0)" in err
    # nothing committed to keep: an error naming what is needed
    (spv / new.name).unlink()
    with pytest.raises(build.CompilerTooOld, match=r"demo.new.spv: needs glslang >= 99.0"):
        build.build(outs, spv_dir=spv, verbose=False)


def test_the_probe_takes_cooperative_matrix_variants_from_the_command_line():
    import argparse

    from kbench.probes.matmul import parse_coop_variant

    assert parse_coop_variant("cm2:128x256x64x256x8x4") == ("coopmat2", (128, 256, 64, 256, 8, 4))
    assert parse_coop_variant("cm2t:128x256x32x256x8x16") == ("coopmat2-bt", (128, 256, 32, 256, 8, 16))
    assert parse_coop_variant("khr:2x4x4x2x32x8") == ("khr", (2, 4, 4, 2, 32, 8))
    with pytest.raises(argparse.ArgumentTypeError, match=r"must start with cm2:, cm2t: or khr:"):
        parse_coop_variant("nv:1x2x3x4x5x6")
    with pytest.raises(argparse.ArgumentTypeError, match=r"needs 6 numbers \(BMxBNxBKxTHREADSxGROUP_MxUNROLL\)"):
        parse_coop_variant("cm2:128x256")


def test_raw_structs_chain_after_and_before_the_bindings_structs():
    """No device needed: a RawStruct's pNext may be a struct the bindings return by value (as
    query_features and the feature chain give it), another RawStruct or nothing, and a
    bindings struct may point at a RawStruct."""
    from kbench.runtime._vk import ffi, vk
    from kbench.runtime.device import RawStruct

    khr = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(cooperativeMatrix=vk.VK_TRUE)
    raw = RawStruct(1000593000, ["a", "b"], khr, b=1)
    assert raw.pnext == ffi.addressof(khr)
    assert ffi.cast("VkPhysicalDeviceCooperativeMatrixFeaturesKHR *", raw.pnext).cooperativeMatrix == 1
    assert (raw["a"], raw["b"], raw.buf[0]) == (0, 1, 1000593000)
    outer = RawStruct(1000141000, ["x"], raw)
    assert outer.pnext == ffi.cast("void *", raw.buf)
    assert RawStruct(7, ["x"]).pnext == ffi.NULL
    f2 = vk.VkPhysicalDeviceFeatures2(pNext=outer.ptr)
    assert f2.pNext == ffi.cast("void *", outer.buf)
    with pytest.raises(ValueError):
        raw["missing"]


@needs_device
def test_the_extension_structs_chain_through_the_feature_query_and_the_enable_chain():
    """The path a device with VK_NV_cooperative_matrix2 and VK_KHR_shader_bfloat16 takes, on this
    device: the driver ignores structs it does not know, so the chain itself is what is checked
    (it once failed on the H200 only: a by-value struct where a pointer belongs)."""
    from kbench.runtime._vk import ffi, vk
    from kbench.runtime.device import (BFLOAT16_EXT, COOPMAT2_EXT, COOPMAT_EXT, Instance,
                                       cooperative_matrix2_properties, query_features)
    from kbench.runtime.manager import Manager

    inst = Instance.acquire()
    try:
        pd = inst.physical_devices()[0]
        api = vk.vkGetPhysicalDeviceProperties(pd).apiVersion
        if api < vk.VK_MAKE_VERSION(1, 2, 0):
            pytest.skip("the feature chain needs a Vulkan 1.2 device")
        exts = {COOPMAT_EXT, COOPMAT2_EXT, BFLOAT16_EXT}
        feats, raw = query_features(pd, api, exts)
        assert raw["coop2"] is not None and raw["bf16"] is not None
        assert raw["bf16"].pnext == ffi.cast("void *", raw["coop2"].buf)
        assert raw["coop2"].pnext == ffi.addressof(raw["coop"])
        assert "cooperative_matrix2_workgroup_scope" in feats and "bfloat16_cooperative_matrix" in feats
        props = cooperative_matrix2_properties(inst.handle, pd, exts)
        assert set(props) >= {"workgroup_scope_max_workgroup_size", "flexible_dimensions"}
        raw["coop"].cooperativeMatrix = vk.VK_TRUE
        raw["coop2"]["cooperativeMatrixWorkgroupScope"] = 1
        chain = Manager._feature_chain(None, raw, api, True, True, True)
        assert chain["coop2"]["cooperativeMatrixWorkgroupScope"] == 1
        assert chain["bf16"].pnext == ffi.cast("void *", chain["coop2"].buf)
        assert chain["coop2"].pnext == ffi.addressof(chain["coop"])
    finally:
        inst.release()
