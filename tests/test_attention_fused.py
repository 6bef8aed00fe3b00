"""The fused decode attention op (``attention``, shaders/attention.comp): results against a
float64 reference for the edge shapes (seq_len 1, seq_len not a multiple of the chunk, head_dim
32..256, grouped-query ratios that do not fill a block of heads, large scores), every partial pass
(the streaming pass with the device's and with forced small knobs, the split pass with subgroup
teams and with one invocation per key row) and forced small chunks; NaN propagation,
argument refusals before any GPU work, its dispatch count, guard bytes after out; its
KernelPolicy choice (no device); the NumPy reference; the case declaration.

NMSE measured on lavapipe against float64: 1e-14 .. 1e-13 (scores of a few units) and up to
6e-13 with scores of std ~13 (q_scale 40: the float32 rounding of each score moves exp).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kbench.backend import NumpyBackend
from kbench.backend.base import check_attention, has_attention
from kbench.backend.kernels import KernelPolicy

kp = pytest.importorskip("kbench.runtime")

#: the case's threshold (kbench.cases.ops.ATTENTION_FUSED_TOL)
NMSE_FUSED = 1e-9
#: large scores: the float32 rounding of each score (|s| * 2^-24) moves exp(s - max)
NMSE_LARGE = 1e-10


from conftest import NO_DEVICE, needs_device, nmse  # noqa: E402 - shared test helpers


def reference(q, kc, vc, hd, t, nh, nkv) -> np.ndarray:
    """float64 attention per head, written out head by head (independent of NumpyBackend's einsum)."""
    q, kc, vc = (np.asarray(a, np.float64) for a in (q, kc, vc))
    keys, values = kc.reshape(t, nkv, hd), vc.reshape(t, nkv, hd)
    out = np.empty(nh * hd)
    for h in range(nh):
        kvh = h // (nh // nkv)
        s = keys[:, kvh, :] @ q[h * hd:(h + 1) * hd] / math.sqrt(hd)
        p = np.exp(s - s.max())
        out[h * hd:(h + 1) * hd] = p @ values[:, kvh, :] / p.sum()
    return out


def inputs(rng, hd, t, nh, nkv, q_scale=1.0):
    q = (rng.uniform(-1, 1, nh * hd) * q_scale).astype(np.float32)
    kc = rng.uniform(-1, 1, t * nkv * hd).astype(np.float32)
    vc = rng.uniform(-1, 1, t * nkv * hd).astype(np.float32)
    return q, kc, vc


GUARD = 16  # float32 elements after out, filled with GUARD_VALUE
GUARD_VALUE = 7.0


def run_attention(be, q, kc, vc, hd, t, nh, nkv) -> np.ndarray:
    """out as the backend computes it; fails when a guard element after out changed."""
    hs = [be.allocate(a.nbytes) for a in (q, kc, vc)]
    ho = be.allocate(4 * (nh * hd + GUARD))
    try:
        for h, a in zip(hs, (q, kc, vc)):
            be.copy_to_device(a, h)
        be.copy_to_device(np.full(nh * hd + GUARD, GUARD_VALUE, np.float32), ho)
        be.attention(*hs, ho, hd, t, nh, nkv)
        out = np.empty(nh * hd + GUARD, np.float32)
        be.copy_from_device(ho, out)
    finally:
        for h in (*hs, ho):
            be.free(h)
    assert np.all(out[nh * hd:] == GUARD_VALUE), f"attention wrote past out: {out[nh * hd:]}"
    return out[:nh * hd]


# (head_dim, seq_len, n_heads, n_kv_heads): seq_len 1 and 2; seq_len around and off the chunk
# (64 on lavapipe, 16 when forced); head_dim 32..256 and not a power of two; group 1 (MHA), 3
# (a block of 4 heads half used), 4 (one full block), 6 (a full and a half block), 8 (two blocks)
SHAPES = [
    (64, 1, 4, 2), (128, 2, 8, 8), (64, 17, 4, 2), (128, 64, 4, 1), (128, 65, 4, 1), (32, 1025, 2, 2),
    (256, 100, 4, 1), (96, 200, 12, 4), (128, 300, 12, 2), (128, 129, 8, 1), (64, 513, 32, 8), (40, 77, 6, 2),
]


#: a streaming pass with every knob away from the device's choice: 4 lanes per row (several vec4
#: columns each, teams merged by shuffles), 3 keys per batch (partial batches), one subgroup per
#: workgroup (wg: the subgroup size), the grid over heads first, the next batch loaded ahead, 8
#: columns per combine workgroup
STREAM_SMALL = {"kernel": "stream", "lanes": 4, "unroll": 3, "heads_first": True, "prefetch": True, "combine_cols": 8}


@pytest.fixture(scope="module", params=["subgroup", "tree", "chunk16", "split", "stream_small"])
def backend(request):
    """VulkanBackend with the device's choice (the streaming pass where it has subgroup shuffles),
    the split pass with one invocation per key row, the device's choice forced to chunks of 16
    keys (many chunks, a partial last one), the split pass with subgroup teams, and the streaming
    pass with the STREAM_SMALL knobs."""
    if NO_DEVICE is not None:
        pytest.skip(NO_DEVICE)
    from kbench.backend import VulkanBackend

    opts = {"subgroup": {}, "tree": {"use_subgroups": False}, "chunk16": {"attention_chunk": 16},
            "split": {"attention": {"kernel": "split"}}, "stream_small": {}}[request.param]
    be = VulkanBackend(**opts)
    be.pass_kind = request.param
    if request.param in ("subgroup", "split") and not be.kernel_policy()["subgroups"]:
        be.close()
        pytest.skip("this device has no subgroup arithmetic: the subgroup passes are never chosen here")
    if request.param == "stream_small":
        if not be.device_properties["features"].get("subgroup_shuffle") or be.device_properties["subgroup_size"] < 8:
            be.close()
            pytest.skip("this device has no subgroup shuffles (or subgroups of < 8): no streaming pass")
        be._policy.configure_attention(STREAM_SMALL, wg=be.device_properties["subgroup_size"])  # noqa: SLF001
    yield be
    messages = be.manager.validation_messages()
    be.close()
    assert not messages, "validation layer reported:\n" + "\n".join(messages[:5])


@needs_device
def test_fused_attention_matches_float64_for_the_edge_shapes(backend):
    rng = np.random.default_rng(20)
    worst = 0.0
    # every shape on the default pass; on the others (each head_dim is a pipeline to compile on
    # lavapipe) the shapes of head_dim 64 and 128
    shapes = SHAPES if backend.pass_kind == "subgroup" else [s for s in SHAPES if s[0] in (64, 128)]
    for hd, t, nh, nkv in shapes:
        q, kc, vc = inputs(rng, hd, t, nh, nkv)
        err = nmse(run_attention(backend, q, kc, vc, hd, t, nh, nkv), reference(q, kc, vc, hd, t, nh, nkv))
        assert err < NMSE_FUSED, f"attention hd={hd} seq={t} heads={nh}/{nkv}: NMSE {err:.2e} >= {NMSE_FUSED}"
        worst = max(worst, err)
    print(f"worst NMSE {worst:.2e}")


@needs_device
def test_seq_len_one_is_the_value_row(backend):
    rng = np.random.default_rng(21)
    hd, nh, nkv = 64, 8, 2
    q, kc, vc = inputs(rng, hd, 1, nh, nkv)
    got = run_attention(backend, q, kc, vc, hd, 1, nh, nkv)
    want = np.concatenate([vc.reshape(nkv, hd)[h // 4] for h in range(nh)])
    np.testing.assert_array_equal(got, want, err_msg="softmax over one key is 1: out must be its V row")


@needs_device
@pytest.mark.parametrize("q_scale", [40.0, 1000.0])
def test_large_scores_stay_finite_and_accurate(backend, q_scale):
    """Scores in the hundreds (q_scale 40) and tens of thousands (1000): no overflow in exp, the
    chunks' maxima differ by far more than float32's exp range and are rescaled exactly."""
    rng = np.random.default_rng(22)
    for hd, t, nh, nkv in [(128, 300, 8, 2), (64, 1000, 4, 4)]:
        q, kc, vc = inputs(rng, hd, t, nh, nkv, q_scale)
        got = run_attention(backend, q, kc, vc, hd, t, nh, nkv)
        assert np.all(np.isfinite(got)), f"q_scale {q_scale}: non-finite output"
        err = nmse(got, reference(q, kc, vc, hd, t, nh, nkv))
        assert err < NMSE_LARGE, f"q_scale {q_scale} hd={hd} seq={t}: NMSE {err:.2e} >= {NMSE_LARGE}"


@needs_device
def test_a_nan_in_q_makes_its_head_nan_and_leaves_the_others(backend):
    rng = np.random.default_rng(23)
    hd, t, nh, nkv = 64, 300, 8, 2
    q, kc, vc = inputs(rng, hd, t, nh, nkv)
    q[5 * hd + 7] = np.nan  # head 5 (kv head 1, shared with heads 4, 6, 7)
    got = run_attention(backend, q, kc, vc, hd, t, nh, nkv).reshape(nh, hd)
    assert np.all(np.isnan(got[5])), f"head 5 has a NaN in q, its output must be NaN: {got[5][:4]}"
    others = np.delete(got, 5, axis=0)
    assert np.all(np.isfinite(others)), "a NaN in head 5's q leaked into other heads"
    ref = np.delete(reference(q, kc, vc, hd, t, nh, nkv).reshape(nh, hd), 5, axis=0)
    assert nmse(others, ref) < NMSE_FUSED


@needs_device
def test_fused_attention_is_two_dispatches_for_all_heads(backend):
    rng = np.random.default_rng(24)
    hd, t, nh, nkv = 128, 1000, 32, 8
    q, kc, vc = inputs(rng, hd, t, nh, nkv)
    hs = [backend.allocate(a.nbytes) for a in (q, kc, vc)]
    ho = backend.allocate(4 * nh * hd)
    try:
        for h, a in zip(hs, (q, kc, vc)):
            backend.copy_to_device(a, h)
        before = backend.cache_stats()["dispatches"]
        backend.attention(*hs, ho, hd, t, nh, nkv)
        backend.attention(*hs, ho, hd, t, nh, nkv)
        per_call = (backend.cache_stats()["dispatches"] - before) / 2
        backend.synchronize()
    finally:
        for h in (*hs, ho):
            backend.free(h)
    assert per_call <= 3, f"the fused attention recorded {per_call} dispatches per call (at most 3)"
    assert per_call == 2, f"expected the partial pass and the combine, got {per_call} dispatches"


# -- argument checks (both backends, before any GPU work) ---------------------------------------------

def _refusals(be):
    hd, t, nh, nkv = 64, 10, 4, 2
    q, k, v = be.allocate(4 * nh * hd), be.allocate(4 * t * nkv * hd), be.allocate(4 * t * nkv * hd)
    out, small = be.allocate(4 * nh * hd), be.allocate(4 * nh * hd - 4)
    cases = [
        ((q, k, v, out, hd, t, 3, nkv), ValueError, "n_heads=3 is not a multiple of n_kv_heads=2"),
        ((q, k, v, out, hd, t + 1, nh, nkv), ValueError, r"k_cache needs float32 elements \[0, 1408\)"),
        ((q, k, small, out, hd, t, nh, nkv), ValueError, "v_cache needs float32 elements"),
        ((small, k, v, out, hd, t, nh, nkv), ValueError, r"q needs float32 elements \[0, 256\)"),
        ((q, k, v, small, hd, t, nh, nkv), ValueError, "out needs float32 elements"),
        ((q, k, v, q, hd, t, nh, nkv), ValueError, "out and q are the same buffer"),
        ((q, k, v, out, 0, t, nh, nkv), ValueError, "head_dim must be positive"),
        ((q, k, v, out, hd, 0, nh, nkv), ValueError, "seq_len must be positive"),
        ((q, k, v, out, hd, t, nh, 0), ValueError, "n_kv_heads must be positive"),
        ((q, k, v, out, 64.0, t, nh, nkv), TypeError, "head_dim must be an integer"),
        ((q, k, v, "out", hd, t, nh, nkv), TypeError, "out must be a BufferHandle"),
    ]
    return cases, (q, k, v, out, small)


@pytest.mark.parametrize("kind", ["numpy", "vulkan"])
def test_bad_arguments_are_refused_before_any_gpu_work(kind):
    if kind == "vulkan":
        if NO_DEVICE is not None:
            pytest.skip(NO_DEVICE)
        from kbench.backend import VulkanBackend

        be = VulkanBackend()
    else:
        be = NumpyBackend()
    with be:
        assert has_attention(be)
        cases, _ = _refusals(be)
        start = be.cache_stats()["dispatches"] if kind == "vulkan" else None
        for args, exc, match in cases:
            with pytest.raises(exc, match=match):
                be.attention(*args)
        if kind == "vulkan":
            assert be.cache_stats()["dispatches"] == start, "a refused call recorded GPU work"


def test_check_attention_returns_the_checked_values():
    with NumpyBackend() as be:
        q, k, v, o = (be.allocate(n) for n in (4 * 8 * 32, 4 * 5 * 2 * 32, 4 * 5 * 2 * 32, 4 * 8 * 32))
        got = check_attention(be, q, k, v, o, np.int64(32), 5, 8, 2)
        assert got[4:] == (32, 5, 8, 2) and all(type(x) is int for x in got[4:])


def test_vulkan_backend_rejects_a_bad_attention_chunk_before_opening_a_device():
    from kbench.backend import VulkanBackend

    for bad in (0, -4, 2.5, True):
        with pytest.raises(ValueError, match="attention_chunk must be None or an int >= 1"):
            VulkanBackend(attention_chunk=bad)


# -- the NumPy reference ----------------------------------------------------------------------------

def test_numpy_attention_is_the_float64_reference_rounded_once():
    rng = np.random.default_rng(25)
    with NumpyBackend() as be:
        for hd, t, nh, nkv in [(64, 1, 4, 2), (96, 200, 12, 4), (128, 77, 8, 8)]:
            q, kc, vc = inputs(rng, hd, t, nh, nkv)
            got = run_attention(be, q, kc, vc, hd, t, nh, nkv)
            want = reference(q, kc, vc, hd, t, nh, nkv).astype(np.float32)
            np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-7)
        q, kc, vc = inputs(rng, 32, 9, 4, 1)
        q[40] = np.nan  # head 1
        got = run_attention(be, q, kc, vc, 32, 9, 4, 1).reshape(4, 32)
        assert np.all(np.isnan(got[1])) and np.all(np.isfinite(np.delete(got, 1, axis=0)))


# -- the kernel policy (no device) ------------------------------------------------------------------

def _props(**over):
    p = {"device_name": "fake gpu", "device_type": "discrete_gpu", "api_version": "1.3.0",
         "max_work_group_invocations": 1024, "max_work_group_size": (1024, 1024, 64),
         "max_work_group_count": (2**31 - 1, 65535, 65535), "max_shared_memory": 49152,
         "subgroup_size": 32, "features": {"subgroup_basic": True, "subgroup_arithmetic": True}}
    p.update(over)
    return p


def test_policy_spreads_the_bench_shape_over_about_a_thousand_workgroups():
    pol = KernelPolicy(_props())
    plan = pol.attention(128, 8192, 32, 8)
    assert plan.partial.spv == "attention.partial.sg.spv" and plan.combine.spv == "attention.combine.spv"
    assert (plan.chunk, plan.n_chunks, plan.head_blocks) == (64, 128, 1)
    assert plan.partial_grid == (128, 8, 1) and plan.combine_grid == (4, 32, 1)
    assert plan.combine.spec == (256, 128, 32)
    assert plan.partial.spec == (256, 64, 128, 128)
    long = pol.attention(128, 32768, 32, 8)
    assert (long.chunk, long.n_chunks) == (256, 128)
    assert pol.attention(128, 5, 32, 8).chunk == 64  # short sequences share the pipeline of 64 keys
    mha = pol.attention(64, 8192, 32, 32)  # 32 kv heads: 32 blocks, longer chunks for the same ~1024 groups
    assert (mha.chunk, mha.head_blocks, mha.partial_grid) == (256, 1, (32, 32, 1))
    wide = pol.attention(128, 4096, 64, 8)  # group 8: two blocks of 4 heads per kv head
    assert wide.head_blocks == 2 and wide.partial_grid[1] == 16
    assert plan.scratch_floats == 32 * 128 * 130 and plan.ml_off == 32 * 128 * 128


SHUFFLES = {"subgroup_basic": True, "subgroup_arithmetic": True, "subgroup_shuffle": True}


def test_policy_streams_where_the_device_has_subgroup_shuffles():
    pol = KernelPolicy(_props(features=SHUFFLES))
    plan = pol.attention(128, 8192, 32, 8)
    assert plan.stream and plan.partial.spv == "attention.partial.stream.spv"
    # (invocations, head_dim, lanes per row, heads per workgroup, keys per batch, subgroups, heads first,
    # prefetch, subgroup size)
    assert plan.partial.spec == (256, 128, 32, 4, 4, 8, 0, 0, 32)
    # about 264 workgroups: 8192 * 8 / 264 = 249 keys, rounded up to a whole number per team (8 teams)
    assert (plan.chunk, plan.n_chunks, plan.partial_grid) == (256, 32, (32, 8, 1))
    assert plan.scratch_floats == 32 * 32 * 130 and plan.ml_off == 32 * 32 * 128
    push = plan.partial_push(8192, 4, 1024, 0.5)
    assert push.dtype.names[-2:] == ("chunk", "scale") and push["chunk"][0] == 256
    long = pol.attention(128, 32768, 32, 8)
    assert (long.chunk, long.n_chunks) == (1000, 33)
    assert pol.attention(128, 5, 32, 8).chunk == 8  # one key per team: no empty teams where avoidable
    # head_dim 40: 10 vec4 columns, 8 lanes (2 columns each, the second for 2 of them)
    assert pol.attention(40, 100, 6, 2).partial.spec[2:4] == (8, 3)  # group 3: one block of 3 heads
    six = pol.attention(128, 100, 12, 2)  # group 6: two blocks of 3, not 4 + 2
    assert six.head_blocks == 2 and six.partial.spec[3] == 3
    assert pol.attention(42, 100, 4, 2).partial.spv == "attention.partial.sg.spv"  # rows not 16-byte aligned
    assert not KernelPolicy(_props()).attention(128, 8192, 32, 8).stream  # no shuffles: the split pass


def test_policy_streaming_pass_fits_shared_memory_and_takes_the_knobs():
    small = KernelPolicy(_props(features=SHUFFLES, max_shared_memory=8192))
    plan = small.attention(128, 8192, 32, 8)  # 8 subgroups' o, m, l would need 16640 bytes
    assert plan.stream and plan.partial.spec[0] == 64
    assert KernelPolicy.attention_stream_shared_bytes(64, 32, 4, 128) <= 8192
    pol = KernelPolicy(_props(features=SHUFFLES))
    pol.configure_attention(lanes=8, unroll=2, wg=128, groups=512, heads_first=True, prefetch=True, combine_cols=8)
    plan = pol.attention(128, 8192, 32, 8)
    assert plan.partial.spec == (128, 128, 8, 4, 2, 4, 1, 1, 32)
    assert (plan.chunk, plan.partial_grid) == (128, (8, 64, 1)) and plan.combine.spec == (256, 128, 8)
    pol.configure_attention(kernel="split")
    assert pol.attention(128, 8192, 32, 8).partial.spv == "attention.partial.sg.spv"
    for bad, match in (({"colour": 1}, "unknown keys"), ({"kernel": "fast"}, "must be auto, stream or split"),
                       ({"lanes": 12}, "lanes must be a power of two"), ({"lanes": 64}, "exceed the subgroup size"),
                       ({"unroll": 0}, "unroll must be a positive int"), ({"heads_first": 1}, "True or False")):
        with pytest.raises(ValueError, match=match):
            pol.configure_attention(bad)
    with pytest.raises(ValueError, match="needs subgroup arithmetic and shuffles"):
        KernelPolicy(_props()).configure_attention(kernel="stream")
    tiny = KernelPolicy(_props(features=SHUFFLES, max_shared_memory=4096))
    tiny.configure_attention(kernel="stream")
    with pytest.raises(ValueError, match="streaming pass's shared memory for head_dim=256"):
        tiny.attention(256, 100, 8, 2)  # one subgroup's o, m, l of 4 heads: 4128 bytes
    with pytest.raises(ValueError, match="needs head_dim % 4 == 0"):
        tiny.attention(42, 100, 8, 2)


def test_policy_takes_the_tree_pass_without_subgroups_and_fits_shared_memory():
    pol = KernelPolicy(_props(features={}))
    assert pol.attention(128, 8192, 32, 8).partial.spv == "attention.partial.tree.spv"
    small = KernelPolicy(_props(max_shared_memory=8192))
    plan = small.attention(128, 1 << 20, 8, 8)  # would want 2048 keys; 8 KiB hold 128
    assert plan.chunk == 128 and small.attention_shared_bytes(plan.chunk, 128) <= 8192
    with pytest.raises(ValueError, match="head_dim=4096 needs .* bytes of shared memory"):
        small.attention(4096, 10, 4, 4)
    with pytest.raises(ValueError, match="a chunk of 1024 keys needs"):
        small.attention(128, 5000, 8, 8, chunk=1024)
    with pytest.raises(ValueError, match="grid limit 65535 in y"):
        pol.attention(64, 10, 70000, 70000)


# -- the case -----------------------------------------------------------------------------------------

def test_attention_fused_case_declaration():
    from kbench.cases import get_case

    case = get_case("attention_fused")
    assert case.ops == ("attention",) and case.peak == "copy_bandwidth"
    bench = [dict(i.params) for i in case.instances("bench")]
    assert {"head_dim": 128, "seq_len": 8192, "n_heads": 32, "n_kv_heads": 8} in bench
    p = bench[0]
    assert case.bytes_moved(p) == 4 * (2 * 8192 * 8 * 128 + 2 * 32 * 128)
    assert case.tolerance_for(p) == NMSE_FUSED
    assert get_case("attention").ops == ("attn_score", "softmax", "attn_value"), "the chain case stays"


# -- the probe ----------------------------------------------------------------------------------------

@needs_device
def test_the_attention_probe_measures_every_pass_against_float64(tmp_path, capsys):
    """`kbench probe attention --small`: each pass the device can run, timed, with its NMSE."""
    import json

    from kbench.cli import main

    path = tmp_path / "attention.json"
    assert main(["probe", "attention", "--small", "--no-torch", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert rows, f"the probe measured nothing:\n{capsys.readouterr().out}"
    assert {"tree"} <= {r["kernel"] for r in rows}, "the split pass without subgroups runs on every device"
    for r in rows:
        if "partial pass alone" in r["variant"]:
            continue  # a timing without the combine: no output to check
        assert r["nmse"] < NMSE_FUSED, f"{r['variant']} at {r['shape']}: NMSE {r['nmse']:.2e}"
        assert r["us"] is None or r["us"] > 0
