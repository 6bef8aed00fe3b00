"""The result-record constructors and the case-id format of kbench.results.records."""

from __future__ import annotations

import pytest

from kbench.results import (
    RecordError, RunWriter, case_error, case_name, case_record, collect_provenance, implementation_of,
    load_runs, make_case_id, parse_case_id, peak_record, validate_record,
)


def test_case_id_parses_back_into_its_name_and_parameter_texts():
    cid = make_case_id("quantized_matmul", {"n_rows": 64, "shape": (2, 3), "dtype": "Q4_0"})
    assert cid == "quantized_matmul[n_rows=64,shape=2x3,dtype=Q4_0]"
    parsed = parse_case_id(cid)
    assert parsed.name == "quantized_matmul"
    assert parsed.params == {"n_rows": "64", "shape": "2x3", "dtype": "Q4_0"}
    assert parse_case_id("peak.h2d") == ("peak.h2d", {}), "an id without brackets has no parameters"
    assert case_name("softmax[size=4096]") == "softmax"


def test_case_record_fills_the_id_and_leaves_the_rest_to_the_caller():
    rec = case_record("softmax", {"size": 8}, mode="validate", status="pass", layer="backend")
    assert rec == {"kind": "case", "case": "softmax", "params": {"size": 8}, "case_id": "softmax[size=8]",
                   "mode": "validate", "status": "pass", "reason": "", "layer": "backend"}
    err = case_error("rope[head_dim=64]", "bench", "timed out", queue_config="single", queues=[])
    assert (err["case"], err["case_id"], err["status"], err["params"]) == ("rope", "rope[head_dim=64]", "error", {})
    assert peak_record("peak.h2d", 12.5, "GB/s")["kind"] == "peak"


PROPS = {"device_name": "GPU", "vendor_id": 1, "device_id": 2, "driver_name": "d", "driver_version": "1",
         "api_version": "1.3.0"}


@pytest.mark.parametrize("backend, given, expected", [
    ("vulkan", None, "kbench"), ("numpy", None, "numpy"), ("torch-cuda", None, "torch-cuda"),
    ("vulkan", "yule@1ef0762", "yule@1ef0762"),
])
def test_every_written_record_carries_the_runs_implementation(tmp_path, backend, given, expected):
    header = collect_provenance(PROPS, backend, implementation=given)
    assert header["implementation"] == expected
    with RunWriter(tmp_path, header) as run:
        case = run.write(case_record("softmax", {"size": 8}, mode="validate", status="pass",
                                     queue_config="single", queues=[]))
        peak = run.write_peak("peak.h2d", 3.0)
    assert case["implementation"] == expected and peak["implementation"] == expected
    assert set(load_runs(tmp_path)["implementation"]) == {expected}


def test_records_without_an_implementation_field_derive_it_from_the_backend(tmp_path):
    assert implementation_of({"backend": "vulkan"}) == "kbench"
    assert implementation_of({"backend": "torch-cuda", "peer": True}) == "torch-cuda"
    assert implementation_of({"backend": "numpy"}) == "numpy"
    header = collect_provenance(PROPS, "vulkan")
    del header["implementation"]  # a run written before the field existed
    with RunWriter(tmp_path, header) as run:
        run.write(case_record("softmax", {"size": 8}, mode="validate", status="pass",
                              queue_config="single", queues=[], implementation=None))
    frame = load_runs(tmp_path)
    assert list(frame["implementation"]) == ["kbench"]


def test_implementation_must_be_text():
    rec = {**case_record("softmax", {}, mode="validate", status="pass", queue_config="single", queues=[]),
           "schema_version": 1, "run_id": "r", "time": "t", "device_name": "", "vendor_name": "",
           "driver_name": "", "driver_version": "", "api_version": "", "device_key": "k", "backend": "vulkan",
           "implementation": 3}
    with pytest.raises(RecordError, match="'implementation' must be str"):
        validate_record(rec)
