"""Build kbench's Docker images and run the test suites inside them, through the Docker SDK.

The nox sessions `docker_build` and `docker_test` call this script; it also runs on its own:

    python docker-builders/kbench_docker.py build [--only ci|swiftshader] [--base-image IMG]
                                                  [--offline-source PATH] [--extra-ca FILE] ...
    python docker-builders/kbench_docker.py test  [--drivers lavapipe,swiftshader] [-k FILTER] ...

Images: kbench-swiftshader:<first 12 hex of the pinned commit> (built once per commit, reused
afterwards) and kbench-ci:latest (the CI image, with SwiftShader copied in).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
SWIFTSHADER_DIR = HERE / "swiftshader"
CI_DIR = HERE / "ci"

# KBENCH_BASE_IMAGE overrides the base where no registry serves debian:bookworm-slim (a local
# run under act passes kbench-base:bookworm this way; the workflow stays as on GitHub).
DEFAULT_BASE_IMAGE = os.environ.get("KBENCH_BASE_IMAGE") or "debian:bookworm-slim"
DEFAULT_CI_IMAGE = "kbench-ci:latest"
LAVAPIPE_CI_IMAGE = "kbench-ci:lavapipe"  # the CI image without SwiftShader (--without-swiftshader)
STREAM_TIMEOUT_S = 6 * 3600  # longest silence tolerated from a build or a test container

# Where the CI image keeps each driver's ICD manifest (see ci/Dockerfile).
ICD_FILES = {
    "lavapipe": "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json",
    "swiftshader": "/swiftshader/vk_swiftshader_icd.json",
}


COMPARE_ARGS = ["--format", "md", "--match", "device_name"]


class DockerTaskError(RuntimeError):
    """A build or a run could not be done; the message says why and what to do."""


def pinned_swiftshader_commit(dockerfile: Path = SWIFTSHADER_DIR / "Dockerfile") -> str:
    """The SwiftShader commit that the builder's Dockerfile pins (its ARG SWIFTSHADER_COMMIT)."""
    text = dockerfile.read_text()
    found = set(re.findall(r"^ARG SWIFTSHADER_COMMIT=(\S+)\s*$", text, flags=re.M))
    if len(found) != 1:
        raise DockerTaskError(f"{dockerfile}: expected one pinned SWIFTSHADER_COMMIT, found {sorted(found)}")
    commit = found.pop()
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise DockerTaskError(f"{dockerfile}: SWIFTSHADER_COMMIT={commit!r} is not a 40-hex commit sha")
    return commit


def swiftshader_image_tag(commit: str) -> str:
    """Tag of the SwiftShader builder image for one commit (one image per pinned commit)."""
    return f"kbench-swiftshader:{commit[:12]}"


def connect():
    """A docker.DockerClient for the daemon in the environment (DOCKER_HOST or the local socket).

    Raises DockerTaskError, with how to fix it, when the SDK is missing or no daemon answers.
    """
    try:
        import docker
        from docker.errors import DockerException
    except ImportError as exc:
        raise DockerTaskError("the Docker SDK for Python is missing: pip install 'docker>=7'") from exc
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        docker.from_env(timeout=10).ping()
        # A build step or a test may print nothing for minutes; the SDK's 60 s default would
        # then end the stream with a read timeout.
        client = docker.from_env(timeout=STREAM_TIMEOUT_S)
    except DockerException as exc:
        raise DockerTaskError(
            f"no Docker daemon reachable at {where} ({exc}). Start one (e.g. `sudo dockerd &` or "
            "`sudo systemctl start docker`) or point DOCKER_HOST at one."
        ) from exc
    return client


def image_exists(client, tag: str) -> bool:
    """Whether the daemon has an image with this tag."""
    from docker.errors import ImageNotFound

    try:
        client.images.get(tag)
    except ImageNotFound:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Build contexts: assembled as tar files, so a context holds exactly what its Dockerfile reads
# (and, for SwiftShader's offline path, a source tree that lives outside the repository).


