"""Warm-up until the device has settled, the clock keeper, and polling waits."""
from __future__ import annotations

import time

import pytest

from kbench.bench.timing import TimingPolicy, host_samples


def _sleeper(durations):
    """run_sample(repeats) that sleeps the next of `durations` seconds per call (the last repeats)."""
    state = {"i": 0}

    def run_sample(repeats: int) -> None:
        d = durations[min(state["i"], len(durations) - 1)]
        state["i"] += 1
        time.sleep(d * repeats)
    return run_sample, state


def test_settle_waits_for_two_agreeing_samples_and_reports_it():
    # a device that starts slow (idle clocks) and speeds up: the first four samples differ by 2x
    # each (wide steps: a loaded CI machine oversleeps by a millisecond or two)
    run, state = _sleeper([0.008, 0.008, 0.064, 0.032, 0.016, 0.008, 0.008, 0.008])
    policy = TimingPolicy(min_sample_s=0.001, samples=3, warmup=1, max_repeats=1, settle_max_s=5.0, settle_tol=0.3)
    info: dict = {}
    out, repeats = host_samples(run, policy, info=info)
    assert info["settled"] is True, f"expected a settled warm-up, got {info}"
    assert info["warmup_samples"] >= 4, f"settled after {info['warmup_samples']} samples, before the speed-up"
    assert all(t < 0.012e9 for t in out), f"timed samples should be the fast ones, got {out}"


def test_settle_gives_up_after_its_time_limit_when_samples_never_agree():
    run, _ = _sleeper([0.002, 0.006] * 100)
    policy = TimingPolicy(min_sample_s=0.001, samples=2, warmup=0, max_repeats=1, settle_max_s=0.1)
    info: dict = {}
    t0 = time.perf_counter()
    host_samples(run, policy, info=info)
    assert info["settled"] is False, f"samples alternated 2 ms / 6 ms, yet settled: {info}"
    assert time.perf_counter() - t0 < 1.0, "settling ran far past settle_max_s"


def test_stable_samples_settle_without_a_boosted_clock_only_after_a_third_of_the_limit():
    # host-bound work: stable from the start, the clock never reported boosted
    run, _ = _sleeper([0.002])
    policy = TimingPolicy(min_sample_s=0.001, samples=2, warmup=0, max_repeats=1, settle_max_s=0.3)
    info: dict = {}
    host_samples(run, policy, ready=lambda: False, info=info)
    assert info["settled"] is True, f"stable samples should settle late, got {info}"
    assert 0.1 <= info["warmup_s"] < 0.3, f"expected settling after 0.1 s (a third of 0.3), got {info}"


def test_bad_settle_options_are_rejected():
    with pytest.raises(ValueError, match="bad timing policy"):
        TimingPolicy(settle_tol=0.0)
    with pytest.raises(ValueError, match="bad timing policy"):
        TimingPolicy(settle_max_s=-1)


kp = pytest.importorskip("kbench.runtime")
try:
    _NO_DEVICE = None if kp.list_devices() else "the Vulkan loader finds no device"
except Exception as exc:  # noqa: BLE001
    _NO_DEVICE = f"no Vulkan available here: {exc}"
needs_vulkan = pytest.mark.skipif(_NO_DEVICE is not None, reason=_NO_DEVICE or "")


@needs_vulkan
@pytest.mark.parametrize("spin", [0, 1_000_000])
def test_eval_gives_the_same_results_with_and_without_fence_polling(spin):
    import numpy as np

    with kp.Manager() as mgr:
        mgr.wait_spin_ns = spin
        a = mgr.tensor(np.arange(1000, dtype=np.float32))
        b = mgr.tensor(np.full(1000, 2, np.float32))
        out = mgr.tensor(np.zeros(1000, np.float32))
        seq = mgr.sequence()
        seq.record(kp.OpTensorSyncDevice([a, b])).record(kp.OpMult([a, b, out], mgr.algorithm())).record(kp.OpTensorSyncLocal([out]))
        seq.eval()
        assert np.array_equal(out.data(), np.arange(1000) * 2.0), f"wrong product with wait_spin_ns={spin}"
        seq.eval_async()
        assert seq.eval_await(timeout_ns=10_000_000_000) is True


@needs_vulkan
@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_wait_spin_ns_rejects_what_is_not_a_non_negative_int(bad):
    with kp.Manager() as mgr:
        with pytest.raises(ValueError, match="wait_spin_ns"):
            mgr.wait_spin_ns = bad


@needs_vulkan
def test_clock_keeper_submits_only_while_resumed_and_closes_its_device():
    from kbench.bench.clocks import ClockKeeper

    keeper = ClockKeeper(0)
    try:
        keeper.resume()
        time.sleep(0.2)
        keeper.pause()
        n = keeper.submissions
        assert n > 0, "the keeper submitted nothing while resumed"
        time.sleep(0.1)
        assert keeper.submissions == n, f"the keeper went on submitting while paused ({keeper.submissions} > {n})"
    finally:
        keeper.close()
    assert not keeper._mgr._alive, "the keeper's Manager is still alive after close()"


def test_samples_hold_whole_cycles_of_a_rotating_case():
    calls = []
    policy = TimingPolicy(min_sample_s=0.0001, samples=2, warmup=0, max_repeats=2, settle_max_s=0.0)
    out, repeats = host_samples(lambda r: calls.append(r), policy, multiple=8)
    assert repeats == 8, f"a case that rotates through 8 copies needs samples of 8 calls, got {repeats}"
    assert calls[-len(out):] == [8] * len(out), f"timed samples ran {calls}"


def test_quantized_matmul_cycle_is_its_weight_copies():
    from kbench.cases.llm_ops import QUANTIZED_MATMUL, _qmm_copies

    p = {"n_rows": 14336, "n_cols": 4096, "rotate_mib": 256, "dtype": "Q4_0"}
    assert QUANTIZED_MATMUL.cycle(p) == _qmm_copies(p) == 9, "256 MiB of 33 MB Q4_0 copies is 9 copies"
    assert QUANTIZED_MATMUL.cycle({"n_rows": 64, "n_cols": 256, "dtype": "Q4_0"}) == 1
