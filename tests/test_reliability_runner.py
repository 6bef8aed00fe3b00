"""Issue 22, the runner: a killed `kbench bench` leaves no worker running and no file behind, and
SIGTERM stops it as Ctrl-C does (worker ended, summary printed, finished records kept)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the worker")


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        # the command may hold spaces and parentheses: the fields after the last ')' are fixed
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start_hung_bench(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    """`kbench validate` whose second case hangs; returns it and its worker's pid once the
    worker runs the hung case (the hang is a sleep in the worker)."""
    env = dict(os.environ, KBENCH_INJECT_FAULT="hang:add[size=3]", TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "kbench", "validate", "--backend", "numpy", "-k", "add",
                             "--timeout", "100", "--quiet", "--out", str(tmp_path / "out")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        kids = _children(proc.pid)
        files = list((tmp_path / "out").glob("*.jsonl"))
        # wait for the worker and for the header and the record of the case before the hung one
        if kids and files and files[0].read_text().count("\n") >= 2:
            return proc, kids[0]
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the worker did not start within 120 s: {proc.communicate()}")


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_sigterm_ends_the_worker_and_prints_the_summary(tmp_path):
    proc, worker = _start_hung_bench(tmp_path)
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        os.kill(worker, signal.SIGKILL)
        pytest.fail("kbench did not stop within 60 s of SIGTERM")
    assert _wait_gone(worker, 10), f"worker {worker} still runs after SIGTERM of kbench"
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "kbench validate:" in out and "interrupted" in out, out
    lines = next((tmp_path / "out").glob("*.jsonl")).read_text().splitlines()
    assert len(lines) == 2 and '"add[size=1]"' in lines[1], lines  # header + the case finished before the hang


def test_sigkill_of_kbench_ends_the_worker_and_leaves_no_temporary_file(tmp_path):
    proc, worker = _start_hung_bench(tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    gone = _wait_gone(worker, 15)
    if not gone:
        os.kill(worker, signal.SIGKILL)
    assert gone, f"worker {worker} was orphaned: still running 15 s after kbench was killed"
    left = sorted(p.name for p in (tmp_path / "tmp").iterdir())
    assert not left, f"files left in the temporary folder: {left}"


def test_compare_fails_a_current_run_that_holds_only_its_header(tmp_path, capsys):
    """A killed run (a header and no records) must not pass the regression gate."""
    from kbench.cli import main
    from kbench.results import RunWriter, collect_provenance

    base = tmp_path / "base"
    with RunWriter(base, collect_provenance(None, "numpy")) as w:
        for n in (1, 2):
            w.write({"kind": "case", "case": "add", "params": {"size": n}, "mode": "validate", "status": "pass",
                     "queue_config": "single", "queues": []})
    cut = tmp_path / "cut"
    with RunWriter(cut, collect_provenance(None, "numpy")):
        pass
    assert main(["compare", str(base), str(cut)]) == 1
    out = capsys.readouterr().out
    assert "MISSING CASES" in out and "2 case(s) of the baseline are missing" in out, out
    assert main(["compare", str(base), str(cut), "--allow-missing"]) == 0
    assert "kbench compare: OK" in capsys.readouterr().out


def _one_record_run(directory: Path, edit) -> Path:
    """A run file of one bench record, whose second line ``edit`` rewrites (text -> text)."""
    import json

    from kbench.results import RunWriter, collect_provenance

    with RunWriter(directory, collect_provenance(None, "numpy")) as w:
        w.write({"kind": "case", "case": "add", "params": {"size": 1}, "mode": "bench", "status": "pass",
                 "queue_config": "single", "queues": [], "gpu_ns": {"median": 1000.0, "n": 3}})
        path = w.path
    lines = path.read_text().splitlines()
    lines[1] = edit(lines[1])
    json.dumps(lines)  # the edit stays text
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("edit, problem", [
    # Python 3.11's json raises RecursionError here, 3.12's parses it and the depth check refuses it
    (lambda line: line[:-1] + ',"x":' + "[" * 5000 + "]" * 5000 + "}", "nested"),
    (lambda line: line.replace('"n":3', '"n":' + "1" + "0" * 400), "an integer of 401 digits"),
    (lambda line: line.replace('"median":1000.0', '"median":-5'), "'gpu_ns.median' must be a finite time > 0"),
    (lambda line: line.replace('"median":1000.0', '"median":0'), "'gpu_ns.median' must be a finite time > 0"),
    (lambda line: line.replace('"median":1000.0', '"median":NaN'), "bare NaN token"),
    (lambda line: line.replace('"median":1000.0', '"median":"NaN"'), "'gpu_ns.median' must be a finite time > 0"),
    (lambda line: line[:-1] + ',"x":' + "[" * 40 + "]" * 40 + "}", "nested deeper than 32 levels"),
], ids=["5000-deep", "10**400", "negative-median", "zero-median", "bare-NaN", "NaN-median", "40-deep"])
def test_nonsense_in_a_results_file_is_refused_with_file_and_line(tmp_path, capsys, edit, problem):
    from kbench.cli import main
    from kbench.results import ResultsFormatError, load_runs

    path = _one_record_run(tmp_path / "r", edit)
    with pytest.raises(ResultsFormatError) as info:
        load_runs([path])
    assert f"{path}:2:" in str(info.value) and problem in str(info.value), str(info.value)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2:" in err and "Traceback" not in err, err


# --- item 6 and 7: the command line --------------------------------------------------------------

@pytest.mark.parametrize("where, message", [
    ("file", "names a file, not a folder"),
    ("under-file", "cannot create the folder"),
], ids=["a-file", "below-a-file"])
def test_out_naming_a_file_or_an_unwritable_path_is_a_message(tmp_path, capsys, where, message):
    from kbench.cli import main

    afile = tmp_path / "afile"
    afile.write_text("x")
    out = afile if where == "file" else afile / "sub"
    assert main(["validate", "--backend", "numpy", "-k", "add[size=1]", "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    runs = _one_record_run(tmp_path / "runs", lambda line: line)
    assert main(["report", str(runs), "--no-plots", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "kbench report: error: cannot write the report to" in err, err


def test_a_negative_seed_is_refused(capsys):
    from kbench.cli import main

    with pytest.raises(SystemExit) as info:
        main(["validate", "--backend", "numpy", "--seed", "-1"])
    assert info.value.code == 2
    assert "--seed: must be >= 0" in capsys.readouterr().err


def test_a_reader_that_leaves_early_gets_no_broken_pipe_traceback():
    proc = subprocess.run(f"{sys.executable} -m kbench cases | head -1", shell=True, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.count("\n") == 1 and "[" in proc.stdout, proc.stdout
    assert "BrokenPipeError" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# --- item 8: report files ---------------------------------------------------------------------------

def test_report_out_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    from kbench.cli import main

    runs = _one_record_run(tmp_path / "runs", lambda line: line)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "report"
    out.mkdir()
    (out / "index.md").symlink_to(victim)
    (out / "report.json").symlink_to(victim)
    assert main(["report", str(runs), "--no-plots", "--out", str(out)]) == 0
    assert victim.read_text() == "keep me"
    assert not (out / "index.md").is_symlink() and (out / "index.md").read_text().startswith("# kbench report")
    assert not (out / "report.json").is_symlink()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "temporary files left behind"


def test_soak_probe_records_rss_and_counts(tmp_path, capsys):
    """`kbench probe soak` (a benchmark, not a timed test): a tiny run writes its counts and RSS."""
    import json

    from kbench.cli import main

    out = tmp_path / "soak.json"
    assert main(["probe", "soak", "--ops", "300", "--managers", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    for phase, n in (("backend_ops", 300), ("manager_cycles", 3)):
        r = result[phase]
        assert r["completed"] == n and r["stopped_by"] == "count", r
        assert r["rss_start"] > 0 and r["rss_end"] > 0 and r["samples"][-1]["count"] == n, r
    assert result["backend_ops"]["finite_output"] is True
