"""Benchmark suite: every case with bench sizes, GPU time as the primary figure.

Each test checks the case (a benchmark of a wrong result is worthless), records GPU timestamps
(median/min/max/spread), GB/s or GFLOP/s in the result, and lets pytest-benchmark time the same
repeat loop on the host (its JSON via --benchmark-json). The GPU figures are also put into
pytest-benchmark's extra_info.
"""

from __future__ import annotations

from conftest import conclude

from kbench.bench.execute import default_policy, prepared, run_instance

MODE = "bench"


def test_case(kbench_case, kbench_session, benchmark):
    props, qc, inst = kbench_case
    target = kbench_session.target(props, qc)
    rec = run_instance(inst, target, MODE)
    if rec["status"] == "pass":
        repeats = rec["host_ns"]["repeats"]
        policy = default_policy(target)
        with prepared(inst, target) as run_sample:
            benchmark.pedantic(run_sample, args=(repeats,), rounds=policy.samples, warmup_rounds=1)
        benchmark.extra_info.update({
            "case_id": inst.case_id, "queue_config": qc.name, "repeats_per_round": repeats,
            "timer": rec.get("timer"), "gpu_ns": rec.get("gpu_ns"), "bytes": rec.get("bytes"),
            "flops": rec.get("flops"), "gbps": rec.get("gbps"), "gflops": rec.get("gflops")})
    conclude(kbench_session.record(props, rec))
