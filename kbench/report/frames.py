"""Derived columns shared by the tables, the comparison and the plots.

Everything here works on the flat frame from ``kbench.results.load_runs``: device labels,
the time a row is judged by, throughput, measured peaks and the peak a case is measured against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from kbench.results.records import IMPLEMENTATION_OF_BACKEND
from kbench.results.schema import PEAK_UNITS

STATUS_ORDER = {"pass": 1, "xfail": 2, "unsupported": 3, "error": 4, "fail": 5}
BANDWIDTH_UNIT = "GB/s"
COMPUTE_UNIT = "GFLOP/s"
_F16_DTYPES = {"f16", "float16", "fp16", "half"}


def column(df: pd.DataFrame, name: str) -> pd.Series:
    """``df[name]`` or an all-missing series when the column was never recorded."""
    if name in df.columns:
        return df[name]
    return pd.Series([None] * len(df), index=df.index, dtype=object)


def numeric(df: pd.DataFrame, name: str) -> pd.Series:
    return pd.to_numeric(column(df, name), errors="coerce").astype(float)


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    return str(value)


def device_labels(df: pd.DataFrame) -> dict[tuple[str, str], str]:
    """Column label per (device_key, backend): the device name, "(backend)" for non-Vulkan
    rows (e.g. "NVIDIA H200 (torch-cuda)"), and the driver when one name has several drivers."""
    rows = (df[["device_key", "backend", "device_name", "driver_name", "driver_version"]]
            .drop_duplicates(["device_key", "backend"]))
    base: dict[tuple[str, str], str] = {}
    for r in rows.itertuples(index=False):
        name = _text(r.device_name) or _text(r.device_key)
        base[(r.device_key, r.backend)] = name if r.backend == "vulkan" else f"{name} ({r.backend})"
    labels: dict[tuple[str, str], str] = {}
    for r in rows.itertuples(index=False):
        key = (r.device_key, r.backend)
        label = base[key]
        if sum(1 for v in base.values() if v == label) > 1:
            label = f"{label} [{_text(r.driver_name)} {_text(r.driver_version)}]".replace(" ]", "]")
        labels[key] = label
    # two keys can still share a label (same driver text, different device ids)
    counts: dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    return {k: (f"{v} {{{k[0]}}}" if counts[v] > 1 else v) for k, v in labels.items()}


def implementation_axis(df: pd.DataFrame) -> pd.Series:
    """The column a record's figures go under besides its device: its backend for kbench's own
    kernels, NumPy and the PyTorch peer, and the implementation (``yule@1ef0762``,
    ``ggml-vulkan@d99724f``) for kernels kbench did not write, so that those get columns
    of their own beside kbench's on the same device instead of replacing its rows."""
    from kbench.results.records import IMPLEMENTATION_OF_BACKEND

    backend = column(df, "backend").map(_text)
    impl = column(df, "implementation").map(_text)
    own = [i in ("", IMPLEMENTATION_OF_BACKEND.get(b, b)) for b, i in zip(backend, impl)]
    return pd.Series([b if o else i for b, i, o in zip(backend, impl, own)], index=df.index, dtype=object)


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Copy of ``df`` with derived columns: device, time_ns, timer, gbps_calc, gflops_calc,
    rel_spread, row (case_id plus the queue configuration when it is not "single", plus the
    run's kernel options, ``variant``, where it had any)."""
    out = df.copy()
    if out.empty:
        for name in ("device", "time_ns", "timer", "gbps_calc", "gflops_calc", "rel_spread", "row", "variant",
                     "implementation"):
            out[name] = pd.Series(dtype=object)
        return out
    out["variant"] = column(out, "variant").map(_text)
    out["backend"] = implementation_axis(out)
    labels = device_labels(out)
    # the implementation axis: a kernel set other than its backend's own (a foreign set on Vulkan)
    # gets a column of its own beside kbench's on the same device
    impl = column(out, "implementation").map(_text)
    out["implementation"] = [i or IMPLEMENTATION_OF_BACKEND.get(b, b) for i, b in zip(impl, out["backend"])]
    out["device"] = [labels[(k, b)] + ("" if i == IMPLEMENTATION_OF_BACKEND.get(b, b) else f" ({i})")
                     for k, b, i in zip(out["device_key"], out["backend"], out["implementation"])]
    gpu = numeric(out, "gpu_ns.median")
    host = numeric(out, "host_ns.median")
    out["time_ns"] = gpu.where(gpu.notna(), host)
    out["timer"] = np.where(gpu.notna(), "gpu", np.where(host.notna(), "host", ""))
    # bytes per ns is GB/s and flops per ns is GFLOP/s
    with np.errstate(divide="ignore", invalid="ignore"):
        derived_bw = numeric(out, "bytes") / out["time_ns"]
        derived_fl = numeric(out, "flops") / out["time_ns"]
    gbps, gflops = numeric(out, "gbps"), numeric(out, "gflops")
    out["gbps_calc"] = gbps.where(gbps.notna(), derived_bw)
    out["gflops_calc"] = gflops.where(gflops.notna(), derived_fl)
    out["rel_spread"] = relative_spread(out)
    qc = column(out, "queue_config").map(_text)
    cid = column(out, "case_id").map(_text)
    out["row"] = [(c if q in ("single", "") else f"{c} [{q}]") + (f" [{v}]" if v else "")
                  for c, q, v in zip(cid, qc, out["variant"])]
    return out


def work_rate(record: Mapping[str, Any]) -> float:
    """Work per ns of a prepared record: FLOPs, else bytes, else 1 (one call) per median ns.

    Ratios between devices or queue configurations compare these rates, not raw times, because
    one timed call may cover more work in one configuration (several lanes) than in another.
    """
    t = record.get("time_ns")
    if t is None or _nan(t) or t <= 0:
        return math.nan
    for name in ("flops", "bytes"):
        work = record.get(name)
        if work is not None and not _nan(work) and work > 0:
            return float(work) / t
    return 1.0 / t


def _nan(value: Any) -> bool:
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return True


def relative_spread(df: pd.DataFrame) -> pd.Series:
    """Spread of the timing samples relative to the median: stdev/median, or the IQR turned
    into a normal-equivalent sigma (IQR/1.349) when no stdev was recorded; 0 when neither."""
    frames = []
    for timer in ("gpu_ns", "host_ns"):
        med = numeric(df, f"{timer}.median")
        sd = numeric(df, f"{timer}.stdev")
        iqr = numeric(df, f"{timer}.iqr") / 1.349
        sigma = sd.where(sd.notna(), iqr)
        with np.errstate(divide="ignore", invalid="ignore"):
            frames.append((sigma / med).where(med > 0))
    gpu_rel, host_rel = frames
    has_gpu = numeric(df, "gpu_ns.median").notna()
    rel = gpu_rel.where(has_gpu, host_rel)
    return rel.fillna(0.0).clip(lower=0.0)


def latest(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The newest record (by its time stamp) per ``keys``: re-runs replace older results."""
    if df.empty:
        return df
    return df.sort_values("time", kind="stable").drop_duplicates(keys, keep="last")


def is_peak_case(df: pd.DataFrame) -> pd.Series:
    return column(df, "case").map(_text).str.startswith("peak.")


def cases_only(df: pd.DataFrame) -> pd.DataFrame:
    """Case records that are not peak measurements."""
    if df.empty:
        return df
    return df[(df["kind"] == "case") & ~is_peak_case(df)]


def peak_unit(name: str, gbps: float = math.nan, gflops: float = math.nan) -> str:
    if name in PEAK_UNITS:
        # integer-op peaks (GOP/s) judge the cases' "gflops" figures, which count those ops
        return COMPUTE_UNIT if PEAK_UNITS[name] == "GOP/s" else PEAK_UNITS[name]
    if "latency" in name:
        return "ns"
    if gflops and not math.isnan(gflops) and gflops > 0:
        return COMPUTE_UNIT
    if gbps and not math.isnan(gbps) and gbps > 0:
        return BANDWIDTH_UNIT
    return "ns"


def peaks_frame(prepared: pd.DataFrame) -> pd.DataFrame:
    """Measured peaks: device_key, backend, device, peak, value, unit (newest per peak).

    Taken from "peak" records and from passing bench records of cases named ``peak.*``.
    """
    rows: list[dict[str, Any]] = []
    if not prepared.empty:
        explicit = prepared[prepared["kind"] == "peak"]
        for r in explicit.to_dict("records"):
            rows.append({"device_key": r["device_key"], "backend": r["backend"], "device": r["device"],
                         "peak": r["peak"], "value": float(r["value"]), "unit": _text(r["unit"]),
                         "time": r["time"]})
        measured = prepared[(prepared["kind"] == "case") & is_peak_case(prepared)
                            & (column(prepared, "status") == "pass")
                            & prepared["time_ns"].notna()]
        for r in measured.to_dict("records"):
            unit = peak_unit(r["case"], r["gbps_calc"], r["gflops_calc"])
            value = {BANDWIDTH_UNIT: r["gbps_calc"], COMPUTE_UNIT: r["gflops_calc"]}.get(unit, r["time_ns"])
            if value is None or math.isnan(value):
                continue
            rows.append({"device_key": r["device_key"], "backend": r["backend"], "device": r["device"],
                         "peak": r["case"], "value": float(value), "unit": unit, "time": r["time"]})
    peaks = pd.DataFrame(rows, columns=["device_key", "backend", "device", "peak", "value", "unit", "time"])
    return latest(peaks, ["device_key", "backend", "peak"]).reset_index(drop=True)


class PeakTable:
    """Lookup of measured peaks; falls back to the same device_key measured by another backend."""

    def __init__(self, peaks: pd.DataFrame):
        self._exact: dict[tuple[str, str, str], tuple[float, str]] = {}
        self._any: dict[tuple[str, str], tuple[float, str]] = {}
        for r in peaks.itertuples(index=False):
            self._exact[(r.device_key, r.backend, r.peak)] = (r.value, r.unit)
            self._any.setdefault((r.device_key, r.peak), (r.value, r.unit))

    def get(self, device_key: str, backend: str, name: str) -> tuple[float, str] | None:
        return self._exact.get((device_key, backend, name)) or self._any.get((device_key, name))

    def for_device(self, device_key: str, backend: str) -> dict[str, tuple[float, str]]:
        found = {p: v for (k, p), v in self._any.items() if k == device_key}
        found.update({p: v for (k, b, p), v in self._exact.items() if k == device_key and b == backend})
        return found


# FLOP/byte below which a case is taken as memory-bound when the device's peaks are unknown
# (GPUs' ridge points, peak FLOP/s over peak GB/s, lie roughly between 5 and 60)
DEFAULT_RIDGE = 8.0


def _positive(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return v if v > 0 else 0.0  # NaN compares False, so it lands here too


def declared_peak(case: str) -> str:
    """The peak the case's current declaration is judged by ("peak.coopmat_fp16" for matmul_f16)
    where `kbench report` handed the declarations in (kbench.report.catalogue), else ""."""
    from .catalogue import current

    return current().peaks.get(case, "")


def throughput_kind(record: Mapping[str, Any], peaks: PeakTable) -> tuple[str, str | None]:
    """(unit, peak name) a bench record is judged by.

    The record's own ``peak_name`` wins. Otherwise the roofline decides: a case whose arithmetic
    intensity (flops / bytes) lies below the device's ridge point (FMA peak / copy bandwidth, or
    DEFAULT_RIDGE without measured peaks) is memory-bound and judged in GB/s against the copy
    bandwidth; above it, in GFLOP/s against the FMA peak of its dtype (fp16 when the params say
    f16 and that peak was measured, else fp32). A case without FLOPs is judged in GB/s.
    """
    name = _text(record.get("peak_name"))
    if name:  # a record judged under an older declaration is judged like a new one
        name = declared_peak(_text(record.get("case"))) or name
        unit = peak_unit(name)
        return (unit if unit in (BANDWIDTH_UNIT, COMPUTE_UNIT) else BANDWIDTH_UNIT), name
    key, backend = record["device_key"], record["backend"]
    flops, nbytes = _positive(record.get("flops")), _positive(record.get("bytes"))
    if flops:
        dtype = _text(record.get("params.dtype")).lower()
        flop_peak = ("peak.fp16_fma" if dtype in _F16_DTYPES and peaks.get(key, backend, "peak.fp16_fma")
                     else "peak.fp32_fma")
        if nbytes:
            fp, bw = peaks.get(key, backend, flop_peak), peaks.get(key, backend, "peak.copy_bandwidth")
            ridge = fp[0] / bw[0] if fp and bw and bw[0] > 0 else DEFAULT_RIDGE
            if flops / nbytes < ridge:
                return BANDWIDTH_UNIT, "peak.copy_bandwidth"
        return COMPUTE_UNIT, flop_peak
    if nbytes:
        return BANDWIDTH_UNIT, "peak.copy_bandwidth"
    return "", None


def format_time(ns: float | None) -> str:
    if ns is None or (isinstance(ns, float) and math.isnan(ns)):
        return ""
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def format_number(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def format_peak(value: float, unit: str) -> str:
    return format_time(value) if unit == "ns" else format_number(value, unit)
