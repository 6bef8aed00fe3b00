"""Streamed staged transfers (kbench.runtime.transfer): chunked syncs and reads whose host copies
overlap the GPU's, checked byte for byte at sizes that split into many uneven chunks."""
from __future__ import annotations

import numpy as np
import pytest

import kbench.runtime as kp
from kbench.runtime import transfer
from kbench.runtime.transfer import StagedTransfer, plan_chunks

SMALL_CHUNK = 1 << 12


def _streaming(mgr, chunk: int = SMALL_CHUNK) -> None:
    mgr.stream_min_bytes = 2 * chunk
    mgr.transfer_chunk_bytes = chunk


def _round_trip(up, down, ts, data, round_: int) -> None:
    errors = transfer.round_trip_errors(up, down, ts, data)
    assert not errors, f"round {round_}: " + "; ".join(errors)


def test_plan_chunks_starts_each_range_on_the_alignment():
    chunks = plan_chunks([("a", 0, 20), ("b", 0, 5000), ("c", 0, 3)], 4096, align=4096)
    assert [(c.host, c.staging_offset, c.size) for c in chunks] == [
        (0, 0, 20), (1, 4096, 4096), (1, 8192, 904), (2, 12288, 3)]


def test_plan_chunks_covers_every_byte_once_in_staging_order():
    chunks = plan_chunks([("a", 0, 10_000), ("b", 64, 4096), ("c", 8, 1)], 4096)
    assert [(c.host, c.host_offset, c.size) for c in chunks] == [
        (0, 0, 4096), (0, 4096, 4096), (0, 8192, 1808), (1, 0, 4096), (2, 0, 1)]
    assert [c.staging_offset for c in chunks] == [0, 4096, 8192, 10_000, 14_096]
    assert [c.device_offset for c in chunks] == [0, 4096, 8192, 64, 8]


def test_host_copy_splits_large_copies_and_rejects_size_mismatch(monkeypatch):
    monkeypatch.setattr(transfer, "PARALLEL_MIN_BYTES", 1 << 10)
    monkeypatch.setattr(transfer, "PIECE_BYTES", 1 << 10)
    src = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8)
    dst = np.zeros_like(src)
    transfer.host_copy(dst, src)
    assert np.array_equal(dst, src)
    with pytest.raises(ValueError, match="destination has 10 bytes, source 100003"):
        transfer.host_copy(np.zeros(10, np.uint8), src)


@pytest.mark.parametrize("sizes", [[70_001], [5, 30_000, 12_289], [4096 * 3]])
def test_streamed_sync_device_then_local_round_trips_exactly(mgr, sizes):
    _streaming(mgr)
    rng = np.random.default_rng(len(sizes))
    data = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    ts = [mgr.tensor_t(np.zeros(n, np.float32)) for n in sizes]
    up, down = mgr.sequence(), mgr.sequence()
    up.record(kp.OpTensorSyncDevice(ts))
    down.record(kp.OpTensorSyncLocal(ts))
    assert up.ops()[0]._transfer.streamed and down.ops()[0]._transfer.streamed
    for round_ in range(2):  # the recorded sequences are evaluated again with new data
        _round_trip(up, down, ts, [d + round_ for d in data], round_)


def test_streamed_read_of_a_range_stays_inside_its_output(mgr):
    _streaming(mgr)
    data = np.random.default_rng(3).integers(0, 256, 50_000, dtype=np.uint8)
    t = mgr.tensor_t(data)
    mgr.sequence().eval(kp.OpTensorSyncDevice([t]))
    guard = 64
    out = np.full(30_001 + 2 * guard, 0xA5, np.uint8)
    seq = mgr.sequence()
    seq.eval(kp.OpTensorRead(t, out[guard:-guard], 7))
    assert seq.ops()[0]._transfer.streamed
    assert np.array_equal(out[guard:-guard], data[7:7 + 30_001])
    assert (out[:guard] == 0xA5).all() and (out[-guard:] == 0xA5).all(), "the read wrote outside its output"


