"""The case declarations: coverage of every backend op, references against the NumPy backend,
and that the checks catch wrong results, NaN, out-of-bounds writes and missing features."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from kbench.backend import ComputeBackend, NumpyBackend
from kbench.bench.execute import run_instance, unsupported_reason
from kbench.bench.targets import Lane, Target
from kbench.cases import ALL_CASES, get_case, instances, parse_filter
from kbench.cases.compare import judge_exact, judge_nmse, nmse
from kbench.cases.runtime_ops import DTYPES

NOT_OPS = {"close", "closed", "live_buffers", "quantized_dtypes"}


def backend_ops() -> set[str]:
    return {n for n, _ in inspect.getmembers(ComputeBackend, predicate=inspect.isfunction)
            if not n.startswith("_") and n not in NOT_OPS}


def numpy_target(backend: ComputeBackend | None = None, features: dict | None = None, **props) -> Target:
    be = backend or NumpyBackend()
    p = {"device_type": "cpu", "features": features if features is not None else {
        "float64": True, "int64": True, "int16": True, "float16": True, "int8": True,
        "storage_buffer_8bit": True, "storage_buffer_16bit": True}}
    p.update(props)
    return Target("numpy", 0, p, "single", [Lane(backend=be)])


def test_every_backend_op_has_a_case():
    ops = backend_ops()
    assert len(ops) == 19, f"expected the trait's 19 methods, found {sorted(ops)}"
    covered = {op for c in ALL_CASES if c.layer == "backend" for op in c.ops}
    assert ops <= covered, f"backend ops without a case: {sorted(ops - covered)}"


def test_case_names_and_ids_are_unique():
    names = [c.name for c in ALL_CASES]
    assert len(names) == len(set(names)), f"duplicate case names in {names}"
    for mode in ("validate", "bench"):
        ids = [i.case_id for i in instances(mode)]
        dup = {i for i in ids if ids.count(i) > 1}
        assert not dup, f"duplicate {mode} case ids: {sorted(dup)[:5]}"


def test_quantized_matmul_sweeps_every_weight_dtype():
    dtypes = {i.params["dtype"] for i in get_case("quantized_matmul").instances("validate")}
    assert dtypes == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"}


def test_bench_sizes_are_model_like_and_declare_their_memory():
    by_case = {}
    for inst in instances("bench", sizes="full"):  # the largest sizes run with --full (issue 20)
        by_case.setdefault(inst.case.name, []).append(inst)
        if inst.case.layer == "backend":
            assert inst.case.footprint(inst.params) > 0, f"{inst.case_id} declares no memory footprint"
            assert inst.bytes_moved > 0, f"{inst.case_id} declares no bytes moved"
    assert {"m": 4096, "n": 4096, "k": 4096} in [i.params for i in by_case["matmul"]]
    shapes = {(i.params["n_rows"], i.params["n_cols"]) for i in by_case["quantized_matmul"]}
    assert {(4096, 14336), (14336, 4096)} <= shapes
    assert {16 << 20, 256 << 20} <= {i.params["size"] for i in by_case["add"]}
    assert any(i.params["seq_len"] == 8192 and i.params["n_heads"] == 32 and i.params["n_kv_heads"] == 8
               for i in by_case["attention"])
    rope = by_case["rope"][0].params
    assert (rope["head_dim"], rope["n_heads_q"], rope["n_heads_k"]) == (128, 32, 8)


def test_matmul_flops_and_bytes_follow_the_shape():
    inst = next(i for i in get_case("matmul").instances("bench") if i.params["m"] == 4096)
    assert inst.flops == 2 * 4096 ** 3
    assert inst.bytes_moved == 4 * 3 * 4096 * 4096


@pytest.mark.parametrize("inst", instances("validate", layers=["backend"]), ids=lambda i: i.case_id)
def test_reference_agrees_with_numpy_backend(inst):
    rec = run_instance(inst, numpy_target())
    assert rec["status"] == "pass", f"{inst.case_id} on NumpyBackend: {rec['status']}: {rec['reason']}"


def test_numpy_backend_bench_mode_records_timings():
    inst = get_case("add").instances("validate")[3]
    rec = run_instance(inst, numpy_target(), "bench")
    assert rec["status"] == "pass", rec["reason"]
    assert rec["host_ns"]["median"] > 0 and rec["host_ns"]["n"] >= 3
    assert rec["gbps"] == pytest.approx(inst.bytes_moved / rec["host_ns"]["median"])
    assert rec["timer"] == "host" and rec["gpu_ns"] is None  # NumPy has no GPU clock
    assert "CPU device" in rec["clocks"]


class _OutOfBounds(NumpyBackend):
    """Writes one float past the end of add's output: the guard bytes must catch it."""

    def _add(self, a, b, output, size):
        super()._add(a, b, output, size)
        self._f32(output, size, 1)[:] = 1.0


class _NanSilu(NumpyBackend):
    def _silu(self, input, output, size):
        super()._silu(input, output, size)
        self._f32(output, 0, 1)[:] = np.nan


