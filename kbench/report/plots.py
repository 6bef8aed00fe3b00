"""Report plots (matplotlib, Agg backend): a roofline per device, throughput bars per op family
(and per case, ``case_bar_plots``).

Roofline: each benchmarked case with FLOPs sits at x = arithmetic intensity (FLOPs / bytes moved)
and y = achieved GFLOP/s, under the ceilings min(peak FLOP/s, intensity x peak bandwidth) drawn
from the device's measured peaks. Cases without FLOPs (copies, conversions) have no place on
that chart; they are drawn in a second panel as achieved GB/s against the measured copy
bandwidth, which is the honest comparison for them.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # reports are written headless; never open a window

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from kbench.results.records import case_name  # noqa: E402
from kbench.results.schema import slug  # noqa: E402

from .files import write_with  # noqa: E402
from .frames import BANDWIDTH_UNIT, COMPUTE_UNIT, PeakTable, peaks_frame, prepare  # noqa: E402
from .tables import device_order, performance_long  # noqa: E402

FORMATS = ("png", "svg")


def _save(fig: plt.Figure, out_dir: Path, stem: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    # one layout pass shared by both formats; bbox_inches="tight" would redo it per file
    fig.tight_layout()
    for ext in FORMATS:
        path = out_dir / f"{stem}.{ext}"
        write_with(path, lambda tmp, ext=ext: fig.savefig(tmp, dpi=110, format=ext))
        paths.append(path)
    plt.close(fig)
    return paths


def roofline_plots(df: pd.DataFrame, out_dir: str | Path) -> dict[str, list[Path]]:
    """One roofline figure per device that has passing benchmarks; returns {device: [png, svg]}."""
    out_dir = Path(out_dir)
    prepared = prepare(df)
    long = performance_long(df)
    if long.empty:
        return {}
    peaks = PeakTable(peaks_frame(prepared))
    bench = prepared[(prepared["kind"] == "case") & (prepared["mode"] == "bench")
                     & (prepared["status"] == "pass")]
    intensity = {}
    for r in bench.to_dict("records"):
        flops, nbytes = _pos(r.get("flops")), _pos(r.get("bytes"))
        intensity[(r["device"], r["row"])] = (flops, nbytes, r["gflops_calc"], r["gbps_calc"])
    written: dict[str, list[Path]] = {}
    for device in device_order(prepared):
        mine = long[long["device"] == device]
        if mine.empty:
            continue
        key = (mine["device_key"].iloc[0], mine["backend"].iloc[0])
        device_peaks = peaks.for_device(*key)
        compute, bandwidth = [], []
        for r in mine.to_dict("records"):
            flops, nbytes, gflops, gbps = intensity.get((device, r["row"]), (0, 0, math.nan, math.nan))
            if flops > 0 and nbytes > 0 and gflops > 0:
                compute.append((r["row"], flops / nbytes, gflops))
            elif gbps > 0:
                bandwidth.append((r["row"], gbps))
        if not compute and not bandwidth:
            continue
        # stacked panels: a roofline with its legend beside it, then the bandwidth bars
        panels = int(bool(compute)) + int(bool(bandwidth))
        heights = ([4.8] if compute else []) + ([max(2.5, 0.22 * len(bandwidth) + 1.2)] if bandwidth else [])
        fig, axes = plt.subplots(panels, 1, figsize=(10, sum(heights)), squeeze=False,
                                 gridspec_kw={"height_ratios": heights})
        axes = list(axes[:, 0])
        bw_peak = device_peaks.get("peak.copy_bandwidth")
        if compute:
            _draw_roofline(axes.pop(0), compute, device_peaks, bw_peak)
        if bandwidth:
            _draw_bandwidth(axes.pop(0), bandwidth, bw_peak)
        fig.suptitle(f"{device}: measured performance vs measured peaks", fontsize=11)
        written[device] = _save(fig, out_dir, f"roofline-{slug(device, 48)}")
    return written


def _pos(value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return v if v > 0 and not math.isnan(v) else 0.0


def _draw_roofline(ax, points, device_peaks, bw_peak) -> None:
    xs = np.array([p[1] for p in points])
    lo, hi = xs.min() / 4, xs.max() * 4
    grid = np.logspace(math.log10(lo), math.log10(hi), 200)
    ceilings = [(name, value) for name, (value, unit) in sorted(device_peaks.items())
                if unit == COMPUTE_UNIT and value > 0]
    if bw_peak and bw_peak[0] > 0:
        ax.plot(grid, grid * bw_peak[0], "--", color="grey", lw=1,
                label=f"copy bandwidth {bw_peak[0]:.4g} GB/s")
    for name, value in ceilings:
        roof = np.minimum(value, grid * bw_peak[0]) if bw_peak and bw_peak[0] > 0 else np.full_like(grid, value)
        ax.plot(grid, roof, lw=1.5, label=f"{name.removeprefix('peak.')} {value:.4g} GFLOP/s")
    # one colour and marker per op, named in the legend: per-point case ids would pile up into
    # an unreadable block where sizes of one op sit close together
    ops = list(dict.fromkeys(case_name(str(row)) for row, _, _ in points))
    markers = "osD^v<>ph*"
    for i, op in enumerate(ops):
        mine = [(x, y) for row, x, y in points if case_name(str(row)) == op]
        ax.scatter([p[0] for p in mine], [p[1] for p in mine], s=22, zorder=3, marker=markers[i % len(markers)],
                   color=plt.cm.tab10(i % 10), label=f"{op} ({len(mine)})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    # the bandwidth line ends where it would leave the chart's interesting part
    top = max([v for _, v in ceilings] + [p[2] for p in points])
    ax.set_ylim(top=top * 3)
    # minor-tick labels on a short log axis overlap each other
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("achieved GFLOP/s")
    if not ceilings and not bw_peak:
        ax.set_title("no measured peaks in these results: points only", fontsize=9)
    else:
        ax.set_title("roofline (ceilings from measured peaks)", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _draw_bandwidth(ax, bars, bw_peak) -> None:
    labels = [b[0] for b in bars]
    values = [b[1] for b in bars]
    pos = np.arange(len(bars))
    ax.barh(pos, values, color="tab:blue")
    ax.set_yticks(pos, labels, fontsize=7)
    if _spans_decades(values):
        ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("achieved GB/s (bytes moved / median GPU time)")
    if bw_peak and bw_peak[0] > 0:
        ax.axvline(bw_peak[0], color="grey", ls="--", label=f"measured copy bandwidth {bw_peak[0]:.4g} GB/s")
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title("cases without FLOPs: bandwidth vs measured copy bandwidth", fontsize=9)
    else:
        ax.set_title("cases without FLOPs: bandwidth (no measured copy bandwidth)", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)


def _spans_decades(values) -> bool:
    """True when the positive values span more than a factor of ten (a linear axis would hide
    the small ones, a CPU driver's bars next to a GPU's)."""
    vals = [float(v) for v in values if v and float(v) > 0 and not math.isnan(float(v))]
    return len(vals) > 1 and max(vals) / min(vals) > 10


#: op families: one figure each; an op not listed here is a family of its own
FAMILIES = {
    "elementwise": ("add", "element_mul", "silu", "kp_mult"),
    "reductions": ("softmax", "rms_norm"),
    "attention": ("attention", "attn_score", "attn_value", "rope"),
    "matmul": ("matmul", "matmul_f16"),
    "quantized_matmul": ("quantized_matmul",),
    "copies": ("copy_buffer", "copy_buffer_offset", "kp_copy"),
    "transfers": ("copy_roundtrip", "kp_sync"),
}


def family_of(case: str) -> str:
    return next((name for name, ops in FAMILIES.items() if case in ops), case)


def family_plots(df: pd.DataFrame, out_dir: str | Path, baseline: str | None = None) -> dict[str, list[Path]]:
    """One horizontal bar chart per op family: a bar per case and device, in the family's unit
    when all its rows share one (GB/s or GFLOP/s, higher is better), else median time; the
    figure grows with its rows (never wider than a page) and takes a log axis where the values
    span more than a decade."""
    out_dir = Path(out_dir)
    long = performance_long(df, baseline)
    if long.empty:
        return {}
    long = long.assign(family=long["case"].map(lambda c: family_of(str(c))))
    devices_all = device_order(prepare(df), baseline)
    written: dict[str, list[Path]] = {}
    for family, part in long.groupby("family", sort=False):
        by_throughput, unit = _axis_unit(part)
        rows = list(dict.fromkeys(part["row"]))
        devices = [d for d in devices_all if d in set(part["device"])]
        height = 0.8 / max(1, len(devices))
        fig, ax = plt.subplots(figsize=(10, 1.4 + len(rows) * max(0.28, 0.16 * len(devices))))
        y = np.arange(len(rows))
        values_all = []
        for i, device in enumerate(devices):
            mine = part[part["device"] == device].set_index("row")
            vals = [(mine.at[r, "throughput"] if by_throughput else mine.at[r, "time_ns"] / 1e3)
                    if r in mine.index else 0.0 for r in rows]
            values_all += vals
            ax.barh(y + (i - (len(devices) - 1) / 2) * height, vals, height, label=device, color=plt.cm.tab10(i % 10))
        ops = set(part["case"])
        # a family of one op: its name once in the title, the sizes alone on the axis
        ax.set_yticks(y, [r.removeprefix(next(iter(ops))) if len(ops) == 1 else r for r in rows], fontsize=7)
        ax.invert_yaxis()
        if _spans_decades(values_all):
            ax.set_xscale("log")
        ax.set_xlabel(f"{unit} (higher is better)" if by_throughput else "median time, µs (lower is better)")
        ax.set_title(f"{family}: {'throughput' if by_throughput else 'time'} per device", fontsize=10)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        written[str(family)] = _save(fig, out_dir, f"family-{slug(str(family), 48)}")
    return written


def _axis_unit(part: pd.DataFrame) -> tuple[bool, str]:
    """(plot throughput?, its unit): throughput where every row shares GB/s or GFLOP/s, else the
    median time in µs."""
    units = set(part["unit"])
    by_throughput = len(units) == 1 and next(iter(units)) in (BANDWIDTH_UNIT, COMPUTE_UNIT) \
        and bool(part["throughput"].notna().all())
    return by_throughput, (next(iter(units)) if by_throughput else "µs")


def case_bar_plots(df: pd.DataFrame, out_dir: str | Path, baseline: str | None = None) -> dict[str, list[Path]]:
    """One grouped bar chart per case name: its variants (case_ids) x devices, throughput in the
    case's unit (median time, lower is better, when the unit differs between rows)."""
    out_dir = Path(out_dir)
    long = performance_long(df, baseline)
    if long.empty:
        return {}
    prepared = prepare(df)
    devices_all = device_order(prepared, baseline)
    written: dict[str, list[Path]] = {}
    for case, part in long.groupby("case", sort=False):
        by_throughput, unit = _axis_unit(part)
        rows = list(dict.fromkeys(part["row"]))
        devices = [d for d in devices_all if d in set(part["device"])]
        width = 0.8 / max(1, len(devices))
        fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(rows) * max(1, len(devices)) ** 0.5 + 2), 4.2))
        x = np.arange(len(rows))
        for i, device in enumerate(devices):
            mine = part[part["device"] == device].set_index("row")
            vals = [(mine.at[r, "throughput"] if by_throughput else mine.at[r, "time_ns"] / 1e3)
                    if r in mine.index else 0.0 for r in rows]
            ax.bar(x + (i - (len(devices) - 1) / 2) * width, vals, width, label=device)
        ax.set_xticks(x, [r.removeprefix(str(case)) or str(case) for r in rows], rotation=30,
                      ha="right", fontsize=7)
        if _spans_decades(part["throughput"] if by_throughput else part["time_ns"]):
            ax.set_yscale("log")
        ax.set_ylabel(f"{unit} (higher is better)" if by_throughput else "median time, µs (lower is better)")
        ax.set_title(f"{case}: {'throughput' if by_throughput else 'time'} per device", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        written[str(case)] = _save(fig, out_dir, f"bars-{slug(str(case), 48)}")
    return written


__all__ = ["case_bar_plots", "family_plots", "roofline_plots"]
