"""Reports over small result sets written with RunWriter: tables, ratios, compare, plots, folder."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from kbench.report import (
    compare, correctness_matrix, devices_table, failures_table, performance_long, performance_matrix,
    queue_config_long, render_table, write_report,
)
from kbench.report.cli import compare_main, report_main
from kbench.report.compare import correctness_change
from kbench.results import RunWriter, collect_provenance, load_runs

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def props(name: str, driver_version: str = "1.0", vendor_id: int = 0x1002) -> dict:
    return {"device_name": name, "vendor_id": vendor_id, "device_id": 7, "vendor_name": "Vendor",
            "device_type": 2, "driver_name": "drv", "driver_version": driver_version,
            "driver_info": "", "api_version": "1.3.0", "features": {"float16": True}}


def timing(median: float, rel_stdev: float = 0.01) -> dict:
    return {"median": median, "min": median * 0.99, "max": median * 1.02, "mean": median,
            "stdev": median * rel_stdev, "iqr": median * rel_stdev * 1.349, "n": 10, "repeats": 4}


def bench(case: str, params: dict, median: float, *, nbytes: int = 0, flops: int = 0,
          queue_config: str = "single", rel_stdev: float = 0.01, **extra) -> dict:
    return {"case": case, "params": params, "mode": "bench", "status": "pass",
            "queue_config": queue_config, "queues": [[0, 0]], "gpu_ns": timing(median, rel_stdev),
            "bytes": nbytes, "flops": flops, **extra}


def validate(case: str, params: dict, status: str = "pass", reason: str = "", **extra) -> dict:
    return {"case": case, "params": params, "mode": "validate", "status": status, "reason": reason,
            "queue_config": "single", "queues": [[0, 0]], **extra}


def make_run(directory: Path, name: str, records: list[dict], *, backend: str = "vulkan",
             driver_version: str = "1.0", peaks: dict | None = None) -> Path:
    with RunWriter(directory, collect_provenance(props(name, driver_version), backend)) as run:
        for peak, value in (peaks or {}).items():
            run.write_peak(peak, value)
        for rec in records:
            run.write(rec)
    return run.path


SOFTMAX = {"size": 4096, "dtype": "f32"}
MATMUL = {"m": 64, "n": 64, "k": 64, "dtype": "f32"}
MATMUL_F16 = {"m": 64, "n": 64, "k": 64, "dtype": "f16"}


def standard_run(directory: Path, name: str, speed: float, *, backend: str = "vulkan",
                 softmax_status: str = "pass", driver_version: str = "1.0") -> Path:
    """softmax (bandwidth) + f32/f16 matmul (compute) + q4 (unsupported), peaks scaled by speed."""
    softmax_reason = "NMSE 2.1e-02 > 1e-06" if softmax_status == "fail" else ""
    return make_run(directory, name, [
        validate("softmax", SOFTMAX, softmax_status, softmax_reason, metric={"nmse": 0.021}),
        bench("softmax", SOFTMAX, 32768 / (20.0 * speed), nbytes=32768),
        validate("matmul", MATMUL),
        bench("matmul", MATMUL, 5000 / speed, nbytes=49152, flops=2 * 64 ** 3),
        bench("matmul", MATMUL, 2500 / speed, nbytes=49152, flops=2 * 64 ** 3, queue_config="async-4"),
        bench("matmul", MATMUL_F16, 2000 / speed, nbytes=24576, flops=2 * 64 ** 3),
        validate("mul_mat_q4_0", {"n": 256}, "unsupported", "device lacks storage_buffer_8bit"),
    ], backend=backend, driver_version=driver_version,
        # ridge points (FMA peak / bandwidth) 5 and 10 FLOP/byte: both matmuls are compute-bound
        peaks={"peak.copy_bandwidth": 40.0 * speed, "peak.fp32_fma": 200.0 * speed,
               "peak.fp16_fma": 400.0 * speed})


@pytest.fixture
def three_devices(tmp_path) -> Path:
    runs = tmp_path / "runs"
    standard_run(runs, "GPU Alpha", 1.0)
    standard_run(runs, "GPU Beta", 2.0, softmax_status="fail")
    standard_run(runs, "GPU Alpha", 3.0, backend="torch-cuda")
    return runs


# ------------------------------------------------------------------------------ tables

def test_correctness_matrix_shows_unsupported_and_failed_differently(three_devices):
    df = load_runs([three_devices])
    matrix = correctness_matrix(df)
    assert list(matrix.columns) == ["GPU Alpha", "GPU Beta", "GPU Alpha (torch-cuda)"]
    assert matrix.loc["softmax[size=4096,dtype=f32]", "GPU Beta"] == "FAIL"
    assert matrix.loc["softmax[size=4096,dtype=f32]", "GPU Alpha"] == "pass"
    assert matrix.loc["mul_mat_q4_0[n=256]", "GPU Beta"] == "unsupported"
    with_reasons = correctness_matrix(df, reasons=True)
    cell = with_reasons.loc["softmax[size=4096,dtype=f32]", "GPU Beta"]
    assert cell.startswith("FAIL") and "NMSE 2.1e-02" in cell, cell
    assert "storage_buffer_8bit" in with_reasons.loc["mul_mat_q4_0[n=256]", "GPU Alpha"]
    failures = failures_table(df)
    assert list(failures["device"]) == ["GPU Beta"] and "NMSE" in failures["reason"].iloc[0]
    assert re.search(r"\.jsonl:\d+$", failures["where"].iloc[0]), failures["where"].iloc[0]


def test_case_missing_on_a_device_is_marked_not_run(tmp_path):
    make_run(tmp_path, "GPU A", [validate("add", {"n": 4}), validate("mul", {"n": 4})])
    make_run(tmp_path, "GPU B", [validate("add", {"n": 4})])
    matrix = correctness_matrix(load_runs([tmp_path]))
    assert matrix.loc["mul[n=4]", "GPU B"] == "not run"


def test_two_drivers_of_one_device_get_separate_columns(tmp_path):
    make_run(tmp_path, "GPU A", [validate("add", {"n": 4})], driver_version="1.0")
    make_run(tmp_path, "GPU A", [validate("add", {"n": 4}, "fail", "NMSE 1 > 1e-6")], driver_version="2.0")
    matrix = correctness_matrix(load_runs([tmp_path]))
    assert sorted(matrix.columns) == ["GPU A [drv 1.0]", "GPU A [drv 2.0]"]
    assert matrix.loc["add[n=4]", "GPU A [drv 2.0]"] == "FAIL"


def test_the_newest_run_of_a_device_wins(tmp_path):
    make_run(tmp_path, "GPU A", [validate("add", {"n": 4}, "fail", "NMSE 1 > 1e-6")])
    make_run(tmp_path, "GPU A", [validate("add", {"n": 4})])
    df = load_runs([tmp_path])
    assert len(df) == 2, "both runs are loaded"
    assert correctness_matrix(df).loc["add[n=4]", "GPU A"] == "pass"


def test_a_run_with_other_kernel_options_is_kept_apart_from_the_default_run(tmp_path):
    make_run(tmp_path, "GPU A", [bench("qmv", {"n": 4}, 1000.0, nbytes=4000)])
    prov = collect_provenance(props("GPU A"), "vulkan")
    prov["backend_options"] = {"qmatvec": {"layout": "packed", "rows": 8}}
    with RunWriter(tmp_path, prov) as run:  # newer, but another experiment
        run.write(bench("qmv", {"n": 4}, 500.0, nbytes=4000))
    df = load_runs([tmp_path])
    assert sorted(df["variant"]) == ["", "qmatvec layout=packed,rows=8"], list(df["variant"])
    perf = performance_matrix(df)
    assert list(perf.index) == ["qmv[n=4]", "qmv[n=4] [qmatvec layout=packed,rows=8]"], list(perf.index)
    assert perf.loc["qmv[n=4]", "GPU A"] != perf.loc["qmv[n=4] [qmatvec layout=packed,rows=8]", "GPU A"]


def test_error_in_bench_mode_outranks_a_passing_validation(tmp_path):
    make_run(tmp_path, "GPU A", [validate("add", {"n": 4}),
                                 {**validate("add", {"n": 4}, "error", "DeviceLostError: timeout"),
                                  "mode": "bench"}])
    matrix = correctness_matrix(load_runs([tmp_path]), reasons=True)
    assert matrix.loc["add[n=4]", "GPU A"] == "error: bench: DeviceLostError: timeout"


def test_performance_ratios_and_peak_fractions_follow_the_records(three_devices):
    df = load_runs([three_devices])
    long = performance_long(df, baseline="GPU Alpha").set_index(["device", "row"])
    base_t = long.loc[("GPU Alpha", "softmax[size=4096,dtype=f32]"), "time_ns"]
    beta = long.loc[("GPU Beta", "softmax[size=4096,dtype=f32]")]
    assert beta["vs_baseline"] == pytest.approx(base_t / beta["time_ns"])
    assert beta["vs_baseline"] == pytest.approx(2.0), "Beta is twice as fast in the records"
    assert beta["unit"] == "GB/s" and beta["peak_name"] == "peak.copy_bandwidth"
    assert beta["throughput"] == pytest.approx(32768 / beta["time_ns"])
    assert beta["peak_fraction"] == pytest.approx(beta["throughput"] / 80.0)
    mm = long.loc[("GPU Alpha", "matmul[m=64,n=64,k=64,dtype=f32]")]
    assert (mm["unit"], mm["peak_name"]) == ("GFLOP/s", "peak.fp32_fma")
    assert mm["peak_fraction"] == pytest.approx(2 * 64 ** 3 / 5000 / 200.0)
    half = long.loc[("GPU Alpha", "matmul[m=64,n=64,k=64,dtype=f16]")]
    assert half["peak_name"] == "peak.fp16_fma", "an f16 case is measured against the fp16 peak"
    peer = long.loc[("GPU Alpha (torch-cuda)", "matmul[m=64,n=64,k=64,dtype=f32]")]
    assert peer["vs_baseline"] == pytest.approx(3.0), "the CUDA peer column gets its own ratio"
    matrix = performance_matrix(df, baseline="Alpha")
    assert list(matrix.columns)[0] == "GPU Alpha", "the baseline column comes first"
    assert "2.00× base" in matrix.loc["softmax[size=4096,dtype=f32]", "GPU Beta"]


def test_low_intensity_cases_are_judged_by_bandwidth(tmp_path):
    # 1 FLOP per 12 bytes (an elementwise add) is far below any ridge point
    make_run(tmp_path, "GPU A", [bench("add", {"n": 1024}, 1000.0, nbytes=12288, flops=1024),
                                 bench("gemm", {"n": 64}, 1000.0, nbytes=1000, flops=100_000)],
             peaks={"peak.copy_bandwidth": 100.0, "peak.fp32_fma": 2000.0})
    long = performance_long(load_runs([tmp_path])).set_index("case")
    assert (long.loc["add", "unit"], long.loc["add", "peak_name"]) == ("GB/s", "peak.copy_bandwidth")
    assert long.loc["add", "peak_fraction"] == pytest.approx(12.288 / 100.0)
    assert (long.loc["gemm", "unit"], long.loc["gemm", "peak_name"]) == ("GFLOP/s", "peak.fp32_fma")


def test_unknown_baseline_names_the_available_devices(three_devices):
    df = load_runs([three_devices])
    with pytest.raises(ValueError, match="GPU Beta"):
        performance_long(df, baseline="Gamma")


def test_recorded_peak_fraction_is_kept_when_no_peak_was_measured(tmp_path):
    make_run(tmp_path, "GPU A", [bench("copy", {"n": 8}, 100.0, nbytes=1000,
                                       peak_fraction=0.42, peak_name="peak.copy_bandwidth")])
    row = performance_long(load_runs([tmp_path])).iloc[0]
    assert (row["peak_fraction"], row["peak_source"]) == (0.42, "recorded")


def test_queue_configuration_speedup_is_single_time_over_config_time(three_devices):
    long = queue_config_long(load_runs([three_devices]))
    beta = long[(long["device"] == "GPU Beta")].set_index("queue_config")
    assert beta.loc["async-4", "speedup_vs_single"] == pytest.approx(
        beta.loc["single", "time_ns"] / beta.loc["async-4", "time_ns"])
    assert beta.loc["single", "speedup_vs_single"] == pytest.approx(1.0)
    assert set(long["case_id"]) == {"matmul[m=64,n=64,k=64,dtype=f32]"}, "only cases run under several configs"


def test_queue_speedup_credits_the_work_of_every_lane(tmp_path):
    make_run(tmp_path, "GPU A", [
        bench("add", {"n": 4}, 1000.0, nbytes=100),
        {**bench("add", {"n": 4}, 1500.0, nbytes=200, queue_config="one-per-family"),
         "queues": [[0, 0], [1, 0]]}])
    long = queue_config_long(load_runs([tmp_path])).set_index("queue_config")
    expected = (200 / 1500.0) / (100 / 1000.0)
    assert long.loc["one-per-family", "speedup_vs_single"] == pytest.approx(expected)
    assert long.loc["one-per-family", "queues"] == "0:0 1:0"


def test_devices_table_lists_measured_peaks_per_device(three_devices):
    table = devices_table(load_runs([three_devices])).set_index("device")
    assert table.loc["GPU Beta", "peak.copy_bandwidth"] == "80 GB/s"
    assert table.loc["GPU Alpha (torch-cuda)", "backend"] == "torch-cuda"
    assert table.loc["GPU Alpha", "features"] == "float16"


def test_peak_cases_count_as_measured_peaks(tmp_path):
    make_run(tmp_path, "GPU A", [
        bench("peak.copy_bandwidth", {}, 1000.0, nbytes=50_000),
        bench("copy", {"n": 1}, 1000.0, nbytes=25_000)])
    row = performance_long(load_runs([tmp_path])).iloc[0]
    assert row["case"] == "copy", "peak measurements are not listed as cases"
    assert row["peak_value"] == pytest.approx(50.0) and row["peak_fraction"] == pytest.approx(0.5)


def test_render_formats(three_devices):
    matrix = correctness_matrix(load_runs([three_devices]))
    md = render_table(matrix, "md")
    assert md.splitlines()[1].startswith("|--"), "GitHub table separator expected"
    assert "softmax[size=4096,dtype=f32]" in render_table(matrix, "simple")
    html = render_table(matrix, "html")
    assert '<td class="st-fail">FAIL</td>' in html and 'class="st-unsupported"' in html
    records = json.loads(render_table(matrix, "json"))
    assert records[0]["case"] == matrix.index[0]
    assert render_table(matrix, "csv").splitlines()[0].startswith("case,")
    with pytest.raises(ValueError, match="unknown table format"):
        render_table(matrix, "latex")


# ----------------------------------------------------------------------------- compare

def run_with(directory: Path, median: float, rel_stdev: float = 0.01, status: str = "pass",
             extra: list[dict] | None = None) -> pd.DataFrame:
    records = [validate("add", {"n": 4}, status, "" if status == "pass" else f"{status} here"),
               bench("add", {"n": 4}, median, nbytes=48, rel_stdev=rel_stdev)] + (extra or [])
    return load_runs([make_run(directory, "GPU A", records)])


@pytest.mark.parametrize("cur_median, rel_stdev, verdict", [
    (1040.0, 0.01, "same"),     # +4%: inside the 5% threshold
    (1080.0, 0.01, "slower"),   # +8%: outside threshold and noise (3*sqrt(2)*1% = 4.2%)
    (1150.0, 0.05, "same"),     # +15%: inside the noise band 3*sqrt(2)*5% = 21%
    (1250.0, 0.05, "slower"),   # +25%: outside it
    (900.0, 0.01, "faster"),
])
def test_noise_band_decides_the_verdict(tmp_path, cur_median, rel_stdev, verdict):
    base = run_with(tmp_path / "b", 1000.0, rel_stdev)
    cur = run_with(tmp_path / "c", cur_median, rel_stdev)
    result = compare(base, cur, threshold=0.05, noise_k=3.0)
    row = result.table[result.table["mode"] == "bench"].iloc[0]
    assert row["verdict"] == verdict, f"change {row['change']:+.3f} band {row['band']:.3f}"
    assert row["band"] == pytest.approx(max(0.05, 3.0 * (2 * rel_stdev ** 2) ** 0.5))
    assert result.exit_code == (1 if verdict == "slower" else 0)


def test_new_and_missing_cases(tmp_path):
    base = run_with(tmp_path / "b", 1000.0, extra=[validate("gone", {"n": 1})])
    cur = run_with(tmp_path / "c", 1000.0, extra=[validate("fresh", {"n": 1})])
    table = compare(base, cur).table.set_index("case_id")
    assert table.loc["gone[n=1]", "verdict"] == "missing"
    assert table.loc["fresh[n=1]", "verdict"] == "new"
    # issue 22: a missing case fails the gate unless asked
    assert compare(base, cur).exit_code == 1
    assert compare(base, cur, allow_missing=True).exit_code == 0


@pytest.mark.parametrize("before, after, change, exit_code", [
    ("pass", "fail", "loss", 1), ("pass", "error", "loss", 1), ("pass", "unsupported", "loss", 1),
    ("fail", "pass", "gain", 0), ("unsupported", "pass", "gain", 0), ("fail", "error", "changed", 0),
])
def test_correctness_changes_are_always_reported(tmp_path, before, after, change, exit_code):
    base = run_with(tmp_path / "b", 1000.0, status=before)
    cur = run_with(tmp_path / "c", 1000.0, status=after)
    result = compare(base, cur)
    row = result.table[result.table["mode"] == "validate"].iloc[0]
    assert (row["base_status"], row["cur_status"], row["correctness"]) == (before, after, change)
    assert result.exit_code == exit_code
    assert f"{before} -> {after}" in result.format("text")
    assert correctness_change(before, after) == change


def test_driver_update_matches_by_name_only_when_asked(tmp_path):
    base = load_runs([standard_run(tmp_path / "b", "GPU A", 1.0, driver_version="1.0")])
    cur = load_runs([standard_run(tmp_path / "c", "GPU A", 1.0, driver_version="2.0")])
    by_key = compare(base, cur)
    assert set(by_key.table["verdict"]) == {"new", "missing"}
    assert any("no case matched" in w for w in by_key.warnings)
    by_name = compare(base, cur, match="device_name")
    assert set(by_name.table["verdict"]) <= {"same", "untimed"}


def test_compare_rejects_bad_arguments(tmp_path):
    df = run_with(tmp_path, 1000.0)
    with pytest.raises(ValueError, match="threshold"):
        compare(df, df, threshold=-1)
    with pytest.raises(ValueError, match="match"):
        compare(df, df, match="vendor")


def test_compare_cli_exit_codes_and_json(tmp_path, capsys):
    base = make_run(tmp_path / "b", "GPU A", [bench("add", {"n": 4}, 1000.0, nbytes=48)])
    slow = make_run(tmp_path / "c", "GPU A", [bench("add", {"n": 4}, 1500.0, nbytes=48)])
    assert compare_main([str(base), str(slow), "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["exit_code"] == 1 and out["counts"]["slower"] == 1
    assert compare_main([str(base), str(slow), "--threshold", "0.6"]) == 0
    assert "kbench compare: OK" in capsys.readouterr().out
    assert compare_main([str(base), str(slow), "--format", "md"]) == 1
    assert "## Regressions (slower)" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text("garbage\n")
    assert compare_main([str(base), str(bad)]) == 2
    assert f"{bad}:1" in capsys.readouterr().err


# ------------------------------------------------------------------------- plots, folder

def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert len(data) > 1024, f"{path} is only {len(data)} bytes"


def test_plots_are_written_as_png_and_svg(three_devices, tmp_path):
    from kbench.report.plots import case_bar_plots, roofline_plots
    df = load_runs([three_devices])
    roof = roofline_plots(df, tmp_path / "plots")
    assert set(roof) == {"GPU Alpha", "GPU Beta", "GPU Alpha (torch-cuda)"}
    bars = case_bar_plots(df, tmp_path / "plots")
    assert set(bars) == {"softmax", "matmul"}
    for png, svg in list(roof.values()) + list(bars.values()):
        _assert_png(png)
        assert svg.read_text().lstrip().startswith("<?xml") and svg.stat().st_size > 1024


def test_write_report_produces_a_complete_folder(three_devices, tmp_path):
    out = tmp_path / "report"
    index = write_report([three_devices], out, baseline="GPU Alpha")
    assert index == out / "index.md"
    for name in ("index.md", "report.html", "report.json", "devices.csv", "correctness.csv",
                 "failures.csv", "performance.csv", "queue_configs.csv", "runs.csv"):
        assert (out / name).stat().st_size > 0, f"{name} is missing or empty"
    text = index.read_text()
    for heading in ("## How to read this report", "## Devices", "## Correctness matrix",
                    "## Failures and errors", "## Performance", "## Queue configurations",
                    "## Rooflines"):
        assert heading in text, f"index.md lacks {heading!r}"
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links, "index.md should embed plots"
    for link in links:
        assert (out / link).is_file(), f"index.md links to missing {link}"
    failures_part = text.split("## Failures and errors")[1].split("\n## ")[0]
    assert "GPU Beta" in failures_part and "NMSE 2.1e-02" in failures_part
    html = (out / "report.html").read_text()
    assert html.count("<table>") >= 5 and 'class="st-fail"' in html
    report = json.loads((out / "report.json").read_text())
    assert report["baseline"] == "GPU Alpha" and report["tables"]["failures"][0]["device"] == "GPU Beta"
    perf = pd.read_csv(out / "performance.csv")
    assert {"time_ns", "throughput", "peak_fraction", "vs_baseline"} <= set(perf.columns)


def test_report_mentions_a_truncated_run(tmp_path):
    path = standard_run(tmp_path / "runs", "GPU A", 1.0)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.warns(UserWarning, match="cut short"):
        index = write_report([path], tmp_path / "out", plots=False)
    assert "## Warnings while loading" in index.read_text()


def test_report_cli(three_devices, tmp_path, capsys):
    assert report_main([str(three_devices), "--reasons", "--baseline", "Beta"]) == 0
    printed = capsys.readouterr().out
    assert "FAIL: validate: NMSE 2.1e-02" in printed and "× base" in printed
    assert report_main([str(three_devices), "--format", "json"]) == 0
    tables_json = json.loads(capsys.readouterr().out)
    assert {"Devices", "Correctness", "Performance"} <= set(tables_json)
    assert report_main([str(three_devices), "--out", str(tmp_path / "r"), "--no-plots"]) == 0
    assert (tmp_path / "r" / "index.md").is_file()
    assert report_main([str(three_devices), "--baseline", "nothing-like-this"]) == 2
    assert "GPU Alpha" in capsys.readouterr().err


def test_report_over_committed_results(tmp_path):
    runs = sorted((REPO / "results").rglob("*.jsonl"))
    if not runs:
        pytest.skip("no committed runs under results/ yet")
    # plots are covered on small sets above; over every committed run they would cost minutes
    index = write_report(runs, tmp_path / "committed", plots=False)
    text = index.read_text()
    assert "## Correctness matrix" in text
    df = load_runs(runs)
    for device in failures_table(df)["device"]:
        assert device in text.split("## Failures and errors")[1], f"failures of {device} not listed"
