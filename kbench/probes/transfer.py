"""Probe for host<->device transfer speed (issue 7: at least 45 GB/s each way).

Separates the two halves of a staged transfer: the host copy between a NumPy array and mapped
host-visible memory (1..16 threads), and the GPU's DMA between that memory and device memory (GPU
timestamps); then times OpTensorSyncDevice/OpTensorSyncLocal end to end with the host clock.

    kbench probe transfer [--mib 256] [--repeats 5]
"""
from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import kbench.runtime as kp
from kbench.runtime.transfer import round_trip_errors


def host_copy_gbps(dst: np.ndarray, src: np.ndarray, threads: int, repeats: int) -> float:
    n = src.size
    parts = [slice(i * n // threads, (i + 1) * n // threads) for i in range(threads)]
    with ThreadPoolExecutor(threads) as ex:
        def once():
            list(ex.map(lambda s: np.copyto(dst[s], src[s]), parts))
        once()
        best = min(_timed(once) for _ in range(repeats))
    return n / best


def _timed(fn) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--checks", type=int, default=20, help="round trips per streaming check")
    a = ap.parse_args()
    n = a.mib << 20
    rng = np.random.default_rng(0)
    src = rng.integers(0, 255, n, dtype=np.uint8)
    plain = np.empty(n, np.uint8)
    with kp.Manager() as mgr:
        mp = mgr._mem_props
        print(f"# {mgr.get_device_properties()['device_name']}; cpus {os.cpu_count()}")
        for i in range(mp.memoryTypeCount):
            t = mp.memoryTypes[i]
            print(f"# memory type {i}: flags {t.propertyFlags:#x} heap {t.heapIndex} "
                  f"({mp.memoryHeaps[t.heapIndex].size / 2**30:.1f} GiB)")
        host = mgr.buffer(n, kp.TensorTypes.host)
        dev = mgr.buffer(n, kp.TensorTypes.storage)
        print(f"# staging-like host tensor: memory type {host._buffer.memory_type}")
        mapped = host.data()
        for threads in (1, 2, 4, 8, 16):
            up = host_copy_gbps(mapped, src, threads, a.repeats)
            down = host_copy_gbps(plain, mapped, threads, a.repeats)
            mem = host_copy_gbps(plain, src, threads, a.repeats)
            print(f"host copy {threads:2d} threads: numpy->mapped {up:6.1f} GB/s, mapped->numpy {down:6.1f} GB/s, "
                  f"numpy->numpy {mem:6.1f} GB/s", flush=True)
        for name, pair in (("DMA host->device", [host, dev]), ("DMA device->host", [dev, host])):
            seq = mgr.sequence(total_timestamps=2 * a.repeats + 2)
            for _ in range(a.repeats):
                seq.record(kp.OpTensorCopy(pair))
            seq.eval()
            seq.eval()
            ts = np.diff(seq.get_timestamps())[1:]
            print(f"{name}: {n / np.median(ts):6.1f} GB/s (GPU timestamps, median of {len(ts)})", flush=True)
            seq.destroy()
        t = mgr.tensor_t(src.view(np.float32), kp.TensorTypes.device)
        # -1: zero copy (the DMA reads/writes the tensor's imported host memory); 0: staged, one
        # whole copy each way (host copy, then DMA); else staged and streamed in chunks of that many MiB
        for chunk_mib in (-1, 0, 4, 8, 16):
            mgr.zero_copy_min_bytes = 1 if chunk_mib == -1 else n + 1
            mgr.stream_min_bytes = n + 1 if chunk_mib == 0 else 1
            mgr.transfer_chunk_bytes = max(1, chunk_mib) << 20
            mode = {-1: "zero copy", 0: "staged whole"}.get(chunk_mib, f"staged, streamed in {chunk_mib} MiB chunks")
            if chunk_mib == -1 and t._host_import() is None:
                print("zero copy: not available on this device (VK_EXT_external_memory_host)")
                continue
            for name, op in (("OpTensorSyncDevice", kp.OpTensorSyncDevice([t])), ("OpTensorSyncLocal", kp.OpTensorSyncLocal([t]))):
                seq = mgr.sequence()
                seq.record(op)
                seq.eval()
                times = [_timed(seq.eval) for _ in range(a.repeats)]
                print(f"{name} {mode}: {n / np.median(times):6.1f} GB/s end to end (host clock, median; "
                      f"min-max {n / max(times):.1f}-{n / min(times):.1f})", flush=True)
                seq.destroy()
        ok = np.array_equal(t.data().view(np.uint8), src)
        print(f"round trip intact: {ok}")
        check_streaming(mgr, a.checks)


def check_streaming(mgr, rounds: int) -> None:
    """Round trips with one direction streamed at a time (the other whole), small uneven
    chunks and several tensors per sync, and zero copy ("zero"): counts tensors whose bytes came
    back wrong."""
    rng = np.random.default_rng(1)
    saved = os.environ.get("KBENCH_STREAM_TRANSFERS")
    for sizes, chunk in (([5, 30000, 12289], 4096), ([70001], 4096), ([3 << 20, 1 << 20], 1 << 20)):
        for mode in ("up", "down", "1", "zero"):
            os.environ["KBENCH_STREAM_TRANSFERS"] = mode if mode != "zero" else "0"
            mgr.stream_min_bytes, mgr.transfer_chunk_bytes = 2 * chunk, chunk
            mgr.zero_copy_min_bytes = 1 if mode == "zero" else 1 << 62
            ts = [mgr.tensor_t(np.zeros(n, np.float32)) for n in sizes]
            up, down = mgr.sequence(), mgr.sequence()
            up.record(kp.OpTensorSyncDevice(ts))
            down.record(kp.OpTensorSyncLocal(ts))
            bad = []
            for r in range(rounds):
                data = [rng.standard_normal(n).astype(np.float32) for n in sizes]
                bad += [f"round {r} {e}" for e in round_trip_errors(up, down, ts, data)]
            print(f"check streamed={mode:4s} sizes={sizes} chunk={chunk}: {len(bad)} tensors wrong in {rounds} rounds; "
                  + "; ".join(bad[:3]), flush=True)
            up.destroy(); down.destroy()
            for t in ts:
                t.destroy()
    if saved is None:
        os.environ.pop("KBENCH_STREAM_TRANSFERS", None)
    else:
        os.environ["KBENCH_STREAM_TRANSFERS"] = saved


if __name__ == "__main__":
    main()
