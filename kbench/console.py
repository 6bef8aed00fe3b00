"""What `kbench validate`, `kbench bench` and `kbench peaks` print while they run.

- one line per finished case (bench: status, median [min-max], GB/s or GFLOP/s, % of the device's
  measured peak, and the ratio to kbench where a peer ran the case; validate: the failures, or
  every case with --verbose), as ggml's `test-backend-ops perf` prints them;
- one line per measured peak, as vkpeak prints them;
- in a terminal, a live bar (the part of the run, done/total, elapsed, time remaining, the case
  running) under those lines; in a log, a line per finished case with done/total and the time left;
- after a bench run, a compact table per device (`device_tables`);
- after a run, where its time went (`time_summary`): per phase of the cases and the slowest cases.

Progress objects implement kbench.bench.runner.Progress (begin/advance/note/end).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

STATUS_STYLE = {"pass": "green", "xfail": "yellow", "unsupported": "cyan", "fail": "bold red", "error": "bold magenta"}

#: peak names as table cells show them
PEAK_LABELS = {"peak.copy_bandwidth": "copy", "peak.buffer_copy": "buffer copy", "peak.fp32_fma": "fp32 FMA",
               "peak.fp16_fma": "fp16 FMA", "peak.coopmat_fp16": "fp16 matrix", "peak.int8_dot": "int8 dot",
               "peak.h2d": "h2d", "peak.d2h": "d2h", "peak.dispatch_latency": "dispatch"}


def format_ns(ns: float | None) -> str:
    """12.3 µs, 4.56 ms, 812 ns."""
    if ns is None or not math.isfinite(ns):
        return "-"
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def percent(fraction: float) -> str:
    """45%, and two digits below 1% (0.07%) so that a small fraction does not read as zero."""
    return f"{100 * fraction:.0f}%" if fraction >= 0.01 else f"{100 * fraction:.2g}%"


def format_spread(median: float, lo: float, hi: float) -> str:
    """``3.96 ms [3.91-4.04]``: min and max in the median's unit."""
    text = format_ns(median)
    unit = text.split(" ")[-1]
    scale = {"s": 1e9, "ms": 1e6, "µs": 1e3, "ns": 1.0}.get(unit, 1.0)
    return f"{text} [{lo / scale:.3g}-{hi / scale:.3g}]"


