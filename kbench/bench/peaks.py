"""kbench's own peak measurements (as vkpeak and clpeak measure them), the denominators of
every benchmark's "fraction of peak".

- ``peak.copy_bandwidth``: a vec4 copy shader between two buffers far larger than any GPU's
  last-level cache; GB/s = 2 * bytes / GPU time (read + write).
- ``peak.buffer_copy``: vkCmdCopyBuffer (OpTensorCopy) between two such buffers, the copy that
  kp_copy, copy_buffer and copy_buffer_offset time: on a GPU a copy engine or the driver's
  copy kernel, on a CPU driver a memcpy (many times a shader copy's speed on llvmpipe).
- ``peak.fp32_fma`` / ``peak.fp16_fma``: eight independent FMA chains per invocation;
  GFLOP/s = 2 * FMAs / GPU time. fp16 needs shaderFloat16.
- ``peak.coopmat_fp16``: cooperative-matrix multiply-adds (fp16 A, B; fp32 accumulators) on
  register tiles, the path of matmul_f16 (VK_KHR_cooperative_matrix).
- ``peak.int8_dot``: packed 4x8-bit dot products (SPV_KHR_integer_dot_product), the instruction
  of the quantized_matmul *.dot.* kernels; GOP/s counting a multiply and an add per byte pair.
- ``peak.dispatch_latency``: submit-and-wait round trip of a one-invocation dispatch, host clock.
- ``peak.h2d`` / ``peak.d2h``: OpTensorSyncDevice / OpTensorSyncLocal of a large device tensor
  (what a Kompute program pays to move data), host clock.

GPU times come from the runtime's sequence timestamps: one sequence records `repeats` dispatches
(the runtime puts a barrier between dependent ones) and each dispatch's time is the difference
of consecutive timestamps. A peak's value comes from the fastest dispatch (what the device can
do; on a shared machine the others only wait longer), the record keeps all their statistics.

On CPU drivers the buffers are 4 MiB: the cases there stop at 16 MiB (`--max-bytes`), so they
run in the caches, and a peak taken from main memory would be exceeded many times over.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kbench.shaders import load_spirv
from kbench.results.records import case_record, peak_record

from .timing import stats

MiB = 1 << 20


@dataclass(frozen=True)
class Peak:
    name: str          # "peak.copy_bandwidth"
    unit: str          # "GB/s", "GFLOP/s", "ns"
    description: str
    measure: Callable[[Any, Any, dict], dict]   # (kp, manager, props) -> result dict
    features: tuple[str, ...] = ()


def _is_cpu(props: dict) -> bool:
    return str(props.get("device_type", "")).lower() == "cpu"


def _local_size(props: dict) -> int:
    return int(min(256, props.get("max_work_group_invocations", 256) or 256))


def _timed_dispatches(kp: Any, mgr: Any, algo: Any, repeats: int) -> list[float]:
    """GPU ns of each of `repeats` dispatches of `algo` recorded in one sequence."""
    seq = mgr.sequence(0, repeats + 1)
    try:
        for _ in range(repeats):
            seq.record(kp.OpAlgoDispatch(algo))
        seq.eval()  # warm-up submission (pipeline, caches, clocks)
        seq.eval()
        ts = seq.get_timestamps()
    finally:
        seq.destroy()
    if len(ts) < 2:
        raise RuntimeError("the device returned no timestamps")
    return [float(b - a) for a, b in zip(ts, ts[1:])]


def _copy_bytes(props: dict) -> int:
    limit = int(props.get("max_storage_buffer_range") or 256 * MiB)
    memory = int(props.get("device_local_bytes") or 0) or 8 * 256 * MiB
    nbytes = min(4 * MiB if _is_cpu(props) else 256 * MiB, limit, memory // 8)
    return nbytes - nbytes % 16


def _fastest(times: list[float]) -> float:
    return min(t for t in times if t > 0)


def _copy_bandwidth(kp: Any, mgr: Any, props: dict) -> dict:
    nbytes = _copy_bytes(props)
    n4 = nbytes // 16
    local = _local_size(props)
    # a CPU driver runs invocations one SIMD batch at a time: a few long grid-stride loops cost
    # it far less than one invocation per vec4
    cap = 64 if _is_cpu(props) else 65535
    groups = min(-(-n4 // local), int(props.get("max_work_group_count", [65535])[0]), cap)
    src, dst = mgr.buffer(nbytes), mgr.buffer(nbytes)
    try:
        algo = mgr.algorithm([src, dst], load_spirv("peak_copy"), (groups, 1, 1), np.array([local], dtype=np.uint32),
                             np.array([n4], dtype=np.uint32))
        times = _timed_dispatches(kp, mgr, algo, 5 if _is_cpu(props) else 20)
        algo.destroy()
    finally:
        src.destroy()
        dst.destroy()
    s = stats(times, 1)
    return {"value": 2 * nbytes / _fastest(times), "gpu_ns": s, "bytes": 2 * nbytes,
            "params": {"buffer_bytes": nbytes, "local_size": local, "groups": groups}}


def _buffer_copy(kp: Any, mgr: Any, props: dict) -> dict:
    nbytes = _copy_bytes(props)
    src, dst = mgr.buffer(nbytes), mgr.buffer(nbytes)
    repeats = 5 if _is_cpu(props) else 20
    seq = mgr.sequence(0, repeats + 1)
    try:
        for _ in range(repeats):
            seq.record(kp.OpTensorCopy([src, dst]))
        seq.eval()  # warm-up submission
        seq.eval()
        ts = seq.get_timestamps()
    finally:
        seq.destroy()
        src.destroy()
        dst.destroy()
    times = [float(b - a) for a, b in zip(ts, ts[1:])]
    if not times:
        raise RuntimeError("the device returned no timestamps")
    return {"value": 2 * nbytes / _fastest(times), "gpu_ns": stats(times, 1), "bytes": 2 * nbytes,
            "params": {"buffer_bytes": nbytes}}


def _fma(shader: str):
    def measure(kp: Any, mgr: Any, props: dict) -> dict:
        cpu = _is_cpu(props)
        local = _local_size(props)
        invocations = (1 << 14) if cpu else (1 << 22)
        iters = 64 if cpu else 1024
        groups = invocations // local
        out = mgr.buffer(4 * groups * local)
        try:
            algo = mgr.algorithm([out], load_spirv(shader), (groups, 1, 1), np.array([local], dtype=np.uint32),
                                 np.array([iters], dtype=np.uint32))
            times = _timed_dispatches(kp, mgr, algo, 3 if cpu else 10)
            algo.destroy()
        finally:
            out.destroy()
        s = stats(times, 1)
        flops = groups * local * iters * 64
        return {"value": flops / _fastest(times), "gpu_ns": s, "flops": flops,
                "params": {"invocations": groups * local, "iters": iters, "local_size": local}}
    return measure


def coopmat_shape(props: dict) -> tuple[int, int, int] | None:
    """The M, N, K of the device's fp16 x fp16 -> fp32 subgroup cooperative matrix (16x16x16
    where offered, as matmul_f16 uses), or None."""
    shapes = [(int(p["M"]), int(p["N"]), int(p["K"])) for p in props.get("cooperative_matrix_properties") or []
              if str(p.get("a")).lower() in ("float16", "f16") and str(p.get("b")).lower() in ("float16", "f16")
              and str(p.get("c")).lower() in ("float32", "f32") and str(p.get("result")).lower() in ("float32", "f32")
              and int(p.get("scope", 3)) == 3]
    if not shapes:
        return None
    return (16, 16, 16) if (16, 16, 16) in shapes else shapes[0]


def _coopmat_fp16(kp: Any, mgr: Any, props: dict) -> dict:
    shape = coopmat_shape(props)
    if shape is None:
        raise kp.UnsupportedFeatureError("no fp16 x fp16 -> fp32 subgroup cooperative-matrix configuration")
    m, n, k = shape
    sub = int(props.get("subgroup_size") or 32)
    local = max(sub, min(4 * sub, _local_size(props)))
    subgroups = local // sub
    groups, iters = 8192, 512
    out = mgr.buffer(4 * m * n * groups * subgroups)
    try:
        algo = mgr.algorithm([out], load_spirv("peak_coopmat_fp16"), (groups, 1, 1),
                             np.array([local, m, n, k], dtype=np.uint32), np.array([iters], dtype=np.uint32))
        times = _timed_dispatches(kp, mgr, algo, 10)
        algo.destroy()
    finally:
        out.destroy()
    flops = groups * subgroups * iters * 4 * 2 * m * n * k
    return {"value": flops / _fastest(times), "gpu_ns": stats(times, 1), "flops": flops,
            "params": {"M": m, "N": n, "K": k, "subgroups": groups * subgroups, "iters": iters, "local_size": local}}


def _dispatch_latency(kp: Any, mgr: Any, props: dict) -> dict:
    out = mgr.buffer(16)
    seq = None
    try:
        algo = mgr.algorithm([out], load_spirv("peak_noop"), (1, 1, 1))
        seq = mgr.sequence(0)
        seq.record(kp.OpAlgoDispatch(algo))
        for _ in range(5):
            seq.eval()
        samples = []
        for _ in range(50 if _is_cpu(props) else 300):
            t0 = time.perf_counter_ns()
            seq.eval()
            samples.append(float(time.perf_counter_ns() - t0))
    finally:
        if seq is not None:
            seq.destroy()
        out.destroy()
    s = stats(samples, 1)
    return {"value": s["median"], "host_ns": s, "params": {}}


def _transfer(direction: str):
    def measure(kp: Any, mgr: Any, props: dict) -> dict:
        nbytes = 4 * MiB if _is_cpu(props) else 256 * MiB  # as the copies: see the module doc
        t = mgr.tensor_t(np.ones(nbytes // 4, dtype=np.float32), kp.TensorTypes.device)
        op = kp.OpTensorSyncDevice([t]) if direction == "h2d" else kp.OpTensorSyncLocal([t])
        seq = mgr.sequence(0)
        try:
            seq.record(op)
            seq.eval()
            samples = []
            for _ in range(3 if _is_cpu(props) else 10):
                t0 = time.perf_counter_ns()
                seq.eval()
                samples.append(float(time.perf_counter_ns() - t0))
        finally:
            seq.destroy()
            t.destroy()
        s = stats(samples, 1)
        return {"value": nbytes / _fastest(samples), "host_ns": s, "bytes": nbytes, "params": {"bytes": nbytes}}
    return measure


PEAKS: tuple[Peak, ...] = (
    Peak("peak.copy_bandwidth", "GB/s", "device memory copy bandwidth (read + write)", _copy_bandwidth),
    Peak("peak.buffer_copy", "GB/s", "vkCmdCopyBuffer bandwidth (read + write)", _buffer_copy),
    Peak("peak.fp32_fma", "GFLOP/s", "fp32 FMA throughput", _fma("peak_fma_fp32")),
    Peak("peak.fp16_fma", "GFLOP/s", "fp16 FMA throughput", _fma("peak_fma_fp16"), features=("float16",)),
    Peak("peak.coopmat_fp16", "GFLOP/s", "cooperative-matrix fp16 multiply-add throughput (fp32 accumulation)",
         _coopmat_fp16, features=("cooperative_matrix", "float16")),
    Peak("peak.int8_dot", "GOP/s", "packed int8 dot-product throughput", _fma("peak_int8_dot"),
         features=("integer_dot_product",)),
    Peak("peak.dispatch_latency", "ns", "tiny dispatch submit-and-wait round trip", _dispatch_latency),
    Peak("peak.h2d", "GB/s", "host-to-device transfer (OpTensorSyncDevice)", _transfer("h2d")),
    Peak("peak.d2h", "GB/s", "device-to-host transfer (OpTensorSyncLocal)", _transfer("d2h")),
)

#: which peak a case's `peak` field refers to, and which figure of the case is divided by it
PEAK_OF_CASE = {
    "copy_bandwidth": ("peak.copy_bandwidth", "gbps"),
    "fp32_fma": ("peak.fp32_fma", "gflops"),
    "fp16_fma": ("peak.fp16_fma", "gflops"),
    "buffer_copy": ("peak.buffer_copy", "gbps"),
    "coopmat_fp16": ("peak.coopmat_fp16", "gflops"),
    "int8_dot": ("peak.int8_dot", "gflops"),
    # transfer peaks are host-clock figures (what a program waits for), so the case's host-clock
    # GB/s is divided by them, not its GPU-timestamp GB/s
    "h2d": ("peak.h2d", "host_gbps"),
    "d2h": ("peak.d2h", "host_gbps"),
}


def get_peak(name: str) -> Peak:
    for p in PEAKS:
        if p.name == name:
            return p
    raise ValueError(f"unknown peak {name!r}; known: {', '.join(p.name for p in PEAKS)}")


def run_peak(peak: Peak, kp: Any, mgr: Any, props: dict) -> dict[str, Any]:
    """A "peak" record for the store, or a case record with status unsupported/error."""
    features = dict(props.get("features") or {})
    missing = [f for f in peak.features if not features.get(f)]
    if missing:
        return peak_failure(peak.name, "unsupported", f"missing device feature: {', '.join(missing)}")
    return measure_peak(peak, lambda: peak.measure(kp, mgr, props))


def peak_failure(name: str, status: str, reason: str) -> dict[str, Any]:
    """The case record of a peak that could not be measured (status "unsupported" or "error")."""
    return case_record(name, mode="bench", status=status, reason=reason, layer="peak")


def measure_peak(peak: Peak, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``measure()`` (a result dict: value, timings, params) into a peak record, or a failed
    peak's case record naming the exception; the run goes on either way."""
    try:
        result = measure()
    except Exception as exc:  # noqa: BLE001 - a failed peak is recorded, the run goes on
        status = "unsupported" if type(exc).__name__ == "UnsupportedFeatureError" else "error"
        return peak_failure(peak.name, status, f"{type(exc).__name__}: {exc}")
    return peak_record(peak.name, unit=peak.unit, **result)


def peak_fraction(record: dict[str, Any], case_peak: str | None, peaks: dict[str, float]) -> None:
    """Set record["peak_fraction"] and ["peak_name"] from the measured `peaks` (in place)."""
    if not case_peak or case_peak not in PEAK_OF_CASE:
        return
    name, figure = PEAK_OF_CASE[case_peak]
    if figure == "host_gbps":
        host = record.get("host_ns") or {}
        value = record["bytes"] / host["median"] if record.get("bytes") and host.get("median") else None
    else:
        value = record.get(figure)
    peak = peaks.get(name)
    if value and peak:
        record["peak_fraction"] = float(value) / float(peak)
        record["peak_name"] = name
