"""The kbench result schema (version 1): record kinds, required fields, value checks.

results/SCHEMA.md documents every field; this module is the executable form of that document.
A record is a plain dict that survives ``json.dumps``; the store writes one per line.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1

KINDS = ("run", "case", "peak")
STATUSES = ("pass", "fail", "unsupported", "error", "xfail")
MODES = ("validate", "bench")
KNOWN_BACKENDS = ("vulkan", "numpy", "torch-cuda")

# The identity columns copied into every case/peak record so a record is readable on its own.
DEVICE_COLUMNS = ("device_name", "vendor_name", "driver_name", "driver_version", "api_version")

# Full device identity kept in the run header.
DEVICE_IDENTITY_FIELDS = (
    "vendor_id", "vendor_name", "device_id", "device_name", "device_type",
    "driver_name", "driver_version", "driver_info", "api_version", "icd_file",
)

RUN_REQUIRED = {
    "schema_version": int, "kind": str, "run_id": str, "started": str,
    "kbench_version": str, "git_revision": str, "host": str, "os": str, "python": str,
    "packages": dict, "backend": str, "device": dict, "device_key": str,
}

_RECORD_COMMON = {
    "schema_version": int, "kind": str, "run_id": str, "time": str,
    "device_name": str, "vendor_name": str, "driver_name": str, "driver_version": str,
    "api_version": str, "device_key": str, "backend": str,
}

CASE_REQUIRED = {
    **_RECORD_COMMON,
    "queue_config": str, "queues": list, "case": str, "params": dict, "case_id": str,
    "mode": str, "status": str, "reason": str,
}

PEAK_REQUIRED = {**_RECORD_COMMON, "peak": str, "value": (int, float), "unit": str}

REQUIRED_BY_KIND = {"run": RUN_REQUIRED, "case": CASE_REQUIRED, "peak": PEAK_REQUIRED}

# Optional fields with a fixed type when present (None is always allowed: "not measured").
CASE_OPTIONAL = {
    "metric": dict, "gpu_ns": dict, "host_ns": dict, "bytes": (int, float),
    "flops": (int, float), "gbps": (int, float), "gflops": (int, float),
    "peak_fraction": (int, float), "peak_name": str, "clocks": (dict, str),
    "implementation": str, "wall_s": (int, float), "phases_s": dict,
}

#: whose kernels the numbers are ("kbench", "numpy", "torch-cuda", a foreign set such as
#: "yule@1ef0762"); optional in every kind: records written before it existed derive it from
#: ``backend`` (kbench.results.records.implementation_of)
PEAK_OPTIONAL = {"implementation": str, "wall_s": (int, float)}
RUN_OPTIONAL = {"implementation": str}
OPTIONAL_BY_KIND = {"run": RUN_OPTIONAL, "case": CASE_OPTIONAL, "peak": PEAK_OPTIONAL}

TIMING_KEYS = ("median", "min", "max", "mean", "stdev", "iqr", "n", "repeats")
# a measured time of 0, a negative one or NaN is a broken timer, never a result
_POSITIVE_TIMES = ("median",)
_NONNEGATIVE = ("min", "max", "mean", "stdev", "iqr", "n", "repeats")

# Units of the measured peaks kbench knows; other "peak.*" names carry their unit in the record.
PEAK_UNITS = {
    "peak.copy_bandwidth": "GB/s",
    "peak.h2d": "GB/s",
    "peak.d2h": "GB/s",
    "peak.fp32_fma": "GFLOP/s",
    "peak.fp16_fma": "GFLOP/s",
    "peak.buffer_copy": "GB/s",
    "peak.coopmat_fp16": "GFLOP/s",
    "peak.int8_dot": "GOP/s",  # integer multiplies and adds; a case's "gflops" counts them the same way
    "peak.dispatch_latency": "ns",
}


class RecordError(ValueError):
    """A record does not follow the schema; the message names the field and what is wrong."""


def _type_name(expected: type | tuple[type, ...]) -> str:
    if isinstance(expected, tuple):
        return " or ".join(t.__name__ for t in expected)
    return expected.__name__


def _is_instance(value: Any, expected: type | tuple[type, ...]) -> bool:
    # bool is an int subclass, but a bool where a count or a size belongs is a bug upstream.
    if isinstance(value, bool):
        exp = expected if isinstance(expected, tuple) else (expected,)
        return bool in exp
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        # non-finite floats are stored as these strings (strict JSON has no NaN)
        exp = expected if isinstance(expected, tuple) else (expected,)
        return float in exp or str in exp
    return isinstance(value, expected)


#: deepest nesting of objects and arrays a record may have (kbench's own reach 4)
MAX_DEPTH = 32
#: integers beyond 64 bits are no count, size or id kbench writes (and do not convert to float)
MAX_INT = 2**64


def _check_structure(record: Mapping[str, Any]) -> None:
    """Nesting depth and integer sizes, without recursion (a hostile file may nest thousands deep)."""
    stack: list[tuple[Any, int, str]] = [(record, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, Mapping) or isinstance(value, (list, tuple)):
            if depth >= MAX_DEPTH:
                raise RecordError(f"field {where.lstrip('.') or 'record'!r} is nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            stack.extend((v, depth + 1, f"{where}.{k}") for k, v in items)
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INT:
            digits = len(str(abs(value))) if abs(value) < 10**4000 else "thousands of"
            raise RecordError(f"field {where.lstrip('.')!r} holds an integer of {digits} digits (at most 64 bits)")


def validate_record(record: Mapping[str, Any]) -> None:
    """Raise RecordError naming the first field of ``record`` that breaks schema version 1."""
    if not isinstance(record, Mapping):
        raise RecordError(f"a record must be a JSON object, got {type(record).__name__}")
    _check_structure(record)
    kind = record.get("kind")
    if kind not in KINDS:
        raise RecordError(f"field 'kind' must be one of {list(KINDS)}, got {kind!r}")
    version = record.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise RecordError(f"field 'schema_version' must be an integer, got {version!r}")
    if version != SCHEMA_VERSION:
        raise RecordError(
            f"unknown schema_version {version} (this kbench reads version {SCHEMA_VERSION})")
    required = REQUIRED_BY_KIND[kind]
    # wrong values first: a bad field often explains why another one could not be derived
    for name, expected in required.items():
        if name not in record:
            continue
        value = record[name]
        if not _is_instance(value, expected):
            raise RecordError(
                f"{kind} record field {name!r} must be {_type_name(expected)}, "
                f"got {type(value).__name__} {value!r}")
    if kind == "case":
        for name, allowed in (("status", STATUSES), ("mode", MODES)):
            if name in record and record[name] not in allowed:
                raise RecordError(f"case field {name!r} must be one of {list(allowed)}, got {record[name]!r}")
    missing = [name for name in required if name not in record]
    if missing:
        raise RecordError(f"{kind} record is missing required field(s): {', '.join(missing)}")
    for name, expected in OPTIONAL_BY_KIND[kind].items():
        value = record.get(name)
        if value is not None and not _is_instance(value, expected):
            raise RecordError(
                f"{kind} field {name!r} must be {_type_name(expected)} or null, "
                f"got {type(value).__name__} {value!r}")
    if kind == "case":
        _validate_case(record)
    elif kind == "peak":
        if not record["peak"].startswith("peak."):
            raise RecordError(f"peak record field 'peak' must start with 'peak.', got {record['peak']!r}")


def _validate_case(record: Mapping[str, Any]) -> None:
    if record["status"] != "pass" and not record["reason"].strip():
        raise RecordError(f"case field 'reason' must say why the status is {record['status']!r}")
    for pos, q in enumerate(record["queues"]):
        if (not isinstance(q, (list, tuple)) or len(q) != 2
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in q)):
            raise RecordError(f"case field 'queues'[{pos}] must be [family, index] integers, got {q!r}")
    for timer in ("gpu_ns", "host_ns"):
        timing = record.get(timer)
        if timing is None:
            continue
        for key in TIMING_KEYS:
            value = timing.get(key)
            if value is not None and not _is_instance(value, (int, float)):
                raise RecordError(f"case field '{timer}.{key}' must be a number, got {value!r}")
            if key in _POSITIVE_TIMES and value is not None and not (
                    isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise RecordError(f"case field '{timer}.{key}' must be a finite time > 0 ns, got {value!r}")
            if key in _NONNEGATIVE and isinstance(value, (int, float)) and not value >= 0:
                raise RecordError(f"case field '{timer}.{key}' must be >= 0, got {value!r}")
        if "median" not in timing:
            raise RecordError(f"case field '{timer}' has no 'median'")
    phases = record.get("phases_s")
    if phases is not None:
        for name, value in phases.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise RecordError(f"case field 'phases_s.{name}' must be seconds >= 0, got {value!r}")
    if record["mode"] == "bench" and record["status"] == "pass":
        if record.get("gpu_ns") is None and record.get("host_ns") is None:
            raise RecordError("a passing bench record needs 'gpu_ns' or 'host_ns' timings")


def slug(text: str, max_len: int = 32) -> str:
    """Lower-case ``[a-z0-9-]`` form of ``text`` for file names and keys."""
    out = re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")
    return out[:max_len].strip("-") or "unknown"


def make_device_key(identity: Mapping[str, Any]) -> str:
    """Short stable key for one device + driver: readable name slug plus a 6-hex digest.

    Two drivers (or driver versions) for the same GPU get different keys, so results of a
    driver update are never silently merged.
    """
    parts = [str(identity.get(k, "")) for k in
             ("vendor_id", "device_id", "device_name", "driver_name", "driver_version")]
    digest = hashlib.sha1("|".join(parts).encode()).hexdigest()[:6]
    return f"{slug(identity.get('device_name', 'device'), 24)}-{digest}"


def to_json_value(value: Any) -> Any:
    """Plain-JSON copy of ``value``: NumPy scalars/arrays to Python, tuples to lists, and
    NaN/inf floats to the strings "NaN"/"Infinity"/"-Infinity" (strict JSON has no NaN)."""
    if hasattr(value, "tolist") and type(value).__module__ == "numpy":
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise RecordError(f"value {value!r} of type {type(value).__name__} cannot be stored as JSON")


_JSON_TYPES = {int: "integer", float: "number", str: "string", dict: "object", list: "array",
               bool: "boolean"}
_NONFINITE_TEXT = ["NaN", "Infinity", "-Infinity"]


def _json_type(expected: type | tuple[type, ...], nullable: bool = False) -> dict[str, Any]:
    kinds = expected if isinstance(expected, tuple) else (expected,)
    names = list(dict.fromkeys(_JSON_TYPES[k] for k in kinds))
    if "number" in names and "integer" in names:
        names.remove("integer")
    options: list[dict[str, Any]] = [{"type": n} for n in names]
    if "number" in names:
        options.append({"enum": _NONFINITE_TEXT})
    if nullable:
        options.append({"type": "null"})
    return options[0] if len(options) == 1 else {"anyOf": options}


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of one line of a results file, derived from the tables above;
    shipped as kbench/results/schema.json (``python -m kbench.results`` rewrites it) for
    tools outside Python."""
    timing = {"type": "object", "required": ["median"],
              "properties": {k: _json_type((int, float)) for k in TIMING_KEYS}}
    timing["properties"].update({k: {"type": "number", "exclusiveMinimum": 0} for k in _POSITIVE_TIMES})

    def kind_schema(kind: str, required: dict, optional: dict | None = None) -> dict[str, Any]:
        props = {name: _json_type(t) for name, t in required.items()}
        props["kind"] = {"const": kind}
        props["schema_version"] = {"const": SCHEMA_VERSION}
        for name, t in (optional or {}).items():
            props[name] = _json_type(t, nullable=True)
        return {"type": "object", "required": list(required), "properties": props}

    case = kind_schema("case", CASE_REQUIRED, CASE_OPTIONAL)
    case["properties"].update({
        "status": {"enum": list(STATUSES)}, "mode": {"enum": list(MODES)},
        "queues": {"type": "array", "items": {"type": "array", "items": {"type": "integer"},
                                              "minItems": 2, "maxItems": 2}},
        "gpu_ns": {"anyOf": [timing, {"type": "null"}]},
        "host_ns": {"anyOf": [timing, {"type": "null"}]},
    })
    peak = kind_schema("peak", PEAK_REQUIRED, PEAK_OPTIONAL)
    peak["properties"]["peak"] = {"type": "string", "pattern": "^peak\\."}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://kbench.invalid/results/schema-v{SCHEMA_VERSION}.json",
        "title": f"kbench result record, schema version {SCHEMA_VERSION} (one line of a .jsonl file)",
        "oneOf": [kind_schema("run", RUN_REQUIRED, RUN_OPTIONAL), case, peak],
    }

