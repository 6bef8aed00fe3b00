"""kbench's own peak measurements (as vkpeak and clpeak measure them), the denominators of
every benchmark's "fraction of peak".

- ``peak.copy_bandwidth``: a vec4 copy shader between two buffers far larger than any GPU's
  last-level cache; GB/s = 2 * bytes / GPU time (read + write).
- ``peak.fp32_fma`` / ``peak.fp16_fma``: eight independent FMA chains per invocation;
  GFLOP/s = 2 * FMAs / GPU time. fp16 needs shaderFloat16.
- ``peak.dispatch_latency``: submit-and-wait round trip of a one-invocation dispatch, host clock.
- ``peak.h2d`` / ``peak.d2h``: OpTensorSyncDevice / OpTensorSyncLocal of a large device tensor
  (what a Kompute program pays to move data), host clock.

GPU times come from the runtime's sequence timestamps: one sequence records `repeats` dispatches
(the runtime puts a barrier between dependent ones) and each dispatch's time is the difference
of consecutive timestamps; the figure is the median over dispatches.
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


def _copy_bandwidth(kp: Any, mgr: Any, props: dict) -> dict:
    limit = int(props.get("max_storage_buffer_range") or 256 * MiB)
    memory = int(props.get("device_local_bytes") or 0) or 8 * 256 * MiB
    nbytes = min(32 * MiB if _is_cpu(props) else 256 * MiB, limit, memory // 8)
    nbytes -= nbytes % 16
    n4 = nbytes // 16
    local = _local_size(props)
    groups = min(-(-n4 // local), int(props.get("max_work_group_count", [65535])[0]), 65535)
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
    return {"value": 2 * nbytes / s["median"], "gpu_ns": s, "bytes": 2 * nbytes,
            "params": {"buffer_bytes": nbytes, "local_size": local, "groups": groups}}


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
        return {"value": flops / s["median"], "gpu_ns": s, "flops": flops,
                "params": {"invocations": groups * local, "iters": iters, "local_size": local}}
    return measure


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
        nbytes = 32 * MiB if _is_cpu(props) else 256 * MiB
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
        return {"value": nbytes / s["median"], "host_ns": s, "bytes": nbytes, "params": {"bytes": nbytes}}
    return measure


PEAKS: tuple[Peak, ...] = (
    Peak("peak.copy_bandwidth", "GB/s", "device memory copy bandwidth (read + write)", _copy_bandwidth),
    Peak("peak.fp32_fma", "GFLOP/s", "fp32 FMA throughput", _fma("peak_fma_fp32")),
    Peak("peak.fp16_fma", "GFLOP/s", "fp16 FMA throughput", _fma("peak_fma_fp16"), features=("float16",)),
    Peak("peak.dispatch_latency", "ns", "tiny dispatch submit-and-wait round trip", _dispatch_latency),
    Peak("peak.h2d", "GB/s", "host-to-device transfer (OpTensorSyncDevice)", _transfer("h2d")),
    Peak("peak.d2h", "GB/s", "device-to-host transfer (OpTensorSyncLocal)", _transfer("d2h")),
)

#: which peak a case's `peak` field refers to, and which figure of the case is divided by it
PEAK_OF_CASE = {
    "copy_bandwidth": ("peak.copy_bandwidth", "gbps"),
    "fp32_fma": ("peak.fp32_fma", "gflops"),
    "fp16_fma": ("peak.fp16_fma", "gflops"),
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
