"""Timing: sample statistics and the repeat-until-long-enough loop.

A sample is `repeats` back-to-back calls issued without waiting (one submission where the
backend batches, with the barriers its ordering rules put between dependent calls), then one
wait. The figure per call is the sample's time divided by `repeats`. `repeats` is chosen from a
first measurement so that a sample lasts about `min_sample_s` (tens of milliseconds on a GPU),
which hides launch and submission overhead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TimingPolicy:
    """How long and how often to measure."""

    min_sample_s: float = 0.02     # aim per sample (GPU); CPU devices use less
    samples: int = 7
    #: untimed calls before calibration: none by default, since a case is timed right after
    #: its checked call has run (pipelines built, buffers touched)
    warmup: int = 0
    max_repeats: int = 1000
    max_total_s: float = 5.0       # stop taking samples once this much time went by (>= 3 samples)
    #: warm-up until the device has settled: two consecutive samples within settle_tol of each
    #: other and the device ready (its clock boosted, where it can be read), for at most
    #: settle_max_s seconds (0: no settling, only the `warmup` calls)
    settle_max_s: float = 10.0
    settle_tol: float = 0.03
    #: host-bound work never lifts the clock: after this long (or a third of settle_max_s, the
    #: shorter), two agreeing samples settle without it (a replaying GPU timer then warms the
    #: device on its own recording before its samples)
    settle_host_s: float = 0.5

    def __post_init__(self) -> None:
        if (self.min_sample_s <= 0 or self.samples < 1 or self.max_repeats < 1 or self.warmup < 0
                or self.settle_max_s < 0 or not 0 < self.settle_tol < 1 or self.settle_host_s < 0):
            raise ValueError(f"bad timing policy {self}")


GPU_POLICY = TimingPolicy()
#: lavapipe / CPU drivers: short samples keep the CI bench quick
CPU_POLICY = TimingPolicy(min_sample_s=0.002, samples=3, max_repeats=50, max_total_s=1.0, settle_max_s=0.0)


@dataclass
class GpuSamples:
    """What a target's GPU timer measured: ns per call for each sample, and how.

    ``method`` "replay": the sample's calls were recorded once (a Vulkan command buffer, a CUDA
    graph) and the recording was submitted once per sample, so the device ran them back to back
    whatever the host's issue rate; "stream": each sample issued its calls from Python (the
    device may have waited for the host between calls, at whatever clock that left it)."""

    ns: list[float]
    method: str
    #: host wall ns per call of the same replayed submissions (None for "stream": the host
    #: timer of a stream sample is the case's host_ns)
    wall_ns: list[float] | None = None
    #: where a timer tried two methods and kept the faster: the other one's method and median
    other: dict | None = None
    #: seconds the timer spent per phase, where it splits them (kbench.results.records.PHASES)
    phases: dict | None = None
    #: calls per sample where the timer chose its own (gpu_repeats), else the host calibration's
    repeats: int | None = None


def stats(values_ns: Sequence[float], repeats: int) -> dict[str, float | int]:
    """median, min, max, mean, stdev, iqr of per-call times in ns, with n and repeats."""
    v = np.asarray(values_ns, dtype=np.float64)
    if v.size == 0:
        raise ValueError("no timing samples")
    q1, q3 = np.percentile(v, [25, 75])
    return {
        "median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()),
        "mean": float(v.mean()), "stdev": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "iqr": float(q3 - q1), "n": int(v.size), "repeats": int(repeats),
    }


def choose_repeats(one_call_s: float, policy: TimingPolicy) -> int:
    """Calls per sample so that a sample lasts about policy.min_sample_s."""
    if one_call_s <= 0 or not math.isfinite(one_call_s):
        return policy.max_repeats
    return int(min(policy.max_repeats, max(1, math.ceil(policy.min_sample_s / one_call_s))))


def gpu_repeats(repeats: int, ns_per_call: float, policy: TimingPolicy, max_calls: int | None = None) -> int:
    """Calls per GPU-timed sample: `repeats` (the host calibration's, a whole number of a case's
    cycles) times the smallest whole factor that makes a sample last policy.min_sample_s of
    device time at `ns_per_call`, with at most max(repeats, policy.max_repeats) and `max_calls`
    calls (never fewer than `repeats`).

    The host calibration times one call with its submission and wait: for kernels of tens of
    microseconds that is mostly overhead, and samples of its few calls leave the device idle
    between them, at a clock the governor never raises."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"gpu_repeats: repeats must be an int >= 1, got {repeats!r}")
    if not (ns_per_call > 0 and math.isfinite(ns_per_call)):
        return repeats
    limit = max(repeats, policy.max_repeats)
    if max_calls is not None:
        limit = min(limit, max_calls)
    want = math.ceil(policy.min_sample_s * 1e9 / ns_per_call / repeats)
    return repeats * max(1, min(want, limit // repeats))


def settle(sample: Callable[[], float], tol: float, max_s: float, *, start: float | None = None,
           min_s: float = 0.0, ready: Callable[[], bool] | None = None,
           host_s: float | None = None) -> tuple[bool, int]:
    """Take samples until two in a row agree within `tol` (relative) and `ready()` holds, at least
    `min_s` and at most `max_s` seconds after `start` (perf_counter; default: now).

    Host-bound work never lifts the clock: after `host_s` seconds (default and at most a third of
    `max_s`), agreeing samples alone settle it. Returns (settled, samples taken)."""
    t_start = time.perf_counter() if start is None else start
    alone = max_s / 3 if host_s is None else min(host_s, max_s / 3)
    prev, n = None, 0
    while time.perf_counter() - t_start < max_s:
        cur = sample()
        n += 1
        elapsed = time.perf_counter() - t_start
        if prev is not None and elapsed >= min_s and abs(cur - prev) <= tol * min(cur, prev) \
                and (ready is None or elapsed > alone or ready()):
            return True, n
        prev = cur
    return False, n


def host_samples(run_sample: Callable[[int], None], policy: TimingPolicy,
                 ready: Callable[[], bool] | None = None,
                 info: dict | None = None, multiple: int = 1,
                 phases: "Phases | None" = None) -> tuple[list[float], int]:
    """Warm up, calibrate, settle, then time `run_sample(repeats)` (issue + wait) on the host clock.

    Settling (policy.settle_max_s > 0) repeats samples until two in a row agree within
    policy.settle_tol and `ready()` (e.g. "the GPU clock is boosted") holds: GPUs leave their
    idle clocks only after seconds of sustained work, and samples taken before that measure
    the clock governor, not the kernel. `info`, when given, receives warmup_s, settled and
    warmup_samples; `phases`, when given, the seconds of "warmup" (warm-up and calibration
    calls), "settle" and "host_samples". `repeats` is rounded up to a multiple of `multiple`.
    Returns per-call nanoseconds for each sample and the repeats used.
    """
    phases = phases if phases is not None else Phases()
    t_start = time.perf_counter()
    with phases("warmup"):
        for _ in range(policy.warmup):
            run_sample(1)
        t0 = time.perf_counter_ns()
        run_sample(1)
        one = (time.perf_counter_ns() - t0) / 1e9
    repeats = choose_repeats(one, policy)
    # whole cycles of a case that rotates its inputs (may exceed policy.max_repeats: a sample
    # that rereads a subset of the copies would time caches, not memory)
    repeats = -(-repeats // multiple) * multiple
    settled, n_settle = True, 0
    if policy.settle_max_s > 0:
        def one_sample() -> float:
            t0 = time.perf_counter_ns()
            run_sample(repeats)
            return time.perf_counter_ns() - t0

        with phases("settle"):
            settled, n_settle = settle(one_sample, policy.settle_tol, policy.settle_max_s, start=t_start,
                                       ready=ready, host_s=policy.settle_host_s)
    if info is not None:
        info.update(warmup_s=round(time.perf_counter() - t_start, 3), settled=settled, warmup_samples=n_settle)
    out: list[float] = []
    start = time.perf_counter()
    with phases("host_samples"):
        for _ in range(policy.samples):
            t0 = time.perf_counter_ns()
            run_sample(repeats)
            out.append((time.perf_counter_ns() - t0) / repeats)
            if len(out) >= 3 and time.perf_counter() - start > policy.max_total_s:
                break
    return out, repeats


class Phases:
    """Wall seconds per named phase of one case (setup, warm-up, settle, samples, ...): ``with
    phases("setup"): ...`` adds the block's time to "setup". ``seconds`` keeps them in first-use
    order; kbench.results.records names the phases a record may carry."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, float(seconds))

    def total(self) -> float:
        return sum(self.seconds.values())


def throughput(bytes_moved: int, flops: int, median_ns: float) -> dict[str, float | None]:
    """GB/s (1e9 bytes/s) and GFLOP/s for one call taking median_ns."""
    if not median_ns or median_ns <= 0:
        return {"gbps": None, "gflops": None}
    return {
        "gbps": bytes_moved / median_ns if bytes_moved else None,   # bytes/ns == GB/s
        "gflops": flops / median_ns if flops else None,
    }