def test_streamed_download_completes_through_a_timed_wait(mgr):
    """eval_await with a timeout skips the overlapped copy-out; the copies happen after the wait."""
    _streaming(mgr)
    data = np.arange(40_000, dtype=np.float32)
    t = mgr.tensor_t(data)
    mgr.sequence().eval(kp.OpTensorSyncDevice([t]))
    t.data()[:] = 0
    seq = mgr.sequence()
    seq.record(kp.OpTensorSyncLocal([t])).eval_async()
    while not seq.eval_await(1_000_000):
        pass
    assert np.array_equal(t.data(), data)


def test_small_transfers_and_disabled_streaming_are_recorded_whole(mgr, monkeypatch):
    t = mgr.tensor_t(np.ones(1000, np.float32))
    op = kp.OpTensorSyncDevice([t])
    seq = mgr.sequence().eval(op)
    assert not op._transfer.streamed, "a 4000-byte sync below stream_min_bytes was streamed"
    monkeypatch.setenv("KBENCH_STREAM_TRANSFERS", "0")
    _streaming(mgr)
    op2 = kp.OpTensorSyncLocal([t])
    seq2 = mgr.sequence().eval(op2)
    assert not op2._transfer.streamed, "KBENCH_STREAM_TRANSFERS=0 did not turn streaming off"
    seq.destroy()
    seq2.destroy()
    assert np.array_equal(t.data(), np.ones(1000, np.float32))


