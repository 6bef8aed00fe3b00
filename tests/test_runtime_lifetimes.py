"""Object lifetimes, destroy order, leak-freedom over many cycles, and bad input that must not crash."""
from __future__ import annotations

import gc
import resource
import threading

import numpy as np
import pytest

import kbench.runtime as kp

COPY = """
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) buffer B { float b[]; };
void main() { uint i = gl_GlobalInvocationID.x; if (i < b.length()) b[i] = a[i]; }
"""


def test_numpy_view_outlives_the_tensor_object(mgr):
    t = mgr.tensor_t(np.arange(10, dtype=np.float32), kp.TensorTypes.host)
    view = t.data()
    del t
    gc.collect()
    assert view.tolist() == list(range(10))
    view[0] = 42.0
    assert view[0] == 42.0


def test_view_of_mapped_memory_survives_explicit_destroy_and_manager_destroy():
    m = kp.Manager(validation=False)
    t = m.tensor_t(np.arange(4, dtype=np.float32), kp.TensorTypes.host)
    view = t.data()
    t.destroy()
    assert not t.is_init()
    assert view.tolist() == [0, 1, 2, 3], "memory must stay mapped while a view exists"
    m.destroy()
    assert view.tolist() == [0, 1, 2, 3], "manager destroy must not unmap memory a view still uses"
    del view
    gc.collect()
    assert m._device is None, "the device is destroyed once the last view is gone"


def test_manager_destroy_invalidates_everything():
    m = kp.Manager(validation=False)
    t = m.tensor([1, 2, 3])
    algo = m.algorithm([t, m.tensor([0, 0, 0])], kp.compile_source(COPY))
    seq = m.sequence()
    m.destroy()
    assert not (t.is_init() or algo.is_init() or seq.is_init())
    with pytest.raises(RuntimeError, match="destroyed"):
        seq.record(kp.OpTensorSyncDevice([t]))
    with pytest.raises(RuntimeError, match="destroyed"):
        m.tensor([1])
    with pytest.raises(RuntimeError, match="destroyed"):
        t.data()
    m.destroy()  # twice is harmless


def test_destroy_in_any_order_is_safe(mgr, compile_glsl):
    a, b = mgr.tensor([1, 2, 3]), mgr.tensor([0, 0, 0])
    algo = mgr.algorithm([a, b], compile_glsl(COPY))
    seq = mgr.sequence().record(kp.OpTensorSyncDevice([a, b])).record(kp.OpAlgoDispatch(algo))
    seq.eval_async()
    a.destroy()  # waits for the running sequence that uses it
    assert not seq.is_running()
    with pytest.raises(RuntimeError, match="has been destroyed"):
        seq.rerecord()
    algo.destroy()
    seq.destroy()
    b.destroy()


def test_context_manager_destroys_the_manager():
    with kp.Manager(validation=False) as m:
        t = m.tensor([1.0])
    assert not t.is_init() and m._device is None


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_tensor_algorithm_and_sequence_are_context_managers(mgr, compile_glsl):
    before = mgr.get_stats()
    with mgr.tensor(np.arange(8, dtype=np.float32)) as a, mgr.tensor(np.zeros(8, np.float32)) as b:
        with mgr.algorithm([a, b], compile_glsl(COPY), (1, 1, 1)) as algo, mgr.sequence() as seq:
            seq.eval(kp.OpTensorSyncDevice([a])).eval(kp.OpAlgoDispatch(algo)).eval(kp.OpTensorSyncLocal([b]))
            assert b.data().tolist() == list(range(8))
        assert not algo.is_init() and seq._destroyed, "leaving the with block must destroy algorithm and sequence"
    assert not a.is_init() and not b.is_init(), "leaving the with block must destroy the tensors"
    after = mgr.get_stats()
    assert {k: after[k] for k in ("tensors", "algorithms", "sequences")} == \
        {k: before[k] for k in ("tensors", "algorithms", "sequences")}, f"live objects before {before}, after {after}"


