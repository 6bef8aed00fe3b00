"""Timing a probe's call at a settled clock (shared by the probes that time kernels one by one)."""

from __future__ import annotations

import statistics
from typing import Any, Callable

from kbench.bench.timing import settle


def time_settled(be: Any, issue: Callable[[], None], repeats: int, settle_s: float) -> float | None:
    """Median GPU ns of one ``issue()`` on backend ``be``, after the clock governor has settled.

    A GPU idles down between short probes; without sustained work first, the samples time the
    governor's low clock (an 8192^3 SGEMM read 5x slower than in the bench). So: bursts of calls
    until at least ``settle_s`` has passed and two samples in a row agree within 3% (the H200
    needs about 5.5 s of load to boost). None where the backend has no GPU timer."""
    if be.measure_gpu_ns(issue) is None:
        return None

    def burst() -> float:
        for _ in range(8):
            issue()
        be.synchronize()
        return be.measure_gpu_ns(issue) or float("nan")

    settle(burst, 0.03, settle_s + 8, min_s=settle_s)
    samples = [be.measure_gpu_ns(issue) for _ in range(repeats)]
    return None if any(s is None for s in samples) else statistics.median(samples)
