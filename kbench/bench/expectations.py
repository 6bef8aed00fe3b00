"""Expected failures per driver and case (in the manner of Mesa's deqp-runner and ANGLE).

An expectations file is TOML with a list of ``[[expected]]`` tables::

    [[expected]]
    driver = "llvmpipe*"          # glob over the driver name (case-insensitive); default "*"
    device = "*"                  # glob over the device name; default "*"
    case = "rope[*pos=32767*]"    # glob (* and ?) over case ids or case names (required)
    queue_config = "*"            # optional glob over the queue configuration
    status = "fail"               # "fail", "error" or "any" (fail or error); default "any"
    reason = "why it is known"    # required: an expectation says why

A result that matches an entry and has the expected status becomes ``xfail`` (it does not
fail the run). A new failure (no matching entry) fails the run. A result that passes although
an entry expects it to fail is an *unexpected pass*: it stays ``pass``, is flagged, and the
summary lists it so the entry can be removed.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from kbench.cases.base import glob_match
from kbench.results.records import case_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI (declared in pyproject.toml for python<3.11)
    import tomli as tomllib

EXPECTABLE = ("fail", "error", "any")


class ExpectationsError(ValueError):
    """An expectations file is malformed; the message names the file, entry and field."""


@dataclass(frozen=True)
class Expectation:
    case: str
    reason: str
    driver: str = "*"
    device: str = "*"
    queue_config: str = "*"
    status: str = "any"
    source: str = ""

    def matches(self, driver: str, device: str, case_id: str, queue_config: str) -> bool:
        def glob(pattern: str, value: str) -> bool:
            return glob_match(pattern, value, ignore_case=True)

        return (glob(self.driver, driver) and glob(self.device, device)
                and glob(self.queue_config, queue_config)
                and (glob(self.case, case_id) or glob(self.case, case_name(case_id))))

    def expects(self, status: str) -> bool:
        return status in ("fail", "error") if self.status == "any" else status == self.status


def parse(text: str, source: str = "<string>") -> list[Expectation]:
    """Expectations from TOML text; ExpectationsError names the problem and where."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"{source}: not valid TOML: {exc}") from None
    unknown_top = set(data) - {"expected"}
    if unknown_top:
        raise ExpectationsError(f"{source}: unknown top-level key(s) {sorted(unknown_top)}; use [[expected]] tables")
    entries = data.get("expected", [])
    if not isinstance(entries, list):
        raise ExpectationsError(f"{source}: 'expected' must be an array of tables ([[expected]])")
    out = []
    allowed = {"case", "reason", "driver", "device", "queue_config", "status"}
    for n, e in enumerate(entries, 1):
        where = f"{source}: expected entry {n}"
        if not isinstance(e, dict):
            raise ExpectationsError(f"{where}: must be a table")
        extra = set(e) - allowed
        if extra:
            raise ExpectationsError(f"{where}: unknown key(s) {sorted(extra)}; allowed: {sorted(allowed)}")
        for key in ("case", "reason"):
            if not isinstance(e.get(key), str) or not e[key].strip():
                raise ExpectationsError(f"{where}: '{key}' is required and must be a non-empty string")
        for key in ("driver", "device", "queue_config", "status"):
            if key in e and not isinstance(e[key], str):
                raise ExpectationsError(f"{where}: '{key}' must be a string, got {e[key]!r}")
        status = e.get("status", "any")
        if status not in EXPECTABLE:
            raise ExpectationsError(f"{where}: 'status' must be one of {EXPECTABLE}, got {status!r}")
        out.append(Expectation(case=e["case"], reason=e["reason"], driver=e.get("driver", "*"),
                               device=e.get("device", "*"), queue_config=e.get("queue_config", "*"),
                               status=status, source=f"{source}#{n}"))
    return out


def load(paths: Iterable[str | Path] = (), *, default: bool = True) -> list[Expectation]:
    """The shipped kbench/cases/expectations.toml (when `default`) plus each file in `paths`."""
    out: list[Expectation] = []
    if default:
        try:
            text = resources.files("kbench.cases").joinpath("expectations.toml").read_text(encoding="utf-8")
        except FileNotFoundError:
            text = ""
        out += parse(text, "kbench/cases/expectations.toml")
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise ExpectationsError(f"expectations file {path} does not exist")
        out += parse(path.read_text(encoding="utf-8"), str(path))
    return out


def apply(record: dict[str, Any], expectations: list[Expectation], driver: str, device: str) -> dict[str, Any]:
    """Mark `record` (in place, and returned): an expected failure becomes "xfail" (the original
    status and the expectation's reason are kept), a pass against an expectation is flagged as
    an unexpected pass."""
    status = record.get("status")
    cid, qc = str(record.get("case_id", "")), str(record.get("queue_config", ""))
    for e in expectations:
        if not e.matches(driver, device, cid, qc):
            continue
        if e.expects(status):
            record["expected"] = {"status": status, "reason": e.reason, "source": e.source}
            record["reason"] = f"expected {status} ({e.reason}): {record.get('reason', '')}"
            record["status"] = "xfail"
            return record
        if status == "pass":
            record["unexpected_pass"] = True
            record["expected"] = {"status": e.status, "reason": e.reason, "source": e.source}
            return record
    return record


@dataclass
class Summary:
    """Counts per status and the results that decide the exit code."""

    counts: Counter = field(default_factory=Counter)
    new_failures: list[str] = field(default_factory=list)
    unexpected_passes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: device peaks measured (``kbench peaks``' records, in a bench's progress count but not results)
    peaks: int = 0

    def add(self, record: dict[str, Any]) -> None:
        status = record.get("status", "error")
        self.counts[status] += 1
        impl = record.get("implementation")
        who = f" {impl}" if impl and impl not in ("kbench", "numpy") else ""
        label = f"{record.get('device_name', '')}{who} {record.get('queue_config', '')} {record.get('case_id', '')}".strip()
        if status in ("fail", "error"):
            self.new_failures.append(f"{label}: {status}: {record.get('reason', '')}")
        if record.get("unexpected_pass"):
            self.unexpected_passes.append(label)

    @property
    def ok(self) -> bool:
        """True when no new failure happened (unsupported and xfail do not fail a run)."""
        return not self.new_failures

    @property
    def total(self) -> int:
        return sum(self.counts.values())
