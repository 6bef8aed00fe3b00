"""The `kbench` command: devices, validate, bench, peaks, report, compare (and cases).

A thin front: `validate` and `bench` run the case declarations (kbench.cases) through the runner
(kbench.bench.runner), the same code the pytest suites in suites/ call; `report` and `compare`
hand their arguments to kbench.report.cli.

Exit status: 0 success; 1 a new failure (fail or error not in the expectations); 2 bad usage;
130 interrupted (the results finished so far are on disk).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from kbench.bench.implementations import main_kinds, peer_kinds
from kbench.console import device_tables, make_progress, time_summary

EXIT_OK, EXIT_FAILURES, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

#: where a user's runs go unless --out says otherwise (ignored by git; results/ holds the committed runs)
USER_RUNS = "runs"

class UsageError(Exception):
    """A bad option value found after parsing (unknown device, bad size, ...)."""


def parse_size(text: str) -> int:
    """'64M', '1G', '1048576', '512KiB' -> bytes; argparse.ArgumentTypeError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: use bytes or a number with K, M, G or T (e.g. 64M)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return v


def nonnegative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return v


def writable_dir(path: Path, option: str = "--out") -> None:
    """UsageError unless ``path`` is (or can be made) a folder this process can write."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} names a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot create the folder ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: the folder is not writable")


def queue_config_list(text: str) -> list[str] | None:
    from kbench.bench.queues import parse_queue_configs

    try:
        return parse_queue_configs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ------------------------------------------------------------------------------------ commands

def cmd_devices(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from kbench.bench.devices import enumerate_devices, select_devices
    from kbench.bench.queues import compute_families

    try:
        devices = select_devices(enumerate_devices(args.backend), args.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - no loader, no driver: say so instead of a traceback
        raise UsageError(f"cannot list the {args.backend} devices: {type(exc).__name__}: {exc}") from None
    if args.json:
        print("kbench devices: --json is deprecated; use --format json", file=sys.stderr)
        args.format = "json"
    if args.format == "json":
        import json

        from kbench.results.schema import to_json_value

        print(json.dumps(to_json_value(devices), indent=2, default=str))
        return EXIT_OK
    rows = []
    for d in devices:
        fams = []
        for f in d.get("queue_families", []):
            flags = f.get("flags", [])
            flags = "+".join(flags) if isinstance(flags, (list, tuple)) else str(flags)
            fams.append(f"{f.get('index')}:{flags}x{f.get('count')}")
        feats = [k for k, v in sorted((d.get("features") or {}).items()) if v]
        rows.append([d.get("index"), d.get("vendor_name", ""), d.get("device_name", ""),
                     f"{d.get('driver_name', '')} {d.get('driver_version', '')}".strip(),
                     d.get("api_version", ""), " ".join(fams) + f" ({len(compute_families(d))} compute)",
                     ", ".join(feats) if args.all_features else
                     ", ".join(f for f in feats if f in _KEY_FEATURES)])
    print(tabulate(rows, headers=["index", "vendor", "name", "driver", "API", "queue families", "features"]))
    return EXIT_OK


_KEY_FEATURES = ("float64", "int64", "int16", "float16", "int8", "storage_buffer_8bit", "storage_buffer_16bit",
                 "subgroup_arithmetic", "cooperative_matrix", "integer_dot_product")


def cmd_cases(args: argparse.Namespace) -> int:
    from kbench.cases import instances

    sizes = args.sizes or "default"
    if sizes != "default" and args.mode != "bench":
        raise UsageError(f"--{sizes} picks bench instances: add --mode bench")
    insts = instances(args.mode, args.cases or None, sizes=sizes)
    if sizes == "quick":  # one size per case, as on a device where the headline size fits
        from kbench.cases.base import pick_quick

        insts = pick_quick(insts)
    if args.format == "json":
        import json

        print(json.dumps([{"case_id": i.case_id, "case": i.case.name, "params": dict(i.params), "layer": i.case.layer}
                          for i in insts], indent=1, default=str))
        return EXIT_OK
    for inst in insts:
        print(inst.case_id)
    return EXIT_OK


def cmd_kernels(args: argparse.Namespace) -> int:
    """`kbench kernels FILE [--source DIR]`: read a kernel declaration, compile and check every
    kernel against its shader (no GPU work), list them and the cases each group would run."""
    from kbench.bench.devices import foreign_implementations, load_foreign
    from kbench.foreign import DeclarationError, declaration_path
    from kbench.foreign.kernelset import describe

    try:
        path = declaration_path(args.file)
        ks = load_foreign(str(path), args.source)
        impls = foreign_implementations(path, args.source)
    except (DeclarationError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    rows = describe(ks)
    counts = {impl.name: len(impl.instances(args.mode)) for impl in impls}
    if args.format == "json":
        import json

        print(json.dumps({"source": ks.source.describe(), "kernels": rows, f"{args.mode}_cases": counts}, indent=1))
        return EXIT_OK
    from tabulate import tabulate

    print(f"{path}: {len(rows)} kernel(s) checked against their shaders; source {ks.source.describe()}")
    print(tabulate(rows, headers="keys"))
    for name, n in counts.items():
        print(f"{name}: {n} {args.mode} case(s)")
    return EXIT_OK


def _run_options(args: argparse.Namespace, mode: str):
    from kbench.bench.runner import RunOptions
    from kbench.bench.timing import GPU_POLICY, TimingPolicy

    policy = None
    if mode == "bench" and (args.min_sample_ms is not None or args.samples is not None):
        policy = TimingPolicy(
            min_sample_s=(args.min_sample_ms / 1000.0) if args.min_sample_ms is not None else GPU_POLICY.min_sample_s,
            samples=args.samples if args.samples is not None else GPU_POLICY.samples)
    return RunOptions(
        mode=mode, backend=args.backend, devices=args.device, queue_configs=args.queue_config,
        patterns=list(args.cases or []), out_dir=Path(args.out), timeout=args.timeout,
        expectation_files=[Path(p) for p in (args.expectations or [])],
        default_expectations=not args.no_default_expectations, max_bytes=args.max_bytes, seed=args.seed,
        peer=getattr(args, "peer", None), peaks=not getattr(args, "no_peaks", False), policy=policy,
        kernels=args.kernels, source=args.source, ggml_bin=getattr(args, "ggml_bin", None),
        sizes=getattr(args, "sizes", None) or "default")


def cmd_run(args: argparse.Namespace, mode: str) -> int:
    """`kbench validate` / `kbench bench` (with --validate: the correctness suite first)."""
    if mode == "bench" and getattr(args, "validate", False):
        first = _run_mode(args, "validate")
        if first == EXIT_INTERRUPTED:
            return first
        second = _run_mode(args, "bench")
        return max(first, second)
    return _run_mode(args, mode)


def _run_mode(args: argparse.Namespace, mode: str) -> int:
    from kbench.bench.expectations import ExpectationsError
    from kbench.bench.runner import Runner

    try:
        options = _run_options(args, mode)
        runner = Runner(options, None)
        if not runner.instances:
            import dataclasses

            larger = (mode == "bench" and options.sizes != "full"
                      and Runner(dataclasses.replace(options, sizes="full"), None).instances)
            raise UsageError(f"no case matches -k {' '.join(args.cases or [])!r} in {mode} mode "
                             + (f"with the {options.sizes} sizes; it is in the --full set: add --full "
                                if larger else "")
                             + f"(list them with: kbench cases --mode {mode}"
                             + ("; the device's peaks alone: kbench peaks" if "peak" in " ".join(args.cases or []) else "")
                             + ")")
    except (ValueError, ExpectationsError) as exc:
        raise UsageError(str(exc)) from None
    writable_dir(Path(args.out))
    try:
        runner.devices()  # a bad --device fails here, before any work
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - no loader, no driver: say so instead of a traceback
        raise UsageError(f"cannot list the {args.backend} devices: {type(exc).__name__}: {exc}") from None
    runner.progress = make_progress(args.quiet, args.verbose, every_case=(mode == "bench")) or runner.progress
    t0 = time.monotonic()
    result = runner.run()
    print_summary(result, mode, wall_s=time.monotonic() - t0)
    if result.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if result.summary.ok else EXIT_FAILURES


def _written_records(files: Any) -> list[dict[str, Any]]:
    """The records this run wrote (unreadable files skipped: the summary still prints)."""
    import json

    recs = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                recs.extend(json.loads(line) for line in f)
        except (OSError, ValueError):
            continue
    return recs


def _timer_checks(recs: list[dict[str, Any]]) -> list[str]:
    """kbench.report.truth's cross-checks over the records this run wrote."""
    from kbench.report.truth import timer_checks

    return timer_checks(recs)


