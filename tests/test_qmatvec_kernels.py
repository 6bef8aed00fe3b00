"""quantized_matmul kernels: every dtype x every kernel variant KernelPolicy can choose.

qmatvec_fast.comp (the GPU path for Q4_0, Q8_0, Q4_K, Q6_K) is forced onto the local device
(lavapipe: subgroups of 8) with several team shapes, so each of its reductions runs here:
one subgroup per team (lanes = subgroup size), teams spanning several subgroups, and the
shared-memory tree (variant *.tree, and lane counts that are not a multiple of the subgroup).
Its decoding has no alignment requirement, so the same variants also cover rows whose byte
length is not a multiple of 16 (and odd block counts, whose blocks alternate 2-byte parity).
Its staged variants (16-byte loads through shared memory) run where rows are a multiple of 16
bytes and a whole number of chunks; each staged config must run at least one shape staged with
several chunks per row.
Its integer-dot variants (x quantized to 16 bits per element by qmatvec_xq.comp, on devices with
shaderIntegerDotProduct, which lavapipe has) run with the same team shapes; their NMSE (about
2e-10) is held to the same limit.  So is qmatvec_packed.comp (Q4_0, Q8_0, Q6_K, Q4_K on weights repacked by
qmatvec_pack.comp; the cache of repacked copies and Q4_K's layout are tested in test_qmatvec_packed.py).
The fp32 configs ask for dot=False explicitly.
The generic qmatvec.comp covers every dtype in QMATVEC_DTYPES (subgroup and shared variants).
Reference: kbench.quant.dequantize in float64; NMSE <= 1e-8.
"""

from __future__ import annotations

import numpy as np
import pytest

from kbench.backend.kernels import (QMATVEC_DTYPES, QMATVEC_FAST_DTYPES, QMATVEC_PACKED_AUTO_DTYPES,
                                    QMATVEC_PACKED_DTYPES, KernelPolicy)
from kbench.quant import DType, dequantize, quantize, row_bytes

kp = pytest.importorskip("kbench.runtime")

try:
    _NO_DEVICE = None if kp.list_devices() else "the Vulkan loader finds no device"
except Exception as exc:  # no loader / no ICD
    _NO_DEVICE = f"no Vulkan available here: {exc}"

NMSE_LIMIT = 1e-8
GUARD = 16  # float32 guard elements after the output

