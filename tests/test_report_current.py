"""`kbench report` with the current declarations handed in: a device's results of an op's current
parameters replace its old ones (unless --history), and records judged under an older
declaration use the peak the case is judged by now."""
from __future__ import annotations

from kbench.cli import main
from kbench.report import catalogue

from test_report import bench, make_run


def _runs(tmp_path):
    runs = tmp_path / "runs"
    for name in ("GPU A", "GPU B"):
        make_run(runs, name, [
            bench("add", {"size": 1048576}, 1000.0, nbytes=12 << 20),
            bench("add", {"size": 12345}, 100.0, nbytes=148140),  # parameters add no longer declares
            bench("add", {"size": 268435456}, 1e5, nbytes=3 << 30),  # a size only `bench --full` runs
            bench("matmul_f16", {"m": 4096, "n": 4096, "k": 4096}, 1e6, flops=2 * 4096 ** 3,
                  nbytes=3 * 2 * 4096 * 4096, peak_name="peak.fp16_fma", peak_fraction=2.57),
        ], peaks={"peak.copy_bandwidth": 100.0, "peak.fp16_fma": 50000.0})
    return runs


def test_report_drops_old_parameters_and_uses_the_declared_peak(tmp_path, capsys):
    runs = _runs(tmp_path)
    try:
        assert main(["report", str(runs), "--out", str(tmp_path / "r"), "--no-plots"]) == 0
        text = (tmp_path / "r" / "index.md").read_text()
        assert "add[size=1048576]" in text and "size=12345" not in text, "old parameters should drop out"
        assert "add[size=268435456]" in text, "a `bench --full` size is declared: its results should stay"
        summary = text.split("## Summary")[1].split("\n## ")[0]
        assert "matmul_f16" in summary and "257%" not in text, \
            f"matmul_f16 is judged against the matrix peak now (not measured here), not fp16 FMA:\n{summary}"
        assert main(["report", str(runs), "--out", str(tmp_path / "h"), "--no-plots", "--history"]) == 0
        assert "size=12345" in (tmp_path / "h" / "index.md").read_text(), "--history keeps old parameters"
    finally:
        catalogue.use((), {})  # other tests build reports without the declarations
    capsys.readouterr()