def print_summary(result: Any, mode: str, stream=None, wall_s: float | None = None) -> None:
    """Counts per status, notes, unexpected passes, new failures, where the run's time went
    (`wall_s`: the run's wall time) and where results went."""
    stream = stream or sys.stdout
    s = result.summary
    order = ("pass", "xfail", "unsupported", "fail", "error")
    counts = ", ".join(f"{s.counts.get(k, 0)} {k}" for k in order)
    peaks = f" (and {s.peaks} device peak(s) measured)" if s.peaks else ""
    print(f"kbench {mode}: {s.total} result(s){peaks}: {counts}", file=stream)
    for line in s.notes:
        print(f"  note: {line}", file=stream)
    if s.unexpected_passes:
        print(f"  {len(s.unexpected_passes)} unexpected pass(es) (remove them from the expectations):", file=stream)
        for line in s.unexpected_passes[:20]:
            print(f"    {line}", file=stream)
    if s.new_failures:
        print(f"  {len(s.new_failures)} new failure(s):", file=stream)
        for line in s.new_failures[:20]:
            print(f"    {line}", file=stream)
        if len(s.new_failures) > 20:
            print(f"    ... and {len(s.new_failures) - 20} more (see the results file)", file=stream)
    recs = _written_records(result.files)
    if mode == "bench":
        for title, table in device_tables(recs):
            print(f"\n{title}\n{table}\n", file=stream)
        for line in _timer_checks(recs):
            print(f"  timer check: {line}", file=stream)
    spent = time_summary(recs, wall_s, sections=getattr(result, "sections", ()))
    if spent:
        print(spent, file=stream)
    for path in result.files:
        print(f"  results: {path}", file=stream)
    if result.interrupted:
        print("  interrupted: the results finished so far are in the files above", file=stream)


