"""Constructors of the result records and the one case-id format.

Every record kbench writes starts here: ``case_record`` for a case (a result, or a failure to get
one), ``peak_record`` for a measured peak; the run header is ``collect_provenance``
(kbench.results.provenance). The RunWriter then fills in what a run knows (run id, time, device
columns, backend, implementation) and validates the record against the schema (schema.py).

Plain data, no kbench imports beyond this package: every layer may build a record or a case id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

#: implementation a record's numbers come from, for runs written before the field existed:
#: derived from the run's backend (kbench's own kernels run on the "vulkan" backend)
IMPLEMENTATION_OF_BACKEND = {"vulkan": "kbench", "numpy": "numpy", "torch-cuda": "torch-cuda"}


def make_case_id(case: str, params: Mapping[str, Any]) -> str:
    """Stable id such as ``softmax[size=4096,dtype=f32]``: parameters in declaration order,
    integral floats as integers, sequences joined with ``x`` (``shape=64x32``)."""
    if not params:
        return case
    parts = ",".join(f"{key}={_param_text(value)}" for key, value in params.items())
    return f"{case}[{parts}]"


def _param_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "x".join(_param_text(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class CaseId(NamedTuple):
    """A case id taken apart: the case name and each parameter's text."""

    name: str
    params: dict[str, str]


def parse_case_id(case_id: str) -> CaseId:
    """``"softmax[size=4096,dtype=f32]"`` -> ``CaseId("softmax", {"size": "4096", "dtype": "f32"})``;
    an id without brackets (``"peak.h2d"``) has no parameters."""
    name, bracket, rest = str(case_id).partition("[")
    params: dict[str, str] = {}
    if bracket:
        for part in rest.removesuffix("]").split(","):
            key, _, value = part.partition("=")
            if key:
                params[key] = value
    return CaseId(name, params)


def case_name(case_id: str) -> str:
    """The case name of an id: ``"softmax[size=4096]"`` -> ``"softmax"``."""
    return parse_case_id(case_id).name


def case_record(case: str, params: Mapping[str, Any] | None = None, *, mode: str, status: str = "error",
                reason: str = "", case_id: str | None = None, **fields: Any) -> dict[str, Any]:
    """A ``"kind": "case"`` record. ``case_id`` defaults to ``make_case_id(case, params)``;
    ``fields`` are the other schema fields (``queue_config``, ``queues``, ``layer``, timings...)."""
    params = dict(params or {})
    return {"kind": "case", "case": case, "params": params,
            "case_id": case_id if case_id is not None else make_case_id(case, params),
            "mode": mode, "status": status, "reason": reason, **fields}


def case_error(case_id: str, mode: str, reason: str, status: str = "error", **fields: Any) -> dict[str, Any]:
    """A case record for an id that got no result of its own (timed out, crashed, unknown,
    unavailable): the name comes from the id; ``fields`` may give ``params`` and others."""
    params = fields.pop("params", None)
    return case_record(case_name(case_id), params, mode=mode, status=status, reason=reason,
                       case_id=case_id, **fields)


#: where a case's wall time goes, in the order a case runs: the phases a record's ``phases_s`` may
#: name (seconds each; ``wall_s`` is the whole case, so the phases sum to at most it)
PHASES: dict[str, str] = {
    "inputs": "inputs generated on the host",
    "setup": "buffers allocated and the inputs uploaded",
    "run": "the checked call issued and its outputs read back",
    "reference": "the float64 reference computed",
    "check": "outputs compared with the reference",
    "warmup": "warm-up and calibration calls (host clock)",
    "settle": "samples until two agree and the clock is up (host clock)",
    "host_samples": "timed samples on the host clock",
    "gpu_timing": "GPU-timed samples: recording, warm-up on the recording, samples",
    "peer_eager": "the peer's eager timing (calls issued from Python)",
    "peer_graph": "the peer's CUDA graph: capture, warm-up, replays",
    "teardown": "buffers released",
}


def phase_fields(wall_s: float, phases: Mapping[str, float]) -> dict[str, Any]:
    """The ``wall_s`` and ``phases_s`` fields of a record: seconds rounded to the millisecond's
    tenth, phases in PHASES order; ValueError for a phase PHASES does not name."""
    unknown = [name for name in phases if name not in PHASES]
    if unknown:
        raise ValueError(f"unknown phase(s) {', '.join(unknown)}; phases: {', '.join(PHASES)}")
    return {"wall_s": round(float(wall_s), 4),
            "phases_s": {name: round(float(phases[name]), 4) for name in PHASES if name in phases}}


def peak_record(peak: str, value: float, unit: str, **fields: Any) -> dict[str, Any]:
    """A ``"kind": "peak"`` record: ``peak`` is a ``peak.*`` name, ``fields`` e.g. ``gpu_ns``, ``params``."""
    return {"kind": "peak", "peak": peak, "value": value, "unit": unit, **fields}


def implementation_of(record: Mapping[str, Any]) -> str:
    """Whose kernels a record measured: its ``implementation`` field, or for records written
    before that field, the one its ``backend`` stands for ("kbench" for "vulkan")."""
    given = record.get("implementation")
    if isinstance(given, str) and given:
        return given
    backend = str(record.get("backend") or "")
    return IMPLEMENTATION_OF_BACKEND.get(backend, backend)
