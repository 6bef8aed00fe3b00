"""The `kbench` command: each command once (lavapipe where a Vulkan device is needed), bad
options, and the runner's robustness (hung and crashing cases, expectations, the peer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kbench.cli import main


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse errors
        code = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return code, out, err


def records(directory: Path) -> list[dict]:
    out = []
    for f in sorted(directory.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") in ("case", "peak"):
                out.append(rec)
    return out


def by_id(recs: list[dict]) -> dict[str, dict]:
    return {r["case_id"]: r for r in recs if r.get("kind") == "case"}


def vulkan_or_skip():
    try:
        import kbench.runtime as kp

        if not kp.list_devices():
            pytest.skip("no Vulkan device (install mesa-vulkan-drivers for lavapipe)")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"Vulkan runtime unavailable: {exc}")


# ------------------------------------------------------------------------------ commands

def test_devices_lists_the_vulkan_devices(capsys):
    vulkan_or_skip()
    code, out, _ = run_cli(["devices"], capsys)
    assert code == 0
    for column in ("vendor", "driver", "API", "queue families", "features"):
        assert column in out, f"column {column!r} missing from:\n{out}"
    code, out, _ = run_cli(["devices", "--json", "--device", "0"], capsys)
    assert code == 0 and json.loads(out)[0]["index"] == 0


def test_validate_on_lavapipe_writes_a_result_per_case(tmp_path, capsys):
    vulkan_or_skip()
    code, out, _ = run_cli(["validate", "-k", "add[size=1000]", "-k", "kp_mult[size=65]", "--queue-config",
                            "single", "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 0, out
    recs = by_id(records(tmp_path))
    assert set(recs) == {"add[size=1000]", "kp_mult[size=65]"}
    for rec in recs.values():
        assert rec["status"] == "pass", rec
        assert rec["queue_config"] == "single" and rec["queues"] == [[0, 0]] and rec["backend"] == "vulkan"
    assert "2 pass" in out and str(tmp_path) in out


def test_validate_async_queue_config_splits_runtime_work(tmp_path, capsys):
    vulkan_or_skip()
    code, out, _ = run_cli(["validate", "-k", "kp_mult[size=100000]", "--queue-config", "async",
                            "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 0, out
    (rec,) = by_id(records(tmp_path)).values()
    assert rec["status"] == "pass" and rec["queue_config"] == "async" and rec["lanes"] == 4


def test_bench_on_lavapipe_measures_peaks_and_fractions(tmp_path, capsys):
    vulkan_or_skip()
    code, out, _ = run_cli(["bench", "-k", "add[size=1048576]", "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 0, out
    recs = records(tmp_path)
    peaks = {r["peak"]: r for r in recs if r["kind"] == "peak"}
    assert {"peak.copy_bandwidth", "peak.fp32_fma", "peak.dispatch_latency", "peak.h2d", "peak.d2h"} <= set(peaks)
    assert all(p["value"] > 0 for p in peaks.values())
    add = by_id(recs)["add[size=1048576]"]
    assert add["status"] == "pass" and add["mode"] == "bench"
    assert add["host_ns"]["median"] > 0 and add["gbps"] > 0
    assert add["peak_name"] == "peak.copy_bandwidth" and add["peak_fraction"] > 0


def test_cases_lists_ids(capsys):
    code, out, _ = run_cli(["cases", "-k", "rope"], capsys)
    assert code == 0 and "rope[head_dim=128,n_heads_q=4,n_heads_k=2,pos=8191]" in out.splitlines()


def test_python_dash_m_kbench_runs_the_cli():
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "kbench", "--version"], capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0 and proc.stdout.startswith("kbench "), proc.stderr


def test_report_and_compare_are_delegated(tmp_path, capsys):
    code, _, _ = run_cli(["validate", "--backend", "numpy", "-k", "add[size=3]", "--out", str(tmp_path),
                          "--quiet"], capsys)
    assert code == 0
    code, out, err = run_cli(["report", str(tmp_path)], capsys)
    assert code == 0, err
    assert "add" in out
    code, out, err = run_cli(["compare", str(tmp_path), str(tmp_path)], capsys)
    assert code == 0, err
    code, _, err = run_cli(["compare"], capsys)
    assert code == 2 and "compare" in err


# ------------------------------------------------------------------------------ bad options

@pytest.mark.parametrize("argv, message", [
    (["validate", "--queue-config", "bogus"], "unknown queue configuration 'bogus'"),
    (["validate", "--timeout", "-1"], "must be a positive number"),
    (["bench", "--max-bytes", "lots"], "invalid size 'lots'"),
    (["bench", "--peer", "jax"], "invalid choice: 'jax'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["validate", "--backend", "numpy", "--device", "99"], "no device with index 99"),
    (["validate", "--backend", "numpy", "--device", "nosuchgpu"], "'nosuchgpu' matches no device"),
    (["validate", "--backend", "numpy", "-k", "nosuchcase"], "no case matches"),
    (["validate", "--backend", "numpy", "--expectations", "/nonexistent/x.toml"], "does not exist"),
])
def test_bad_options_exit_2_with_a_clear_message(argv, message, capsys):
    code, out, err = run_cli(argv, capsys)
    assert code == 2, f"{argv}: exit {code}, stdout {out!r}"
    assert message in err, f"{argv}: expected {message!r} in stderr, got {err!r}"


# ------------------------------------------------------------------------------ robustness

def test_a_hung_case_times_out_as_an_error_and_the_run_goes_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KBENCH_INJECT_FAULT", "hang:add[size=3]")
    code, out, _ = run_cli(["validate", "--backend", "numpy", "-k", "add[size=1]", "-k", "add[size=3]",
                            "-k", "add[size=64]", "--timeout", "2", "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 1, out
    recs = by_id(records(tmp_path))
    assert recs["add[size=3]"]["status"] == "error"
    assert "timed out after 2 s" in recs["add[size=3]"]["reason"]
    assert recs["add[size=1]"]["status"] == "pass" and recs["add[size=64]"]["status"] == "pass"
    assert "1 new failure" in out


def test_a_crashing_case_is_recorded_and_a_fresh_worker_goes_on(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KBENCH_INJECT_FAULT", "crash:add[size=1]")
    code, out, _ = run_cli(["validate", "--backend", "numpy", "-k", "add[size=1]", "-k", "add[size=3]",
                            "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 1
    recs = by_id(records(tmp_path))
    assert "crashed (killed by signal SIGABRT)" in recs["add[size=1]"]["reason"]
    assert recs["add[size=3]"]["status"] == "pass"


def test_expected_failure_is_xfail_and_does_not_fail_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KBENCH_INJECT_FAULT", "crash:add[size=1]")
    exp = tmp_path / "exp.toml"
    exp.write_text('[[expected]]\ndriver = "numpy"\ncase = "add[size=1]"\nstatus = "error"\nreason = "injected crash"\n'
                   '[[expected]]\ndriver = "numpy"\ncase = "add[size=3]"\nreason = "was broken once"\n')
    out_dir = tmp_path / "out"
    code, out, _ = run_cli(["validate", "--backend", "numpy", "-k", "add[size=1]", "-k", "add[size=3]",
                            "--expectations", str(exp), "--out", str(out_dir), "--quiet"], capsys)
    assert code == 0, out
    recs = by_id(records(out_dir))
    assert recs["add[size=1]"]["status"] == "xfail" and "injected crash" in recs["add[size=1]"]["reason"]
    assert recs["add[size=3]"]["status"] == "pass" and recs["add[size=3]"]["unexpected_pass"] is True
    assert "1 unexpected pass" in out


def test_peer_without_torch_is_recorded_unavailable(tmp_path, capsys):
    try:
        import torch  # noqa: F401

        pytest.skip("PyTorch is installed here; the unavailable path needs a machine without it")
    except ImportError:
        pass
    code, out, _ = run_cli(["bench", "--backend", "numpy", "-k", "add[size=1048576]", "--peer", "torch",
                            "--out", str(tmp_path), "--quiet"], capsys)
    assert code == 0, out
    peer = [r for r in records(tmp_path) if r.get("backend") == "torch-cuda"]
    assert peer and all(r["status"] == "unsupported" for r in peer)
    assert "PyTorch is not installed" in peer[0]["reason"]
    assert "peer torch-cuda unavailable" in out


# ------------------------------------------------------------------------------ queue configurations

H200_LIKE = {"queue_families": [
    {"index": 0, "flags": ["graphics", "compute", "transfer"], "count": 16},
    {"index": 1, "flags": ["transfer"], "count": 2},
    {"index": 2, "flags": ["compute", "transfer"], "count": 8},
    {"index": 3, "flags": ["video_decode"], "count": 1}]}


def test_queue_configurations_follow_the_queue_families():
    from kbench.bench.queues import queue_configs

    cfgs = {c.name: c for c in queue_configs(H200_LIKE)}
    assert cfgs["single"].family_queue_indices == (0,)
    assert cfgs["multi_queue"].family_queue_indices == (0, 0, 0, 0)
    assert cfgs["multi_queue"].queues == [[0, 0], [0, 1], [0, 2], [0, 3]]
    assert cfgs["multi_family"].family_queue_indices == (0, 2)   # the transfer-only family is left out
    assert cfgs["async"].queues == [[0, 0]] and len(cfgs["async"].lanes) == 4
    assert not any(c.unsupported for c in cfgs.values())


def test_queue_configurations_a_device_lacks_say_why():
    from kbench.bench.queues import queue_configs

    one = {"queue_families": [{"index": 0, "flags": ["graphics", "compute", "transfer"], "count": 1}]}
    cfgs = {c.name: c for c in queue_configs(one)}
    assert "no compute family has 2 or more queues" in cfgs["multi_queue"].unsupported
    assert "only one compute-capable queue family" in cfgs["multi_family"].unsupported
    assert not cfgs["single"].unsupported and not cfgs["async"].unsupported


def test_pytest_suites_run_from_the_declarations(tmp_path):
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "pytest", "suites/test_validate.py", "-q", "-p", "no:cacheprovider",
                           "--kbench-backend", "numpy", "--kbench-cases", "add[size=1000]",
                           "--kbench-cases", "softmax_large[size=5,", "--kbench-out", str(tmp_path)],
                          capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout, proc.stdout[-500:]
    assert {r["case_id"] for r in records(tmp_path)} == {
        "add[size=1000]", "softmax_large[size=5,scale=30]", "softmax_large[size=5,scale=1000]"}


def test_no_vulkan_driver_gives_a_message_not_a_traceback():
    root = Path(__file__).resolve().parents[1]
    env = dict(__import__("os").environ, VK_DRIVER_FILES="/nonexistent/icd.json", VK_ICD_FILENAMES="/nonexistent/icd.json")
    proc = subprocess.run([sys.executable, "-m", "kbench", "devices"], capture_output=True, text=True, cwd=root, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "cannot list the vulkan devices" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_queue_config_all_means_every_configuration_for_bench_too():
    from kbench.bench.queues import QUEUE_CONFIGS, parse_queue_configs

    assert parse_queue_configs("all") == list(QUEUE_CONFIGS)
    assert parse_queue_configs(None) is None


def test_matmul_tile_from_the_environment_is_parsed_and_bad_values_are_named(monkeypatch):
    from kbench.bench.devices import backend_options

    monkeypatch.setenv("KBENCH_MATMUL_TILE", "128x64x16x8x4x8")
    assert backend_options().get("matmul_tile") == (128, 64, 16, 8, 4, 8)
    monkeypatch.setenv("KBENCH_MATMUL_TILE", "128x64xbig")
    with pytest.raises(ValueError, match="KBENCH_MATMUL_TILE='128x64xbig'"):
        backend_options()
    monkeypatch.delenv("KBENCH_MATMUL_TILE")
    assert "matmul_tile" not in backend_options()


def test_qmatvec_knobs_from_the_environment_are_parsed_and_recorded(monkeypatch):
    from kbench.bench.devices import backend_options, recorded_options

    monkeypatch.delenv("KBENCH_MATMUL_TILE", raising=False)
    monkeypatch.setenv("KBENCH_QMATVEC", "layout=packed, rows=2,staged=false")
    opts = backend_options()
    assert opts.get("qmatvec") == {"layout": "packed", "rows": 2, "staged": False}, opts
    assert recorded_options(opts) == {"qmatvec": {"layout": "packed", "rows": 2, "staged": False}}
    monkeypatch.setenv("KBENCH_QMATVEC", "layout")
    with pytest.raises(ValueError, match="KBENCH_QMATVEC='layout': expected key=value"):
        backend_options()
    monkeypatch.delenv("KBENCH_QMATVEC")
    assert recorded_options(backend_options()) == {}


def test_bench_run_header_records_the_kernel_options(tmp_path, monkeypatch):
    vulkan_or_skip()
    monkeypatch.setenv("KBENCH_QMATVEC", "kernel=generic")
    rc = main(["bench", "-k", "quantized_matmul*Q8_0*", "--no-peaks", "--samples", "1", "--quiet",
               "--out", str(tmp_path), "--max-bytes", "1M"])
    assert rc == 0
    (path,) = tmp_path.glob("*.jsonl")
    header = json.loads(path.read_text().splitlines()[0])
    assert header.get("backend_options") == {"qmatvec": {"kernel": "generic"}}, header.get("backend_options")


def test_a_users_runs_go_to_a_git_ignored_folder_of_their_own():
    from kbench.cli import USER_RUNS, build_parser

    for command in ("validate", "bench"):
        out = build_parser().parse_args([command]).out
        assert out == USER_RUNS == "runs", f"kbench {command} writes to {out!r} by default, expected runs/"
    root = Path(__file__).resolve().parents[1]
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/x.jsonl"], cwd=root)
    assert ignored.returncode == 0, "runs/ is not ignored by git: a user's run would show as untracked"
    committed = subprocess.run(["git", "check-ignore", "-q", "results/x.jsonl"], cwd=root)
    assert committed.returncode == 1, "results/ must stay tracked (the committed runs)"
