"""What the runtime guarantees where Kompute falls short (see kompute-api.md): asynchronous eval, timestamps,
push-constant and queue checks, automatic barriers, staging, distinct errors; each checked in numbers."""
from __future__ import annotations

import time

import numpy as np
import pytest

import kbench.runtime as kp
from kbench.runtime import _vk
from kbench.runtime._vk import vk

SLOW = """
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer A { float a[]; };
layout(push_constant) uniform P { uint iters; } p;
void main() {
    uint i = gl_GlobalInvocationID.x;
    float x = a[i];
    for (uint k = 0; k < p.iters; ++k) { x = x * 1.0000001 + 1e-7; }
    a[i] = x;
}
"""

ADD_ONE = """
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) writeonly buffer B { float b[]; };
layout(push_constant) uniform P { uint n; } p;
void main() { uint i = gl_GlobalInvocationID.x; if (i < p.n) b[i] = a[i] + 1.0; }
"""


def _slow_algo(mgr, compile_glsl, iters: int):
    t = mgr.tensor(np.ones(64 * 256), kp.TensorTypes.storage)
    return mgr.algorithm([t], compile_glsl(SLOW), (256, 1, 1), [], np.array([iters], np.uint32))


def test_eval_async_without_op_returns_before_the_work_is_done(mgr, compile_glsl):
    algo = _slow_algo(mgr, compile_glsl, 200000)
    seq = mgr.sequence().record(kp.OpAlgoDispatch(algo))
    t0 = time.perf_counter()
    seq.eval_async()
    submitted = time.perf_counter() - t0
    assert seq.is_running()
    assert seq.eval_await()
    total = time.perf_counter() - t0
    assert not seq.is_running()
    assert submitted < total / 2, f"eval_async took {submitted:.4f}s of a {total:.4f}s run: it waited"


def test_eval_await_timeout_keeps_the_sequence_running_until_a_later_await(mgr, compile_glsl):
    algo = _slow_algo(mgr, compile_glsl, 400000)
    seq = mgr.sequence().record(kp.OpAlgoDispatch(algo))
    seq.eval_async()
    assert seq.eval_await(timeout_ns=1000) is False
    assert seq.is_running(), "a timed-out await must leave the sequence running"
    with pytest.raises(RuntimeError, match="already running"):
        seq.eval_async()
    assert seq.eval_await() is True
    assert not seq.is_running()


def test_timestamps_are_nanoseconds_and_the_pool_is_reset_on_reuse(mgr, compile_glsl):
    iters = 100000
    algo = _slow_algo(mgr, compile_glsl, iters)
    seq = mgr.sequence(total_timestamps=2).record(kp.OpAlgoDispatch(algo))
    t0 = time.perf_counter_ns()
    seq.eval()
    host_ns = time.perf_counter_ns() - t0
    first = seq.get_timestamps()
    seq.eval()
    second = seq.get_timestamps()
    assert len(first) == len(second) == 2
    gpu_ns = first[1] - first[0]
    assert 0 < gpu_ns <= host_ns, f"GPU time {gpu_ns} ns must be positive and within host wall time {host_ns} ns"
    assert gpu_ns > host_ns * 0.2, f"GPU time {gpu_ns} ns is implausibly small against host {host_ns} ns (ticks?)"
    assert second[0] > first[1], f"second run's timestamps {second} must come after the first's {first}"


def test_push_constants_of_wrong_dtype_or_size_raise_before_recording(mgr, compile_glsl):
    t = mgr.tensor(np.zeros(64))
    spv = compile_glsl(ADD_ONE)
    with pytest.raises(TypeError, match=r"dtype float32 does not match.*'n' \(uint32\)"):
        mgr.algorithm([t, t], spv, (1, 1, 1), [], [1.0])
    with pytest.raises(ValueError, match="8 bytes, the shader's block is 4 bytes"):
        mgr.algorithm([t, t], spv, (1, 1, 1), [], np.array([1, 2], np.uint32))
    algo = mgr.algorithm([t, mgr.tensor(np.zeros(64))], spv, (1, 1, 1), [], np.array([64], np.uint32))
    with pytest.raises(TypeError, match="int32 does not match"):
        kp.OpAlgoDispatch(algo, np.array([3], np.int32))
    with pytest.raises(ValueError, match="push constants given"):
        mgr.algorithm([t], compile_glsl(SLOW.replace("layout(push_constant) uniform P { uint iters; } p;", "").replace("p.iters", "4u")),
                      (1, 1, 1), [], [1.0])


