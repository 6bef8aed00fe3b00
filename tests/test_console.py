"""What `kbench bench` / `kbench peaks` print: a line per finished case and per peak, the live
bar's labels (brackets kept), the per-device table at the end."""
from __future__ import annotations

import io
import json

import pytest

from kbench.console import RichProgress, TextProgress, case_line, device_tables, peak_line


def _rec(case_id="add[size=1048576]", median=2.0e6, lo=1.9e6, hi=2.5e6, **extra):
    rec = {"kind": "case", "case": case_id.split("[")[0], "case_id": case_id, "mode": "bench", "status": "pass",
           "gpu_ns": {"median": median, "min": lo, "max": hi}, "gbps": 6.0, "gflops": 0.5,
           "peak_fraction": 0.45, "peak_name": "peak.copy_bandwidth", "implementation": "kbench",
           "device_name": "GPU A", "layer": "backend"}
    rec.update(extra)
    return rec


def test_a_bench_line_has_median_spread_rate_and_percent_of_peak():
    line = case_line(_rec())
    for part in ("pass", "add[size=1048576]", "2 ms [1.9-2.5]", "6 GB/s", "45% of copy"):
        assert part in line, f"expected {part!r} in the case line, got {line!r}"


def test_a_compute_bound_line_shows_gflops_against_its_flop_peak():
    line = case_line(_rec("matmul_f16[m=4096]", gflops=250000.0, gbps=900.0, peak_name="peak.coopmat_fp16",
                          peak_fraction=0.5))
    assert "250,000 GFLOP/s" in line and "50% of fp16 matrix" in line and "GB/s" not in line, line


def test_a_failure_line_carries_its_reason():
    line = case_line({"case_id": "softmax[size=3]", "status": "fail", "reason": "nmse 0.3 > 1e-6"})
    assert line.startswith("fail") and "softmax[size=3]" in line and "nmse 0.3" in line, line


def test_text_progress_prints_every_bench_case_and_peak_and_the_peer_ratio():
    out = io.StringIO()
    p = TextProgress(stream=out, every_case=True)
    p.begin(3, "GPU A [single]")
    p.advance({"kind": "peak", "peak": "peak.copy_bandwidth", "unit": "GB/s", "value": 3000.0})
    p.advance(_rec(median=2.0e6))
    p.begin(1, "GPU A torch-cuda [single]")  # the peer's run of the same device
    p.advance(_rec(median=3.0e6, implementation="torch-cuda"))
    text = out.getvalue()
    assert "peak.copy_bandwidth" in text and "3,000 GB/s" in text, text
    assert "[2/3] pass" in text and "add[size=1048576]" in text, text
    assert "(torch-cuda)" in text and "kbench 1.50x this" in text, f"expected the peer line with kbench's ratio:\n{text}"


def test_validate_progress_prints_failures_only_unless_verbose():
    out = io.StringIO()
    p = TextProgress(stream=out, every_case=False)
    p.begin(2, "GPU A [single]")
    p.advance({**_rec(), "mode": "validate"})
    p.advance({"case_id": "rope[pos=3]", "status": "error", "reason": "boom", "mode": "validate"})
    text = out.getvalue()
    assert "add[size" not in text and "rope[pos=3]" in text, text


def test_the_live_bar_keeps_brackets_and_tells_configurations_apart():
    from rich.console import Console

    sink = io.StringIO()
    console = Console(file=sink, force_terminal=False, width=200)
    p = RichProgress(every_case=True, console=console)
    p.begin(1, "GPU A [single]")
    p.advance(_rec("add[size=3]"))
    p.begin(1, "GPU A [async]")
    p.advance(_rec("add[size=3]", status="fail", reason="bad [x]"))
    p.end()
    text = sink.getvalue()
    assert "add[size=3]" in text, f"the case parameters were eaten as markup:\n{text}"
    assert "GPU A [single]" in text and "GPU A [async]" in text, f"both bar labels should show their configuration:\n{text}"
    assert "bad [x]" in text, text


def test_peak_line_formats_latency_as_time():
    assert "32.2 µs" in peak_line({"kind": "peak", "peak": "peak.dispatch_latency", "unit": "ns", "value": 32200.0})


def test_device_table_per_op_best_figure_and_peer_ratio():
    recs = [_rec("add[size=1]", median=4e6, peak_fraction=0.2), _rec("add[size=2]", median=2e6, peak_fraction=0.4),
            _rec("add[size=2]", median=3e6, implementation="torch-cuda", peak_fraction=None),
            {**_rec("add[size=3]"), "status": "fail", "gpu_ns": None}]
    tables = dict(device_tables(recs))
    assert set(tables) == {"GPU A", "GPU A (torch-cuda)"}, tables.keys()
    ours = tables["GPU A"]
    assert "2/3 (1 failed)" in ours and "(size=2)" in ours and "40%" in ours and "30%" in ours, ours
    assert "1.50x" in ours, f"expected kbench's speed ratio over the peer (3 ms / 2 ms):\n{ours}"


def test_kbench_peaks_measures_each_peak_on_its_own(tmp_path, capsys):
    import kbench.runtime as kp
    from kbench.cli import main

    if not kp.list_devices():
        pytest.skip("no Vulkan device (install mesa-vulkan-drivers for lavapipe)")
    code = main(["peaks", "--device", "0", "--format", "json", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    got = {r.get("peak") or r.get("case_id"): r for r in json.loads(out)}
    for name in ("peak.copy_bandwidth", "peak.buffer_copy", "peak.fp32_fma", "peak.int8_dot", "peak.coopmat_fp16",
                 "peak.dispatch_latency", "peak.h2d", "peak.d2h"):
        assert name in got, f"{name} missing from kbench peaks: {sorted(got)}"
    measured = [n for n, r in got.items() if r.get("value")]
    assert "peak.copy_bandwidth" in measured and "peak.fp32_fma" in measured, got
    assert list(tmp_path.glob("*.jsonl")), "kbench peaks writes its run like a bench run"