class _WrongSoftmax(NumpyBackend):
    def _softmax(self, input, output, size):
        super()._softmax(input, output, size)
        self._f32(output, 0, size)[:] *= 1.001


class _Raises(NumpyBackend):
    def _element_mul(self, a, b, output, size):
        raise RuntimeError("kernel exploded")


def test_guard_bytes_catch_an_out_of_bounds_write():
    rec = run_instance(get_case("add").instances("validate")[2], numpy_target(_OutOfBounds()))
    assert rec["status"] == "fail"
    assert "guard byte after the output changed" in rec["reason"], rec["reason"]


def test_nan_in_output_is_a_failure():
    rec = run_instance(get_case("silu").instances("validate")[2], numpy_target(_NanSilu()))
    assert rec["status"] == "fail" and "NaN at index 0" in rec["reason"], rec["reason"]


def test_wrong_values_fail_with_the_nmse():
    rec = run_instance(get_case("softmax").instances("validate")[3], numpy_target(_WrongSoftmax()))
    assert rec["status"] == "fail" and "NMSE" in rec["reason"], rec["reason"]
    assert rec["metric"]["nmse"] > 1e-6


def test_an_exception_is_an_error_with_its_message():
    rec = run_instance(get_case("element_mul").instances("validate")[0], numpy_target(_Raises()))
    assert rec["status"] == "error" and "RuntimeError: kernel exploded" in rec["reason"], rec["reason"]


def test_missing_feature_is_unsupported_and_named():
    inst = next(i for i in get_case("kp_mul").instances("validate") if i.params["dtype"] == "float64")
    t = Target("vulkan", 0, {"features": {"float64": False}}, "single", [Lane(manager=object())])
    assert "shaderFloat64" in unsupported_reason(inst, t)
    rec = run_instance(inst, t)
    assert rec["status"] == "unsupported" and "shaderFloat64 (float64)" in rec["reason"]


def test_sizes_beyond_the_device_limits_are_unsupported():
    inst = next(i for i in get_case("add").instances("bench", "full") if i.params["size"] == 256 << 20)
    t = numpy_target(max_storage_buffer_range=128 << 20)
    rec = run_instance(inst, t)
    assert rec["status"] == "unsupported" and "maxStorageBufferRange" in rec["reason"], rec["reason"]
    small = numpy_target(memory_bytes=64 << 20)
    assert "of device memory" in unsupported_reason(inst, small)


def test_runtime_cases_need_the_runtime():
    rec = run_instance(get_case("kp_sync").instances("validate")[0], numpy_target())
    assert rec["status"] == "unsupported" and "kbench.runtime" in rec["reason"]


def test_runtime_cases_cover_the_kompute_operations_and_dtypes():
    ops = {op for c in ALL_CASES if c.layer == "runtime" for op in c.ops}
    for needed in ("OpTensorSyncDevice", "OpTensorSyncLocal", "OpTensorCopy", "OpMult", "OpMemoryBarrier",
                   "OpAlgoDispatch"):
        assert needed in ops, f"no runtime case exercises {needed}"
    assert {i.params["dtype"] for i in get_case("kp_mul").instances("validate")} == set(DTYPES)
    f64 = next(i for i in get_case("kp_mul").instances("validate") if i.params["dtype"] == "float64")
    assert f64.features == ("float64",)


def test_filter_patterns():
    keep = parse_filter(["softmax", "not large"])
    assert keep("softmax[size=5,scale=1]") and not keep("softmax_large[size=5,scale=30]")
    assert not keep("add[size=1]")
    glob = parse_filter(["rope*pos=8191*"])
    assert glob("rope[head_dim=128,n_heads_q=4,n_heads_k=2,pos=8191]") and not glob("rope[pos=1]")
    exact = parse_filter(["kp_sync[size=1000,"])  # brackets and commas are literal
    assert exact("kp_sync[size=1000,dtype=int8]") and not exact("kp_sync[size=1,dtype=int8]")
    assert parse_filter(None)("anything")


def test_nmse_and_exact_judges():
    ref = np.array([1.0, -2.0, 3.0])
    assert nmse(ref, ref) == 0.0
    assert judge_nmse({"o": ref.astype(np.float32)}, {"o": ref}, 1e-7).passed
    bad = judge_nmse({"o": np.array([1.0, -2.0, np.inf])}, {"o": ref}, 1e-7)
    assert not bad.passed and "infinity" in bad.reason
    ex = judge_exact({"o": np.array([1, 2, 4])}, {"o": np.array([1, 2, 3])})
    assert not ex.passed and "first mismatch at index 2: got 4, expected 3" in ex.reason


def _vulkan_device_or_skip():
    try:
        import kbench.runtime as kp

        if not kp.list_devices():
            pytest.skip("no Vulkan device (install mesa-vulkan-drivers for lavapipe)")
        return kp
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"Vulkan runtime unavailable: {exc}")