def test_structured_push_constants_are_checked_member_by_member(mgr, compile_glsl):
    src = """
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { float a[]; };
layout(push_constant) uniform P { uint n; float s; } p;
void main() { a[0] = float(p.n) * p.s; }
"""
    t = mgr.tensor([0])
    good = np.array([(3, 0.5)], dtype=[("n", "<u4"), ("s", "<f4")])
    algo = mgr.algorithm([t], compile_glsl(src), (1, 1, 1), [], good)
    mgr.sequence().record(kp.OpAlgoDispatch(algo)).record(kp.OpTensorSyncLocal([t])).eval()
    assert t.data()[0] == 1.5
    bad = np.array([(3.0, 0.5)], dtype=[("n", "<f4"), ("s", "<f4")])
    with pytest.raises(TypeError, match="member 'n' is uint32"):
        algo.set_push_constants(bad)


def test_queue_index_and_family_errors_are_clear(mgr):
    props = mgr.get_device_properties()
    n_fam = len(props["queue_families"])
    with pytest.raises(IndexError, match=r"queue_index 1 is out of range: this Manager has 1 queue"):
        mgr.sequence(queue_index=1)
    with pytest.raises(ValueError, match=f"family_queue_indices\\[0\\] = {n_fam}: no such queue family"):
        kp.Manager(family_queue_indices=[n_fam])
    fam0 = props["queue_families"][0]
    with pytest.raises(ValueError, match=f"asks for {fam0['count'] + 1} queues of family 0, which has only {fam0['count']}"):
        kp.Manager(family_queue_indices=[0] * (fam0["count"] + 1))
    no_compute = [q["index"] for q in props["queue_families"] if "compute" not in q["flags"]]
    if no_compute:
        with pytest.raises(ValueError, match="has no compute support"):
            kp.Manager(family_queue_indices=[no_compute[0]])


