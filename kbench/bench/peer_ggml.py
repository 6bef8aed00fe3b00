"""The ggml-vulkan peer: ggml's Vulkan backend timed and checked by its own ``test-backend-ops``
on the same device, its figures recorded beside kbench's as implementation ``ggml-vulkan@<commit>``.

kbench runs the binary (built from a pinned ggml commit, see scripts/build-ggml-peer.sh), never
links it: ``perf`` mode over a test file that describes kbench's own bench shapes (so each ggml
row has a kbench case id) and ``test`` mode (ggml's comparison against its CPU backend) for the
same op types. Its output is read in ``--output sql`` form (the one that carries timings). ggml times a run on the host (the
wall time of a graph of many repetitions, divided by them), so its records say ``timer: host``.

What maps onto what (ggml's ops are not always kbench's):

- ``quantized_matmul[n_rows=R,n_cols=C,dtype=T]`` -> ``MUL_MAT`` with ``type_a=T``, m=R, k=C, n=1; only the
  instances that re-read one matrix (no ``rotate_mib``, or ``rotate_mib=0``: ``bench --full`` has them at the
  model shapes), as ggml's perf mode does: kbench's rotated instances stream their weights past the L2 cache;
- ``add`` / ``element_mul`` -> ``ADD`` / ``MUL`` of two f32 vectors;
- ``rms_norm`` -> ``RMS_NORM`` (ggml's op has no weight multiply: it moves 8 bytes per element,
  kbench's 12; the record's ``bytes`` is ggml's);
- ``softmax`` -> ``SOFT_MAX`` of one row with scale 1;
- ``matmul_f16`` / ``matmul_bf16`` [m, n, k] -> ``MUL_MAT`` with ``type_a`` F16 / BF16 (ggml's src0: m
  rows of k) and an F32 src1 (n rows of k: B transposed, as ggml stores activations), the same 2*m*n*k
  FLOPs; ggml converts src1 to the matrix units' type itself, inside the timed run. kbench's fp32
  ``matmul`` has no ggml counterpart: where a device has matrix cores ggml's F32 ``MUL_MAT`` runs on
  them in fp16 (five times the fp32 rate on the H100: README, performance round 3), not an fp32 product.

A full-feature build (integer-dot, cooperative-matrix, coopmat2 shaders; scripts/build-ggml-peer.sh
with GLSLANG) leaves ``build.json`` beside the binary: the peer then names itself
``ggml-vulkan@<commit>+<features>`` (for example ``+coopmat+coopmat2+intdot+bf16``), so that runs of
the two builds stay apart in results and reports, and its records carry the file as ``peer_build``.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kbench.foreign.formula import f32_bits
from kbench.quant import DType, row_bytes

PEER_NAME = "ggml-vulkan"
#: environment variable naming the binary when --ggml-bin is not given
BIN_ENV = "KBENCH_GGML_BIN"

#: ggml enum values at the pinned commit (include/ggml.h of ggml-org/ggml d99724f2): the test file
#: names ops and types by number
GGML_OP = {"ADD": 2, "MUL": 7, "RMS_NORM": 25, "MUL_MAT": 29, "SOFT_MAX": 46}
GGML_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13,
             "Q6_K": 14, "BF16": 30}
#: the GLSL extensions of a build (build.json's glsl_extensions) that change which shaders ggml
#: runs, and the short names the peer's implementation name gives them
BUILD_FEATURES = {"GL_KHR_cooperative_matrix": "coopmat", "GL_NV_cooperative_matrix2": "coopmat2",
                  "GL_EXT_integer_dot_product": "intdot", "GL_EXT_bfloat16": "bf16"}
#: kbench's matrix products and the ggml type of their first operand
MATMUL_TYPE_A = {"matmul_f16": "F16", "matmul_bf16": "BF16"}
#: ggml op types the test mode checks (kbench's ops that ggml has)
TEST_OPS = ("MUL_MAT", "RMS_NORM", "SOFT_MAX", "ADD", "MUL")
#: the weight types whose MUL_MAT the test mode checks
TEST_TYPES = ("q4_0", "q8_0", "q4_K", "q6_K", "f16")


class PeerUnavailable(RuntimeError):
    """The ggml binary is missing, does not run, or finds no Vulkan device."""


@dataclass(frozen=True)
class GgmlRow:
    """One row of test-backend-ops' output."""

    op_name: str
    op_params: str
    mode: str
    supported: bool
    passed: bool
    time_us: float
    n_runs: int
    memory_kb: float
    bandwidth_gb_s: float
    flops: float
    backend_name: str
    build_commit: str
    error: str = ""

    @property
    def name(self) -> str:
        """The ``name=`` kbench gave the test in its test file (a kbench case id), or ""."""
        for part in _split_params(self.op_params):
            key, _, value = part.partition("=")
            if key == "name":
                return value
        return ""


