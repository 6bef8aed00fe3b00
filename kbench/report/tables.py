"""The report's tables, computed from the flat frame of ``kbench.results.load_runs``.

Each table comes in a long (one row per measurement: for CSV/JSON and further analysis) and,
where it is a matrix, a wide display form (case rows x device columns: for people).
When several runs hold the same case for the same device, the newest record is used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from .frames import (
    STATUS_ORDER, PeakTable, _text, cases_only, column, format_number, format_peak, format_time,
    latest, numeric, peaks_frame, prepare, throughput_kind, work_rate,
)

STATUS_TEXT = {"pass": "pass", "fail": "FAIL", "error": "error", "unsupported": "unsupported",
               "xfail": "xfail"}
NOT_RUN = "not run"
# features that decide which cases can run; the devices table names these, has or lacks
KEY_FEATURES = ("float16", "float64", "int8", "int16", "int64", "storage_buffer_8bit",
                "storage_buffer_16bit", "subgroup_arithmetic", "subgroup_shuffle",
                "integer_dot_product", "cooperative_matrix")
# "variant": runs with non-default kernel options (the run header's backend_options) stay apart
_RESULT_KEYS = ["device_key", "backend", "implementation", "case_id", "queue_config", "mode", "variant"]


def _ordered(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def row_order(long: pd.DataFrame) -> list[str]:
    """Rows grouped by case name (in order of first appearance), each case's rows in the order
    they were recorded, so one case's sizes stay together even when runs list different ones."""
    cases = _ordered(long["case"])
    rank = {c: i for i, c in enumerate(cases)}
    pairs = _ordered(zip(long["case"], long["row"]))
    return _ordered(row for _, row in sorted(pairs, key=lambda p: rank[p[0]]))


def device_order(prepared: pd.DataFrame, baseline: str | None = None) -> list[str]:
    """Device columns: the baseline first, then Vulkan devices, then the other backends, by name."""
    if prepared.empty:
        return []
    pairs = prepared[["device", "backend"]].drop_duplicates()
    names = sorted(pairs.itertuples(index=False), key=lambda r: (r.backend != "vulkan", r.device))
    order = [r.device for r in names]
    if baseline in order:
        order.remove(baseline)
        order.insert(0, baseline)
    return _ordered(order)


def resolve_baseline(prepared: pd.DataFrame, baseline: str | None) -> str | None:
    """Device label for ``baseline``: an exact label, a device_key, or a unique case-insensitive
    part of a label ("H200", "llvmpipe"). Raises ValueError listing the choices otherwise."""
    if baseline is None:
        return None
    if prepared.empty:
        raise ValueError(f"baseline device {baseline!r}: the results hold no devices")
    labels = _ordered(prepared["device"])
    if baseline in labels:
        return baseline
    by_key = _ordered(prepared.loc[prepared["device_key"] == baseline, "device"])
    if len(by_key) == 1:
        return by_key[0]
    hits = [lab for lab in labels if baseline.lower() in lab.lower()]
    if len(hits) == 1:
        return hits[0]
    # a bare device name matches both its Vulkan and its peer column; Vulkan is the one meant
    vulkan_hits = [lab for lab in hits if not lab.endswith(")")]
    if len(vulkan_hits) == 1 and len(hits) > 1:
        return vulkan_hits[0]
    choices = "; ".join(labels)
    what = "matches several devices" if hits else "matches no device"
    raise ValueError(f"baseline device {baseline!r} {what}; devices in these results: {choices}")


# ----------------------------------------------------------------------------- correctness

