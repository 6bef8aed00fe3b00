"""``write_report``: a complete report folder (index.md, report.html, CSV, JSON, plots)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from kbench.results import load_runs
from kbench.results.provenance import utc_now

from . import tables
from .files import write_text
from .frames import prepare
from .render import render_table, table_records

HOW_TO_READ = """\
- **Correctness**: each case is checked against a float64 NumPy reference (NMSE = sum((out-ref)^2) / \
sum(ref^2), NaN counts as a failure). `pass` met the case's tolerance; `FAIL` ran and gave wrong \
results; `error` did not complete (exception, device lost, timeout); `unsupported` needs a feature \
or limit the device lacks (not a defect); `xfail` is a known, expected failure; `not run` means no \
record for that device. A row with `[config]` ran under a queue configuration other than `single`.
- **Performance**: median GPU time (timestamp queries; `(host)` marks host wall time), throughput \
(bytes moved or FLOPs divided by the median time) and the percentage of that device's *measured* \
peak of the same kind: copy bandwidth (GB/s) for memory-bound cases, fp32/fp16 FMA rate \
(GFLOP/s) for compute-bound ones; a case is memory-bound when its FLOPs per byte lie below the \
device's ridge point (FMA peak / copy bandwidth) unless the case names its peak itself. `× base` is the throughput ratio to the baseline device (work per time: > 1 is faster).
- **Queue configurations**: the same case on one device under each queue configuration; the \
factor is the speedup over `single` (work per time, so a configuration that ran the case on \
several queues at once is credited with all of their work).
- When several runs hold the same case for the same device, the newest record is shown.
"""


@dataclass
class Section:
    title: str
    text: str = ""
    table: pd.DataFrame | None = None
    empty_note: str = ""
    images: list[tuple[str, Path, Path]] = field(default_factory=list)  # (caption, png, svg)

    @property
    def anchor(self) -> str:
        """The heading's id, as GitHub and Python-Markdown's toc both derive it."""
        return re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", self.title.lower()).strip())


def _md(section: Section, out_dir: Path) -> str:
    parts = [f"## {section.title}", ""]
    if section.text:
        parts += [section.text.rstrip(), ""]
    if section.table is not None:
        if section.table.empty:
            parts += [f"_{section.empty_note or 'nothing to show'}_", ""]
        else:
            parts += [render_table(section.table, "md")]
    for caption, png, svg in section.images:
        rel_png, rel_svg = png.relative_to(out_dir).as_posix(), svg.relative_to(out_dir).as_posix()
        parts += [f"**{caption}** ([SVG]({rel_svg}))", "", f"![{caption}]({rel_png})", ""]
    return "\n".join(parts)


def _toc(sections: list[Section]) -> str:
    # inline HTML links: GitHub and Python-Markdown both render them, and index.md's Markdown
    # links stay those of files in the folder (plots, SVGs)
    return "**Contents:** " + " · ".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in sections) + "\n"


_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:76em;padding:0 1em;line-height:1.4}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
.headerlink{color:#bbb;text-decoration:none;margin-left:.3em;font-size:.8em}
.scroll{overflow-x:auto;margin-bottom:1.5em;max-width:100%}
table{border-collapse:collapse;font-size:0.82em}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0;position:sticky;top:0}td{max-width:28em;overflow-wrap:break-word}
td:first-child{white-space:nowrap}
.st-pass{background:#e6f4e6}.st-fail{background:#f8c8c8;font-weight:bold}
.st-error{background:#f8dcb4;font-weight:bold}.st-unsupported{background:#e8e8e8;color:#555}
.st-xfail{background:#f4f0d0}.st-notrun{color:#999}img{max-width:100%;height:auto}
figure{margin:1em 0}code{background:#f4f4f4;padding:0 .2em}"""

_STATUS_CELL = re.compile(r"<td>(FAIL|error|unsupported|xfail|not run|pass)(:[^<]*)?</td>")
_STATUS_CSS = {"FAIL": "st-fail", "error": "st-error", "unsupported": "st-unsupported", "xfail": "st-xfail",
               "not run": "st-notrun", "pass": "st-pass"}


def markdown_to_html(md_text: str, title: str = "kbench report") -> str:
    """The report's HTML: its Markdown rendered by Python-Markdown (tables, heading anchors with
    permalinks), wide tables scrolling inside the page and status cells coloured."""
    import markdown

    body = markdown.markdown(md_text, extensions=["tables", "toc"],
                             extension_configs={"toc": {"permalink": "#"}}, output_format="html")
    body = body.replace("<table>", '<div class="scroll"><table>').replace("</table>", "</table></div>")
    body = _STATUS_CELL.sub(lambda m: f'<td class="{_STATUS_CSS[m.group(1)]}">{m.group(1)}{m.group(2) or ""}</td>',
                            body)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")


def _devices_by_row(devices: pd.DataFrame) -> pd.DataFrame:
    """The Devices table turned: one column per device, one row per property and peak, so that a
    report with many peaks stays as wide as its number of devices."""
    if devices.empty:
        return devices
    turned = devices.set_index("device").T
    turned = turned[[c for c in turned.columns]]
    turned.index.name = "property"
    return turned.reset_index()