def test_dependent_dispatches_get_barriers_without_the_user_adding_any(mgr, compile_glsl):
    n = 100_000
    spv = compile_glsl(ADD_ONE)
    ts = [mgr.buffer(4 * n) for _ in range(2)]  # zero-filled (storage tensors ignore initial data)
    host = mgr.tensor(np.zeros(n), kp.TensorTypes.host)
    grid = ((n + 63) // 64, 1, 1)
    pc = np.array([n], np.uint32)
    fwd = mgr.algorithm([ts[0], ts[1]], spv, grid, [], pc)
    back = mgr.algorithm([ts[1], ts[0]], spv, grid, [], pc)
    seq = mgr.sequence()
    for _ in range(10):
        seq.record(kp.OpAlgoDispatch(fwd)).record(kp.OpAlgoDispatch(back))
    seq.record(kp.OpTensorCopyRegion(ts[0], host, 0, 0, 4 * n)).record(kp.OpTensorSyncLocal([host])).eval()
    assert np.all(host.data() == 20.0), f"expected 20 everywhere, got {np.unique(host.data())[:5]}"


def test_independent_dispatches_are_not_serialized(mgr, compile_glsl):
    spv = compile_glsl(ADD_ONE)
    pairs = [(mgr.tensor(np.zeros(64)), mgr.tensor(np.zeros(64))) for _ in range(4)]
    algos = [mgr.algorithm([a, b], spv, (1, 1, 1), [], np.array([64], np.uint32)) for a, b in pairs]
    seq = mgr.sequence()
    recorded = []
    orig = seq._cmd_barrier
    seq._cmd_barrier = lambda *a: (recorded.append(a), orig(*a))
    for algo in algos:
        seq.record(kp.OpAlgoDispatch(algo))
    assert len(recorded) == 1, f"only the sequence-start barrier expected, got {len(recorded)}"
    seq.record(kp.OpAlgoDispatch(mgr.algorithm([pairs[0][1], pairs[1][0]], spv, (1, 1, 1), [], np.array([64], np.uint32))))
    assert len(recorded) == 2, "a read of an earlier write needs one barrier"
    seq.eval()


def test_device_tensors_hold_no_permanent_staging(mgr):
    n = 1 << 16
    base = mgr.get_stats()["buffers"]
    ts = [mgr.tensor(np.random.rand(n)) for _ in range(4)]
    assert mgr.get_stats()["buffers"] - base == 4, "a device tensor is one device buffer, no staging twin"
    seq = mgr.sequence()
    seq.eval(kp.OpTensorSyncDevice(ts))
    seq.eval(kp.OpTensorSyncLocal(ts))
    assert mgr._staging._lent == 1, "the recorded sync op holds one pooled staging buffer"
    seq.clear()
    assert mgr._staging._lent == 0, "clearing the sequence gives the staging back"
    assert mgr.get_stats()["staging_idle_bytes"] <= 4 * n * 4, "idle staging stays within one transfer's size"


def test_sync_round_trip_keeps_data_exact_for_every_dtype(mgr):
    for dt in (np.float32, np.float64, np.int32, np.uint32, np.float16, np.int8, np.uint8, np.int16, np.uint16,
               np.int64, np.uint64, np.bool_):
        src = (np.arange(37) % 2).astype(dt) if dt == np.bool_ else (np.arange(37) * 3 - 20).astype(dt)
        a = mgr.tensor_t(src)
        b = mgr.tensor_t(np.zeros_like(src))
        mgr.sequence().record(kp.OpTensorSyncDevice([a])).record(kp.OpTensorCopy([a, b])).eval()
        b.data()[:] = 0
        mgr.sequence().eval(kp.OpTensorSyncLocal([b]))
        np.testing.assert_array_equal(b.data(), src, err_msg=f"dtype {np.dtype(dt)}")


def test_out_of_memory_and_device_lost_are_distinct_exceptions(mgr):
    limit = mgr._max_allocation_size
    with pytest.raises(kp.OutOfDeviceMemoryError):
        mgr.buffer(limit + 4096)
    assert issubclass(kp.OutOfDeviceMemoryError, MemoryError)
    lost = _vk.translate(vk.VkErrorDeviceLost(), "vkQueueSubmit")
    oom = _vk.translate(vk.VkErrorOutOfDeviceMemory(), "vkAllocateMemory")
    assert isinstance(lost, kp.DeviceLostError) and not isinstance(lost, kp.OutOfDeviceMemoryError)
    assert isinstance(oom, kp.OutOfDeviceMemoryError) and not isinstance(oom, kp.DeviceLostError)
    with pytest.raises(kp.DeviceLostError):
        _vk.check(vk.VK_ERROR_DEVICE_LOST, "vkWaitForFences")


def test_memory_barrier_masks_combine_with_or(mgr):
    t = mgr.tensor([1, 2, 3])
    op = kp.OpMemoryBarrier([t], kp.AccessFlags.shader_write | kp.AccessFlags.transfer_write,
                            kp.AccessFlags.shader_read | kp.AccessFlags.transfer_read,
                            kp.PipelineStageFlags.compute_shader | kp.PipelineStageFlags.transfer,
                            kp.PipelineStageFlags.compute_shader | kp.PipelineStageFlags.transfer)
    mgr.sequence().record(kp.OpTensorSyncDevice([t])).record(op).record(kp.OpTensorSyncLocal([t])).eval()
    assert t.data().tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="stage masks must not be empty"):
        kp.OpMemoryBarrier([t], 0, 0, 0, kp.PipelineStageFlags.transfer)
