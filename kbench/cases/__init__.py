"""The case database: one declaration per op or runtime operation (see kbench.cases.base).

``ALL_CASES`` holds every declared case; ``select`` filters them the way ``-k`` does.
Adding an op means adding one `Case` to ``llm_ops.py`` (listed in ``ops.py``; runtime operations
in ``runtime_ops.py``): the suites, the benchmark runner and the reports pick it up from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Case, CaseFailure, Instance, UnsupportedCase, parse_filter
from .ops import BACKEND_CASES
from .runtime_ops import RUNTIME_CASES

__all__ = [
    "ALL_CASES", "Case", "CaseFailure", "Instance", "UnsupportedCase", "get_case",
    "instances", "parse_filter", "select",
]

ALL_CASES: tuple[Case, ...] = BACKEND_CASES + RUNTIME_CASES

_names = [c.name for c in ALL_CASES]
if len(set(_names)) != len(_names):  # a duplicate would make case ids ambiguous in results
    raise RuntimeError(f"duplicate case names: {sorted(n for n in set(_names) if _names.count(n) > 1)}")


def get_case(name: str) -> Case:
    """The case called `name`; ValueError lists the known names otherwise."""
    for c in ALL_CASES:
        if c.name == name:
            return c
    raise ValueError(f"unknown case {name!r}; known cases: {', '.join(_names)}")


def select(layers: Sequence[str] | None = None) -> list[Case]:
    """Cases of the given layers ("backend", "runtime"), all when None."""
    return [c for c in ALL_CASES if layers is None or c.layer in layers]


def instances(mode: str, patterns: Sequence[str] | str | None = None,
              layers: Sequence[str] | None = None, sizes: str = "default") -> list[Instance]:
    """Every instance for `mode` whose case id matches the -k style `patterns`; `sizes` picks the
    bench set ("default", "quick", "full": kbench.cases.base.SIZE_SETS)."""
    keep = parse_filter(patterns)
    return [i for c in select(layers) for i in c.instances(mode, sizes) if keep(i.case_id)]