def test_thousands_of_create_destroy_cycles_do_not_grow(mgr, compile_glsl):
    spv = compile_glsl(COPY)

    def cycle():
        a = mgr.tensor(np.ones(256))
        b = mgr.tensor(np.zeros(256), kp.TensorTypes.host)
        algo = mgr.algorithm([a, b], spv, (4, 1, 1))
        seq = mgr.sequence(total_timestamps=4)
        seq.record(kp.OpTensorSyncDevice([a])).record(kp.OpAlgoDispatch(algo)).eval()
        assert b.data()[0] == 1.0
        seq.destroy()
        algo.destroy()
        a.destroy()
        b.destroy()

    for _ in range(200):
        cycle()
    gc.collect()
    base = mgr.get_stats()  # after warm-up: the staging pool keeps one idle buffer
    rss_warm = _rss_kib()
    for _ in range(1800):
        cycle()
    gc.collect()
    stats = mgr.get_stats()
    for key in ("buffers", "descriptor_sets", "sequences", "tensors", "algorithms"):
        assert stats[key] == base[key], f"{key}: {base[key]} before, {stats[key]} after 2000 cycles"
    assert stats["pipelines"] <= base["pipelines"] + 1
    grown = _rss_kib() - rss_warm
    assert grown < 20_000, f"peak RSS grew by {grown} KiB over 1800 cycles"


def test_many_managers_created_and_destroyed():
    for _ in range(30):
        with kp.Manager(validation=False) as m:
            # tensor and sequence are dropped without destroy(): their Vulkan objects must go too
            m.sequence().eval(kp.OpTensorSyncDevice([m.tensor([1.0])]))
        assert m._device is None, f"device leaked: {m.get_stats()}"


def test_managers_share_one_instance_and_only_unused_shared_instances_are_destroyed(monkeypatch):
    from kbench.runtime.device import Instance

    # the NVIDIA driver refuses vkCreateInstance after ~30 create/destroy cycles per process
    with kp.Manager(validation=False) as a:
        first = a._instance
        with kp.Manager(validation=False) as b:
            assert b._instance is first, "a second live Manager made its own VkInstance"
            assert first.users == 2, f"expected 2 users of the shared instance, got {first.users}"
            kp.list_devices()
            assert first.users == 2, f"list_devices did not hand the instance back: {first.users} users"
            assert Instance.destroy_shared() >= 1, "destroy_shared destroyed an instance in use"
            assert first.handle is not None
    assert first.users == 0 and first.handle is not None, "the shared instance went with its last Manager"
    with kp.Manager(validation=False) as c:
        assert c._instance is first, "a later Manager did not reuse the shared instance"
    assert Instance.destroy_shared() == 0 and first.handle is None, "an unused shared instance was kept"
    with kp.Manager(validation=False) as d:
        assert d._instance is not first and d._instance.handle is not None, "no fresh shared instance"
    monkeypatch.setenv("KBENCH_SHARED_INSTANCE", "0")
    with kp.Manager(validation=False) as e:
        own = e._instance
        assert not own.is_shared and own is not d._instance
    assert own.handle is None, "KBENCH_SHARED_INSTANCE=0: the Manager's own instance was not destroyed"


@pytest.mark.parametrize("bad,exc,match", [
    ([], ValueError, "zero-size tensor"),
    (np.zeros(0, np.float32), ValueError, "zero-size tensor"),
])
def test_zero_size_tensors_are_rejected(mgr, bad, exc, match):
    with pytest.raises(exc, match=match):
        mgr.tensor_t(bad) if isinstance(bad, np.ndarray) else mgr.tensor(bad)


def test_unsupported_dtype_is_rejected_with_the_supported_list(mgr):
    with pytest.raises(TypeError, match=r"unsupported tensor dtype complex64.*float32"):
        mgr.tensor_t(np.zeros(3, np.complex64))
    with pytest.raises(TypeError, match="expects a numpy array"):
        mgr.tensor_t([1, 2, 3])