def format_rate(value: float | None, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return ""
    return f"{value:,.0f} {unit}" if value >= 1000 else f"{value:.3g} {unit}"


def _timing(rec: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The record's timing statistics and which clock they are from."""
    if isinstance(rec.get("gpu_ns"), Mapping) and rec["gpu_ns"].get("median"):
        return dict(rec["gpu_ns"]), "gpu"
    if isinstance(rec.get("host_ns"), Mapping) and rec["host_ns"].get("median"):
        return dict(rec["host_ns"]), "host"
    return {}, ""


def median_ns(rec: Mapping[str, Any]) -> float | None:
    stats, _ = _timing(rec)
    return float(stats["median"]) if stats.get("median") else None


def throughput_text(rec: Mapping[str, Any]) -> str:
    """GB/s or GFLOP/s of a bench record, the one its peak is judged by (GFLOP/s when it has FLOPs
    and its peak is a FLOP rate, else GB/s)."""
    peak = str(rec.get("peak_name") or "")
    gflops, gbps = rec.get("gflops"), rec.get("gbps")
    compute_peak = peak in ("peak.fp32_fma", "peak.fp16_fma", "peak.coopmat_fp16", "peak.int8_dot")
    if gflops and (compute_peak or not gbps):
        unit = "GOP/s" if peak == "peak.int8_dot" else "GFLOP/s"
        return format_rate(float(gflops), unit)
    if gbps:
        return format_rate(float(gbps), "GB/s")
    return ""


def case_line(rec: Mapping[str, Any], peer_ratio: float | None = None, width: int = 44) -> str:
    """One finished case: ``pass  add[size=1048576]  12.3 µs [11.9-13.0]  1,021 GB/s  45% of copy``."""
    status = str(rec.get("status", ""))
    cid = str(rec.get("case_id", ""))
    who = rec.get("implementation")
    if who and who != "kbench":
        cid = f"{cid} ({who})"
    parts = [f"{status:<11}", f"{cid:<{width}}"]
    stats, clock = _timing(rec)
    if status == "pass" and stats:
        lo, hi, med = stats.get("min"), stats.get("max"), float(stats["median"])
        text = format_spread(med, float(lo), float(hi)) if lo is not None and hi is not None else format_ns(med)
        parts.append(f"{text}{' (host)' if clock == 'host' else ''}")
        rate = throughput_text(rec)
        if rate:
            parts.append(rate)
        if rec.get("peak_fraction"):
            label = PEAK_LABELS.get(str(rec.get("peak_name")), str(rec.get("peak_name", "peak")))
            parts.append(f"{percent(float(rec['peak_fraction']))} of {label}")
        if peer_ratio:
            parts.append(f"kbench {peer_ratio:.2f}x this")
    elif status != "pass" and rec.get("reason"):
        parts.append(str(rec["reason"]))
    if rec.get("unexpected_pass"):
        parts.append("(unexpected pass)")
    return "  ".join(parts).rstrip()


def peak_line(rec: Mapping[str, Any]) -> str:
    """One measured peak: ``peak.copy_bandwidth  2,950 GB/s``."""
    if rec.get("kind") != "peak":
        return f"{rec.get('case_id', '')}: {rec.get('status')}: {rec.get('reason', '')}"
    unit = str(rec.get("unit", ""))
    value = float(rec.get("value") or 0)
    text = format_ns(value) if unit == "ns" else format_rate(value, unit)
    return f"{str(rec.get('peak')):<24} {text}"


class _Lines:
    """What both progress styles share: which records get a line, and the peer ratios."""

    def __init__(self, verbose: bool = False, every_case: bool = False):
        self.verbose, self.every_case = verbose, every_case
        self.device = ""
        self.kbench_ns: dict[tuple[str, str], float] = {}  # (device name, case id) -> kbench's median

    def begin_device(self, label: str) -> None:
        # labels are "<device name>[ <implementation>] [<queue configuration>]"
        self.device = label.rsplit(" [", 1)[0]

    def line_for(self, rec: Mapping[str, Any]) -> str | None:
        if rec.get("kind") == "peak":
            return peak_line(rec)
        status = rec.get("status")
        wanted = (self.verbose or status in ("fail", "error") or rec.get("unexpected_pass")
                  or (self.every_case and rec.get("mode") == "bench"))
        ratio = None
        ns = median_ns(rec) if status == "pass" else None
        cid, device = str(rec.get("case_id", "")), str(rec.get("device_name") or self.device)
        if ns and rec.get("mode") == "bench":
            if rec.get("implementation", "kbench") == "kbench":
                self.kbench_ns.setdefault((device, cid), ns)
            else:
                ours = self.kbench_ns.get((device, cid))
                ratio = ns / ours if ours else None
        return case_line(rec, ratio) if wanted else None


def format_duration(seconds: float) -> str:
    """``4.2 s``, ``42 s``, ``3 min 05 s``, ``1 h 02 min``."""
    seconds = max(0.0, float(seconds))
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, sec = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def time_left(elapsed_s: float, done: int, total: int) -> float | None:
    """Seconds left at the mean pace so far (None before the first result)."""
    if done <= 0:
        return None
    return elapsed_s / done * max(0, total - done)


class TextProgress(_Lines):
    """Progress for logs (no terminal): a line per device and configuration, then a line per case
    with done/total and the estimated time left of that part of the run."""

    def __init__(self, stream=None, verbose: bool = False, every_case: bool = True, clock=None):
        import time

        super().__init__(verbose, every_case)
        self.stream = stream or sys.stderr
        self.total = self.done = 0
        self.clock = clock or time.monotonic
        self.started = self.clock()

    def begin(self, total: int, label: str) -> None:
        self.total, self.done = total, 0
        self.started = self.clock()
        self.begin_device(label)
        print(f"kbench: {label}: {total} case(s)", file=self.stream, flush=True)

    def start(self, case_id: str) -> None:
        pass  # a line per finished case is the log's progress

    def advance(self, record: dict[str, Any]) -> None:
        self.done += 1
        line = self.line_for(record)
        if line is None and self.every_case:  # a passing validate case: its status and id
            line = case_line(record)
        if line is not None:
            left = time_left(self.clock() - self.started, self.done, self.total)
            eta = f"  ({format_duration(left)} left)" if left is not None and self.done < self.total else ""
            print(f"  [{self.done}/{self.total}] {line}{eta}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        print(f"kbench: {text}", file=self.stream, flush=True)

    def end(self) -> None:
        pass


class RichProgress(_Lines):
    """A live rich bar on a terminal (done/total, elapsed, remaining), the case lines above it.
    Case ids and labels hold brackets (``add[size=3]``, ``[single]``): they are escaped, not markup."""

    def __init__(self, verbose: bool = False, every_case: bool = True, console: Any = None):
        super().__init__(verbose, every_case)
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)
        from rich.table import Column

        self.console = console or Console(stderr=True)
        # in a narrow terminal the label and the case name give way (ellipsis), never done/total or the times
        squeeze = {"no_wrap": True, "overflow": "ellipsis"}
        fixed = {"no_wrap": True, "min_width": 7}
        self.bar = Progress(TextColumn("{task.description}", table_column=Column(ratio=1, max_width=44, **squeeze)),
                            BarColumn(bar_width=12), MofNCompleteColumn(table_column=Column(**fixed)),
                            TimeElapsedColumn(table_column=Column(**fixed)), TextColumn("eta"),
                            TimeRemainingColumn(table_column=Column(**fixed)),
                            TextColumn("{task.fields[last]}", table_column=Column(ratio=2, **squeeze)),
                            console=self.console, transient=False)
        self.task = None
        self.bar.start()

    def begin(self, total: int, label: str) -> None:
        from rich.markup import escape

        if self.task is not None:
            self.bar.update(self.task, last="")
        self.begin_device(label)
        self.task = self.bar.add_task(escape(label), total=total, last="")

    def start(self, case_id: str) -> None:
        from rich.markup import escape

        if self.task is not None:
            self.bar.update(self.task, last=escape(f"running {case_id}"[:60]))

    def advance(self, record: dict[str, Any]) -> None:
        from rich.markup import escape

        status = str(record.get("status", "pass" if record.get("kind") == "peak" else ""))
        cid = str(record.get("case_id") or record.get("peak", ""))
        self.bar.update(self.task, advance=1, last=escape(f"{status} {cid}"[:60]))
        line = self.line_for(record)
        if line is not None:
            style = STATUS_STYLE.get(status, "")
            head, _, rest = line.partition(" ")
            text = f"[{style}]{escape(head)}[/] {escape(rest)}" if style and head == status else escape(line)
            self.console.print(text, markup=True, highlight=False)

    def note(self, text: str) -> None:
        from rich.markup import escape

        self.console.print(escape(f"kbench: {text}"), highlight=False)

    def end(self) -> None:
        if self.task is not None:
            self.bar.update(self.task, last="")
        self.bar.stop()


def make_progress(quiet: bool, verbose: bool, every_case: bool = False):
    """None with --quiet; a rich bar on a terminal (``every_case``: a line per finished case above
    it, not only per failure); otherwise plain lines, one per finished case with done/total and
    the time left (a log has no bar)."""
    if quiet:
        return None
    if sys.stderr.isatty():
        try:
            return RichProgress(verbose, every_case)
        except ImportError:
            pass
    return TextProgress(verbose=verbose, every_case=True)


# ---------------------------------------------------------------------------- end-of-run tables

def peak_table(records: Iterable[Mapping[str, Any]], descriptions: Mapping[str, str]) -> str:
    """`kbench peaks`' table: device, peak, value (or why not measured), what it measures."""
    from tabulate import tabulate

    rows = []
    for r in records:
        name = str(r.get("peak") or r.get("case_id"))
        if r.get("kind") == "peak":
            unit, value = str(r.get("unit", "")), float(r.get("value") or 0)
            text = format_ns(value) if unit == "ns" else format_rate(value, unit)
        else:
            text = f"{r.get('status')}: {r.get('reason', '')}"
        rows.append([r.get("device_name", ""), name, text, descriptions.get(name, "")])
    return tabulate(rows, headers=["device", "peak", "value", "measures"], disable_numparse=True)


def _op_row(recs: list[Mapping[str, Any]], peers: Mapping[str, float]) -> list[Any]:
    passed = [r for r in recs if r.get("status") == "pass" and median_ns(r)]
    fails = sum(1 for r in recs if r.get("status") in ("fail", "error"))
    row: list[Any] = [str(recs[0].get("case")), f"{len(passed)}/{len(recs)}" + (f" ({fails} failed)" if fails else "")]
    if not passed:
        return row + ["", "", "", ""]
    fractions = [float(r["peak_fraction"]) for r in passed if r.get("peak_fraction")]
    best = max(passed, key=lambda r: float(r.get("peak_fraction") or 0) or -median_ns(r))
    params = str(best.get("case_id", "")).partition("[")[2].rstrip("]")
    ratios = [peers[r["case_id"]] / median_ns(r) for r in passed if r.get("case_id") in peers]
    row += [f"{throughput_text(best) or format_ns(median_ns(best))}" + (f" ({params})" if params else ""),
            percent(max(fractions)) if fractions else "",
            percent(statistics.median(fractions)) if fractions else "",
            f"{math.exp(statistics.fmean(math.log(x) for x in ratios)):.2f}x" if ratios else ""]
    return row


def device_tables(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(title, table) per device and implementation of a bench run: per op, the cases passed, the
    best figure (and its parameters), the best and median % of peak, and kbench's geometric-mean
    speed ratio over a peer (> 1: kbench faster) where one ran."""
    from tabulate import tabulate

    groups: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    peer_ns: dict[str, dict[str, float]] = defaultdict(dict)  # device -> case id -> peer median
    for r in records:
        if r.get("kind") != "case" or r.get("mode") != "bench" or r.get("layer") in ("runner", "peak"):
            continue
        device, who = str(r.get("device_name", "?")), str(r.get("implementation") or "kbench")
        groups[(device, who)][str(r.get("case"))].append(r)
        if who not in ("kbench", "numpy") and r.get("status") == "pass" and median_ns(r):
            peer_ns[device][str(r.get("case_id"))] = median_ns(r)
    out = []
    for (device, who), ops in groups.items():
        peers = peer_ns.get(device, {}) if who == "kbench" else {}
        rows = [_op_row(recs, peers) for _, recs in sorted(ops.items())]
        headers = ["op", "passed", "best", "best % peak", "median % peak"] + (["vs peer"] if peers else [])
        if not peers:
            rows = [r[:5] for r in rows]
        title = device if who == "kbench" else f"{device} ({who})"
        out.append((title, tabulate(rows, headers=headers, disable_numparse=True)))
    return out


# ----------------------------------------------------------------------- where the time went

def time_summary(records: Iterable[Mapping[str, Any]], run_wall_s: float | None = None, top: int = 8,
                 sections: Iterable[Mapping[str, Any]] = ()) -> str:
    """Where a run's time went, from its records' ``wall_s`` and ``phases_s`` (phases named by
    kbench.results.records.PHASES): the total per phase, largest first, with the part of the
    cases' time no phase holds as "other"; the run's wall time when given (the rest is worker
    start, device open, writing); each of the run's `sections` (label, wall_s, open_s: its worker's
    start and device open); and the `top` slowest cases with their largest phases."""
    timed = [r for r in records if isinstance(r.get("wall_s"), (int, float))]
    if not timed:
        return ""
    in_cases = sum(float(r["wall_s"]) for r in timed)
    per_phase: dict[str, float] = defaultdict(float)
    for r in timed:
        for name, sec in (r.get("phases_s") or {}).items():
            per_phase[name] += float(sec)
        if r.get("kind") == "peak" and not r.get("phases_s"):
            per_phase["peaks"] += float(r["wall_s"])  # a peak's measurement is one phase
    rest = in_cases - sum(per_phase.values())
    lines = [f"where the time went: {len(timed)} result(s), {format_duration(in_cases)} in cases"
             + (f" of {format_duration(run_wall_s)} (the rest: worker start, device open, writing)"
                if run_wall_s else "")]
    names = [n for n in per_phase if per_phase[n] > 0]
    if rest > 0.001 * in_cases:
        per_phase["other"] = rest
        names.append("other")
    parts = [f"{n} {per_phase[n]:.1f} s ({100 * per_phase[n] / in_cases:.0f}%)"
             for n in sorted(names, key=lambda n: -per_phase[n])] if in_cases > 0 else []
    if parts:
        lines.append("  by phase: " + ", ".join(parts))
    parts = [f"{sec.get('label')} {format_duration(float(sec.get('wall_s') or 0))}"
             + (f" (open {float(sec['open_s']):.1f} s)" if sec.get("open_s") else "") for sec in sections]
    if parts:
        lines.append("  by part: " + "; ".join(parts))
    lines.append("  slowest:")
    for r in sorted(timed, key=lambda r: -float(r["wall_s"]))[:top]:
        name = str(r.get("case_id") or r.get("peak"))
        where = ", ".join(str(v) for v in (r.get("implementation") or r.get("backend"), r.get("mode"),
                                            r.get("queue_config")) if v)
        phases = sorted((r.get("phases_s") or {}).items(), key=lambda kv: -kv[1])[:4]
        split = ", ".join(f"{k} {v:.2f}" for k, v in phases if v >= 0.005)
        lines.append(f"    {float(r['wall_s']):7.2f} s  {name}" + (f" ({where})" if where else "")
                     + (f"  {split}" if split else ""))
    return "\n".join(lines)
