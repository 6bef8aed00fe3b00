"""What a report knows of the current case declarations.

The report layer reads results only and does not import kbench.cases; `kbench report` (kbench.cli,
which may) hands the declarations' facts in with ``use``. Empty (the default, e.g. a report built
from a library call): every record stays and each is judged by the peak it recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CaseCatalogue:
    #: case ids the declarations generate now (any mode)
    case_ids: frozenset[str] = frozenset()
    #: case name -> the measured peak it is judged by now ("matmul_f16" -> "peak.coopmat_fp16")
    peaks: Mapping[str, str] = field(default_factory=dict)


_current = CaseCatalogue()


def use(case_ids: Iterable[str], peaks: Mapping[str, str]) -> None:
    """Set the catalogue the following reports use."""
    global _current
    _current = CaseCatalogue(frozenset(case_ids), dict(peaks))


def current() -> CaseCatalogue:
    return _current