def cmd_peaks(args: argparse.Namespace) -> int:
    """`kbench peaks`: measure each device's peaks (as vkpeak does), print each as it is measured,
    then a table (or --format json); the run is written to --out like a bench run's."""
    from kbench.bench.peaks import PEAKS
    from kbench.bench.runner import RunOptions, Runner
    from kbench.console import TextProgress, peak_table

    try:
        options = RunOptions(mode="bench", backend="vulkan", devices=args.device, out_dir=Path(args.out),
                             timeout=args.timeout, cases=False, peaks=True)
        runner = Runner(options, None)
        runner.devices()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - no loader, no driver: say so instead of a traceback
        raise UsageError(f"cannot list the vulkan devices: {type(exc).__name__}: {exc}") from None
    as_json = args.format == "json"
    if not (as_json or args.quiet):
        runner.progress = TextProgress(every_case=True)
    result = runner.run()
    recs = [r for r in _written_records(result.files) if r.get("kind") == "peak" or r.get("layer") == "peak"]
    if as_json:
        import json

        print(json.dumps([{k: r.get(k) for k in ("device_name", "driver_name", "peak", "case_id", "value", "unit",
                                                 "status", "reason", "params") if r.get(k) is not None}
                          for r in recs], indent=1))
    else:
        print(peak_table(recs, {p.name: p.description for p in PEAKS}))
        for path in result.files:
            print(f"results: {path}")
    return EXIT_INTERRUPTED if result.interrupted else EXIT_OK


def _report_catalogue() -> None:
    """Hand the current case declarations to the report layer (which reads results only): the
    case ids they generate and the peak each case is judged by."""
    from kbench.bench.peaks import PEAK_OF_CASE
    from kbench.cases import ALL_CASES, instances
    from kbench.report import catalogue

    # the full set: a `bench --full` run's sizes (256M ops, every weight type at model shapes) are declared too
    ids = {i.case_id for mode in ("validate", "bench") for i in instances(mode, sizes="full")}
    peaks = {c.name: PEAK_OF_CASE[c.peak][0] for c in ALL_CASES if c.peak in PEAK_OF_CASE}
    catalogue.use(ids, peaks)