# name -> (VulkanBackend options, kernel family)
CONFIGS = {
    "auto": ({}, "auto"),
    "generic-shared": ({"use_subgroups": False, "qmatvec": {"kernel": "generic"}}, "generic"),
    "fast-sg-l8r2": ({"qmatvec": {"kernel": "fast", "lanes": 8, "rows": 2, "reduce": "subgroup", "dot": False}}, "fast"),
    "fast-sg-l32r4": ({"qmatvec": {"kernel": "fast", "lanes": 32, "rows": 4, "reduce": "subgroup", "dot": False}},
                      "fast"),
    "fast-sg-l128r2": ({"qmatvec": {"kernel": "fast", "lanes": 128, "rows": 2, "teams": 1, "dot": False}}, "fast"),
    "fast-tree-l16r3t3": ({"qmatvec": {"kernel": "fast", "lanes": 16, "rows": 3, "teams": 3,
                                       "reduce": "tree", "dot": False}}, "fast"),
    "fast-nosg-l4r1": ({"use_subgroups": False, "qmatvec": {"kernel": "fast", "lanes": 4, "rows": 1, "dot": False}},
                       "fast"),
    # integer dot products on x quantized by a first dispatch (qmatvec_xq.comp)
    "dot-sg-l8r2": ({"qmatvec": {"kernel": "fast", "lanes": 8, "rows": 2, "reduce": "subgroup", "dot": True,
                                 "xq": "dispatch"}}, "dot"),
    "dot-sg-l32r4": ({"qmatvec": {"kernel": "fast", "lanes": 32, "rows": 4, "dot": True, "xq": "dispatch"}}, "dot"),
    "dot-tree-l16r3t3": ({"qmatvec": {"kernel": "fast", "lanes": 16, "rows": 3, "teams": 3, "reduce": "tree",
                                      "dot": True, "xq": "dispatch"}}, "dot"),
    "dot-nosg-l4r1": ({"use_subgroups": False, "qmatvec": {"kernel": "fast", "lanes": 4, "rows": 1, "dot": True,
                                                           "xq": "dispatch"}}, "dot"),
    # ... and on x quantized by every lane for its own unit (variant *.dotl.*)
    "dotl-sg-l8r2t4": ({"qmatvec": {"kernel": "fast", "lanes": 8, "rows": 2, "teams": 4, "dot": True,
                                    "xq": "lane"}}, "dot"),
    "dotl-sg-l32r4": ({"qmatvec": {"kernel": "fast", "lanes": 32, "rows": 4, "dot": True, "xq": "lane"}}, "dot"),
    "dotl-tree-l16r3t3": ({"qmatvec": {"kernel": "fast", "lanes": 16, "rows": 3, "teams": 3, "reduce": "tree",
                                       "dot": True, "xq": "lane"}}, "dot"),
    # staged through shared memory (rows of a multiple of 16 bytes; other shapes fall back to
    # the unstaged kernel): one chunk per row, several chunks, a tile not a multiple of WG
    "staged-sg-l8r2t4": ({"qmatvec": {"kernel": "fast", "lanes": 8, "rows": 2, "teams": 4, "staged": True,
                                      "tile_kib": 1}}, "fast"),
    "staged-sg-l32r3t2": ({"qmatvec": {"kernel": "fast", "lanes": 32, "rows": 3, "teams": 2, "staged": True,
                                       "chunk": 8}}, "fast"),
    "staged-tree-l16r1t3": ({"qmatvec": {"kernel": "fast", "lanes": 16, "rows": 1, "teams": 3, "staged": True,
                                         "tile_kib": 1, "reduce": "tree"}}, "fast"),
    # weights repacked 16-byte aligned (qmatvec_pack.comp) for qmatvec_packed.comp, integer dots
    # on x quantized by each workgroup (default) or by qmatvec_xq first: several subgroups per
    # workgroup, one partial subgroup, the tree
    "packed-sg-auto": ({"qmatvec": {"layout": "packed"}}, "packed"),
    "packed-sg-l8r3": ({"qmatvec": {"layout": "packed", "lanes": 8, "rows": 3, "xq": "dispatch"}}, "packed"),
    "packed-sg-l4r1": ({"qmatvec": {"layout": "packed", "lanes": 4, "rows": 1}}, "packed"),
    "packed-tree-l16r2": ({"qmatvec": {"layout": "packed", "lanes": 16, "rows": 2, "reduce": "tree",
                                       "xq": "dispatch"}}, "packed"),
    # ... several teams per workgroup (some past the last row), several units loaded ahead, teams
    # wider than a subgroup
    "packed-sg-l8r3t4u3": ({"qmatvec": {"layout": "packed", "lanes": 8, "rows": 3, "teams": 4, "unroll": 3,
                                        "xq": "dispatch"}}, "packed"),
    "packed-sg-l64r2t2u4": ({"qmatvec": {"layout": "packed", "lanes": 64, "rows": 2, "teams": 2, "unroll": 4}},
                            "packed"),
    "packed-tree-l4r2t3u2": ({"qmatvec": {"layout": "packed", "lanes": 4, "rows": 2, "teams": 3, "unroll": 2,
                                          "reduce": "tree"}}, "packed"),
    # ... with x quantized by every workgroup into shared memory (variant *.xwg.*)
    "packed-xwg-auto": ({"qmatvec": {"layout": "packed", "xq": "workgroup"}}, "packed"),
    "packed-xwg-sg-l8r8": ({"qmatvec": {"layout": "packed", "xq": "workgroup", "lanes": 8, "rows": 8}}, "packed"),
    "packed-xwg-tree-l16r3": ({"qmatvec": {"layout": "packed", "xq": "workgroup", "lanes": 16, "rows": 3,
                                           "reduce": "tree"}}, "packed"),
    "packed-xwg-sg-l16r2t4u2": ({"qmatvec": {"layout": "packed", "xq": "workgroup", "lanes": 16, "rows": 2,
                                             "teams": 4, "unroll": 2}}, "packed"),
    # ... fewer workgroups than row groups: each takes every 2nd / 3rd group of rows (the launch
    # in whole waves where the device reports its compute units)
    "packed-xwg-sg-l8r2t2g2": ({"qmatvec": {"layout": "packed", "xq": "workgroup", "lanes": 8, "rows": 2,
                                            "teams": 2, "groups": 2}}, "packed"),
    "packed-xwg-sg-l16r2t2g2-noprefetch": ({"qmatvec": {"layout": "packed", "xq": "workgroup", "lanes": 16, "rows": 2,
                                                        "teams": 2, "groups": 2, "prefetch": False}}, "packed"),
    "packed-sg-l64r1t2g3": ({"qmatvec": {"layout": "packed", "lanes": 64, "rows": 1, "teams": 2, "groups": 3,
                                         "xq": "dispatch"}}, "packed"),
    "packed-tree-l4r3t2g2": ({"qmatvec": {"layout": "packed", "lanes": 4, "rows": 3, "teams": 2, "groups": 2,
                                          "reduce": "tree"}}, "packed"),
    # ... x held a chunk of columns at a time (where x does not fit whole): chunks of whole and
    # partial lane steps, row groups that come back to the first chunk, the tree, 8-bit x
    "packed-xwg-sg-l8r2t2-chunk64": ({"qmatvec": {"layout": "packed", "xq": "workgroup", "lanes": 8, "rows": 2,
                                                  "teams": 2, "x_chunk": 64}}, "packed"),
    "packed-xwg-sg-l4r3t2g2u2-chunk192": ({"qmatvec": {"layout": "packed", "xq": "workgroup", "lanes": 4, "rows": 3,
                                                       "teams": 2, "groups": 2, "unroll": 2, "x_chunk": 192}}, "packed"),
    "packed-xwg-tree-l16r2-chunk128": ({"qmatvec": {"layout": "packed", "xq": "workgroup", "lanes": 16, "rows": 2,
                                                    "reduce": "tree", "x_chunk": 128}}, "packed"),
    "packed-x8-chunk64": ({"qmatvec": {"layout": "packed", "x_bits": 8, "lanes": 8, "rows": 2, "x_chunk": 64}},
                          "packed"),
    # ... each row split over 2-3 workgroups (grid z), their partial sums added by a second dispatch:
    # splits of one unit, of partial and whole lane steps, with chunks of x, x from a dispatch, the tree
    "packed-xwg-sg-l8r2t2-split3": ({"qmatvec": {"layout": "packed", "lanes": 8, "rows": 2, "teams": 2,
                                                 "splits": 3}}, "packed"),
    "packed-xwg-sg-l4r3t2g2u2-split2-chunk64": ({"qmatvec": {"layout": "packed", "lanes": 4, "rows": 3, "teams": 2,
                                                             "groups": 2, "unroll": 2, "splits": 2, "x_chunk": 64}},
                                                "packed"),
    "packed-sg-l16r2-split2-dispatch": ({"qmatvec": {"layout": "packed", "lanes": 16, "rows": 2, "splits": 2,
                                                     "xq": "dispatch"}}, "packed"),
    "packed-xwg-sg-l8r2t2-split3-last": ({"qmatvec": {"layout": "packed", "lanes": 8, "rows": 2, "teams": 2,
                                                      "splits": 3, "split_sum": "last"}}, "packed"),
    "packed-sg-l4r3t2g2-split2-last-dispatch": ({"qmatvec": {"layout": "packed", "lanes": 4, "rows": 3, "teams": 2,
                                                             "groups": 2, "splits": 2, "split_sum": "last",
                                                             "xq": "dispatch"}}, "packed"),
    "packed-xwg-tree-l8r2-split3": ({"qmatvec": {"layout": "packed", "lanes": 8, "rows": 2, "reduce": "tree",
                                                 "splits": 3}}, "packed"),
    # ... the rows spread evenly over a whole number of workgroups per (pretended) compute unit, a
    # team's rows at a time, teams past their workgroup's share idle: subgroup and tree sums, x from a
    # dispatch, x in chunks, several units ahead
    "packed-xwg-sg-l8r2t4-balance3": ({"qmatvec": {"layout": "packed", "lanes": 8, "rows": 2, "teams": 4,
                                                   "balance": 3}}, "packed"),
    "packed-xwg-tree-l16r3t2-balance2": ({"qmatvec": {"layout": "packed", "lanes": 16, "rows": 3, "teams": 2,
                                                      "reduce": "tree", "balance": 2}}, "packed"),
    "packed-sg-l8r2t3u2-balance5-dispatch": ({"qmatvec": {"layout": "packed", "lanes": 8, "rows": 2, "teams": 3,
                                                          "unroll": 2, "balance": 5, "xq": "dispatch"}}, "packed"),
    "packed-xwg-sg-l8r2t2-chunk64-balance2": ({"qmatvec": {"layout": "packed", "lanes": 8, "rows": 2, "teams": 2,
                                                           "x_chunk": 64, "balance": 2}}, "packed"),
    # ... only the even teams loading before x is quantized (variants *.stagger.*): several units ahead,
    # x in chunks with row groups that come back to the first chunk, the balanced grid, batches' layout
    "packed-xwg-sg-l8r3t4u2-stagger": ({"qmatvec": {"layout": "packed", "lanes": 8, "rows": 3, "teams": 4,
                                                    "unroll": 2, "stagger": True}}, "packed"),
    "packed-xwg-sg-l4r3t2g2u2-chunk192-stagger": ({"qmatvec": {"layout": "packed", "lanes": 4, "rows": 3,
                                                               "teams": 2, "groups": 2, "unroll": 2, "x_chunk": 192,
                                                               "stagger": True}}, "packed"),
    "packed-xwg-sg-l8r2t4-balance3-stagger": ({"qmatvec": {"layout": "packed", "lanes": 8, "rows": 2, "teams": 4,
                                                           "balance": 3, "stagger": True}}, "packed"),
    # ... each lane quantizing the blocks of x its units meet (variants *.xlane.*): several units ahead with
    # a ragged last batch, the tree, the balanced grid, rows split over workgroups summed by a dispatch
    "packed-xlane-sg-l8r3t4u2": ({"qmatvec": {"layout": "packed", "xq": "lane", "lanes": 8, "rows": 3, "teams": 4,
                                              "unroll": 2}}, "packed"),
    "packed-xlane-tree-l16r2t2": ({"qmatvec": {"layout": "packed", "xq": "lane", "reduce": "tree", "lanes": 16,
                                               "rows": 2, "teams": 2}}, "packed"),
    "packed-xlane-sg-l8r2t4-balance3": ({"qmatvec": {"layout": "packed", "xq": "lane", "lanes": 8, "rows": 2,
                                                     "teams": 4, "balance": 3}}, "packed"),
    "packed-xlane-sg-l8r2-split3": ({"qmatvec": {"layout": "packed", "xq": "lane", "lanes": 8, "rows": 2,
                                                 "splits": 3}}, "packed"),
    # x as 8-bit signed bytes (variant xwg8): held to its own quantization bound
    "packed-x8-auto": ({"qmatvec": {"layout": "packed", "x_bits": 8}}, "packed"),
    "packed-x8-tree-l8r3t2u2": ({"qmatvec": {"layout": "packed", "x_bits": 8, "lanes": 8, "rows": 3, "teams": 2,
                                             "unroll": 2, "reduce": "tree"}}, "packed"),
}