def test_runtime_cases_pass_on_the_vulkan_device():
    kp = _vulkan_device_or_skip()
    mgr = kp.Manager(0)
    try:
        t = Target("vulkan", 0, mgr.get_device_properties(), "single",
                   [Lane(kp=kp, manager=mgr, queue_index=0)])
        small = [i for i in instances("validate", layers=["runtime"])
                 if i.params.get("size", 0) <= 4097 or "size" not in i.params]
        bad = [(i.case_id, r["status"], r["reason"]) for i in small
               for r in [run_instance(i, t)] if r["status"] not in ("pass", "unsupported")]
        assert not bad, f"runtime cases failed: {bad[:5]}"
        stats = mgr.get_stats()
        assert stats["tensors"] == 0 and stats["algorithms"] == 0, f"cases leaked runtime objects: {stats}"
    finally:
        mgr.destroy()


def test_runtime_cases_split_across_async_lanes():
    kp = _vulkan_device_or_skip()
    mgr = kp.Manager(0)
    try:
        t = Target("vulkan", 0, mgr.get_device_properties(), "async",
                   [Lane(kp=kp, manager=mgr, queue_index=0) for _ in range(3)])
        rec = run_instance(get_case("kp_mult").instances("validate")[-1], t)
        assert rec["status"] == "pass", rec["reason"]
        assert rec["lanes"] == 3 and rec["queues"] == [[0, 0]]
    finally:
        mgr.destroy()


def test_peak_fraction_divides_the_matching_figure():
    from kbench.bench.peaks import peak_fraction

    peaks = {"peak.copy_bandwidth": 100.0, "peak.fp32_fma": 1000.0, "peak.h2d": 10.0}
    rec = {"gbps": 50.0, "gflops": 1.0}
    peak_fraction(rec, get_case("add").peak, peaks)
    assert rec["peak_fraction"] == pytest.approx(0.5) and rec["peak_name"] == "peak.copy_bandwidth"
    rec = {"gbps": 1.0, "gflops": 250.0}
    peak_fraction(rec, get_case("matmul").peak, peaks)
    assert rec["peak_fraction"] == pytest.approx(0.25) and rec["peak_name"] == "peak.fp32_fma"
    # transfers: the host-clock figure (bytes / host median) against the host-clock peak
    rec = {"gbps": 99.0, "bytes": 1000, "host_ns": {"median": 200.0}}
    peak_fraction(rec, get_case("copy_roundtrip").peak, peaks)
    assert rec["peak_fraction"] == pytest.approx(0.5) and rec["peak_name"] == "peak.h2d"
    rec = {"gbps": 1.0}
    peak_fraction(rec, get_case("add").peak, {})  # peak not measured: no fraction
    assert "peak_fraction" not in rec


class _ValidationStub:
    """A Manager stand-in whose validation layer complains once a case has run."""

    def __init__(self):
        self.messages: list[str] = []

    def validation_messages(self):
        return list(self.messages)


class _Complaining(NumpyBackend):
    def __init__(self, stub):
        super().__init__()
        self.stub = stub

    def _add(self, a, b, output, size):
        super()._add(a, b, output, size)
        self.stub.messages.append("VUID-vkCmdDispatch-None-02697: descriptor set not bound")


def test_validation_layer_messages_fail_a_passing_case():
    stub = _ValidationStub()
    t = Target("numpy", 0, {"features": {}}, "single", [Lane(backend=_Complaining(stub), manager=stub)])
    rec = run_instance(get_case("add").instances("validate")[0], t)
    assert rec["status"] == "fail" and "VUID-vkCmdDispatch-None-02697" in rec["reason"], rec["reason"]
    assert rec["validation_messages"] == stub.messages


def test_quantized_matmul_batches_are_declared_for_the_main_weight_types_only_and_run_with_full():
    from kbench.cases.op_helpers import QMATMUL_MAIN_DTYPES

    case = get_case("quantized_matmul")
    full = [i.params for i in case.instances("bench", sizes="full") if i.params.get("n_vecs")]
    assert {p["dtype"] for p in full} == set(QMATMUL_MAIN_DTYPES), "omit: no batch of the other weight types"
    assert {p["n_vecs"] for p in full} == {2, 4, 8}, full
    # cold (rotating copies) at 2, 4 and 8 vectors, and 8 re-reading one matrix for the ggml peer
    rotated = [p for p in full if p["rotate_mib"]]
    assert len(rotated) == 3 * 2 * len(QMATMUL_MAIN_DTYPES), rotated
    reread = [p for p in full if not p["rotate_mib"]]
    assert {p["n_vecs"] for p in reread} == {8} and len(reread) == 2 * len(QMATMUL_MAIN_DTYPES), reread
    assert not any(i.params.get("n_vecs") for i in case.instances("bench")), "batches run only with --full"
    p = full[0]
    assert case.flops(p) == 2 * p["n_vecs"] * p["n_rows"] * p["n_cols"]
    assert case.buffers(p)["output"] == 4 * p["n_vecs"] * p["n_rows"], "every vector's outputs are counted"
    batch = next(i for i in case.instances("validate") if i.params.get("n_vecs") == 3 and i.params["dtype"] == "Q4_0")
    inputs = case.generate(batch.params, np.random.default_rng(5))
    y = case.reference(inputs, batch.params)["y"]
    assert y.shape == (3 * 17,), f"the reference gives 3 products of 17 rows back to back, got {y.shape}"