def test_streamed_transfers_free_their_events(mgr):
    _streaming(mgr)
    t = mgr.tensor_t(np.ones(20_000, np.float32))
    for _ in range(50):
        seq = mgr.sequence()
        seq.record(kp.OpTensorSyncDevice([t])).record(kp.OpTensorSyncLocal([t])).eval()
        assert mgr.get_stats()["events"] == 2 * -(-80_000 // SMALL_CHUNK)
        seq.rerecord()  # re-recording reuses the events
        seq.eval()
        seq.destroy()
        assert mgr.get_stats()["events"] == 0, f"events left after destroy: {mgr.get_stats()['events']}"


def test_failed_streamed_upload_raises_and_leaves_the_gpu_unblocked(mgr, monkeypatch):
    _streaming(mgr)
    t = mgr.tensor_t(np.ones(30_000, np.float32))
    seq = mgr.sequence()
    seq.record(kp.OpTensorSyncDevice([t]))

    def broken(dst, src, **kw):
        raise MemoryError("copy failed on purpose")

    monkeypatch.setattr(transfer.np, "copyto", broken)
    with pytest.raises(MemoryError, match="on purpose"):
        seq.eval()
    monkeypatch.undo()
    assert not seq.is_running(), "the sequence was left running after a failed upload"
    seq.eval()  # the GPU was released (every event set); the sequence works again
    t.data()[:] = 0
    mgr.sequence().eval(kp.OpTensorSyncLocal([t]))
    assert np.array_equal(t.data(), np.ones(30_000, np.float32))


@pytest.mark.parametrize("name, value", [("stream_min_bytes", 0), ("transfer_chunk_bytes", -4), ("transfer_chunk_bytes", 1.5)])
def test_transfer_settings_reject_non_positive_ints(mgr, name, value):
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        setattr(mgr, name, value)


def test_transfer_chunk_bytes_must_be_whole_pages(mgr):
    with pytest.raises(ValueError, match="multiple of 4096.*got 5000"):
        mgr.transfer_chunk_bytes = 5000


def test_staged_transfer_rejects_unknown_direction(mgr):
    with pytest.raises(ValueError, match="direction must be 'up' or 'down'"):
        StagedTransfer(mgr, "sideways", [])


# --- zero copy: the DMA reads and writes the tensor's imported host memory ------------------------

def _zero_copy(mgr) -> None:
    if not mgr._host_import_align:
        pytest.skip(f"{mgr.get_device_properties()['device_name']} lacks VK_EXT_external_memory_host")
    mgr.zero_copy_min_bytes = 1


def test_zero_copy_syncs_round_trip_exactly_without_staging(mgr):
    _zero_copy(mgr)
    sizes = [5, 30_000, 12_289]
    rng = np.random.default_rng(7)
    ts = [mgr.tensor_t(np.zeros(n, np.float32)) for n in sizes]
    up, down = mgr.sequence(), mgr.sequence()
    up.record(kp.OpTensorSyncDevice(ts))
    down.record(kp.OpTensorSyncLocal(ts))
    for op in up.ops() + down.ops():
        assert op._transfer is None and len(op._direct) == 3, "zero-copy syncs went through staging"
    assert mgr.get_stats()["host_imports"] == 3
    for round_ in range(3):
        _round_trip(up, down, ts, [rng.standard_normal(n).astype(np.float32) for n in sizes], round_)


def test_zero_copy_imports_are_freed_with_their_tensors_and_views_stay_valid(mgr):
    _zero_copy(mgr)
    before = mgr.get_stats()["buffers"]
    for i in range(200):
        t = mgr.tensor_t(np.full(3000, i, np.float32))
        seq = mgr.sequence()
        seq.eval(kp.OpTensorSyncDevice([t]))
        view = t.data()
        seq.destroy()
        t.destroy()
        assert mgr.get_stats()["host_imports"] == 0, f"cycle {i}: import outlived its tensor"
        assert (view == i).all(), "a data() view held past destroy changed"
    assert mgr.get_stats()["buffers"] == before


def test_zero_copy_sync_of_a_destroyed_tensor_raises_before_submitting(mgr):
    _zero_copy(mgr)
    t = mgr.tensor_t(np.ones(4096, np.float32))
    seq = mgr.sequence()
    seq.record(kp.OpTensorSyncLocal([t]))
    t.destroy()
    with pytest.raises(RuntimeError, match="tensor has been destroyed"):
        seq.eval()
    assert not seq.is_running()


def test_zero_copy_off_by_environment_or_threshold(mgr, monkeypatch):
    _zero_copy(mgr)
    t = mgr.tensor_t(np.ones(4096, np.float32))
    monkeypatch.setenv("KBENCH_ZERO_COPY", "0")
    op = kp.OpTensorSyncDevice([t])
    seq = mgr.sequence().eval(op)
    assert op._direct == [] and op._staged == [t], "KBENCH_ZERO_COPY=0 did not turn zero copy off"
    monkeypatch.delenv("KBENCH_ZERO_COPY")
    mgr.zero_copy_min_bytes = 1 << 30
    seq.rerecord()
    assert op._direct == [], "a tensor below zero_copy_min_bytes was imported"
    seq.destroy()
    with pytest.raises(ValueError, match="zero_copy_min_bytes must be a positive int"):
        mgr.zero_copy_min_bytes = 0


@pytest.mark.parametrize("make_op", [
    lambda t: kp.OpTensorSyncLocal([t]), lambda t: kp.OpTensorSyncDevice([t]),
    lambda t: kp.OpTensorRead(t, np.zeros(16, np.uint8)), lambda t: kp.OpTensorWrite(t, np.ones(16, np.uint8))],
    ids=["sync_local", "sync_device", "read", "write"])
def test_staged_transfer_of_a_destroyed_tensor_raises_before_submitting(mgr, make_op):
    t = mgr.tensor_t(np.ones(64, np.float32))
    keep = mgr.tensor_t(np.ones(64, np.float32))  # the sequence stays usable for other work
    seq = mgr.sequence()
    seq.record(make_op(t))
    t.destroy()
    with pytest.raises(RuntimeError, match="tensor has been destroyed"):
        seq.eval()
    assert not seq.is_running(), "a transfer touching a destroyed tensor was submitted"
    seq.eval(kp.OpTensorSyncLocal([keep]))