# (n_rows, n_cols): odd row counts, row lengths whose byte size is / is not a multiple of 16
SHAPES = {
    1: [(1, 1), (7, 33), (5, 512)],
    32: [(1, 32), (7, 96), (13, 160), (33, 1024)],   # Q4_0 rows of 18, 54, 90, 576 bytes
    # Q6_K rows of 210, 630, 1050, 1680, 3360 bytes; Q4_K rows of 4, 12, 20, 32, 64 packed units of 64
    # weights (a row of fewer units than a team has lanes, and of a number no lane count divides)
    256: [(1, 256), (7, 768), (5, 1280), (9, 2048), (5, 4096)],
}


def _cases():
    for cfg, (_, family) in CONFIGS.items():
        for dt in QMATVEC_DTYPES:
            if family in ("fast", "dot") and dt not in QMATVEC_FAST_DTYPES:
                continue
            if family == "packed" and dt not in QMATVEC_PACKED_DTYPES:
                continue
            yield pytest.param(cfg, dt, id=f"{cfg}-{dt.name}")


_backends: dict = {}


@pytest.fixture(scope="module")
def backends():
    yield _backends
    for be in _backends.values():
        be.close()
    _backends.clear()


def _backend(backends, cfg):
    from kbench.backend import VulkanBackend

    if cfg not in backends:
        opts = CONFIGS[cfg][0]
        feats = kp.list_devices()[0].get("features", {})
        if opts.get("use_subgroups") is None and opts.get("qmatvec", {}).get("reduce") == "subgroup":
            if not (feats.get("subgroup_basic") and feats.get("subgroup_arithmetic")):
                pytest.skip("the device has no subgroup arithmetic")
        q = opts.get("qmatvec", {})
        if (q.get("dot") or q.get("layout") == "packed") and not feats.get("integer_dot_product"):
            pytest.skip("the device has no shaderIntegerDotProduct")
        backends[cfg] = VulkanBackend(**opts)
    return backends[cfg]