def cmd_delegate(name: str, argv: list[str]) -> int:
    from kbench.report import cli as report_cli

    _report_catalogue()

    fn = report_cli.report_main if name == "report" else report_cli.compare_main
    try:
        return int(fn(list(argv)) or 0)
    except SystemExit as exc:  # argparse inside report/compare: --help (0) or bad usage (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)


def cmd_probe(argv: list[str]) -> int:
    """`kbench probe NAME [ARGS]`: one of kbench.probes, its own options after the name."""
    from kbench.probes import PROBES, run_probe

    if not argv or argv[0] in ("-h", "--help") or argv[0] not in PROBES:
        lines = [f"  {name:11s} {what}" for name, what in PROBES.items()]
        print("usage: kbench probe NAME [ARGS]   (kbench probe NAME --help for its options)\nprobes:\n"
              + "\n".join(lines), file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else EXIT_USAGE
    try:
        return run_probe(argv[0], argv[1:])
    except SystemExit as exc:  # argparse inside the probe: --help (0) or bad usage (2); a probe's own message
        if isinstance(exc.code, str):
            print(f"kbench probe {argv[0]}: {exc.code}", file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)


# ------------------------------------------------------------------------------------ parser

def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", "-d", metavar="SPEC",
                   help="devices to use: index, vendor or a substring of the device/driver name; "
                        "comma-separated; default all")
    p.add_argument("--queue-config", "-q", type=queue_config_list, metavar="LIST",
                   help="queue configurations: single, multi_queue, multi_family, async (comma-separated) "
                        "or all; default: all for validate, single for bench")
    p.add_argument("-k", "--cases", action="append", metavar="PATTERN",
                   help="run the case ids matching PATTERN (substring or glob; 'not X' or '!X' excludes); repeatable")
    p.add_argument("--out", "-o", default=USER_RUNS, metavar="DIR",
                   help=f"directory for the results (default {USER_RUNS}/, git-ignored: your runs stay apart from "
                        "the committed results/ and its report)")
    p.add_argument("--timeout", type=positive_float, default=300.0, metavar="SECONDS",
                   help="time limit per case; a case over it is recorded as an error (default 300)")
    p.add_argument("--backend", choices=main_kinds(), default="vulkan",
                   help="vulkan (default) or numpy (the float64 reference, for checking the suite itself)")
    p.add_argument("--expectations", action="append", metavar="FILE",
                   help="extra expectations TOML (known failures per driver and case); repeatable")
    p.add_argument("--no-default-expectations", action="store_true",
                   help="ignore the expectations shipped in kbench/cases/expectations.toml")
    p.add_argument("--max-bytes", type=parse_size, metavar="SIZE",
                   help="skip (as unsupported) instances needing more device memory than SIZE, e.g. 256M "
                        "(bench on CPU devices defaults to 16M)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--kernels", metavar="FILE",
                   help="run third-party kernels declared in FILE (TOML; or a shipped set: yule) instead of "
                        "kbench's own; see docs/foreign-kernels.md")
    p.add_argument("--source", metavar="DIR",
                   help="the source tree the --kernels declaration refers to (a checkout of its pinned commit)")
    p.add_argument("--quiet", action="store_true", help="no progress output, only the summary")
    p.add_argument("--verbose", "-v", action="store_true", help="print every result as it completes")


def _add_peer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peer", choices=peer_kinds(),
                   help="also run the backend cases through a peer: torch = PyTorch on CUDA (CUDA events); "
                        "ggml = ggml's Vulkan backend through its test-backend-ops (perf over kbench's bench "
                        "shapes; in validate, ggml's own test mode for the same op types)")
    p.add_argument("--ggml-bin", metavar="PATH",
                   help="ggml's test-backend-ops binary for --peer ggml (default $KBENCH_GGML_BIN, then PATH)")