def correctness_long(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (device, case row): the worst status over modes, with its reasons."""
    cols = ["row", "device", "device_key", "backend", "case", "case_id", "queue_config", "status",
            "reason", "modes"]
    data = cases_only(prepare(df)) if not df.empty else df
    if data.empty:
        return pd.DataFrame(columns=cols)
    data = latest(data, _RESULT_KEYS)
    out: list[dict[str, Any]] = []
    # one to_dict for the whole frame: per-group DataFrame.to_dict costs tens of ms each
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in data.to_dict("records"):
        groups.setdefault((rec["device"], rec["row"]), []).append(rec)
    for (device, row), records in groups.items():
        worst = max(records, key=lambda r: STATUS_ORDER.get(r["status"], 0))["status"]
        modes = _ordered(r["mode"] for r in records)
        reasons = []
        for r in records:
            if r["status"] != worst or worst == "pass":
                continue
            text = _text(r["reason"])
            nmse = r.get("metric.nmse")
            if worst == "fail" and "nmse" not in text.lower() and nmse is not None and not _isnan(nmse):
                text = f"{text} (NMSE {float(nmse):.3g})".strip()
            reasons.append(f"{r['mode']}: {text}" if len(modes) > 1 else text)
        first = records[0]
        out.append({"row": row, "device": device, "device_key": first["device_key"],
                    "backend": first["backend"], "case": first["case"], "case_id": first["case_id"],
                    "queue_config": first["queue_config"], "status": worst,
                    "reason": "; ".join(_ordered(reasons)), "modes": ",".join(modes)})
    return pd.DataFrame(out, columns=cols)


def _isnan(value: Any) -> bool:
    """True for NaN and for anything that is not a number (None, text): "no value"."""
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        return True


def correctness_matrix(df: pd.DataFrame, reasons: bool = False, baseline: str | None = None) -> pd.DataFrame:
    """Case rows x device columns; cells pass / FAIL / unsupported / error / xfail / not run,
    followed by ": <reason>" when ``reasons`` is set."""
    long = correctness_long(df)
    if long.empty:
        return pd.DataFrame()
    prepared = prepare(df)
    devices = [d for d in device_order(prepared, resolve_baseline(prepared, baseline))
               if d in set(long["device"])]
    cells = {}
    for r in long.itertuples(index=False):
        text = STATUS_TEXT.get(r.status, r.status)
        if reasons and r.reason:
            text = f"{text}: {r.reason}"
        cells[(r.row, r.device)] = text
    rows = row_order(long)
    matrix = pd.DataFrame([[cells.get((row, d), NOT_RUN) for d in devices] for row in rows],
                          index=pd.Index(rows, name="case"), columns=devices)
    return matrix


def status_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Per device: how many case rows passed, failed, errored, were unsupported or xfail."""
    long = correctness_long(df)
    if long.empty:
        return pd.DataFrame()
    counts = long.groupby(["device", "status"]).size().unstack(fill_value=0)
    for status in STATUS_TEXT:
        if status not in counts.columns:
            counts[status] = 0
    counts = counts[list(STATUS_TEXT)]
    counts.columns = [STATUS_TEXT[c] for c in counts.columns]
    counts.index.name = "device"
    return counts


# ----------------------------------------------------------------------------- performance

def _timed_passes(prepared: pd.DataFrame) -> pd.DataFrame:
    """The newest passing, timed bench record per result key (what performance tables show)."""
    data = cases_only(prepared)
    if data.empty:
        return data
    data = data[(data["mode"] == "bench") & (data["status"] == "pass") & data["time_ns"].notna()]
    return latest(data, _RESULT_KEYS) if not data.empty else data


def performance_long(df: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """One row per passing bench measurement (newest per device, case and queue configuration):
    time, throughput in the unit of its peak, fraction of that device's measured peak, and the
    throughput ratio to the baseline device (this work rate / the baseline's; > 1 is faster)."""
    cols = ["row", "case", "case_id", "queue_config", "device", "device_key", "backend", "timer",
            "time_ns", "rel_spread", "unit", "throughput", "peak_name", "peak_value",
            "peak_fraction", "peak_source", "vs_baseline"]
    prepared = prepare(df)
    peaks = PeakTable(peaks_frame(prepared))
    base_label = resolve_baseline(prepared, baseline)
    data = _timed_passes(prepared)
    if data.empty:
        return pd.DataFrame(columns=cols)
    out: list[dict[str, Any]] = []
    for r in data.to_dict("records"):
        unit, peak_name = throughput_kind(r, peaks)
        value = {"GB/s": r["gbps_calc"], "GFLOP/s": r["gflops_calc"]}.get(unit, math.nan)
        peak = peaks.get(r["device_key"], r["backend"], peak_name) if peak_name else None
        fraction, source, peak_value = math.nan, "", math.nan
        if peak is not None and peak[1] == unit and peak[0] > 0 and not _isnan(value):
            peak_value, fraction, source = peak[0], value / peak[0], "measured"
        elif not _isnan(r.get("peak_fraction")) and _text(r.get("peak_name")) in ("", peak_name or ""):
            # no measured peak in these results: keep what the run computed itself
            fraction, source = float(r["peak_fraction"]), "recorded"
            peak_name = _text(r.get("peak_name")) or peak_name
        out.append({"row": r["row"], "case": r["case"], "case_id": r["case_id"],
                    "queue_config": r["queue_config"], "device": r["device"],
                    "device_key": r["device_key"], "backend": r["backend"], "timer": r["timer"],
                    "time_ns": r["time_ns"], "rel_spread": r["rel_spread"], "unit": unit,
                    "throughput": value, "peak_name": peak_name or "", "peak_value": peak_value,
                    "peak_fraction": fraction, "peak_source": source, "vs_baseline": math.nan,
                    "_rate": work_rate(r)})
    long = pd.DataFrame(out, columns=cols + ["_rate"])
    if base_label is not None:
        base_rates = long[long["device"] == base_label].set_index("row")["_rate"]
        long["vs_baseline"] = [rate / base_rates.get(row, math.nan)
                               for row, rate in zip(long["row"], long["_rate"])]
    return long.drop(columns=["_rate"])


_PEAK_LABELS = {"peak.copy_bandwidth": "copy BW", "peak.fp32_fma": "fp32 FMA",
                "peak.fp16_fma": "fp16 FMA", "peak.h2d": "upload BW", "peak.d2h": "download BW"}


def peak_label(name: str) -> str:
    """Short label of a peak for table cells ("copy BW", "fp32 FMA")."""
    return _PEAK_LABELS.get(name, name.removeprefix("peak.") or "peak")


def performance_cell(r: Mapping[str, Any], with_ratio: bool) -> str:
    parts = [format_time(r["time_ns"]) + (" (host)" if r["timer"] == "host" else "")]
    if not _isnan(r["throughput"]):
        parts.append(format_number(r["throughput"], r["unit"]))
    if not _isnan(r["peak_fraction"]):
        parts.append(f"{100 * r['peak_fraction']:.0f}% of {peak_label(r['peak_name'])}")
    if with_ratio and not _isnan(r["vs_baseline"]):
        parts.append(f"{r['vs_baseline']:.2f}× base")
    return " · ".join(parts)


def performance_matrix(df: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """Case rows x device columns; cells "median time · throughput · % of peak · ratio to base"."""
    long = performance_long(df, baseline)
    if long.empty:
        return pd.DataFrame()
    prepared = prepare(df)
    base_label = resolve_baseline(prepared, baseline)
    devices = [d for d in device_order(prepared, base_label) if d in set(long["device"])]
    cells = {(r["row"], r["device"]): performance_cell(r, base_label is not None)
             for r in long.to_dict("records")}
    rows = row_order(long)
    return pd.DataFrame([[cells.get((row, d), "") for d in devices] for row in rows],
                        index=pd.Index(rows, name="case"), columns=devices)


# ----------------------------------------------------------------------- queue configurations

def queue_config_long(df: pd.DataFrame) -> pd.DataFrame:
    """Cases benchmarked under more than one queue configuration on one device, with the
    speedup over "single": work per ns of this configuration / that of "single" (a configuration
    whose timed call spans several lanes records bytes and flops for all of them); NaN when
    "single" was not run."""
    cols = ["device", "case_id", "queue_config", "queues", "time_ns", "rel_spread", "speedup_vs_single"]
    prepared = prepare(df)
    data = _timed_passes(prepared)
    if data.empty:
        return pd.DataFrame(columns=cols)
    out: list[dict[str, Any]] = []
    for (device, case_id), group in data.groupby(["device", "case_id"], sort=False):
        if group["queue_config"].nunique() < 2:
            continue
        records = group.to_dict("records")
        single = [work_rate(r) for r in records if r["queue_config"] == "single"]
        single_rate = single[0] if single else math.nan
        for r in records:
            out.append({"device": device, "case_id": case_id, "queue_config": r["queue_config"],
                        "queues": " ".join(f"{f}:{i}" for f, i in (r.get("queues") or [])),
                        "time_ns": r["time_ns"], "rel_spread": r["rel_spread"],
                        "speedup_vs_single": work_rate(r) / single_rate})
    return pd.DataFrame(out, columns=cols)


def queue_config_matrix(df: pd.DataFrame) -> pd.DataFrame:
    """(device, case) rows x queue configuration columns; cells "time (speedup× vs single)"."""
    long = queue_config_long(df)
    if long.empty:
        return pd.DataFrame()
    configs = _ordered(long["queue_config"])
    if "single" in configs:
        configs.remove("single")
        configs.insert(0, "single")
    cells, rows = {}, []
    for r in long.to_dict("records"):
        key = (r["device"], r["case_id"])
        rows.append(key)
        text = format_time(r["time_ns"])
        if not _isnan(r["speedup_vs_single"]):
            text += f" ({r['speedup_vs_single']:.2f}×)"
        cells[(key, r["queue_config"])] = text
    rows = _ordered(rows)
    return pd.DataFrame([[cells.get((k, c), "") for c in configs] for k in rows],
                        index=pd.MultiIndex.from_tuples(rows, names=["device", "case"]), columns=configs)


# ----------------------------------------------------------------------------- devices, runs

def devices_table(df: pd.DataFrame, headers: list[Mapping[str, Any]] | None = None,
                  all_features: bool = False) -> pd.DataFrame:
    """One row per device column: identity, the KEY_FEATURES it has and lacks (every reported
    feature too with ``all_features``) and its measured peaks."""
    headers = list(headers if headers is not None else df.attrs.get("runs", []))
    prepared = prepare(df)
    peaks = peaks_frame(prepared)
    by_key: dict[tuple[str, str], Mapping[str, Any]] = {}
    for h in sorted(headers, key=lambda h: str(h.get("started", ""))):
        by_key[(h["device_key"], h["backend"])] = h  # newest header wins
    pairs: list[tuple[str, str]] = []
    if not prepared.empty:
        pairs = _ordered(zip(prepared["device_key"], prepared["backend"]))
    pairs += [k for k in by_key if k not in pairs]
    labels = dict(zip(zip(prepared["device_key"], prepared["backend"]), prepared["device"])) if not prepared.empty else {}
    rank = {d: i for i, d in enumerate(device_order(prepared))}
    pairs.sort(key=lambda k: rank.get(labels.get(k, ""), len(rank)))
    peak_names = _ordered(peaks["peak"])
    rows = []
    for key in pairs:
        header = by_key.get(key, {})
        dev = dict(header.get("device", {}))
        if not dev and not prepared.empty:
            rec = prepared[(prepared["device_key"] == key[0]) & (prepared["backend"] == key[1])].iloc[0]
            dev = {c: rec.get(c) for c in ("device_name", "vendor_name", "driver_name", "driver_version", "api_version")}
        features = {k: bool(v) for k, v in (dev.get("features") or {}).items()}
        row = {
            "device": labels.get(key) or f"{dev.get('device_name', key[0])}"
                      + ("" if key[1] == "vulkan" else f" ({key[1]})"),
            "vendor": _text(dev.get("vendor_name")) + (f" (0x{dev['vendor_id']:04x})" if dev.get("vendor_id") else ""),
            "name": _text(dev.get("device_name")),
            "type": _text(dev.get("device_type")),
            "driver": f"{_text(dev.get('driver_name'))} {_text(dev.get('driver_version'))}".strip(),
            "driver_info": _text(dev.get("driver_info")),
            "api": _text(dev.get("api_version")),
            "backend": key[1],
            "device_key": key[0],
            "features": ", ".join(f for f in KEY_FEATURES if features.get(f)) or ("" if header else "(no header)"),
            "lacks": ", ".join(f for f in KEY_FEATURES if f in features and not features[f]),
        }
        if all_features:
            row["all_features"] = ", ".join(sorted(k for k, v in features.items() if v))
        mine = peaks[(peaks["device_key"] == key[0]) & (peaks["backend"] == key[1])]
        measured = {r.peak: format_peak(r.value, r.unit) for r in mine.itertuples(index=False)}
        for name in peak_names:
            row[name] = measured.get(name, "")
        rows.append(row)
    return pd.DataFrame(rows)


def runs_table(headers: list[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per loaded run file: when, where, with which software, on which device."""
    rows = [{"run_id": h["run_id"], "started": h["started"], "host": h["host"],
             "device": h.get("device", {}).get("device_name", ""), "backend": h["backend"],
             "kbench": h["kbench_version"], "git": str(h["git_revision"])[:12], "os": h["os"],
             "file": h.get("source", "")}
            for h in sorted(headers, key=lambda h: str(h.get("started", "")))]
    return pd.DataFrame(rows, columns=["run_id", "started", "host", "device", "backend", "kbench",
                                       "git", "os", "file"])


def failures_table(df: pd.DataFrame, statuses: Iterable[str] = ("fail", "error")) -> pd.DataFrame:
    """Every newest record with one of ``statuses``, with its reason and where it was recorded.
    Peak measurements are included: a peak that errored is a failure too."""
    cols = ["device", "case_id", "queue_config", "mode", "status", "reason", "nmse", "where"]
    prepared = prepare(df)
    if prepared.empty:
        return pd.DataFrame(columns=cols)
    data = prepared[prepared["kind"] == "case"]
    data = latest(data, _RESULT_KEYS)
    data = data[data["status"].isin(list(statuses))]
    if data.empty:
        return pd.DataFrame(columns=cols)
    nmse = numeric(data, "metric.nmse")
    out = pd.DataFrame({
        "device": data["device"], "case_id": data["case_id"], "queue_config": data["queue_config"],
        "mode": data["mode"], "status": data["status"].map(lambda s: STATUS_TEXT.get(s, s)),
        "reason": data["reason"].map(_text), "nmse": nmse,
        "where": [f"{s}:{n}" for s, n in zip(column(data, "source"), column(data, "source_line"))],
    })
    return out.sort_values(["device", "case_id", "queue_config", "mode"]).reset_index(drop=True)


# ----------------------------------------------------------------------------- summary

def current_only(df: pd.DataFrame) -> pd.DataFrame:
    """Leave out the records of old parameters: where a device (and implementation) has results
    of an op's currently declared cases, its results of that op's parameters that are no longer
    declared drop out. Ops without any current result (and peaks, runner records) stay. The
    declared ids come from kbench.report.catalogue (set by `kbench report`); without them, all stay."""
    from .catalogue import current

    ids = current().case_ids
    if df.empty or "case_id" not in df.columns or not ids:
        return df
    cid = column(df, "case_id").map(_text)
    case = column(df, "case").map(_text)
    impl = column(df, "implementation").map(_text)
    who = list(zip(column(df, "device_key").map(_text), column(df, "backend").map(_text), impl, case))
    is_case = (df["kind"] == "case").to_numpy()
    current = cid.isin(ids).to_numpy()
    has_current = {w for w, c, k in zip(who, current, is_case) if c and k}
    keep = [not k or c or w not in has_current for w, c, k in zip(who, current, is_case)]
    out = df[keep]
    out.attrs = dict(df.attrs)
    return out


#: the column the summary puts side by side; "implementation" would compare kernel sets instead
SUMMARY_AXIS = "device"


def summary_table(df: pd.DataFrame, baseline: str | None = None, shared_only: bool = True) -> pd.DataFrame:
    """Per op and size (single queue, default kernels): each column's figure (GB/s or GFLOP/s) and
    % of its measured peak, and the winner (shortest median time: the work is the same). With
    ``shared_only``, only the sizes that at least two columns ran (when there are two or more)."""
    long = performance_long(df, baseline)
    cols = ["op", "size"]
    if long.empty:
        return pd.DataFrame(columns=cols + ["winner"])
    long = long[(long["queue_config"] == "single") & (long["row"] == long["case_id"])]
    axis = list(dict.fromkeys(d for d in device_order(prepare(df), baseline) if d in set(long[SUMMARY_AXIS])))
    rows = []
    for case_id, part in long.groupby("case_id", sort=False):
        cells, times = {}, {}
        for r in part.to_dict("records"):
            who = r[SUMMARY_AXIS]
            figure = (format_number(r["throughput"], r["unit"]) if not _isnan(r["throughput"])
                      else format_time(r["time_ns"]))
            if not _isnan(r["peak_fraction"]):
                figure += f" · {100 * r['peak_fraction']:.0f}%"
            cells[who], times[who] = figure, r["time_ns"]
        if shared_only and len(axis) > 1 and len(cells) < 2:
            continue
        name, _, params = str(case_id).partition("[")
        row = {"op": name, "size": params.rstrip("]").replace(",", ", ")}  # a space to wrap at
        row.update({who: cells.get(who, "") for who in axis})
        row["winner"] = min(times, key=times.get) if len(times) > 1 else ""
        rows.append(row)
    out = pd.DataFrame(rows, columns=cols + axis + ["winner"])
    if out.empty:
        return out
    rank = {c: i for i, c in enumerate(dict.fromkeys(long["case"]))}
    return out.sort_values("op", key=lambda s: s.map(lambda c: rank.get(c, len(rank))), kind="stable").reset_index(drop=True)