def write_report(runs_paths: Iterable[str | Path] | str | Path, out_dir: str | Path,
                 baseline: str | None = None, reasons: bool = False, plots: bool = True,
                 history: bool = False) -> Path:
    """Load the runs and write the report folder ``out_dir``; returns the path of index.md.

    ``baseline`` picks the device column the performance ratios refer to (a device label,
    device_key, or a unique part of a name). ``reasons`` puts failure reasons into the
    correctness matrix cells; the failures section always lists them. Without ``history``,
    records of cases no longer declared (old parameters) are left out: each device shows its
    newest result of each current case.
    """
    df = load_runs(runs_paths)
    if not history:
        df = tables.current_only(df)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out} names a file, not a folder for the report")
    out.mkdir(parents=True, exist_ok=True)
    headers = df.attrs.get("runs", [])
    base_label = tables.resolve_baseline(prepare(df), baseline)  # fails early on a bad name

    summary = tables.summary_table(df, base_label)
    runs = tables.runs_table(headers)
    devices = tables.devices_table(df, headers)
    devices_full = tables.devices_table(df, headers, all_features=True)
    counts = tables.status_counts(df)
    correctness = tables.correctness_matrix(df, reasons=reasons, baseline=base_label)
    failures = tables.failures_table(df, ("fail", "error"))
    not_run = tables.failures_table(df, ("unsupported", "xfail"))
    perf_long = tables.performance_long(df, base_label)
    perf = tables.performance_matrix(df, base_label)
    queues_long = tables.queue_config_long(df)
    queues = tables.queue_config_matrix(df)

    if plots:
        from .plots import family_plots, roofline_plots  # matplotlib only when plotting
    roof = roofline_plots(df, out / "plots") if plots else {}
    bars = family_plots(df, out / "plots", base_label) if plots else {}

    warnings_text = "\n".join(f"- {w}" for w in df.attrs.get("warnings", []))
    sections = [
        Section("Summary", "Per op and size, each device's figure (GB/s or GFLOP/s, as the op is judged) and "
                "its % of that device's *measured* peak; the winner has the shortest median time (same work). "
                "Only sizes that two or more devices ran (a CPU driver stops at 16 MiB); every size is under "
                "<a href=\"#performance\">Performance</a>.", table=summary, empty_note="no passing benchmark records"),
        Section("How to read this report", HOW_TO_READ),
        Section("Devices", "Identity, supported features and measured peaks (`kbench peaks`) of each device "
                "column.", table=_devices_by_row(devices), empty_note="no devices"),
        Section("Correctness summary", "Number of case rows per status and device.", table=counts,
                empty_note="no case records"),
        Section("Correctness matrix", table=correctness, empty_note="no case records"),
        Section("Failures and errors", "Every failed or errored case with its reason, per device "
                "(`where` is the results file and line).", table=failures,
                empty_note="no failures and no errors"),
        Section("Unsupported and expected failures", "Cases the device could not run (missing "
                "feature or limit) or that are known to fail, with the reason.", table=not_run,
                empty_note="none"),
        Section("Performance", (f"Baseline device: **{base_label}**." if base_label else
                "No baseline device chosen (`--baseline DEVICE` adds ratios)."), table=perf,
                empty_note="no passing benchmark records"),
        Section("Queue configurations", table=queues,
                empty_note="no case was benchmarked under more than one queue configuration"),
    ]
    if plots:
        sections.append(Section(
            "Rooflines", "Cases with FLOPs: achieved GFLOP/s over arithmetic intensity under the "
            "ceilings from the measured peaks (one colour per op). Cases without FLOPs: achieved GB/s "
            "against the measured copy bandwidth.",
            images=[(f"Roofline: {d}", p[0], p[1]) for d, p in roof.items()],
            table=None if roof else pd.DataFrame(), empty_note="no passing benchmark records"))
        sections.append(Section(
            "Throughput per op family", "Each op family's cases and sizes, one bar per device; a log "
            "axis where the figures span more than a decade.",
            images=[(f"{c}", p[0], p[1]) for c, p in bars.items()],
            table=None if bars else pd.DataFrame(), empty_note="no passing benchmark records"))
    if warnings_text:
        sections.append(Section("Warnings while loading", warnings_text))
    sections.append(Section("Runs and provenance", "Every result file read (newest last): when, where, "
                            "which kbench and git revision, on which device.", table=runs, empty_note="no runs"))

    n_records = int((df["kind"] == "case").sum()) if not df.empty else 0
    intro = (f"Generated {utc_now()} from {len(headers)} run(s), {n_records} case record(s), "
             f"{len(devices)} device column(s). Failures: {len(failures)}; "
             f"unsupported/xfail: {len(not_run)}.")
    md_text = ("# kbench report\n\n" + intro + "\n\n" + _toc(sections) + "\n"
               + "\n".join(_md(s, out) for s in sections))
    write_text(out / "index.md", md_text)
    write_text(out / "report.html", markdown_to_html(md_text))

    csv_tables = {"summary": summary, "runs": runs, "devices": devices_full, "correctness": correctness,
                  "correctness_summary": counts, "failures": failures, "unsupported": not_run,
                  "performance": perf_long, "performance_matrix": perf, "queue_configs": queues_long}
    for name, table in csv_tables.items():
        write_text(out / f"{name}.csv", render_table(table, "csv") if not table.empty or len(table.columns) else "")
    report = {"generated": utc_now(), "baseline": base_label, "warnings": df.attrs.get("warnings", []),
              "tables": {name: table_records(t) for name, t in csv_tables.items()},
              "plots": {"roofline": {d: [p.relative_to(out).as_posix() for p in ps] for d, ps in roof.items()},
                        "families": {c: [p.relative_to(out).as_posix() for p in ps] for c, ps in bars.items()}}}
    write_text(out / "report.json", json.dumps(report, indent=1, ensure_ascii=False, default=str))
    return out / "index.md"