@dataclass
class ContextPlan:
    """Files for one build context: (path on disk, name inside the context)."""

    entries: list[tuple[Path, str]] = field(default_factory=list)

    def add(self, path: Path, arcname: str) -> None:
        if not path.exists():
            raise DockerTaskError(f"build context: {path} does not exist")
        self.entries.append((path, arcname))


def _skip_git_dir(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = info.name.split("/")
    return None if ".git" in parts else info


def write_context(plan: ContextPlan, out: IO[bytes]) -> None:
    """Write the context as an uncompressed tar (root-owned entries, no .git folders)."""

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if _skip_git_dir(info) is None:
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, arcname in plan.entries:
            tar.add(str(path), arcname=arcname, filter=owned_by_root)


def swiftshader_context(offline_source: Path | None) -> ContextPlan:
    """Context of the SwiftShader builder; with offline_source, that tree goes in as source/."""
    plan = ContextPlan()
    for name in ("Dockerfile", "fetch-source.sh", "repair-snapshot.sh"):
        plan.add(SWIFTSHADER_DIR / name, name)
    if offline_source is not None:
        if not (offline_source / "CMakeLists.txt").is_file():
            raise DockerTaskError(f"--offline-source {offline_source}: no CMakeLists.txt, not a SwiftShader tree")
        plan.add(offline_source, "source")
    return plan


def ci_context(extra_ca: Iterable[Path]) -> ContextPlan:
    """Context of the CI image, laid out as the repository root (see ci/Dockerfile)."""
    plan = ContextPlan()
    plan.add(REPO_ROOT / "pyproject.toml", "pyproject.toml")
    plan.add(CI_DIR / "Dockerfile", "docker-builders/ci/Dockerfile")
    plan.add(CI_DIR / "requirements_from_pyproject.py", "docker-builders/ci/requirements_from_pyproject.py")
    for cert in extra_ca:
        if cert.suffix != ".crt":
            raise DockerTaskError(f"--extra-ca {cert}: update-ca-certificates only reads files named *.crt")
        plan.add(cert, f"docker-builders/ci/extra-ca/{cert.name}")
    return plan


# ---------------------------------------------------------------------------------------------
# Building


def stream_build(client, plan: ContextPlan, *, tag: str, dockerfile: str, buildargs: dict[str, str],
                 network_mode: str | None, log: IO[str] = sys.stdout) -> str:
    """Build one image from plan, printing the daemon's progress lines; returns the image id."""
    image_id = ""
    with tempfile.TemporaryFile() as context:
        write_context(plan, context)
        size_mb = context.tell() / 1e6
        context.seek(0)
        print(f"== building {tag} ({dockerfile}, context {size_mb:.1f} MB, args {buildargs})", file=log, flush=True)
        stream = client.api.build(
            fileobj=context, custom_context=True, tag=tag, dockerfile=dockerfile, buildargs=buildargs,
            network_mode=network_mode, rm=True, forcerm=True, decode=True,
        )
        for chunk in stream:
            if "error" in chunk:
                detail = chunk.get("errorDetail", {}).get("message", chunk["error"])
                raise DockerTaskError(f"building {tag} failed: {detail.strip()}")
            if "stream" in chunk:
                log.write(chunk["stream"])
                log.flush()
            elif "status" in chunk:
                print(chunk["status"], chunk.get("progress", ""), file=log, flush=True)
            aux = chunk.get("aux")
            if isinstance(aux, dict) and "ID" in aux:
                image_id = aux["ID"]
    if not image_id:
        image_id = client.images.get(tag).id
    print(f"== built {tag} {image_id}", file=log, flush=True)
    return image_id


def load_image(client, archive: Path, tag: str) -> None:
    """Load a `docker save` archive (CI's cache of the SwiftShader image) and check it holds tag."""
    print(f"== loading {archive}", flush=True)
    with archive.open("rb") as f:
        images = client.images.load(f)
    tags = [t for image in images for t in image.tags]
    if tag not in tags:
        raise DockerTaskError(f"{archive} holds {tags}, not {tag}: delete it, it is from another commit")


def save_image(client, tag: str, archive: Path) -> None:
    """Write the image to a `docker save` archive (written aside, then renamed into place)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with partial.open("wb") as f:
        for chunk in client.images.get(tag).save(named=True):
            f.write(chunk)
    partial.replace(archive)
    print(f"== saved {tag} to {archive} ({archive.stat().st_size / 1e6:.0f} MB)", flush=True)


def build(args: argparse.Namespace, client=None) -> None:
    """`build`: the SwiftShader image (unless one exists for the pinned commit) and the CI image."""
    client = client or connect()
    commit = pinned_swiftshader_commit()
    ss_tag = args.swiftshader_image or swiftshader_image_tag(commit)
    common = {"BASE_IMAGE": args.base_image}
    cache: Path | None = args.swiftshader_cache
    if args.without_swiftshader:
        if args.only == "swiftshader":
            raise DockerTaskError("--without-swiftshader builds the lavapipe-only CI image; drop --only swiftshader")
        # The Dockerfile's `none` stage stands in for the SwiftShader image.
        stream_build(
            client, ci_context(args.extra_ca), tag=args.ci_image or LAVAPIPE_CI_IMAGE,
            dockerfile="docker-builders/ci/Dockerfile",
            buildargs={**common, "SWIFTSHADER_IMAGE": "none", "KBENCH_ICD_SWIFTSHADER": ""},
            network_mode=args.network,
        )
        return
    if args.only in (None, "swiftshader"):
        if not image_exists(client, ss_tag) and cache is not None and cache.is_file() and not args.rebuild:
            load_image(client, cache, ss_tag)
        if image_exists(client, ss_tag) and not args.rebuild:
            print(f"== {ss_tag} exists (pinned commit {commit}); --rebuild builds it again", flush=True)
        else:
            source = "context" if args.offline_source else "git"
            stream_build(
                client, swiftshader_context(args.offline_source), tag=ss_tag, dockerfile="Dockerfile",
                buildargs={**common, "SWIFTSHADER_COMMIT": commit, "SWIFTSHADER_SOURCE": source,
                           "BUILD_NICENESS": str(args.niceness)},
                network_mode=args.network,
            )
            if cache is not None:
                save_image(client, ss_tag, cache)
    if args.only in (None, "ci"):
        if not image_exists(client, ss_tag):
            raise DockerTaskError(f"the CI image copies SwiftShader from {ss_tag}, which does not exist: "
                                  "build it first (drop --only ci)")
        stream_build(
            client, ci_context(args.extra_ca), tag=args.ci_image or DEFAULT_CI_IMAGE,
            dockerfile="docker-builders/ci/Dockerfile",
            buildargs={**common, "SWIFTSHADER_IMAGE": ss_tag}, network_mode=args.network,
        )


# ---------------------------------------------------------------------------------------------
# Running inside the CI image


@dataclass
class Step:
    """One command run in a fresh container of the CI image."""

    name: str
    command: list[str]
    driver: str
    env: dict[str, str] = field(default_factory=dict)


def plan_test_steps(drivers: list[str], *, unit: bool, validate: bool, out: str,
                    filter_expr: str | None, pytest_args: list[str],
                    compare_to: str | None = None) -> list[Step]:
    """The container runs that `test` makes: unit tests (first driver), validate per driver, and
    with compare_to, `kbench compare BASELINE OUT` (the regression check)."""
    unknown = [d for d in drivers if d not in ICD_FILES]
    if unknown or not drivers:
        raise DockerTaskError(f"--drivers: unknown {unknown or drivers}; choose from {sorted(ICD_FILES)}")
    steps = []
    if unit:
        # As `nox -s tests` runs them: with the Khronos validation layer on.
        steps.append(Step(f"unit tests on {drivers[0]}",
                          ["python", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *pytest_args], drivers[0],
                          {"KBENCH_VALIDATION": "1"}))
    if validate:
        for driver in drivers:
            cmd = ["python", "-m", "kbench.cli", "validate", "--out", out]
            if filter_expr:
                cmd += ["-k", filter_expr]
            steps.append(Step(f"validate on {driver}", cmd, driver))
    if compare_to:
        # Markdown, for the job summary; devices matched by name (a Mesa point update on the runner
        # changes the device_key, not what is being compared).
        steps.append(Step(f"compare {out} with {compare_to}",
                          ["python", "-m", "kbench.cli", "compare", compare_to, out, *COMPARE_ARGS], drivers[0]))
    return steps


def git_dir_mounts(checkout: Path) -> dict[str, dict[str, str]]:
    """Volumes for a checkout that is a git worktree: its `.git` is a file naming git data outside
    the checkout, which the container needs at the same path (read-only) for git to work there
    (kbench records the git revision; tests ask git what is ignored). Read from the file, not from
    git, so it also works where that folder is not visible (inside an act job container)."""
    dot_git = checkout / ".git"
    if not dot_git.is_file():
        return {}
    m = re.match(r"gitdir:\s*(\S.*)", dot_git.read_text().strip())
    if not m:
        return {}
    gitdir = Path(m.group(1))
    if not gitdir.is_absolute():
        gitdir = checkout / gitdir
    common = gitdir.parent.parent if gitdir.parent.name == "worktrees" else gitdir
    return {str(common): {"bind": str(common), "mode": "ro"}}


def run_step(client, image: str, step: Step, checkout: Path, log: IO[str] = sys.stdout,
             captured: list[str] | None = None) -> int:
    """Run one step with the checkout mounted at /src; streams its output (and appends it to
    captured, where given); returns its exit code."""
    env = {
        "VK_ICD_FILENAMES": ICD_FILES[step.driver],
        # Runs as the caller's user (files it writes under results/ stay the caller's), who has
        # no home folder in the image.
        "HOME": "/tmp",
        "MPLCONFIGDIR": "/tmp/matplotlib",
        "PYTHONPATH": "/src",
        "CI": os.environ.get("CI", ""),
        **step.env,
    }
    print(f"== {step.name}: {' '.join(step.command)}", file=log, flush=True)
    container = client.containers.run(
        image, step.command, detach=True, working_dir="/src", environment=env,
        volumes={str(checkout): {"bind": "/src", "mode": "rw"}, **git_dir_mounts(checkout)},
        user=f"{os.getuid()}:{os.getgid()}", network_mode="none",
    )
    try:
        for line in container.logs(stream=True, follow=True):
            text = line.decode(errors="replace")
            log.write(text)
            log.flush()
            if captured is not None:
                captured.append(text)
        code = int(container.wait()["StatusCode"])
    finally:
        container.remove(force=True)
    print(f"== {step.name}: exit {code}", file=log, flush=True)
    return code


def write_job_summary(step: Step, code: int, output: str) -> None:
    """Append a step's Markdown output to the GitHub job summary ($GITHUB_STEP_SUMMARY; act sets it
    too). Outside a workflow run there is no summary file and nothing is written."""
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if not summary:
        return
    verdict = "passed" if code == 0 else f"FAILED (exit {code})"
    with open(summary, "a", encoding="utf-8") as f:
        f.write(f"## Regression gate: {step.name} {verdict}\n\n{output.strip()}\n\n")


def test(args: argparse.Namespace, client=None) -> int:
    """`test`: every step runs even after a failure (each driver's results get written)."""
    for name, value in (("--out", args.out), ("--compare-to", args.compare_to)):
        if value and (Path(value).is_absolute() or ".." in Path(value).parts):
            raise DockerTaskError(f"{name} {value}: must be a path inside the checkout (mounted at /src)")
    if args.compare_to and not (REPO_ROOT / args.compare_to).exists():
        raise DockerTaskError(f"--compare-to {args.compare_to}: no such baseline in the checkout")
    steps = plan_test_steps(
        [d.strip() for d in args.drivers.split(",") if d.strip()], unit=args.only in (None, "unit"),
        validate=args.only in (None, "validate"), out=args.out, filter_expr=args.k, pytest_args=args.pytest_args,
        compare_to=args.compare_to if args.only in (None, "compare") else None,
    )
    if not steps:
        raise DockerTaskError("--only compare needs --compare-to BASELINE")
    client = client or connect()
    if not image_exists(client, args.image):
        raise DockerTaskError(f"image {args.image} not found: build it with `nox -s docker_build`")
    (REPO_ROOT / args.out).mkdir(parents=True, exist_ok=True)
    codes = []
    for step in steps:
        captured: list[str] = []
        codes.append((step.name, run_step(client, args.image, step, REPO_ROOT, captured=captured)))
        if step.command[3:4] == ["compare"]:
            write_job_summary(step, codes[-1][1], "".join(captured))
    print("== summary", flush=True)
    for name, code in codes:
        print(f"   {'ok  ' if code == 0 else 'FAIL'} {name} (exit {code})", flush=True)
    return 0 if all(code == 0 for _, code in codes) else 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="kbench Docker images: build them, test in them")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build the SwiftShader image (once per pinned commit) and the CI image")
    b.add_argument("--base-image", default=DEFAULT_BASE_IMAGE,
                   help="Debian bookworm base image (kbench-base:bookworm from make-base-image.sh offline; "
                        "default $KBENCH_BASE_IMAGE, else debian:bookworm-slim)")
    b.add_argument("--offline-source", type=Path, default=None,
                   help="SwiftShader source tree to build instead of fetching the pinned commit with git")
    b.add_argument("--only", choices=["ci", "swiftshader"], default=None)
    b.add_argument("--rebuild", action="store_true", help="build SwiftShader even if its image exists")
    b.add_argument("--swiftshader-image", default=None, help="tag of the SwiftShader image to make or use")
    b.add_argument("--ci-image", default=None,
                   help=f"tag of the CI image (default {DEFAULT_CI_IMAGE}, {LAVAPIPE_CI_IMAGE} with --without-swiftshader)")
    b.add_argument("--without-swiftshader", action="store_true",
                   help=f"build only the lavapipe-only CI image ({LAVAPIPE_CI_IMAGE}): no SwiftShader image needed")
    b.add_argument("--network", default=None,
                   help="network of the build containers, e.g. host where the default bridge has no DNS")
    b.add_argument("--extra-ca", type=Path, action="append",
                   default=[Path(p) for p in os.environ.get("KBENCH_EXTRA_CA", "").split(os.pathsep) if p],
                   help="PEM certificate (*.crt) pip needs behind a TLS-intercepting proxy (repeatable; "
                        "default: the paths in $KBENCH_EXTRA_CA, separated by the path separator)")
    b.add_argument("--swiftshader-cache", type=Path, default=None,
                   help="docker-save archive of the SwiftShader image: loaded when present, written after a build")
    b.add_argument("--niceness", type=int, default=0, choices=range(0, 20), metavar="0..19",
                   help="nice level of SwiftShader's compile")

    t = sub.add_parser("test", help="unit tests and `kbench validate` inside the CI image")
    t.add_argument("--image", default=DEFAULT_CI_IMAGE)
    t.add_argument("--drivers", default="lavapipe,swiftshader", help=f"comma list of {sorted(ICD_FILES)}")
    t.add_argument("--only", choices=["unit", "validate", "compare"], default=None)
    t.add_argument("--compare-to", default=None,
                   help="baseline results (inside the checkout) that `kbench compare` checks --out against")
    t.add_argument("--out", default="results", help="result folder, relative to the checkout")
    t.add_argument("-k", default=None, help="case filter passed to kbench validate")
    t.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            build(args)
            return 0
        return test(args)
    except DockerTaskError as exc:
        print(f"kbench_docker: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