def test_invalid_spirv_and_missing_bindings_raise(mgr, compile_glsl):
    t = mgr.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="invalid SPIR-V: magic number"):
        mgr.algorithm([t], b"\x00" * 64)
    with pytest.raises(ValueError, match="not a whole SPIR-V module"):
        mgr.algorithm([t], b"\x03\x02\x23\x07\x00")
    truncated = compile_glsl(COPY)[:-8]
    with pytest.raises(ValueError, match="invalid SPIR-V"):
        mgr.algorithm([t], truncated)
    with pytest.raises(ValueError, match="uses 2 bindings but 1 tensors were given"):
        mgr.algorithm([t], compile_glsl(COPY))
    with pytest.raises(TypeError, match="expected a kbench.runtime.Tensor"):
        mgr.algorithm([t, np.zeros(3)], compile_glsl(COPY))


def test_destroyed_objects_are_rejected(mgr, compile_glsl):
    a, b = mgr.tensor([1, 2, 3]), mgr.tensor([0, 0, 0])
    b.destroy()
    with pytest.raises(RuntimeError, match="tensor has been destroyed"):
        mgr.algorithm([a, b], compile_glsl(COPY))
    with pytest.raises(RuntimeError, match="tensor has been destroyed"):
        kp.OpTensorSyncDevice([b])
    seq = mgr.sequence()
    seq.destroy()
    with pytest.raises(RuntimeError, match="sequence has been destroyed"):
        seq.eval()


def test_storage_tensors_have_no_host_view(mgr):
    t = mgr.tensor([1, 2], kp.TensorTypes.storage)
    with pytest.raises(TypeError, match="storage tensors have no host memory"):
        t.data()


def test_record_requires_an_op_and_eval_requires_a_recording(mgr):
    seq = mgr.sequence()
    with pytest.raises(TypeError, match="record expects an op"):
        seq.record("not an op")
    with pytest.raises(RuntimeError, match="nothing recorded"):
        seq.eval()


def test_op_argument_errors(mgr):
    a, b = mgr.tensor([1, 2, 3]), mgr.tensor_t(np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="must match"):
        kp.OpTensorCopy([a, b])
    with pytest.raises(ValueError, match="needs at least 2"):
        kp.OpTensorCopy([a])
    with pytest.raises(ValueError, match="exactly 3 tensors"):
        kp.OpMult([a, a], mgr.algorithm())
    with pytest.raises(ValueError, match="outside the 12-byte source"):
        kp.OpTensorCopyRegion(a, a, 8, 0, 8)
    with pytest.raises(ValueError, match="overruns the 12-byte tensor"):
        kp.OpTensorWrite(a, b"\x00" * 16)
    with pytest.raises(TypeError, match="read-only"):
        kp.OpTensorRead(a, b"\x00" * 4)


def test_byte_range_ops_write_read_and_copy_overlapping(mgr):
    t = mgr.buffer(64)
    seq = mgr.sequence()
    seq.eval(kp.OpTensorWrite(t, bytes(range(64))))
    seq.eval(kp.OpTensorCopyRegion(t, t, 0, 8, 32))  # overlapping ranges of one buffer
    out = bytearray(64)
    seq.eval(kp.OpTensorRead(t, out))
    expect = bytearray(range(64))
    expect[8:40] = bytes(range(32))
    assert out == expect


def test_buffer_is_zero_filled(mgr):
    t = mgr.buffer(1000)
    out = np.ones(1000, np.uint8)
    mgr.sequence().eval(kp.OpTensorRead(t, out))
    assert not out.any()


def test_compile_source_reports_the_compiler_message():
    with pytest.raises(kp.ShaderCompileError, match="undeclared identifier"):
        kp.compile_source("#version 450\nlayout(local_size_x=1) in;\nvoid main() { nope = 1; }\n")


def test_compile_source_is_thread_safe():
    srcs = [COPY.replace("b[i] = a[i];", f"b[i] = a[i] + {k}.0;") for k in range(6)]
    results: dict[int, bytes] = {}

    def work(k):
        results[k] = kp.compile_source(srcs[k])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len({results[k] for k in range(6)}) == 6, "each thread must get its own shader's SPIR-V"