def _split_params(text: str) -> list[str]:
    """Top-level comma-separated ``key=value`` parts (values may hold bracketed lists)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts


def _bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes")


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


_INSERT = re.compile(r"^INSERT INTO test_backend_ops \(([^)]*)\) VALUES \((.*)\);\s*$")
_SQL_VALUE = re.compile(r"'((?:[^']|'')*)'|(NULL|[-+0-9.eE]+)")


def _sql_values(text: str) -> list[str]:
    values, pos = [], 0
    while pos < len(text):
        m = _SQL_VALUE.match(text, pos)
        if m is None:
            raise ValueError(f"cannot read SQL value at {text[pos:pos + 40]!r}")
        values.append(m.group(1).replace("''", "'") if m.group(1) is not None else m.group(2))
        pos = m.end()
        while pos < len(text) and text[pos] in ", ":
            pos += 1
    return values


def parse_sql(text: str) -> list[GgmlRow]:
    """Rows of ``test-backend-ops --output sql`` (its one format that carries the timings): one
    ``INSERT INTO test_backend_ops (...) VALUES (...);`` line per test; other lines are skipped."""
    rows = []
    for line in text.splitlines():
        m = _INSERT.match(line)
        if m is None:
            continue
        names = [c.strip() for c in m.group(1).split(",")]
        try:
            values = _sql_values(m.group(2))
        except ValueError:
            continue
        if len(values) != len(names):
            continue
        f = dict(zip(names, values))
        rows.append(GgmlRow(
            op_name=f.get("op_name", ""), op_params=f.get("op_params", ""), mode=f.get("test_mode", ""),
            supported=_bool(f.get("supported", "")), passed=_bool(f.get("passed", "")),
            time_us=_float(f.get("time_us", "nan")), n_runs=int(_float(f.get("n_runs", "0")) or 0),
            memory_kb=_float(f.get("memory_kb", "nan")), bandwidth_gb_s=_float(f.get("bandwidth_gb_s", "nan")),
            flops=_float(f.get("flops", "nan")), backend_name=f.get("backend_name", ""),
            build_commit=f.get("build_commit", ""), error=f.get("error_message", "")))
    return rows


# --------------------------------------------------------------------------- the test file

def _f32_bits(x: float) -> int:
    """A float's bits as the signed int32 the test file's op parameters are read into."""
    bits = f32_bits(x)
    return bits - (1 << 32) if bits >= 1 << 31 else bits


def _tensor(type_name: str, ne: tuple[int, int, int, int]) -> str:
    """``type ne0..3 nb0..3`` of a contiguous tensor, as the test file lists a source."""
    dt = DType[type_name]
    nb0 = dt.block_bytes
    nb1 = row_bytes(dt, ne[0])
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return " ".join(str(v) for v in (GGML_TYPE[type_name], *ne, nb0, nb1, nb2, nb3))


def test_line(case: str, params: Mapping[str, Any], case_id: str) -> str | None:
    """One test-file line reproducing kbench case instance ``case_id`` as a ggml op, or None when
    ggml has no matching op."""
    def line(op: str, out: tuple[int, int, int, int], op_params: list[int], *sources: str) -> str:
        return " ".join([str(GGML_OP[op]), str(GGML_TYPE["F32"]), *map(str, out), str(len(op_params)),
                         *map(str, op_params), str(len(sources)), *sources, case_id])

    if case == "quantized_matmul":
        dtype = str(params["dtype"]).upper()
        if dtype not in GGML_TYPE:
            return None
        if int(params.get("rotate_mib", 0)):
            return None   # ggml re-reads one matrix: its rows belong to the rotate_mib=0 instances
        rows, cols, n = int(params["n_rows"]), int(params["n_cols"]), int(params.get("n_vecs", 1))
        return line("MUL_MAT", (rows, n, 1, 1), [], _tensor(dtype, (cols, rows, 1, 1)), _tensor("F32", (cols, n, 1, 1)))
    if case in MATMUL_TYPE_A:
        m, n, k = int(params["m"]), int(params["n"]), int(params["k"])
        return line("MUL_MAT", (m, n, 1, 1), [], _tensor(MATMUL_TYPE_A[case], (k, m, 1, 1)),
                    _tensor("F32", (k, n, 1, 1)))
    if case in ("add", "element_mul") and not params.get("inplace"):
        size = int(params["size"])
        vec = _tensor("F32", (size, 1, 1, 1))
        return line("ADD" if case == "add" else "MUL", (size, 1, 1, 1), [], vec, vec)
    if case == "rms_norm":
        size = int(params["size"])
        return line("RMS_NORM", (size, 1, 1, 1), [_f32_bits(float(params.get("eps", 1e-5)))],
                    _tensor("F32", (size, 1, 1, 1)))
    if case == "softmax" and not params.get("inplace"):
        size = int(params["size"])
        return line("SOFT_MAX", (size, 1, 1, 1), [_f32_bits(1.0), _f32_bits(0.0)], _tensor("F32", (size, 1, 1, 1)))
    return None


def ggml_bytes(case: str, params: Mapping[str, Any], kbench_bytes: int) -> int:
    """Bytes one ggml run of the mapped op moves (differs from kbench's only for rms_norm)."""
    if case == "rms_norm":
        return 8 * int(params["size"])
    return int(kbench_bytes)


# --------------------------------------------------------------------------- running the binary

def find_binary(path: str | os.PathLike | None) -> Path:
    """The test-backend-ops binary: ``path``, else $KBENCH_GGML_BIN, else on PATH."""
    given = path or os.environ.get(BIN_ENV)
    if given:
        p = Path(given)
        if not p.is_file():
            raise PeerUnavailable(f"{PEER_NAME}: no test-backend-ops binary at {p}")
        if not os.access(p, os.X_OK):
            raise PeerUnavailable(f"{PEER_NAME}: {p} is not executable")
        return p
    found = shutil.which("test-backend-ops")
    if found is None:
        raise PeerUnavailable(f"{PEER_NAME}: no test-backend-ops binary (pass --ggml-bin PATH or set {BIN_ENV}; "
                              "scripts/build-ggml-peer.sh builds one)")
    return Path(found)


@dataclass(frozen=True)
class BinaryRun:
    """What one run of the binary gave: its rows, exit status and the end of its stderr."""

    rows: list[GgmlRow]
    returncode: int
    stderr_tail: str

    def failure(self) -> str:
        """"" for a clean exit, else what went wrong (a crash midway still leaves the rows before it)."""
        if self.returncode == 0:
            return ""
        how = f"killed by signal {-self.returncode}" if self.returncode < 0 else f"exited {self.returncode}"
        return f"test-backend-ops {how} after {len(self.rows)} result(s): {self.stderr_tail}"


def run_binary(binary: Path, args: Iterable[str], *, timeout: float, device: int = 0) -> BinaryRun:
    """Run test-backend-ops with ``args`` on Vulkan device ``device`` (the index kbench lists;
    GGML_VK_VISIBLE_DEVICES names it, so a CPU driver such as lavapipe is used too, which ggml
    skips by default). PeerUnavailable when it cannot run at all or printed nothing."""
    cmd = [str(binary), *args, "-b", "Vulkan0", "--output", "sql"]
    env = dict(os.environ, GGML_VK_VISIBLE_DEVICES=str(int(device)))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"{PEER_NAME}: {' '.join(cmd)} did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise PeerUnavailable(f"{PEER_NAME}: cannot run {binary}: {exc}") from None
    rows = parse_sql(proc.stdout)
    tail = " ".join((proc.stderr or "")[-600:].split())
    if not rows and proc.returncode != 0:
        raise PeerUnavailable(f"{PEER_NAME}: {binary.name} exited {proc.returncode}: {tail}")
    return BinaryRun(rows, proc.returncode, tail)


# --------------------------------------------------------------------------- records

#: what every record of the peer says about where it ran
_BASE = {"queue_config": "single", "queues": [], "layer": "backend", "peer": True}


def perf_records(instances: list[Any], rows: list[GgmlRow]) -> list[dict[str, Any]]:
    """One bench record per planned kbench instance from ggml's perf rows (matched by the case id
    kbench gave each test-file line as its name)."""
    from kbench.results.records import case_record

    from .timing import throughput

    by_name = {r.name: r for r in rows if r.mode == "perf"}
    out = []
    for inst in instances:
        row = by_name.get(inst.case_id)
        if row is None or not row.supported or not row.time_us > 0:
            why = "ggml-vulkan does not support it" if row is not None else "ggml printed no result for it"
            out.append(case_record(inst.case.name, inst.params, case_id=inst.case_id, mode="bench",
                                   status="unsupported", reason=why, **_BASE))
            continue
        nbytes = ggml_bytes(inst.case.name, inst.params, inst.bytes_moved)
        ns = row.time_us * 1000.0
        out.append(case_record(
            inst.case.name, inst.params, case_id=inst.case_id, mode="bench", status="pass",
            reason="timed by ggml test-backend-ops perf (host wall time of a graph of repeated runs); "
                   "its correctness is ggml's own test mode", timer="host",
            host_ns={"median": ns, "min": ns, "max": ns, "mean": ns, "stdev": 0.0, "iqr": 0.0, "n": 1,
                     "repeats": max(1, row.n_runs)},
            bytes=nbytes, flops=inst.flops, **throughput(nbytes, inst.flops, ns), **_BASE))
    return out


def test_records(rows: list[GgmlRow]) -> list[dict[str, Any]]:
    """One validate record per ggml test (ggml-vulkan against ggml's CPU backend)."""
    from kbench.results.records import case_record

    out = []
    for r in rows:
        if r.mode != "test":
            continue
        text = r.op_params.replace(",", ";").replace("[", "(").replace("]", ")")
        status = "unsupported" if not r.supported else ("pass" if r.passed else "fail")
        reason = {"pass": "", "unsupported": "ggml-vulkan does not support it",
                  "fail": f"ggml test-backend-ops: FAIL against ggml's CPU backend {r.error}".strip()}[status]
        out.append(case_record("ggml_test", {"op": r.op_name, "test": text}, mode="validate", status=status,
                               reason=reason, **_BASE))
    return out


def _run_error(what: str, run: BinaryRun) -> dict[str, Any]:
    """A run of the binary that ended badly midway: an error record of its own (the rows it
    printed before stand)."""
    from kbench.results.records import case_record

    mode = "bench" if what.startswith("bench") else "validate"
    return case_record("ggml_run", {"run": what.replace(" ", "_")}, mode=mode, status="error", reason=run.failure(),
                       **_BASE)


def build_info(binary: Path) -> dict[str, Any]:
    """build.json beside the binary (scripts/build-ggml-peer.sh writes it), or {} where there is
    none (a build from before it, or one made by hand)."""
    path = Path(binary).parent / "build.json"
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PeerUnavailable(f"{PEER_NAME}: {path} is not readable JSON: {exc}") from None
    if not isinstance(info, dict):
        raise PeerUnavailable(f"{PEER_NAME}: {path} holds {type(info).__name__}, expected an object")
    return info


def peer_name(commit: str, info: Mapping[str, Any]) -> str:
    """``ggml-vulkan@<commit7>``, plus ``+feature`` for each of BUILD_FEATURES the build has."""
    have = set(info.get("glsl_extensions") or ())
    extra = "".join(f"+{short}" for ext, short in BUILD_FEATURES.items() if ext in have)
    return f"{PEER_NAME}@{commit[:7]}{extra}"


def drive(binary: str | None, mode: str, instances: list[Any], props: dict[str, Any] | None,
          timeout: float) -> tuple[str, list[dict[str, Any]]]:
    """Run the binary for ``mode``; (implementation name with ggml's build commit, records)."""
    import tempfile

    exe = find_binary(binary)
    info = build_info(exe)
    device = int((props or {}).get("index", 0))
    if mode == "bench":
        lines = [test_line(i.case.name, i.params, i.case_id) for i in instances]
        with tempfile.NamedTemporaryFile("w", prefix="kbench-ggml-", suffix=".txt", delete=False) as tf:
            tf.write("\n".join(line for line in lines if line) + "\n")
        try:
            run = run_binary(exe, ["perf", "--test-file", tf.name], timeout=max(600.0, timeout), device=device)
        finally:
            os.unlink(tf.name)
        records = perf_records(instances, run.rows)
    else:
        pattern = f"^(?!.*type_a=)|type_a=({'|'.join(TEST_TYPES)}),"
        # one run per op: a crash in one op's tests leaves the other ops' verdicts standing
        runs = [(op, run_binary(exe, ["test", "-o", op, "-p", pattern], timeout=max(3600.0, timeout), device=device))
                for op in TEST_OPS]
        records = [rec for _, r in runs for rec in test_records(r.rows)]
        records += [_run_error(f"{mode} {op}", r) for op, r in runs if r.failure()]
        rows = [row for _, r in runs for row in r.rows]
        commit = next((row.build_commit for row in rows if row.build_commit), "unknown")
        return peer_name(commit, info), records
    if run.failure():
        records.append(_run_error(mode, run))
    commit = next((r.build_commit for r in run.rows if r.build_commit), "unknown")
    return peer_name(commit, info), records


def implementation(binary: str | None = None) -> Any:
    """The registry entry (kbench.bench.implementations): kbench's backend cases that ggml has an
    op for, driven through the binary."""
    from .implementations import Implementation

    def available() -> tuple[bool, str]:
        try:
            find_binary(binary)
        except PeerUnavailable as exc:
            return False, str(exc)
        return True, ""

    def accepts(inst: Any) -> bool:
        return test_line(inst.case.name, inst.params, inst.case_id) is not None

    return Implementation(
        kind="ggml", name=PEER_NAME, backend=PEER_NAME,
        description="ggml's Vulkan backend through its test-backend-ops (perf and test modes)",
        devices=lambda: [], configs=lambda props: [], open=_no_open, accepts=accepts, availability=available,
        peer=True, drive=lambda mode, insts, props, timeout: drive(binary, mode, insts, props, timeout),
        header=lambda: _header(binary), args={"binary": binary} if binary else {})


def _header(binary: str | None) -> dict[str, Any]:
    try:
        info = build_info(find_binary(binary))
    except PeerUnavailable:
        info = {}
    return {"peer_program": "test-backend-ops", **({"peer_build": info} if info else {})}


def _no_open(props: Any, config: Any) -> Any:
    raise RuntimeError("the ggml peer is a program kbench runs, not a device it opens")
