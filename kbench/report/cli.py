"""Entry points behind `kbench report` and `kbench compare` (kbench.cli calls these)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from kbench.results import ResultsFormatError, ResultsWarning, load_runs

from . import tables
from .build import write_report
from .compare import MATCH_ON, compare
from .frames import prepare
from .render import render_table, table_records

_TERMINAL_FORMATS = ("simple", "github", "md", "html", "csv", "json")


def _report_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kbench report", description=(
        "Tables and plots from kbench result files (reads results only; never opens a device). "
        "With --out, writes a report folder (index.md, report.html, CSV, JSON, plots); "
        "without, prints the tables."))
    p.add_argument("runs", nargs="+", help="result files (*.jsonl) or folders holding them")
    p.add_argument("--out", help="report folder to write")
    p.add_argument("--baseline", help="device the performance ratios refer to (label, device_key "
                   "or a unique part of the name)")
    p.add_argument("--reasons", action="store_true", help="show failure reasons in the correctness matrix")
    p.add_argument("--format", choices=_TERMINAL_FORMATS, default="simple",
                   help="table format for terminal output (default: simple)")
    p.add_argument("--no-plots", action="store_true", help="skip the plots (faster)")
    p.add_argument("--history", action="store_true",
                   help="keep results of parameters an op no longer declares (default: a device's results of "
                        "an op's current parameters replace its older ones)")
    return p


def report_main(argv: list[str]) -> int:
    """`kbench report RUNS... [--out DIR] [--baseline DEVICE] [--reasons]`; returns the exit code
    (0 written/printed, 2 bad input such as an unreadable results file or an unknown baseline)."""
    args = _report_parser().parse_args(argv)
    try:
        if args.out:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResultsWarning)  # repeated in the report itself
                index = write_report(args.runs, args.out, baseline=args.baseline,
                                     reasons=args.reasons, plots=not args.no_plots, history=args.history)
            df = load_runs(args.runs)
            for note in df.attrs.get("warnings", []):
                print(f"warning: {note}", file=sys.stderr)
            counts = tables.status_counts(df)
            if not counts.empty:
                print(render_table(counts, args.format if args.format in ("simple", "github", "md") else "simple"))
            print(f"report written: {index}")
            return 0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResultsWarning)
            df = load_runs(args.runs)
        if not args.history:
            df = tables.current_only(df)
        for note in df.attrs.get("warnings", []):
            print(f"warning: {note}", file=sys.stderr)
        base = tables.resolve_baseline(prepare(df), args.baseline)
        sections = [("Summary", tables.summary_table(df, base)),
                    ("Devices", tables.devices_table(df)),
                    ("Correctness", tables.correctness_matrix(df, reasons=args.reasons, baseline=base)),
                    ("Failures and errors", tables.failures_table(df)),
                    ("Performance", tables.performance_matrix(df, base)),
                    ("Queue configurations", tables.queue_config_matrix(df))]
        if args.format == "json":  # one document, not one per table
            print(json.dumps({title: table_records(t) for title, t in sections}, indent=1,
                             ensure_ascii=False, default=str))
            return 0
        for title, table in sections:
            if table.empty:
                continue
            if args.format in ("simple", "github", "md"):
                print(f"\n{'## ' if args.format != 'simple' else ''}{title}\n")
            print(render_table(table, args.format))
        return 0
    except (ResultsFormatError, FileNotFoundError, ValueError) as exc:
        print(f"kbench report: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # --out not writable, a file, a full disk
        print(f"kbench report: error: cannot write the report to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2


def _compare_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kbench compare", description=(
        "Compare two sets of results: exit 1 on a speed regression beyond the noise band, a "
        "correctness loss (pass -> fail/error/unsupported) or baseline cases missing from the current "
        "results (unless --allow-missing), 0 otherwise, 2 on bad input."))
    p.add_argument("base", help="baseline results (file or folder)")
    p.add_argument("current", help="current results (file or folder)")
    p.add_argument("--threshold", type=float, default=0.05,
                   help="smallest relative change of the median time that counts (default 0.05)")
    p.add_argument("--noise-k", type=float, default=3.0,
                   help="noise band = max(threshold, K x combined relative spread) (default 3)")
    p.add_argument("--match", choices=list(MATCH_ON), default="device_key",
                   help="match devices by device_key (device+driver, default) or device_name")
    p.add_argument("--format", choices=("md", "text", "json"), default="text")
    p.add_argument("--all", action="store_true", help="also list unchanged cases")
    p.add_argument("--allow-missing", action="store_true",
                   help="pass even when baseline cases are missing from the current results (by default "
                        "they fail the gate: a run cut short must not pass)")
    return p


def compare_main(argv: list[str]) -> int:
    """`kbench compare BASE CURRENT [--threshold 0.05] [--format md|text|json]`; returns the exit code."""
    args = _compare_parser().parse_args(argv)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResultsWarning)  # listed in the comparison output
            base, current = load_runs([args.base]), load_runs([args.current])
        result = compare(base, current, threshold=args.threshold, noise_k=args.noise_k, match=args.match,
                         allow_missing=args.allow_missing)
    except (ResultsFormatError, FileNotFoundError, ValueError) as exc:
        print(f"kbench compare: error: {exc}", file=sys.stderr)
        return 2
    print(result.format(args.format, show_all=args.all), end="")
    return result.exit_code


if __name__ == "__main__":  # pragma: no cover - `python -m kbench.report.cli report ...`
    commands = {"report": report_main, "compare": compare_main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print("usage: python -m kbench.report.cli {report,compare} ...", file=sys.stderr)
        sys.exit(2)
    sys.exit(commands[sys.argv[1]](sys.argv[2:]))
