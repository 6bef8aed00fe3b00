"""Judging an output: NMSE against float64, exact comparison, guard bytes.

NMSE = sum((out - ref)^2) / sum(ref^2), accumulated in float64 (llama.cpp's test-backend-ops
metric). Any NaN in an output is a failure; infinities must match the reference in sign.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .base import CaseFailure

#: The byte written around every checked output. 0xA5A5A5A5 as float32 is -2.9e-16: finite, and
#: not a value any op here produces by accident.
GUARD_BYTE = 0xA5
#: Bytes of guard after (and, where the op takes an offset, before) every checked output.
GUARD_BYTES = 256


@dataclass
class Verdict:
    """Outcome of comparing one case's outputs with its reference."""

    passed: bool
    reason: str = ""
    metric: dict[str, float] = field(default_factory=dict)


def nmse(out: np.ndarray, ref: np.ndarray) -> float:
    """Normalized mean squared error in float64; NaN when out has NaN; 0 when both are zero."""
    o = np.asarray(out, dtype=np.float64).ravel()
    r = np.asarray(ref, dtype=np.float64).ravel()
    if o.shape != r.shape:
        raise ValueError(f"output has {o.size} elements, reference has {r.size}")
    if np.isnan(o).any():
        return float("nan")
    finite = np.isfinite(r)
    diff = o[finite] - r[finite]
    num = float(np.dot(diff, diff))
    den = float(np.dot(r[finite], r[finite]))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def judge_nmse(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray], tolerance: float) -> Verdict:
    """Pass when every output's NMSE <= tolerance, no NaN, and infinities agree with the reference."""
    metric: dict[str, float] = {}
    worst = 0.0
    for name, ref in reference.items():
        if name not in outputs:
            return Verdict(False, f"output {name!r} missing from the case's results")
        out = np.asarray(outputs[name])
        ref = np.asarray(ref)
        if out.size != ref.size:
            return Verdict(False, f"{name}: {out.size} elements returned, expected {ref.size}")
        o64 = out.astype(np.float64).ravel()
        r64 = ref.astype(np.float64).ravel()
        nan_at = np.flatnonzero(np.isnan(o64))
        if nan_at.size:
            metric[f"nmse_{name}" if len(reference) > 1 else "nmse"] = float("nan")
            return Verdict(False, f"{name}: NaN at index {int(nan_at[0])} ({nan_at.size} NaN values)", _agg(metric))
        inf_ref = np.isinf(r64)
        bad_inf = np.flatnonzero((np.isinf(o64) != inf_ref) | (inf_ref & (np.sign(o64) != np.sign(r64))))
        if bad_inf.size:
            i = int(bad_inf[0])
            return Verdict(False, f"{name}: index {i} is {float(o64[i])!r}, reference {float(r64[i])!r} (infinity mismatch)")
        err = nmse(o64, r64)
        key = f"nmse_{name}" if len(reference) > 1 else "nmse"
        metric[key] = err
        worst = max(worst, err)
        if not err <= tolerance:
            i = int(np.argmax(np.abs(o64 - r64)))
            return Verdict(
                False,
                f"{name}: NMSE {err:.3e} > tolerance {tolerance:.1e} "
                f"(largest error at index {i}: got {float(o64[i])!r}, expected {float(r64[i])!r})",
                _agg(metric),
            )
    metric["nmse"] = worst
    return Verdict(True, "", metric)


def _agg(metric: dict[str, float]) -> dict[str, float]:
    if "nmse" not in metric and metric:
        vals = list(metric.values())
        metric["nmse"] = float("nan") if any(np.isnan(v) for v in vals) else max(vals)
    return metric


def judge_exact(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> Verdict:
    """Pass when every output equals its reference element for element (bytes for raw data)."""
    for name, ref in reference.items():
        if name not in outputs:
            return Verdict(False, f"output {name!r} missing from the case's results")
        out = np.asarray(outputs[name]).ravel()
        ref = np.asarray(ref).ravel()
        if out.size != ref.size:
            return Verdict(False, f"{name}: {out.size} elements returned, expected {ref.size}")
        if out.dtype.kind == "f" or ref.dtype.kind == "f":
            same = (out == ref) | (np.isnan(out.astype(np.float64)) & np.isnan(ref.astype(np.float64)))
        else:
            same = out == ref
        bad = np.flatnonzero(~same)
        if bad.size:
            i = int(bad[0])
            return Verdict(
                False,
                f"{name}: first mismatch at index {i}: got {out[i].item()!r}, expected {ref[i].item()!r} "
                f"({bad.size} of {out.size} differ)",
                {"mismatches": float(bad.size)},
            )
    return Verdict(True, "", {"mismatches": 0.0})


def guard_pattern(nbytes: int) -> np.ndarray:
    """`nbytes` guard bytes."""
    return np.full(nbytes, GUARD_BYTE, dtype=np.uint8)


def check_guards(raw: np.ndarray, start: int, stop: int, what: str) -> None:
    """Raise CaseFailure when any byte of `raw` outside [start, stop) differs from the guard byte."""
    raw = np.asarray(raw, dtype=np.uint8).ravel()
    for lo, hi, side in ((0, start, "before"), (stop, raw.size, "after")):
        region = raw[lo:hi]
        bad = np.flatnonzero(region != GUARD_BYTE)
        if bad.size:
            off = lo + int(bad[0])
            raise CaseFailure(
                f"{what}: guard byte {side} the output changed at byte {off} "
                f"(output range [{start}, {stop}), value 0x{int(raw[off]):02x}, expected 0x{GUARD_BYTE:02x}; "
                f"{bad.size} guard bytes changed): out-of-bounds write"
            )