def build_parser() -> argparse.ArgumentParser:
    from kbench import __version__

    parser = argparse.ArgumentParser(
        prog="kbench", description="Correctness and speed of GPU compute kernels on every Vulkan device.")
    parser.add_argument("--version", action="version", version=f"kbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("devices", help="list the Vulkan devices (vendor, driver, API, queue families, features)")
    p.add_argument("--device", "-d", metavar="SPEC", help="only the devices SPEC names (see validate --help)")
    p.add_argument("--backend", choices=main_kinds(), default="vulkan")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="table (default) or json (full device properties)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # deprecated: --format json
    p.add_argument("--all-features", action="store_true", help="list every supported feature")

    p = sub.add_parser("validate", help="correctness suite: every case against its float64 reference")
    _add_run_options(p)
    _add_peer_options(p)

    p = sub.add_parser("bench", help="benchmark suite: GPU time, GB/s, GFLOP/s and fraction of measured peak")
    _add_run_options(p)
    _add_peer_options(p)
    p.add_argument("--no-peaks", action="store_true", help="skip the peak measurements")
    p.add_argument("--validate", action="store_true",
                   help="run the correctness suite (kbench validate, same options) first: the whole main job")
    p.add_argument("--min-sample-ms", type=positive_float, metavar="MS",
                   help="aim for samples of at least MS milliseconds (default 20 on GPUs, 2 on CPU devices)")
    p.add_argument("--samples", type=int, metavar="N", help="samples per case (default 7 on GPUs, 3 on CPU devices)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--quick", dest="sizes", action="store_const", const="quick",
                       help="the headline cases only, one size each (the largest of the headline size and "
                            "those below it that fits the device): about a minute on a GPU")
    which.add_argument("--full", dest="sizes", action="store_const", const="full",
                       help="every declared size, also the largest (256M-element ops, 1 GiB copies, every "
                            "weight type at model shapes) that the default set leaves out")

    p = sub.add_parser("peaks", help="measure each device's peaks: copy bandwidth, FMA, matrix and int8-dot "
                                     "rates, dispatch latency, transfers (the denominators of %% of peak)")
    p.add_argument("--device", "-d", metavar="SPEC", help="only the devices SPEC names (see validate --help)")
    p.add_argument("--out", "-o", default=USER_RUNS, metavar="DIR", help=f"directory for the run (default {USER_RUNS}/)")
    p.add_argument("--timeout", type=positive_float, default=300.0, metavar="SECONDS", help="time limit per peak")
    p.add_argument("--format", choices=("table", "json"), default="table", help="table (default) or json")
    p.add_argument("--quiet", action="store_true", help="no line per peak while measuring, only the table")

    p = sub.add_parser("kernels", help="check a kernel declaration against its shaders (no GPU work) and list it")
    p.add_argument("file", metavar="FILE", help="a declaration file (TOML) or a shipped set's name (yule)")
    p.add_argument("--source", metavar="DIR", help="the source tree the declaration refers to")
    p.add_argument("--mode", choices=("validate", "bench"), default="validate", help="whose cases to count")
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser("cases", help="list the case ids (what -k selects from)")
    p.add_argument("--mode", choices=("validate", "bench"), default="validate")
    p.add_argument("--format", choices=("text", "json"), default="text", help="one id per line (default) or json")
    p.add_argument("-k", "--cases", action="append", metavar="PATTERN")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--quick", dest="sizes", action="store_const", const="quick",
                       help="with --mode bench: the cases `kbench bench --quick` runs where their headline size fits")
    which.add_argument("--full", dest="sizes", action="store_const", const="full",
                       help="with --mode bench: every declared size (`kbench bench --full`)")

    for name, text in (("report", "tables and plots from results (kbench report --help)"),
                       ("compare", "compare two result sets for regressions (kbench compare --help)"),
                       ("probe", "measurements beside the suites: kbench probe NAME [ARGS] (kbench probe --help)")):
        p = sub.add_parser(name, help=text, add_help=False, prefix_chars="\0")
        p.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kbench` command; returns the exit status."""
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`kbench cases | head -3`): stop quietly, as cat and grep do
        _stdout_to_devnull()
        return EXIT_OK


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so that the flush at interpreter exit does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # report/compare own their options: hand everything after the command word over untouched
    if argv and argv[0] in ("report", "compare"):
        return cmd_delegate(argv[0], argv[1:])
    if argv and argv[0] == "probe":
        return cmd_probe(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "samples", None) is not None and args.samples < 1:
        parser.error(f"--samples must be at least 1, got {args.samples}")
    try:
        if args.command == "devices":
            return cmd_devices(args)
        if args.command == "cases":
            return cmd_cases(args)
        if args.command == "kernels":
            return cmd_kernels(args)
        if args.command == "peaks":
            return cmd_peaks(args)
        return cmd_run(args, args.command)
    except UsageError as exc:
        print(f"kbench {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kbench: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