def _nmse(out: np.ndarray, ref: np.ndarray) -> float:
    out = out.astype(np.float64)
    return float(np.sum((out - ref) ** 2) / max(np.sum(ref ** 2), 1e-300))


def _assert_within_x_quantization(got, ref, data, dtype, x, what, qmax=32639):
    """The integer-dot kernels' error is x's quantization (|x - q s| <= s / 2 per element, s
    = max|x| / qmax per block of 32: 32639 for 16-bit x, 127 for 8-bit) plus fp32 rounding:
    every row within that bound, and for 16-bit x over several rows NMSE <= 1e-8 (a single
    row's relative error can exceed it where its sum nearly cancels)."""
    n_rows, n_cols = len(ref), len(x)
    W = np.abs(dequantize(data, dtype, (n_rows, n_cols)).astype(np.float64))
    s = np.repeat(np.abs(x.astype(np.float64)).reshape(-1, 32).max(1) / qmax, 32)
    bound = 0.5 * (W @ s) * 1.001 + 1e-6 * (W @ np.abs(x.astype(np.float64)))
    err = np.abs(got.astype(np.float64) - ref)
    worst = int(np.argmax(err - bound))
    assert np.all(err <= bound), f"{what}: row {worst} off by {err[worst]:.3e}, bound {bound[worst]:.3e}"
    if n_rows >= 5 and qmax == 32639:
        e = _nmse(got, ref)
        assert e <= NMSE_LIMIT, f"{what}: NMSE {e:.3e} > {NMSE_LIMIT:.0e}"


@pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")
@pytest.mark.parametrize("cfg,dtype", list(_cases()))
def test_qmatvec_variant_matches_float64(backends, cfg, dtype):
    be = _backend(backends, cfg)
    rng = np.random.default_rng(int(dtype) * 1000 + len(cfg))
    family = CONFIGS[cfg][1]
    staged_shapes = []
    for n_rows, n_cols in SHAPES[dtype.block_elems]:
        kernel = be._policy.qmatvec(dtype, n_cols, n_rows)
        if ".staged." in kernel.spv:
            staged_shapes.append((n_rows, n_cols, n_cols // dtype.block_elems // kernel.spec[3]))
        if family == "packed":
            # x quantized by every workgroup unless asked otherwise (it always fits at these sizes)
            xq = CONFIGS[cfg][0]["qmatvec"].get("xq", "workgroup")
            assert kernel.packed, kernel
            x8 = CONFIGS[cfg][0]["qmatvec"].get("x_bits") == 8
            tag = ".xwg8." if x8 else ".xwg."
            assert kernel.uses_xq == (xq == "dispatch") and (tag in kernel.spv) == (xq == "workgroup"), kernel
            assert (".xlane." in kernel.spv) == (xq == "lane"), kernel
            balance = CONFIGS[cfg][0]["qmatvec"].get("balance")
            assert bool(kernel.balanced_groups) == bool(balance) and kernel.spec[9] == bool(balance), kernel
            stagger = bool(CONFIGS[cfg][0]["qmatvec"].get("stagger"))
            assert (".stagger." in kernel.spv) == stagger, kernel
        elif family != "auto":
            assert kernel.spv.startswith("qmatvec." if family == "generic" else "qmatvec_fast."), kernel
            assert (".dot" in kernel.spv) == (family == "dot"), kernel
            if family == "dot":
                lane = CONFIGS[cfg][0]["qmatvec"]["xq"] == "lane"
                assert (".dotl." in kernel.spv) == lane and kernel.uses_xq != lane, kernel
        W = rng.uniform(-1, 1, (n_rows, n_cols)).astype(np.float32)
        x = rng.uniform(-1, 1, n_cols).astype(np.float32)
        data = quantize(W, dtype)
        assert len(data) == n_rows * row_bytes(dtype, n_cols)
        ref = dequantize(data, dtype, (n_rows, n_cols)).astype(np.float64) @ x.astype(np.float64)
        hw, hx, hy = be.allocate(len(data)), be.allocate(4 * n_cols), be.allocate(4 * (n_rows + GUARD))
        try:
            be.copy_to_device(data, hw)
            be.copy_to_device(x.tobytes(), hx)
            sentinel = np.full(n_rows + GUARD, -7.25, np.float32)
            be.copy_to_device(sentinel.tobytes(), hy)
            be.quantized_matmul(hw, hx, hy, n_rows, n_cols, dtype)
            raw = bytearray(4 * (n_rows + GUARD))
            be.copy_from_device(hy, raw)
            got = np.frombuffer(raw, np.float32)
        finally:
            for h in (hw, hx, hy):
                be.free(h)
        what = f"{cfg} {dtype.name} {n_rows}x{n_cols} ({kernel.spv} {kernel.spec})"
        assert np.all(got[n_rows:] == np.float32(-7.25)), f"{what}: wrote past the output"
        assert not np.any(np.isnan(got[:n_rows])), f"{what}: NaN"
        if family in ("dot", "packed"):
            x8 = CONFIGS[cfg][0].get("qmatvec", {}).get("x_bits") == 8
            _assert_within_x_quantization(got[:n_rows], ref, data, dtype, x, what, qmax=127 if x8 else 32639)
        else:
            err = _nmse(got[:n_rows], ref)
            assert err <= NMSE_LIMIT, f"{what}: NMSE {err:.3e} > {NMSE_LIMIT:.0e}"
    if cfg.startswith("staged"):
        # (rows, cols, chunks per row): the staged kernel ran, and with several chunks per row
        assert any(chunks > 1 for *_, chunks in staged_shapes), f"{cfg} {dtype.name}: staged on {staged_shapes}"


def _props(**over):
    props = {
        "device_name": "fake", "device_type": "discrete_gpu", "api_version": "1.3",
        "max_work_group_invocations": 1024, "max_work_group_size": [1024, 1024, 64],
        "max_work_group_count": [2**31 - 1, 65535, 65535], "max_shared_memory": 49152,
        "subgroup_size": 32, "features": {"subgroup_basic": True, "subgroup_arithmetic": True},
    }
    props.update(over)
    return props


def test_policy_picks_the_fast_kernel_only_where_it_was_tuned():
    gpu = KernelPolicy(_props())
    for dt in QMATVEC_DTYPES:
        k = gpu.qmatvec(dt, 4096, 14336)
        assert k.spv.startswith("qmatvec_fast." if dt in QMATVEC_FAST_DTYPES else "qmatvec."), (dt, k)
    # 14336 short rows: teams of 128 lanes; 4096 long rows: 256; one team per workgroup, unstaged
    k = gpu.qmatvec(DType.Q4_0, 4096, 14336)
    assert k.spv == "qmatvec_fast.q4_0.sg.spv" and k.spec == (128, 128, 4), k
    assert k.rows == (k.spec[0] // k.spec[1]) * k.spec[2]
    assert gpu.qmatvec(DType.Q6_K, 14336, 4096).spec == (256, 256, 4)
    # staged on request, where the rows are whole 16-byte chunks: chunk = spec[3] blocks
    gpu.configure_qmatvec(staged=True)
    k = gpu.qmatvec(DType.Q4_0, 4096, 14336)
    assert k.spv == "qmatvec_fast.q4_0.staged.sg.spv" and (4 * k.spec[3] * 18) % 16 == 0, k
    assert gpu.qmatvec(DType.Q4_0, 4096 + 32, 14336).spv == "qmatvec_fast.q4_0.sg.spv", "129 blocks: no chunk"
    gpu.configure_qmatvec({})
    cpu = KernelPolicy(_props(device_type="cpu", subgroup_size=8))
    wave64 = KernelPolicy(_props(subgroup_size=64))
    nosg = KernelPolicy(_props(features={}))
    for pol in (cpu, wave64, nosg):
        assert pol.qmatvec(DType.Q4_0, 4096, 14336).spv.startswith("qmatvec.q4_0."), pol.props
    nosg.configure_qmatvec(kernel="fast")
    assert nosg.qmatvec(DType.Q4_K, 4096, 14336).spv == "qmatvec_fast.q4_k.tree.spv"
    with pytest.raises(ValueError, match="no Q5_K variant"):
        nosg.qmatvec(DType.Q5_K, 4096, 14336)
    with pytest.raises(ValueError, match="power of two"):
        gpu.configure_qmatvec(lanes=24)
    with pytest.raises(ValueError, match="unknown keys"):
        gpu.configure_qmatvec(lane=32)
    small = KernelPolicy(_props(max_shared_memory=4096, max_work_group_invocations=128,
                                max_work_group_size=[128, 128, 64]))
    small.configure_qmatvec(kernel="fast", lanes=32, rows=8, teams=8)
    wg, lanes, rows = small.qmatvec(DType.Q8_0, 4096, 100).spec
    assert wg <= 128 and wg * (4 * rows + 4) <= 4096 and lanes == 32


def test_policy_takes_the_integer_dot_variant_where_the_device_has_it():
    feats = {"subgroup_basic": True, "subgroup_arithmetic": True, "integer_dot_product": True}
    gpu = KernelPolicy(_props(features=feats))
    for dt in QMATVEC_FAST_DTYPES:  # the automatic layout: repacked where a packed kernel was timed faster
        assert gpu.qmatvec(dt, 4096, 14336).packed == (dt in QMATVEC_PACKED_AUTO_DTYPES), dt
    assert not gpu.qmatvec(DType.Q4_0, 1024, 1023).packed, "below 2^20 weights: GGUF's layout"
    gpu.configure_qmatvec(layout="gguf")  # the GGUF kernels' own choices from here on
    assert ".dot" not in gpu.qmatvec(DType.Q4_0, 1024, 1023).spv, "below 2^20 weights: exact fp32"
    assert ".dot" in gpu.qmatvec(DType.Q4_0, 1024, 1024).spv
    for dt in QMATVEC_FAST_DTYPES:
        k = gpu.qmatvec(dt, 4096, 14336)  # x quantized by a first dispatch (qmatvec_xq)
        assert ".dot." in k.spv and k.uses_xq, (dt, k)
    assert gpu.qmatvec(DType.Q4_0, 4096, 14336).spv == "qmatvec_fast.q4_0.dot.sg.spv"
    gpu.configure_qmatvec(layout="gguf", xq="lane")
    k = gpu.qmatvec(DType.Q4_0, 4096, 14336)
    assert k.spv == "qmatvec_fast.q4_0.dotl.sg.spv" and not k.uses_xq, k
    with pytest.raises(ValueError, match="xq must be lane, dispatch or workgroup"):
        gpu.configure_qmatvec(xq="shared")
    assert not gpu.qmatvec(DType.Q5_K, 4096, 14336).uses_xq, "no dot kernel for Q5_K"
    gpu.configure_qmatvec(layout="gguf", dot=False)
    assert gpu.qmatvec(DType.Q4_0, 4096, 14336).spv == "qmatvec_fast.q4_0.sg.spv"
    gpu.configure_qmatvec(staged=True)
    assert ".staged." in gpu.qmatvec(DType.Q4_0, 4096, 14336).spv, "staged asked for: the fp32 staged kernel"
    with pytest.raises(ValueError, match="dot and staged"):
        gpu.configure_qmatvec(dot=True, staged=True)
    with pytest.raises(ValueError, match="dot must be True or False"):
        gpu.configure_qmatvec(dot=1)
    nodot = KernelPolicy(_props())
    k = nodot.qmatvec(DType.Q4_0, 4096, 14336)
    assert ".dot." not in k.spv and not k.packed, k
    with pytest.raises(ValueError, match="shaderIntegerDotProduct"):
        nodot.configure_qmatvec(dot=True)
    assert KernelPolicy.qmatvec_xq_bytes(4096) == 2 * 4096 + 4 * 128


def _run_xq(x: np.ndarray) -> np.ndarray:
    """qmatvec_xq.comp on ``x`` through the runtime: its output words."""
    from kbench.shaders import load_spirv

    n = len(x)
    words = KernelPolicy.qmatvec_xq_bytes(n) // 4
    with kp.Manager() as mgr:
        tx = mgr.tensor(x.astype(np.float32))
        tq = mgr.tensor_t(np.full(words, 0xDEADBEEF, np.uint32))
        wg = 256
        algo = mgr.algorithm([tx, tq], load_spirv("qmatvec_xq.spv"), (-(-n // 4 // wg), 1, 1), np.array([wg], np.uint32),
                             np.array([n], np.uint32))
        mgr.sequence().record(kp.OpTensorSyncDevice([tx, tq])).record(kp.OpAlgoDispatch(algo)) \
            .record(kp.OpTensorSyncLocal([tq])).eval()
        return tq.data().copy()


@pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")
def test_x_quantizer_keeps_16_bits_per_element_in_blocks_of_32():
    rng = np.random.default_rng(7)
    n = 32 * 70  # not a multiple of the 256-wide workgroup's 1024 elements
    x = (rng.standard_normal(n) * np.exp(2 * rng.standard_normal(n))).astype(np.float32)
    x[32:64] = 0.0           # an all-zero block
    x[64:96] = 1e-30         # tiny magnitudes keep their relative precision
    w = _run_xq(x)
    nb = n // 32
    lo = w[: 8 * nb].view(np.int8).astype(np.int64)
    hi = w[8 * nb: 16 * nb].view(np.int8).astype(np.int64)
    s = w[16 * nb:].view(np.float32).astype(np.float64)
    q = 256 * hi + lo
    assert np.all(np.abs(q) <= 32639), f"|q| up to {np.abs(q).max()}, expected <= 32639"
    amax = np.abs(x.astype(np.float64)).reshape(nb, 32).max(1)
    np.testing.assert_allclose(s, amax / 32639, rtol=1e-6, err_msg="block scales")
    assert s[1] == 0 and np.all(q[32:64] == 0), "the zero block"
    xq = (q.reshape(nb, 32) * s[:, None]).ravel()
    err = np.abs(xq - x) / np.repeat(np.where(s > 0, s, 1), 32)
    assert err.max() <= 0.5 + 1e-3, f"|x - q s| up to {err.max():.4f} steps, expected <= 0.5 (rounding)"


@pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")
@pytest.mark.parametrize("cfg", ["dot-sg-l32r4", "dot-nosg-l4r1", "dotl-sg-l32r4", "dotl-tree-l16r3t3"])
def test_integer_dot_path_turns_nan_or_inf_in_x_into_nan_rows(backends, cfg):
    be = _backend(backends, cfg)
    n_rows, n_cols = 5, 512
    rng = np.random.default_rng(3)
    data = quantize(rng.uniform(-1, 1, (n_rows, n_cols)).astype(np.float32), DType.Q8_0)
    for bad in (np.nan, np.inf):
        x = rng.uniform(-1, 1, n_cols).astype(np.float32)
        x[100] = bad
        hw, hx, hy = be.allocate(len(data)), be.allocate(4 * n_cols), be.allocate(4 * n_rows)
        try:
            be.copy_to_device(data, hw)
            be.copy_to_device(x.tobytes(), hx)
            be.quantized_matmul(hw, hx, hy, n_rows, n_cols, DType.Q8_0)
            raw = bytearray(4 * n_rows)
            be.copy_from_device(hy, raw)
        finally:
            for h in (hw, hx, hy):
                be.free(h)
        got = np.frombuffer(raw, np.float32)
        assert np.all(np.isnan(got)), f"x[100] = {bad}: expected NaN rows, got {got}"
