"""The timer cross-checks printed by the bench and the report (kbench.report.truth)."""
from __future__ import annotations

from kbench.report.truth import timer_checks


def _case(case: str, ratio: float, timing: str = "stream", gpu_ns: float = 2e6) -> dict:
    return {"kind": "case", "status": "pass", "timer": "gpu", "case": case, "case_id": f"{case}[x]",
            "gpu_ns": {"median": gpu_ns}, "gpu_host_ratio": ratio, "gpu_timing": timing}


def test_long_kernels_within_five_percent_agree():
    lines = timer_checks([_case("add", 0.99), _case("matmul", 1.02)])
    assert len(lines) == 1 and "2 kernels" in lines[0] and "agree within 5%" in lines[0], lines


def test_a_kernel_outside_five_percent_is_named():
    lines = timer_checks([_case("add", 0.99), _case("softmax", 0.80)])
    assert "1 outside 5%" in lines[0] and "softmax[x] 0.800" in lines[0], lines


def test_short_kernels_are_not_checked():
    assert timer_checks([_case("add", 0.5, gpu_ns=1e5)]) == []


def test_host_bound_cases_count_only_when_replayed():
    streamed = timer_checks([_case("attention", 0.3)])
    assert streamed == [], f"a streamed host-bound case's host time is other work, got {streamed}"
    replayed = timer_checks([_case("attention", 0.98, timing="replay")])
    assert len(replayed) == 1 and "1 kernels" in replayed[0] and "agree" in replayed[0], replayed


def test_copy_peaks_of_both_timers_are_compared():
    def peak(value: float, nbytes: int = 1 << 28) -> dict:
        return {"kind": "peak", "peak": "peak.copy_bandwidth", "value": value, "params": {"buffer_bytes": nbytes}}
    ok = timer_checks([{"kind": "run", "backend": "vulkan"}, peak(4100.0),
                       {"kind": "run", "backend": "torch-cuda"}, peak(4000.0)])
    assert ok and "ratio 1.025" in ok[-1] and "agree within 5%" in ok[-1], ok
    bad = timer_checks([{"kind": "run", "backend": "vulkan"}, peak(4400.0),
                        {"kind": "run", "backend": "torch-cuda"}, peak(4000.0)])
    assert "DISAGREE" in bad[-1], bad
    sizes = timer_checks([{"kind": "run", "backend": "vulkan"}, peak(4000.0),
                          {"kind": "run", "backend": "torch-cuda"}, peak(4000.0, 1 << 20)])
    assert "DISAGREE" in sizes[-1] and "sizes differ" in sizes[-1], sizes
