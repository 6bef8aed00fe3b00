"""Kernels kbench did not write: declared in TOML, compiled from a third party's tree, checked and
timed by kbench's cases exactly as kbench's own kernels are (docs/foreign-kernels.md).

    ks = load_kernel_set("kbench/foreign/sets/yule.toml", "path/to/yule")   # checks, no GPU work
    be = ForeignBackend(ks, group="")                                        # a ComputeBackend
"""

from __future__ import annotations

from pathlib import Path

from .declaration import Declaration, DeclarationError, load, parse
from .formula import FormulaError

#: declaration files shipped with kbench, by short name (``--kernels yule``)
SETS_DIR = Path(__file__).parent / "sets"


def shipped_sets() -> dict[str, Path]:
    """Short name -> path of every declaration file shipped with kbench."""
    return {p.stem: p for p in sorted(SETS_DIR.glob("*.toml"))}


def declaration_path(name_or_path: str | Path) -> Path:
    """A shipped set's short name (``yule``) or a path to a declaration file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        return p
    sets = shipped_sets()
    if str(name_or_path) in sets:
        return sets[str(name_or_path)]
    raise DeclarationError(f"{name_or_path}: neither a declaration file nor a shipped set "
                           f"({', '.join(sets) or 'none shipped'})")


__all__ = ["Declaration", "DeclarationError", "FormulaError", "declaration_path", "load", "parse", "shipped_sets"]
