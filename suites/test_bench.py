"""Benchmark suite: every case with bench sizes, GPU time as pytest-benchmark's statistic.

Each test checks the case (a benchmark of a wrong result is worthless) and times it as `kbench
bench` does. pytest-benchmark's rounds are then kbench's samples: each round's duration is one
sample's GPU time per call (from timestamps; host time where the device gives none), so its
min/median/mean/stddev, `--benchmark-compare` and `--benchmark-compare-fail=median:5%` work on
GPU time. ``extra_info`` says which clock ("timer": "gpu" or "host") and holds GB/s, GFLOP/s and
the case id. One benchmark group per op (``--benchmark-group-by=group``, the default).
"""

from __future__ import annotations

from conftest import conclude

from kbench.bench.execute import run_instance

MODE = "bench"


class SampleClock:
    """A timer for pytest-benchmark that replays measured samples: each round it is read before
    and after, and ``step`` (the round's target) moves it on by the next sample."""

    def __init__(self, samples_ns: list[float]):
        self.samples, self.now, self.next = list(samples_ns), 0.0, 0

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.samples[self.next] * 1e-9
        self.next += 1


def test_case(kbench_case, kbench_session, benchmark):
    inst = kbench_case.inst
    target = kbench_session.target(kbench_case)
    samples: dict[str, list[float]] = {}
    rec = run_instance(inst, target, MODE, samples=samples)
    benchmark.group = inst.case.name
    if rec["status"] == "pass":
        clock_name = "gpu" if samples.get("gpu") else "host"
        clock = SampleClock(samples[clock_name])
        # pytest-benchmark reads its timer through this attribute (its --benchmark-timer option
        # sets it for every test; here it is the samples of this one)
        benchmark._timer = clock
        benchmark.pedantic(clock.step, rounds=len(clock.samples), warmup_rounds=0)
        benchmark.extra_info.update({
            "case_id": inst.case_id, "queue_config": kbench_case.qc.name,
            "device": kbench_case.props.get("device_name"), "implementation": kbench_case.impl.name,
            "timer": clock_name, "gbps": rec.get("gbps"), "gflops": rec.get("gflops"),
            "bytes": rec.get("bytes"), "flops": rec.get("flops")})
    conclude(kbench_session.record(kbench_case, rec))
