"""The result schema and the JSONL run store: round trips, interrupted writes, bad files."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import kbench
from kbench.results import (
    SCHEMA_VERSION, RecordError, ResultsFormatError, ResultsWarning, RunWriter, collect_provenance, git_revision,
    load_run_headers, load_runs, make_case_id, make_device_key,
)

REPO = Path(__file__).resolve().parents[1]

PROPS = {
    "device_name": "Test GPU 1", "vendor_id": 0x1002, "device_id": 0x73BF, "vendor_name": "AMD",
    "device_type": 2, "driver_name": "radv", "driver_version": "Mesa 24.0.1",
    "driver_info": "Mesa 24.0.1", "api_version": (1 << 22) | (3 << 12) | 274,
    "features": {"float16": True, "int8": True, "float64": False}, "subgroup_size": 64,
    "icd_file": "/usr/share/vulkan/icd.d/radeon_icd.x86_64.json",
}


def case_record(**overrides):
    rec = {"case": "softmax", "params": {"size": 4096, "dtype": "f32"}, "mode": "bench",
           "status": "pass", "queue_config": "single", "queues": [[0, 0]],
           "gpu_ns": {"median": 1500.0, "min": 1400.0, "max": 1700.0, "mean": 1520.0,
                      "stdev": 30.0, "iqr": 40.0, "n": 10, "repeats": 20},
           "bytes": 32768, "flops": 0, "gbps": 21.8, "peak_name": "peak.copy_bandwidth"}
    rec.update(overrides)
    return rec


def new_writer(tmp_path, props=PROPS, backend="vulkan") -> RunWriter:
    return RunWriter(tmp_path, collect_provenance(props, backend))


def test_round_trip_through_pandas_keeps_values_and_flattens_nested_fields(tmp_path):
    with new_writer(tmp_path) as run:
        run.write(case_record())
        run.write(case_record(mode="validate", status="fail", reason="NMSE 3e-2 > 1e-6",
                              gpu_ns=None, metric={"nmse": 0.03, "max_abs_err": 0.5,
                                                   "first_mismatch": 17}))
        run.write_peak("peak.copy_bandwidth", 512.5)
    df = load_runs([tmp_path])
    assert len(df) == 3, f"expected 3 records, got {len(df)}"
    bench = df[(df["kind"] == "case") & (df["mode"] == "bench")].iloc[0]
    assert bench["case_id"] == "softmax[size=4096,dtype=f32]"
    assert bench["gpu_ns.median"] == 1500.0 and bench["gpu_ns.repeats"] == 20
    assert bench["params.size"] == 4096 and bench["params.dtype"] == "f32"
    assert bench["run_id"] == run.run_id and bench["device_name"] == "Test GPU 1"
    assert bench["api_version"] == "1.3.274", f"api_version decoded wrongly: {bench['api_version']}"
    assert bench["device_key"] == run.header["device_key"]
    assert bench["source_line"] == 2, "the header is line 1, the first record line 2"
    failed = df[df["status"] == "fail"].iloc[0]
    assert failed["metric.nmse"] == 0.03 and failed["reason"] == "NMSE 3e-2 > 1e-6"
    peak = df[df["kind"] == "peak"].iloc[0]
    assert (peak["peak"], peak["value"], peak["unit"]) == ("peak.copy_bandwidth", 512.5, "GB/s")
    assert [h["run_id"] for h in df.attrs["runs"]] == [run.run_id]
    assert df.attrs["warnings"] == []


def test_header_carries_provenance_and_device_identity(tmp_path):
    with new_writer(tmp_path) as run:
        pass
    header = json.loads(run.path.read_text().splitlines()[0])
    assert header["kind"] == "run" and header["schema_version"] == SCHEMA_VERSION
    assert header["run_id"] == run.run_id and run.path.name == f"{run.run_id}.jsonl"
    assert header["kbench_version"] == kbench.__version__
    assert header["git_revision"], "git revision must be a commit or 'unknown'"
    assert {"numpy", "pandas"} <= set(header["packages"]), header["packages"]
    device = header["device"]
    for field in ("vendor_id", "vendor_name", "device_id", "device_name", "device_type",
                  "driver_name", "driver_version", "driver_info", "api_version", "icd_file"):
        assert field in device, f"device identity lacks {field}"
    assert device["device_type"] == "discrete_gpu" and device["vendor_id"] == 0x1002
    assert device["features"] == {"float16": True, "int8": True, "float64": False}
    assert header["started"].endswith("Z")
    assert "test-gpu-1" in run.run_id, f"run_id should name the device: {run.run_id}"
    assert load_run_headers([run.path])[0]["run_id"] == run.run_id


def test_numpy_backend_provenance_names_the_cpu(tmp_path):
    prov = collect_provenance(None, "numpy")
    assert prov["device"]["device_type"] == "cpu" and prov["device"]["driver_name"] == "numpy"
    assert prov["device"]["driver_version"] == np.__version__
    with RunWriter(tmp_path, prov) as run:
        rec = run.write(case_record(gpu_ns=None, host_ns={"median": 9000.0, "stdev": 100.0}))
    assert rec["backend"] == "numpy" and "numpy" in run.run_id


def test_a_backend_without_a_device_is_not_named_after_the_cpu():
    prov = collect_provenance(None, "torch-cuda")
    assert prov["device"]["device_name"] == "no device" and prov["backend"] == "torch-cuda"


def test_each_record_is_on_disk_before_the_writer_closes(tmp_path):
    run = new_writer(tmp_path)
    run.write(case_record())
    lines = run.path.read_text().splitlines()
    assert len(lines) == 2, f"expected header + 1 record on disk while open, found {len(lines)} lines"
    run.close()
    with pytest.raises(ValueError, match="closed"):
        run.write(case_record())


def test_numpy_values_and_nan_are_stored_as_strict_json(tmp_path):
    with new_writer(tmp_path) as run:
        run.write(case_record(mode="validate", status="fail", reason="NaN in output", gpu_ns=None,
                              bytes=np.int64(64), metric={"nmse": float("nan"), "max_abs_err": np.float32(0.25)}))
    raw = run.path.read_text().splitlines()[1]
    json.loads(raw, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c} written"))
    row = load_runs(run.path).iloc[0]
    assert math.isnan(row["metric.nmse"]), f"NaN NMSE must load back as NaN, got {row['metric.nmse']!r}"
    assert row["metric.max_abs_err"] == 0.25 and row["bytes"] == 64


@pytest.mark.parametrize("overrides, message", [
    ({"status": "passed"}, "status"),
    ({"mode": "benchmark"}, "mode"),
    ({"status": "fail", "reason": ""}, "reason"),
    ({"gpu_ns": None}, "gpu_ns"),
    ({"queues": [[0, True]]}, "queues"),
    ({"queues": [0, 0]}, "queues"),
    ({"bytes": "many"}, "bytes"),
    ({"gpu_ns": {"stdev": 1.0}}, "median"),
    ({"params": "size=4"}, "params"),
])
def test_write_rejects_records_that_break_the_schema(tmp_path, overrides, message):
    with new_writer(tmp_path) as run:
        with pytest.raises(RecordError, match=message):
            run.write(case_record(**overrides))
    assert len(run.path.read_text().splitlines()) == 1, "a rejected record must not reach the file"


def test_write_requires_the_queue_configuration(tmp_path):
    rec = case_record()
    del rec["queue_config"]
    with new_writer(tmp_path) as run, pytest.raises(RecordError, match="queue_config"):
        run.write(rec)


def test_two_runs_with_the_same_id_get_distinct_files(tmp_path):
    prov = collect_provenance(PROPS, "vulkan")
    with RunWriter(tmp_path, prov) as a, RunWriter(tmp_path, prov) as b:
        pass
    assert a.path != b.path and b.run_id == f"{a.run_id}-2"
    assert len(load_runs([tmp_path]).attrs["runs"]) == 2


def test_truncated_last_line_is_reported_with_file_and_line(tmp_path):
    with new_writer(tmp_path) as run:
        for size in (64, 128, 256):
            run.write(case_record(params={"size": size, "dtype": "f32"}))
    data = run.path.read_bytes()
    run.path.write_bytes(data[:-25])  # cut the last record short, as a killed writer would
    with pytest.warns(ResultsWarning, match=rf"{run.path.name}:4: last line is cut short"):
        df = load_runs([run.path])
    assert sorted(df["params.size"]) == [64, 128], f"complete records must load, got {list(df['params.size'])}"
    assert len(df.attrs["warnings"]) == 1 and f"{run.path}:4" in df.attrs["warnings"][0]


def test_a_killed_writer_leaves_a_loadable_file(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from kbench.results import RunWriter, collect_provenance
        run = RunWriter({str(tmp_path)!r}, collect_provenance(None, "numpy"))
        print(run.path, flush=True)
        i = 0
        while True:
            run.write({{"case": "add", "params": {{"i": i, "pad": "x" * 2000}}, "mode": "validate",
                       "status": "pass", "queue_config": "single", "queues": []}})
            i += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        path = Path(proc.stdout.readline().strip())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not path.exists() or path.stat().st_size < 20_000):
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert path.stat().st_size >= 20_000, "the writer subprocess produced too little to test"
    with _AllowResultsWarning():
        df = load_runs([path])
    written = sorted(df["params.i"].astype(int))
    assert written == list(range(len(written))), "records must be complete and in order"
    assert len(written) >= 5


class _AllowResultsWarning:
    """A kill can land mid-write (then a ResultsWarning is due) or between writes (then none)."""

    def __enter__(self):
        import warnings
        self._ctx = warnings.catch_warnings(record=True)
        self.caught = self._ctx.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        others = [w for w in self.caught if not issubclass(w.category, ResultsWarning)]
        assert not others, f"unexpected warnings: {[str(w.message) for w in others]}"


def _write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def _valid_lines(tmp_path) -> list[dict]:
    with new_writer(tmp_path / "src") as run:
        run.write(case_record())
        run.write(case_record(params={"size": 8, "dtype": "f32"}))
    return [json.loads(line) for line in run.path.read_text().splitlines()]


@pytest.mark.parametrize("mutate, line, message", [
    (lambda ls: ls[:1] + ["{not json"] + ls[2:], 2, "not valid JSON"),
    (lambda ls: ls[1:], 1, "missing run header"),
    (lambda ls: [{**ls[0], "schema_version": 99}] + ls[1:], 1, "unknown schema_version 99"),
    (lambda ls: ls[:2] + [{k: v for k, v in ls[2].items() if k != "status"}], 3, "status"),
    (lambda ls: ls[:2] + [{**ls[2], "run_id": "other"}], 3, "run_id"),
    (lambda ls: ls[:2] + [[1, 2, 3]], 3, "expected a JSON object"),
    (lambda ls: ls + [ls[0]], 4, "second run header"),
])
def test_bad_files_raise_naming_file_and_line(tmp_path, mutate, line, message):
    bad = _write_lines(tmp_path / "bad.jsonl", mutate(_valid_lines(tmp_path)))
    with pytest.raises(ResultsFormatError, match=message) as info:
        load_runs([bad])
    assert str(info.value).startswith(f"{bad}:{line}:"), f"message must start with file:line, got {info.value}"
    assert info.value.line == line


def test_foreign_and_empty_files_are_refused(tmp_path):
    foreign = tmp_path / "notes.jsonl"
    foreign.write_text('{"name": "something else", "value": 3}\n')
    with pytest.raises(ResultsFormatError, match=r"notes.jsonl:1: missing run header"):
        load_runs([foreign])
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ResultsFormatError, match=r"empty.jsonl:1: empty file"):
        load_runs([empty])
    with pytest.raises(ResultsFormatError, match="missing run header"):
        load_run_headers([foreign])


def test_folders_are_searched_recursively_and_missing_paths_raise(tmp_path):
    with new_writer(tmp_path / "a" / "b") as run:
        run.write(case_record())
    (tmp_path / "a" / "README.md").write_text("not results")
    df = load_runs([tmp_path])
    assert list(df["run_id"]) == [run.run_id]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_runs([tmp_path / "nope"])
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"no \*\.jsonl"):
        load_runs([empty])


def test_the_same_run_given_twice_is_an_error_not_a_double_count(tmp_path):
    with new_writer(tmp_path / "x") as run:
        run.write(case_record())
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(run.path.read_bytes())
    with pytest.raises(ResultsFormatError, match="already loaded"):
        load_runs([run.path, copy])
    assert len(load_runs([run.path, tmp_path / "x"])) == 1, "the same file named twice is read once"


def test_case_id_and_device_key_are_stable_and_distinguish_drivers():
    assert make_case_id("softmax", {"size": 4096, "dtype": "f32"}) == "softmax[size=4096,dtype=f32]"
    assert make_case_id("matmul", {"shape": (64, 32)}) == "matmul[shape=64x32]"
    assert make_case_id("fill", {}) == "fill"
    ident = {"vendor_id": 1, "device_id": 2, "device_name": "GPU X", "driver_name": "d",
             "driver_version": "1.0"}
    assert make_device_key(ident) == make_device_key(dict(ident))
    assert make_device_key(ident) != make_device_key({**ident, "driver_version": "1.1"})
    assert make_device_key(ident).startswith("gpu-x-")


def test_schema_document_example_is_a_loadable_run(tmp_path):
    doc = (REPO / "results" / "SCHEMA.md").read_text()
    example = doc.split("## Example")[1].split("```json")[1].split("```")[0].strip()
    path = tmp_path / "example.jsonl"
    path.write_text(example + "\n")
    df = load_runs([path])
    assert sorted(df["kind"]) == ["case", "peak"], "the documented example must follow the schema"


def test_schema_document_names_every_required_field():
    from kbench.results.schema import CASE_OPTIONAL, CASE_REQUIRED, PEAK_REQUIRED, RUN_REQUIRED
    doc = (REPO / "results" / "SCHEMA.md").read_text()
    fields = set(RUN_REQUIRED) | set(CASE_REQUIRED) | set(PEAK_REQUIRED) | set(CASE_OPTIONAL)
    undocumented = sorted(f for f in fields if f"`{f}`" not in doc)
    assert not undocumented, f"results/SCHEMA.md does not document: {undocumented}"


def test_shipped_json_schema_matches_the_python_schema():
    from kbench.results.schema import json_schema
    shipped = json.loads((REPO / "kbench" / "results" / "schema.json").read_text())
    assert shipped == json_schema(), "kbench/results/schema.json is stale: run `python -m kbench.results`"


def test_json_schema_accepts_written_records_and_rejects_bad_ones(tmp_path):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    from kbench.results.schema import json_schema
    validator = jsonschema.Draft202012Validator(json_schema())
    with new_writer(tmp_path) as run:
        run.write(case_record())
        run.write(case_record(mode="validate", status="fail", reason="NaN output", gpu_ns=None,
                              metric={"nmse": float("nan")}))
        run.write_peak("peak.fp32_fma", 1234.5)
    for number, line in enumerate(run.path.read_text().splitlines(), start=1):
        errors = [e.message for e in validator.iter_errors(json.loads(line))]
        assert not errors, f"line {number} rejected by the JSON Schema: {errors}"
    bad = json.loads(run.path.read_text().splitlines()[1])
    bad["status"] = "passed"
    assert not validator.is_valid(bad), "a status outside the schema's list must be rejected"


def test_a_given_revision_names_a_tree_copied_without_its_history(tmp_path, monkeypatch):
    # a copied tree whose .git is stale (or absent) says which commit it holds through the environment
    monkeypatch.setenv("KBENCH_GIT_REVISION", "1b4df67")
    assert git_revision() == "1b4df67"
    with new_writer(tmp_path) as run:
        pass
    header = json.loads(run.path.read_text().splitlines()[0])
    assert header["git_revision"] == "1b4df67", f"expected the given revision, got {header['git_revision']!r}"
    monkeypatch.setenv("KBENCH_GIT_REVISION", "  ")
    assert git_revision() != "  ", "a blank KBENCH_GIT_REVISION must fall back to git"
