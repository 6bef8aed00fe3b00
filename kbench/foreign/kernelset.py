"""A declaration bound to a source tree: shaders compiled, reflected and checked against what the
declaration says, before any GPU work.

:func:`load_kernel_set` is the one entry point: it reads the declaration, finds the source tree
(``--source DIR``), records which commit it is, compiles each GLSL file with the glslang kbench
uses (or reads the SPIR-V), and refuses with the declaration's file and line where the shader
and the declaration disagree (binding count and numbers, a written buffer the shader declares
readonly, the push-constant block's size and members, specialization ids).
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kbench.backend.op_table import OP_BUFFER_ACCESS
from kbench.runtime import compile_source
from kbench.runtime.errors import ShaderCompileError
from kbench.runtime.spirv import ShaderInfo, reflect

from .declaration import LOCAL, SCALAR_TYPES, Declaration, DeclarationError, KernelDecl, load

@dataclass(frozen=True)
class SourceTree:
    """Where the third-party files are and which commit they are."""

    path: Path
    commit: str
    verified: bool  # True when read from the tree's git HEAD, False when only the declared pin is known

    def describe(self) -> str:
        how = "git HEAD" if self.verified else "declared pin, not verified (no git metadata in the tree)"
        return f"{self.path} at {self.commit[:12]} ({how})"


@dataclass(frozen=True)
class LoadedKernel:
    decl: KernelDecl
    spirv: bytes
    info: ShaderInfo
    sha256: str
    push_dtype: np.dtype

    @property
    def name(self) -> str:
        return self.decl.name


@dataclass(frozen=True)
class KernelSet:
    """Every kernel of a declaration, compiled and checked; one implementation per group."""

    declaration: Declaration
    source: SourceTree
    kernels: tuple[LoadedKernel, ...]

    def implementation(self, group: str = "") -> str:
        return self.declaration.implementation(group, self.source.commit)

    def groups(self) -> tuple[str, ...]:
        return self.declaration.groups()

    def group(self, group: str) -> dict[str, list[LoadedKernel]]:
        """op -> kernels of ``group`` (several only for quantized_matmul, one per weight type set)."""
        out: dict[str, list[LoadedKernel]] = {}
        for k in self.kernels:
            if k.decl.group == group:
                out.setdefault(k.decl.op, []).append(k)
        return out

    def provenance(self, group: str = "") -> dict[str, Any]:
        """What a run header records about this implementation."""
        src = self.declaration.source
        return {
            "implementation": self.implementation(group), "declaration": str(self.declaration.path),
            "repository": src.repository, "pinned_commit": src.commit, "source_commit": self.source.commit,
            "commit_verified": self.source.verified, "license": src.license,
            "kernels": {k.name: {"op": k.decl.op, "path": k.decl.path, "sha256": k.sha256}
                        for k in self.kernels if k.decl.group == group},
        }


def find_commit(tree: Path) -> str | None:
    """The git HEAD commit of ``tree`` (or a tree above it), or None when it is not a git checkout."""
    try:
        proc = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    out = proc.stdout.strip()
    return out if proc.returncode == 0 and len(out) == 40 else None


def resolve_source(decl: Declaration, source: str | Path | None) -> SourceTree:
    """The source tree for ``decl``: ``source`` (a checkout or snapshot of the declared repository;
    for ``commit = "local"`` declarations, default: the declaration's own folder)."""
    if source is None and decl.source.commit == LOCAL:
        source = decl.path.parent
    if source is None:
        raise DeclarationError(
            f"{decl.path}: kernels of {decl.source.name} need their source tree: pass --source DIR, a clone of "
            f"{decl.source.repository} at commit {decl.source.commit} "
            f"(git clone {decl.source.repository} DIR && git -C DIR checkout {decl.source.commit})")
    root = Path(source)
    if not root.is_dir():
        raise DeclarationError(f"--source {root}: no such directory")
    commit = find_commit(root)
    if decl.source.commit == LOCAL:
        return SourceTree(root, commit or LOCAL, commit is not None)
    if commit is not None and commit != decl.source.commit:
        raise DeclarationError(
            f"--source {root} is at commit {commit}, but {decl.path} is pinned to {decl.source.commit}: check out "
            f"the pinned commit (git -C {root} checkout {decl.source.commit}) or update the declaration's pin "
            "after reviewing it against the new sources")
    return SourceTree(root, commit or decl.source.commit, commit is not None)


def load_kernel_set(declaration: str | Path | Declaration, source: str | Path | None) -> KernelSet:
    """Read ``declaration``, compile and check every kernel against the tree at ``source``."""
    decl = declaration if isinstance(declaration, Declaration) else load(declaration)
    tree = resolve_source(decl, source)
    base = tree.path / decl.source.root
    return KernelSet(decl, tree, tuple(_load_kernel(k, base) for k in decl.kernels))


def _load_kernel(k: KernelDecl, base: Path) -> LoadedKernel:
    path = base / k.path
    where = f"{k.where}: kernel {k.name!r}"
    if not path.is_file():
        raise DeclarationError(f"{where}: {'glsl' if k.is_glsl else 'spirv'} file {path} does not exist")
    try:
        if k.is_glsl:
            spirv = compile_source(path.read_text(encoding="utf-8"), defines=dict(k.defines),
                                   target_env=k.target_env, include_dirs=[str(path.parent)])
        else:
            spirv = path.read_bytes()
        info = reflect(spirv)
    except ShaderCompileError as exc:
        raise DeclarationError(f"{where}: {path} does not compile: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DeclarationError(f"{where}: {path} is not valid SPIR-V: {exc}") from None
    push_dtype = _check_against_shader(k, info, where)
    return LoadedKernel(k, spirv, info, hashlib.sha256(path.read_bytes()).hexdigest(), push_dtype)


def _check_against_shader(k: KernelDecl, info: ShaderInfo, where: str) -> np.dtype:
    reflected = sorted(b.binding for b in info.bindings if b.set == 0)
    if any(b.set != 0 for b in info.bindings):
        raise DeclarationError(f"{where}: the shader uses descriptor sets other than 0; kbench binds set 0 only")
    declared = sorted(b.binding for b in k.bindings)
    if len(declared) != len(reflected):
        raise DeclarationError(f"{where}: declares {len(declared)} binding(s) {declared}, the shader has "
                               f"{len(reflected)} {reflected}")
    if declared != reflected:
        raise DeclarationError(f"{where}: declares bindings {declared}, the shader's are {reflected}")
    if reflected != list(range(len(reflected))):
        raise DeclarationError(f"{where}: the shader's bindings {reflected} are not 0..{len(reflected) - 1}; "
                               "kbench binds buffers in order from 0")
    readonly = info.readonly_bindings()
    for b in k.bindings:
        if b.arg is not None and "w" in OP_BUFFER_ACCESS.get(k.op, {}).get(b.arg, "") and b.binding in readonly:
            raise DeclarationError(f"{where}: binding {b.binding} ({b.arg}) is written by {k.op}, but the shader "
                                   "declares it readonly")
    fields = [(c.name, SCALAR_TYPES[c.type][0]) for c in k.push_constants]
    declared_size = 4 * len(fields)  # every declarable scalar type is 4 bytes
    if declared_size != info.push_size:
        raise DeclarationError(f"{where}: push_constants add up to {declared_size} bytes, the shader's push-constant "
                               f"block is {info.push_size} bytes")
    members = sorted(info.push_members, key=lambda m: m.offset)
    if members and k.push_constants:
        flat = [(m.offset + 4 * i, m.scalar) for m in members for i in range(m.count)]
        if len(flat) != len(k.push_constants):
            raise DeclarationError(f"{where}: declares {len(k.push_constants)} push constants, the shader's block "
                                   f"holds {len(flat)} scalars")
        for idx, (c, (off, scalar)) in enumerate(zip(k.push_constants, flat)):
            want = SCALAR_TYPES[c.type][1]
            if off != 4 * idx or scalar.width != 32 or scalar.kind != want:
                kind = {"u": "uint", "i": "int", "f": "float", "b": "bool"}.get(scalar.kind, scalar.kind)
                raise DeclarationError(f"{where}: push constant {c.name!r} is declared {c.type} at byte {4 * idx}; "
                                       f"the shader has a {kind}{scalar.width} at byte {off}")
    for c in k.spec_constants:
        sc = info.spec_constants.get(int(c.name))
        if sc is None:
            raise DeclarationError(f"{where}: specialization constant id {c.name} is not in the shader "
                                   f"(its ids: {sorted(info.spec_constants) or 'none'})")
        if sc.scalar.kind != SCALAR_TYPES[c.type][1]:
            raise DeclarationError(f"{where}: specialization constant id {c.name} is declared {c.type}; the "
                                   f"shader's is of kind {sc.scalar.kind}{sc.scalar.width}")
    if k.spec_constants:
        ids = sorted(int(c.name) for c in k.spec_constants)
        if ids != list(range(len(ids))):
            raise DeclarationError(f"{where}: specialization constant ids {ids} must be 0..{len(ids) - 1} "
                                   "(kbench passes them in order)")
    return np.dtype(fields) if fields else np.dtype([])


def describe(ks: KernelSet) -> list[Mapping[str, Any]]:
    """One row per kernel: name, group, op, dtypes, file, bindings, push bytes (for `kbench kernels`)."""
    rows = []
    for k in ks.kernels:
        d = k.decl
        rows.append({"implementation": ks.implementation(d.group), "kernel": d.name, "op": d.op,
                     "dtypes": ",".join(t.name for t in d.dtypes), "file": d.path,
                     "bindings": len(d.bindings), "push_bytes": k.info.push_size,
                     "local_size": "x".join(map(str, k.info.local_size or ())) or "spec"})
    return rows

