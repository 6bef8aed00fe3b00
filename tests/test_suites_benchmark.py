"""pytest-benchmark over the bench suite: GPU time as its statistic, short stable params, one
group per op, test ids that are case ids, compare working on the GPU median."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench(tmp_path: Path, name: str, *cases: str) -> dict:
    out = tmp_path / f"{name}.json"
    args = [a for c in cases for a in ("--kbench-cases", c)]
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites/test_bench.py", "-q", "-p", "no:cacheprovider",
                           *args, "--benchmark-json", str(out), "--kbench-out", str(tmp_path / "runs")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def lavapipe(tmp_path_factory):
    import kbench.runtime as kp

    if not kp.list_devices():
        pytest.skip("no Vulkan device (install mesa-vulkan-drivers for lavapipe)")
    return tmp_path_factory.mktemp("bench")


def test_benchmark_json_holds_gpu_medians_short_params_and_op_groups(lavapipe):
    doc = _bench(lavapipe, "one", "add[size=1048576]", "softmax[size=4096,")
    by_id = {b["param"]: b for b in doc["benchmarks"]}
    assert set(by_id) == {"add[size=1048576]", "softmax[size=4096,scale=1]"}, sorted(by_id)
    for param, b in by_id.items():
        assert b["name"] == f"test_case[{param}]", b["name"]
        assert b["group"] == param.split("[")[0], f"{param} is in group {b['group']!r}, expected its op"
        assert b["params"] == {"kbench_id": param}, f"params should be the short id, got {b['params']}"
        assert len(json.dumps(b["params"])) < 200 and "0x" not in json.dumps(b["params"])
        assert b["extra_info"]["timer"] == "gpu", b["extra_info"]
    # the statistic is kbench's GPU median: the same figure as in the kbench record
    recs = [json.loads(line) for f in (lavapipe / "runs").glob("*.jsonl") for line in f.read_text().splitlines()]
    gpu = {r["case_id"]: r["gpu_ns"]["median"] for r in recs if r.get("kind") == "case" and r.get("gpu_ns")}
    for param, b in by_id.items():
        assert b["stats"]["median"] * 1e9 == pytest.approx(gpu[param], rel=1e-9), \
            f"{param}: pytest-benchmark's median {b['stats']['median']} s is not the GPU median {gpu[param]} ns"
        assert b["stats"]["rounds"] >= 3


def test_benchmark_compare_runs_on_the_gpu_statistic(lavapipe):
    doc = _bench(lavapipe, "two", "add[size=1048576]")
    first, second = lavapipe / "first.json", lavapipe / "second.json"
    first.write_text(json.dumps(doc))
    second.write_text(json.dumps(doc))
    cli = Path(sys.executable).parent / "pytest-benchmark"  # pytest-benchmark's own console script
    proc = subprocess.run([str(cli), "compare", str(first), str(second),
                           "--group-by=group", "--columns=median,min,max"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "benchmark 'add'" in proc.stdout and "test_case[add[size=1048576]]" in proc.stdout, proc.stdout


def _collected(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites/test_bench.py", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "--kbench-backend", "numpy", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    return [line.split("::test_case[", 1)[1][:-1] for line in proc.stdout.splitlines() if "::test_case[" in line]


def test_suite_marks_the_large_bench_cases_slow_and_none_gpu_on_a_cpu_device():
    from kbench.cases import instances

    size = {i.case_id: i.bytes_moved or 0 for i in instances("bench")}
    slow, fast = _collected("-m", "slow"), _collected("-m", "not slow")
    assert slow and fast, f"expected both slow and other bench cases, got {len(slow)} and {len(fast)}"
    assert all(size[c] >= 256 << 20 for c in slow), [c for c in slow if size[c] < 256 << 20]
    assert all(size[c] < 256 << 20 for c in fast), [c for c in fast if size[c] >= 256 << 20]
    assert _collected("-m", "gpu") == [], "the numpy backend is a CPU device: no test is marked gpu"
