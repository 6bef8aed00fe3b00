"""Regression check between two sets of runs: speed within a noise band, and correctness."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .frames import _text, format_time, latest, prepare
from .render import render_table, table_records

VERDICTS = ("slower", "faster", "same", "new", "missing", "untimed")
MATCH_ON = {"device_key": "device_key", "device_name": "device_name"}
_FAILED = {"fail", "error"}


@dataclass
class Comparison:
    """Result of :func:`compare`. ``table`` has one row per matched (device, case, queue
    configuration, backend, mode); ``exit_code`` is 0 only without regressions, without
    correctness losses and, unless ``allow_missing``, without baseline cases missing from the
    current results (a run cut short must not pass the gate)."""

    table: pd.DataFrame
    threshold: float
    noise_k: float
    match: str
    warnings: list[str] = field(default_factory=list)
    allow_missing: bool = False

    @property
    def regressions(self) -> pd.DataFrame:
        return self.table[self.table["verdict"] == "slower"]

    @property
    def improvements(self) -> pd.DataFrame:
        return self.table[self.table["verdict"] == "faster"]

    @property
    def correctness_losses(self) -> pd.DataFrame:
        return self.table[self.table["correctness"] == "loss"]

    @property
    def correctness_changes(self) -> pd.DataFrame:
        return self.table[self.table["correctness"].isin(["loss", "gain", "changed"])]

    @property
    def missing(self) -> pd.DataFrame:
        return self.table[self.table["verdict"] == "missing"]

    @property
    def missing_fails(self) -> bool:
        return bool(len(self.missing)) and not self.allow_missing

    @property
    def exit_code(self) -> int:
        return 1 if len(self.regressions) or len(self.correctness_losses) or self.missing_fails else 0

    def counts(self) -> dict[str, int]:
        counts = {v: int((self.table["verdict"] == v).sum()) for v in VERDICTS}
        counts["correctness_losses"] = len(self.correctness_losses)
        counts["correctness_gains"] = int((self.table["correctness"] == "gain").sum())
        return counts

    def format(self, fmt: str = "text", show_all: bool = False) -> str:
        """Human summary ("text" or "md") or the full result as JSON."""
        if fmt == "json":
            return json.dumps({"exit_code": self.exit_code, "threshold": self.threshold,
                               "noise_k": self.noise_k, "match": self.match, "allow_missing": self.allow_missing,
                               "counts": self.counts(),
                               "warnings": self.warnings, "rows": table_records(self.table)},
                              indent=1, ensure_ascii=False, default=str)
        if fmt not in ("text", "md"):
            raise ValueError(f"unknown compare format {fmt!r}; choose text, md or json")
        tfmt = "github" if fmt == "md" else "simple"
        head = "## " if fmt == "md" else ""
        c = self.counts()
        if len(self.regressions) or len(self.correctness_losses):
            verdict = "REGRESSION"
        else:
            verdict = "MISSING CASES" if self.missing_fails else "OK"
        lines = [f"{'# ' if fmt == 'md' else ''}kbench compare: {verdict}", "",
                 f"{c['slower']} slower, {c['faster']} faster, {c['same']} same (within the noise band), "
                 f"{c['new']} new, {c['missing']} missing, {c['untimed']} untimed; "
                 f"{c['correctness_losses']} correctness losses, {c['correctness_gains']} fixed. "
                 f"Threshold {self.threshold:.1%}, noise band = max(threshold, {self.noise_k:g} x "
                 f"combined relative spread), matched on {self.match}.", ""]
        if self.missing_fails:
            lines += [f"{c['missing']} case(s) of the baseline are missing from the current results (a run cut "
                      "short?): the gate fails; pass --allow-missing to accept fewer cases.", ""]
        for note in self.warnings:
            lines.append(f"warning: {note}")
        sections = [("Correctness changes", self.correctness_changes),
                    ("Regressions (slower)", self.regressions),
                    ("Improvements (faster)", self.improvements),
                    ("New / missing", self.table[self.table["verdict"].isin(["new", "missing"])])]
        if show_all:
            sections.append(("All", self.table))
        for title, part in sections:
            if part.empty:
                continue
            lines += [f"{head}{title}", "", render_table(_display(part), tfmt)]
        return "\n".join(lines).rstrip() + "\n"


def _display(part: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({
        "device": part["device"], "case": part["case_id"], "queues": part["queue_config"],
        "backend": part["backend"], "mode": part["mode"],
        "status": [f"{_text(b) or '-'} -> {_text(c) or '-'}" if b != c else _text(c)
                   for b, c in zip(part["base_status"], part["cur_status"])],
        "base": part["base_ns"].map(format_time), "current": part["cur_ns"].map(format_time),
        "change": part["change"].map(lambda v: "" if math.isnan(v) else f"{v:+.1%}"),
        "band": part["band"].map(lambda v: "" if math.isnan(v) else f"±{v:.1%}"),
        "verdict": part["verdict"],
        "reason": part["cur_reason"].map(_text),
    })
    return out.reset_index(drop=True)


def correctness_change(base: str | None, cur: str | None) -> str:
    """"loss", "gain", "changed" or "" for a status transition (None: not present)."""
    if not base or not cur or base == cur:
        return ""
    if cur in _FAILED and base not in _FAILED:
        return "loss"
    if base == "pass" and cur in ("unsupported", "xfail"):
        return "loss"  # a case that passed no longer runs: coverage lost
    if cur == "pass":
        return "gain"
    return "changed"


def compare(baseline_df: pd.DataFrame, current_df: pd.DataFrame, threshold: float = 0.05,
            noise_k: float = 3.0, match: str = "device_key", allow_missing: bool = False) -> Comparison:
    """Compare two result frames (from ``load_runs``), case by case.

    Records are matched on the device (``match``: "device_key" = device and driver, or
    "device_name" to follow a device across driver updates) + case_id + queue_config + backend +
    mode. The relative change of the median time is judged against a band of
    ``max(threshold, noise_k * sqrt(s_base**2 + s_cur**2))`` where s is each run's relative spread
    (stdev or IQR over median): beyond it "slower"/"faster", inside it "same". Baseline cases
    missing from the current results fail the comparison unless ``allow_missing``.
    """
    if not (isinstance(threshold, (int, float)) and 0 <= threshold < 10):
        raise ValueError(f"threshold must be a relative change such as 0.05, got {threshold!r}")
    if not (isinstance(noise_k, (int, float)) and noise_k >= 0):
        raise ValueError(f"noise_k must be >= 0, got {noise_k!r}")
    if match not in MATCH_ON:
        raise ValueError(f"match must be one of {list(MATCH_ON)}, got {match!r}")
    keys = [MATCH_ON[match], "case_id", "queue_config", "backend", "mode"]

    def side(df: pd.DataFrame) -> pd.DataFrame:
        cols = keys + ["device", "time_ns", "timer", "rel_spread", "status", "reason"]
        if df.empty:
            return pd.DataFrame(columns=cols)
        p = prepare(df)
        p = p[p["kind"] == "case"]
        return latest(p, keys)[cols]

    base, cur = side(baseline_df), side(current_df)
    merged = base.merge(cur, on=keys, how="outer", suffixes=("_b", "_c"), indicator=True)
    rows: list[dict[str, Any]] = []
    for r in merged.to_dict("records"):
        b_status = _text(r.get("status_b")) or None
        c_status = _text(r.get("status_c")) or None
        b_ns, c_ns = _num(r.get("time_ns_b")), _num(r.get("time_ns_c"))
        change = band = math.nan
        if r["_merge"] == "left_only":
            verdict = "missing"
        elif r["_merge"] == "right_only":
            verdict = "new"
        elif (r["mode"] == "bench" and b_status == "pass" and c_status == "pass"
              and b_ns > 0 and c_ns > 0 and r.get("timer_b") == r.get("timer_c")):
            change = c_ns / b_ns - 1.0
            spread = math.hypot(_num(r.get("rel_spread_b"), 0.0), _num(r.get("rel_spread_c"), 0.0))
            band = max(threshold, noise_k * spread)
            verdict = "slower" if change > band else ("faster" if change < -band else "same")
        else:
            verdict = "untimed"
        rows.append({
            "device": _text(r.get("device_c")) or _text(r.get("device_b")),
            "device_match": r[keys[0]], "case_id": r["case_id"], "queue_config": r["queue_config"],
            "backend": r["backend"], "mode": r["mode"], "base_status": b_status, "cur_status": c_status,
            "correctness": correctness_change(b_status, c_status),
            "base_ns": b_ns, "cur_ns": c_ns, "change": change, "band": band, "verdict": verdict,
            "cur_reason": _text(r.get("reason_c")) or _text(r.get("reason_b")),
        })
    columns = ["device", "device_match", "case_id", "queue_config", "backend", "mode", "base_status",
               "cur_status", "correctness", "base_ns", "cur_ns", "change", "band", "verdict", "cur_reason"]
    table = pd.DataFrame(rows, columns=columns)
    if not table.empty:
        order = {"loss": 0, "changed": 1, "gain": 2, "": 3}
        table = (table.assign(_c=table["correctness"].map(order),
                              _v=table["verdict"].map({v: i for i, v in enumerate(VERDICTS)}))
                 .sort_values(["_c", "_v", "device", "case_id"], kind="stable")
                 .drop(columns=["_c", "_v"]).reset_index(drop=True))
    notes = list(baseline_df.attrs.get("warnings", [])) + list(current_df.attrs.get("warnings", []))
    if table.empty:
        notes.append("nothing to compare: neither result set holds case records")
    elif len(base) and len(cur) and not (merged["_merge"] == "both").any():
        notes.append("no case matched between the two result sets (different devices or drivers? "
                     "try matching on device_name)")
    return Comparison(table=table, threshold=float(threshold), noise_k=float(noise_k), match=match,
                      warnings=notes, allow_missing=bool(allow_missing))


def _num(value: Any, default: float = math.nan) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return default
    return default if np.isnan(v) else v
