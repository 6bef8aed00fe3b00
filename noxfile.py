"""nox sessions for kbench: `nox -s tests`, `nox -s validate`, `nox -s bench`, `nox -s report`,
and the Docker sessions `docker_build` / `docker_test`. Extra arguments go after `--`.

`bench` is the main job: on a GPU machine it checks and times every case on every Vulkan device;
on a machine without a GPU it runs on lavapipe (Mesa's CPU Vulkan driver).
"""
from __future__ import annotations

import os

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

TEST_ENV = {"KBENCH_VALIDATION": os.environ.get("KBENCH_VALIDATION", "1"), "PYTHONUNBUFFERED": "1"}


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests (runtime, backend, cases, results, report, CI files) with Vulkan validation on."""
    session.install("-e", ".[test]")
    session.run("python", "-m", "pytest", "tests", "-q", "-rs", "--timeout=900", *session.posargs, env=TEST_ENV)


@nox.session
def validate(session: nox.Session) -> None:
    """Correctness suite on every Vulkan device (options: see `kbench validate --help`)."""
    session.install("-e", ".")
    session.run("kbench", "validate", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The main job: correctness and benchmark suites, results written under results/."""
    session.install("-e", ".")
    session.run("kbench", "bench", "--validate", *session.posargs)


@nox.session
def report(session: nox.Session) -> None:
    """Cross-device report from results/ into results/report/ (options: `kbench report --help`)."""
    session.install("-e", ".")
    args = session.posargs or ["results", "--out", "results/report"]
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
