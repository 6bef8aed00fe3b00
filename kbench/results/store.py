"""The JSONL result store: one file per run, one JSON object per line, header first.

Each record is written with one ``os.write`` of a complete line followed by ``fsync``, so a run
killed at any point leaves every earlier record intact; at worst the last line is cut short,
and the loader reports that line (file:line) instead of failing or hiding it.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .provenance import make_run_id, utc_now
from .records import implementation_of, make_case_id, peak_record
from .schema import (
    CASE_REQUIRED, DEVICE_COLUMNS, PEAK_REQUIRED, PEAK_UNITS, SCHEMA_VERSION, RecordError,
    to_json_value, validate_record,
)

if TYPE_CHECKING:  # pandas is imported by load_runs alone
    import pandas as pd

_NONFINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class ResultsFormatError(ValueError):
    """A results file is not a valid kbench results file; says which file, which line, what."""

    def __init__(self, path: str | Path, line: int | None, problem: str):
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


class ResultsWarning(UserWarning):
    """Something in a results file was not loaded (a cut-off last line); the message says where."""


class RunWriter:
    """Writes one run to ``<directory>/<run_id>.jsonl``; the header is written on creation.

    >>> with RunWriter("results", collect_provenance(props, "vulkan")) as run:   # doctest: +SKIP
    ...     run.write({"case": "softmax", "params": {"size": 4096}, ...})
    """

    def __init__(self, directory: str | Path, provenance: Mapping[str, Any]):
        if not isinstance(provenance, Mapping):
            raise TypeError(f"provenance must be a dict from collect_provenance(), got {type(provenance).__name__}")
        given = to_json_value(dict(provenance))
        # run_id goes near the front so a header line is readable with `head -c 200`
        header = {"schema_version": given.pop("schema_version", SCHEMA_VERSION),
                  "kind": given.pop("kind", "run"), "run_id": given.pop("run_id", None),
                  "started": given.pop("started", utc_now()), **given}
        base_id = header["run_id"] or make_run_id(header)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._fd, run_id = self._create_unique(directory, base_id)
        header["run_id"] = run_id
        self.run_id: str = run_id
        self.path: Path = directory / f"{run_id}.jsonl"
        try:
            validate_record(header)
        except RecordError as exc:
            os.close(self._fd)
            self.path.unlink()
            raise RecordError(f"provenance header: {exc}") from None
        self.header: dict[str, Any] = header
        self._device = header["device"]
        self.records_written = 0
        self._append(header)

    @staticmethod
    def _create_unique(directory: Path, base_id: str) -> tuple[int, str]:
        # O_EXCL: two runs started in the same second on one host never share a file
        for n in range(1, 1000):
            run_id = base_id if n == 1 else f"{base_id}-{n}"
            try:
                fd = os.open(directory / f"{run_id}.jsonl",
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            except FileExistsError:
                continue
            return fd, run_id
        raise FileExistsError(f"could not find a free run file name for {base_id!r} in {directory}")

    def _append(self, record: Mapping[str, Any]) -> None:
        if self._fd is None:
            raise ValueError(f"RunWriter for {self.path} is closed")
        line = json.dumps(record, allow_nan=False, ensure_ascii=False, separators=(",", ":")) + "\n"
        data = line.encode("utf-8")
        view = memoryview(data)
        while view:  # one call for ordinary lines; the loop only guards against short writes
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    def complete(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The record as it would be written: defaults from the header filled in, then validated."""
        if not isinstance(record, Mapping):
            raise TypeError(f"record must be a dict, got {type(record).__name__}")
        rec = to_json_value(dict(record))
        kind = rec.setdefault("kind", "case")
        if kind not in ("case", "peak"):
            raise RecordError(f"RunWriter.write takes 'case' or 'peak' records, got kind {kind!r}")
        rec.setdefault("schema_version", SCHEMA_VERSION)
        if rec.setdefault("run_id", self.run_id) != self.run_id:
            raise RecordError(f"record run_id {rec['run_id']!r} is not this run's {self.run_id!r}")
        rec.setdefault("time", utc_now())
        for column in DEVICE_COLUMNS:
            rec.setdefault(column, self._device.get(column, ""))
        rec.setdefault("device_key", self.header["device_key"])
        rec.setdefault("backend", self.header["backend"])
        # the one place a record gets its implementation: the run's (see collect_provenance)
        rec.setdefault("implementation", implementation_of(self.header))
        if kind == "case":
            if "case_id" not in rec and isinstance(rec.get("case"), str) and isinstance(rec.get("params"), dict):
                rec["case_id"] = make_case_id(rec["case"], rec["params"])
            if rec.get("status") == "pass":
                rec.setdefault("reason", "")
        else:
            rec.setdefault("unit", PEAK_UNITS.get(str(rec.get("peak")), ""))
        validate_record(rec)
        return rec

    def write(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Validate ``record`` (a case or peak), fill run defaults, append it durably; returns it."""
        rec = self.complete(record)
        self._append(rec)
        self.records_written += 1
        return rec

    def write_peak(self, name: str, value: float, unit: str | None = None, **extra: Any) -> dict[str, Any]:
        """Shortcut for a ``"kind": "peak"`` record (e.g. ``write_peak("peak.fp32_fma", 1.2e3)``)."""
        return self.write(peak_record(name, value, unit if unit is not None else PEAK_UNITS.get(name, ""), **extra))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)


# ---------------------------------------------------------------------------------- loading

def result_files(paths: Iterable[str | Path] | str | Path) -> list[Path]:
    """The ``*.jsonl`` files named by ``paths`` (files, or folders searched recursively)."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(path.rglob("*.jsonl"))
        elif path.exists():
            found = [path]
        else:
            raise FileNotFoundError(f"results path {str(path)!r} does not exist")
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                files.append(f)
    return files


def _reject_constant(token: str) -> Any:
    raise ValueError(f"bare {token} token (kbench stores non-finite numbers as the string \"{token}\")")


def _parse_int(text: str) -> int:
    if len(text) > 40:  # far beyond 64 bits; int() of thousands of digits is slow or refused
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def parse_line(raw: bytes) -> Any:
    """One line of a results file as JSON; ValueError (with a short reason) for text that is no
    JSON, bare NaN/Infinity tokens, integers of dozens of digits or nesting too deep to parse."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, parse_int=_parse_int)
    except RecursionError:
        raise ValueError("nested too deep to read (kbench records nest a few levels)") from None


def read_run_file(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """Parse and validate one run file: (header, records, warnings). Raises ResultsFormatError."""
    path = Path(path)
    data = path.read_bytes()
    if not data.strip():
        raise ResultsFormatError(path, 1, "empty file: no run header (is this a kbench results file?)")
    lines = data.split(b"\n")
    ends_with_newline = data.endswith(b"\n")
    if ends_with_newline:
        lines.pop()
    header: dict[str, Any] | None = None
    records: list[dict[str, Any]] = []
    notes: list[str] = []
    for number, raw in enumerate(lines, start=1):
        is_cut_last = number == len(lines) and not ends_with_newline
        if not raw.strip():
            continue  # a blank line carries nothing
        try:
            obj = parse_line(raw)
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError among them
            if is_cut_last and header is not None:
                notes.append(f"{path}:{number}: last line is cut short ({len(raw)} bytes, no newline; "
                             "the writer was probably interrupted) and was not loaded")
                break
            what = "header line is cut short" if is_cut_last else f"not valid JSON ({exc})"
            raise ResultsFormatError(path, number, what) from None
        if not isinstance(obj, dict):
            raise ResultsFormatError(path, number, f"expected a JSON object, got {type(obj).__name__}")
        if header is None:
            if obj.get("kind") != "run":
                raise ResultsFormatError(
                    path, number, f"missing run header: the first record must have \"kind\": \"run\", "
                    f"got kind {obj.get('kind')!r} (is this a kbench results file?)")
        try:
            validate_record(obj)
        except RecordError as exc:
            raise ResultsFormatError(path, number, str(exc)) from None
        if header is None:
            header = obj
            continue
        if obj["kind"] == "run":
            raise ResultsFormatError(path, number, "a second run header; one file holds one run")
        if obj["run_id"] != header["run_id"]:
            raise ResultsFormatError(path, number, f"run_id {obj['run_id']!r} differs from the header's "
                                     f"{header['run_id']!r}")
        obj["_line"] = number
        records.append(obj)
    assert header is not None  # data was not blank, so some line parsed or raised
    return header, records, notes


def _decode_nonfinite(value: Any) -> Any:
    if isinstance(value, str) and value in _NONFINITE:
        return _NONFINITE[value]
    return value


def flatten_record(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become dotted columns (``gpu_ns.median``, ``params.size``); lists stay."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_record(value, prefix=f"{name}."))
        elif isinstance(value, Mapping):
            flat[name] = None
        else:
            flat[name] = _decode_nonfinite(value)
    return flat


_BASE_COLUMNS = [c for c in dict.fromkeys(
    ["run_id", "kind", *CASE_REQUIRED, *PEAK_REQUIRED, "gpu_ns.median", "host_ns.median",
     "bytes", "flops", "gbps", "gflops", "peak_name", "implementation", "variant", "source", "source_line"]) if c != "params"]


def options_label(options: Mapping[str, Any] | None) -> str:
    """A run header's ``backend_options`` as a short label ("" for the default kernels), e.g.
    ``"qmatvec layout=packed"``: records of such runs are kept apart from default runs."""
    parts = []
    for group, value in sorted((options or {}).items()):
        if isinstance(value, Mapping):
            parts.append(f"{group} " + ",".join(f"{k}={v}" for k, v in sorted(value.items())))
        elif isinstance(value, (list, tuple)):
            parts.append(f"{group}=" + "x".join(str(v) for v in value))
        else:
            parts.append(f"{group}={value}")
    return "; ".join(parts)


def _load(paths: Iterable[str | Path] | str | Path) -> tuple[list[dict], list[dict], list[str]]:
    files = result_files(paths)
    if not files:
        named = [str(paths)] if isinstance(paths, (str, Path)) else [str(p) for p in paths]
        raise FileNotFoundError(f"no *.jsonl results files in {', '.join(named) or '(no paths given)'}")
    headers: list[dict] = []
    rows: list[dict] = []
    notes: list[str] = []
    run_files: dict[str, Path] = {}
    for f in files:
        header, records, file_notes = read_run_file(f)
        if header["run_id"] in run_files:
            raise ResultsFormatError(f, 1, f"run_id {header['run_id']!r} was already loaded from "
                                     f"{run_files[header['run_id']]}; the same run is given twice")
        run_files[header["run_id"]] = f
        headers.append({**header, "implementation": implementation_of(header), "source": str(f)})
        variant = options_label(header.get("backend_options"))
        for rec in records:
            line = rec.pop("_line")
            # records from before the implementation field read as the run's backend stands for
            rows.append({**flatten_record(rec), "implementation": implementation_of({**header, **rec}),
                         "variant": variant, "source": str(f), "source_line": line})
        notes.extend(file_notes)
    return headers, rows, notes


def load_runs(paths: Iterable[str | Path] | str | Path) -> pd.DataFrame:
    """All case and peak records of the given run files/folders as one flat DataFrame.

    ``attrs["runs"]`` holds the run headers, ``attrs["warnings"]`` the file:line of every line
    that was not loaded (also issued through ``warnings.warn``). A malformed or foreign file
    raises ResultsFormatError naming the file and line.
    """
    import pandas as pd  # only the loader needs it: writing records and case ids stay light

    headers, rows, notes = _load(paths)
    frame = pd.DataFrame(rows)
    for column in _BASE_COLUMNS:
        if column not in frame.columns:
            frame[column] = None
    extra = sorted(c for c in frame.columns if c not in _BASE_COLUMNS)
    frame = frame[_BASE_COLUMNS + extra]
    frame.attrs["runs"] = headers
    frame.attrs["warnings"] = list(notes)
    for note in notes:
        warnings.warn(note, ResultsWarning, stacklevel=2)
    return frame


def load_run_headers(paths: Iterable[str | Path] | str | Path) -> list[dict[str, Any]]:
    """The validated header (provenance) of each run file, with its ``source`` path."""
    headers: list[dict[str, Any]] = []
    for f in result_files(paths):
        with open(f, "rb") as fh:
            first = fh.readline()
        if not first.strip():
            raise ResultsFormatError(f, 1, "empty file: no run header (is this a kbench results file?)")
        try:
            obj = parse_line(first)
        except ValueError as exc:
            raise ResultsFormatError(f, 1, f"not valid JSON ({exc})") from None
        if not isinstance(obj, dict) or obj.get("kind") != "run":
            raise ResultsFormatError(f, 1, "missing run header: the first record must have \"kind\": \"run\"")
        try:
            validate_record(obj)
        except RecordError as exc:
            raise ResultsFormatError(f, 1, str(exc)) from None
        headers.append({**obj, "source": str(f)})
    return headers
