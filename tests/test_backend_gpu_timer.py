"""VulkanBackend.measure_gpu_ns: device time of a burst of backend ops, from GPU timestamps."""
from __future__ import annotations

import time

import numpy as np
import pytest

from kbench.backend import create_backend


@pytest.fixture
def vk_backend():
    try:
        be = create_backend("vulkan")
    except (ImportError, RuntimeError, OSError) as e:
        pytest.skip(f"no Vulkan device: {e}")
    yield be
    be.close()


def test_gpu_time_is_positive_within_host_time_and_grows_with_work(vk_backend):
    be = vk_backend
    n = 1 << 18
    a, b, o = (be.allocate(4 * n) for _ in range(3))
    be.copy_to_device(np.random.rand(n).astype(np.float32), a)
    be.add(a, b, o, n)  # first use: pipeline creation (lavapipe JITs here) stays out of the samples
    be.synchronize()
    times = {}
    for reps in (2, 20):
        samples = []
        for _ in range(3):  # the least of three: a shared 2-core CI machine stalls single samples
            t0 = time.perf_counter_ns()
            ns = be.measure_gpu_ns(lambda: [be.add(a, b, o, n) for _ in range(reps)])
            host = time.perf_counter_ns() - t0
            assert ns is not None and 0 < ns <= host, f"GPU {ns} ns vs host {host} ns for {reps} adds"
            samples.append(ns)
        times[reps] = min(samples)
    assert times[20] > 3 * times[2], f"20 adds took {times[20]} ns, 2 adds {times[2]} ns"
    out = np.empty(n, np.float32)
    be.copy_from_device(o, out)  # the measured work really ran
    ref = np.empty(n, np.float32)
    be.copy_from_device(a, ref)
    np.testing.assert_array_equal(out, ref)


def test_measured_work_spanning_several_batches_is_summed(vk_backend):
    be = vk_backend
    n = 4096
    a, o = be.allocate(4 * n), be.allocate(4 * n)
    ns = be.measure_gpu_ns(lambda: [be.silu(a, o, n) for _ in range(300)])  # > batch_ops (64)
    assert ns is not None and ns > 0
