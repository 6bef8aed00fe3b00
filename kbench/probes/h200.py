"""Diagnostics for issue 7 on the H200 (device tool): the large-buffer slowdown and the
dispatch round trip, with the SM clock sampled through NVML while the work runs.

    kbench probe h200 [--out DIR] [--small]

Sections (each prints one compact table):
- large: per-call GPU time (timestamps) of add / silu / copy over 1 GiB buffers through the
  backend, call by call and in batches, fresh, after allocation churn, with a 65535-wide grid,
  and again while a CUDA context is alive; the SM clock seen during each series.
- roundtrip: submit-and-wait of a one-invocation dispatch: Sequence.eval, the raw calls with a
  blocking vkWaitForFences, the raw submit with a vkGetFenceStatus spin; torch launch + sync.
"""
from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np


class ClockSampler:
    """SM clock (MHz) and performance state every ~2 ms through NVML, in a thread."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as exc:  # noqa: BLE001
            print("no NVML:", exc)
            self._nvml = None
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._nvml is not None:
                n = self._nvml
                try:
                    sm = n.nvmlDeviceGetClockInfo(self._h, n.NVML_CLOCK_SM)
                    ps = n.nvmlDeviceGetPerformanceState(self._h)
                    self.samples.append((time.perf_counter(), sm, ps))
                except Exception:  # noqa: BLE001
                    pass
            time.sleep(0.002)

    def window(self, t0: float, t1: float) -> str:
        v = [s for s in self.samples if t0 <= s[0] <= t1]
        if not v:
            return "-"
        sm = [s[1] for s in v]
        ps = sorted({s[2] for s in v})
        return f"sm {min(sm)}-{max(sm)} MHz (median {int(np.median(sm))}), P{ps}"

    def stop(self) -> None:
        self._stop.set()


def series(be, fn, calls: int, batch: int) -> list[float]:
    """Per-call GPU ns: `calls` samples, each `batch` calls in one submission."""
    out = []
    for _ in range(calls):
        ns = be.measure_gpu_ns(lambda: [fn() for _ in range(batch)])
        out.append(ns / batch)
    return out


def fmt(name: str, ns: list[float], bytes_per_call: int, clocks: str) -> str:
    a = np.asarray(ns)
    gbps = bytes_per_call / np.median(a)
    fast = int(np.sum(a < 1.3 * a.min()))
    return (f"{name:42s} med {np.median(a) / 1e3:8.1f} us min {a.min() / 1e3:8.1f} max {a.max() / 1e3:8.1f}"
            f"  {gbps:7.0f} GB/s  fast {fast}/{len(a)}  {clocks}")


def large(args, sampler, rows, torch_alive=None) -> None:
    from kbench.backend import create_backend

    n = (1 << 20) if args.small else (256 << 20)
    nbytes = 4 * n
    kw = {}

    def run_set(tag: str, be) -> None:
        a, b, o = (be.allocate(nbytes) for _ in range(3))
        rng = np.random.default_rng(0)
        for h in (a, b):
            be.copy_to_device(rng.standard_normal(n, dtype=np.float32), h)
        be.synchronize()
        tests = [
            ("add call-by-call", lambda: be.add(a, b, o, n), 12 * n, 1),
            ("add batch of 8", lambda: be.add(a, b, o, n), 12 * n, 8),
            ("silu call-by-call", lambda: be.silu(a, o, n), 8 * n, 1),
            ("copy call-by-call", lambda: be.copy_buffer(a, o, nbytes), 8 * n, 1),
        ]
        for name, fn, nb, batch in tests:
            t0 = time.perf_counter()
            ns = series(be, fn, 6 if args.small else 24, batch)
            t1 = time.perf_counter()
            line = fmt(f"{tag}: {name}", ns, nb, sampler.window(t0, t1))
            print(line, flush=True)
            rows.append({"section": "large", "tag": tag, "test": name, "ns": ns, "clocks": sampler.window(t0, t1)})
        for h in (a, b, o):
            be.free(h)

    if torch_alive is None:
        be = create_backend("vulkan", **kw)
        mt = None
        try:
            h = be.allocate(nbytes)
            mt = be._tensor(h.id)._buffer.memory_type
            be.free(h)
        except Exception as exc:  # noqa: BLE001
            mt = f"? {exc}"
        print("memory type of a 1 GiB buffer:", mt, flush=True)
        run_set("fresh", be)
        # churn: many allocations and frees of assorted sizes, as a long bench run does
        rng = np.random.default_rng(1)
        live = []
        for i in range(60):
            size = int(rng.choice([1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30])) + int(rng.integers(0, 4096)) * 16
            live.append(be.allocate(size))
            if len(live) > 6:
                be.free(live.pop(int(rng.integers(0, len(live)))))
        for h in live:
            be.free(h)
        be.synchronize()
        run_set("after churn", be)
        be.close()
        be = create_backend("vulkan", grid_limit=65535)
        run_set("grid 65535 x y", be)
        be.close()
    else:
        be = create_backend("vulkan")
        run_set("CUDA context alive", be)
        be.close()


def roundtrip(args, sampler, rows) -> None:
    import kbench.runtime as kp
    from kbench.shaders import load_spirv
    from kbench.runtime._vk import ffi, lib, vk

    n = 300
    with kp.Manager() as mgr:
        out = mgr.buffer(16)
        algo = mgr.algorithm([out], load_spirv("peak_noop"), (1, 1, 1))
        seq = mgr.sequence(0)
        seq.record(kp.OpAlgoDispatch(algo))
        for _ in range(20):
            seq.eval()

        def timeit(name, fn):
            for _ in range(20):
                fn()
            t = []
            t0 = time.perf_counter()
            for _ in range(n):
                s = time.perf_counter_ns()
                fn()
                t.append(time.perf_counter_ns() - s)
            t1 = time.perf_counter()
            a = np.asarray(t, dtype=float)
            print(f"roundtrip {name:40s} med {np.median(a) / 1e3:7.1f} us  p10 {np.percentile(a, 10) / 1e3:7.1f}"
                  f"  p90 {np.percentile(a, 90) / 1e3:7.1f}  {sampler.window(t0, t1)}", flush=True)
            rows.append({"section": "roundtrip", "test": name, "ns": t})

        timeit("Sequence.eval", seq.eval)
        dev, q, fences, submit = mgr._device, seq._queue, seq._fences, seq._submit
        fence = fences[0]

        def raw_block():
            lib.vkResetFences(dev, 1, fences)
            lib.vkQueueSubmit(q, 1, submit, fence)
            lib.vkWaitForFences(dev, 1, fences, 1, 0xFFFFFFFFFFFFFFFF)

        def raw_spin():
            lib.vkResetFences(dev, 1, fences)
            lib.vkQueueSubmit(q, 1, submit, fence)
            while lib.vkGetFenceStatus(dev, fence) != vk.VK_SUCCESS:
                pass

        def raw_spin_then_block():
            lib.vkResetFences(dev, 1, fences)
            lib.vkQueueSubmit(q, 1, submit, fence)
            for _ in range(2000):
                if lib.vkGetFenceStatus(dev, fence) == vk.VK_SUCCESS:
                    return
            lib.vkWaitForFences(dev, 1, fences, 1, 0xFFFFFFFFFFFFFFFF)

        def raw_wait0_poll():
            lib.vkResetFences(dev, 1, fences)
            lib.vkQueueSubmit(q, 1, submit, fence)
            while lib.vkWaitForFences(dev, 1, fences, 1, 0) != vk.VK_SUCCESS:
                pass

        timeit("raw submit + vkWaitForFences", raw_block)
        timeit("raw submit + vkGetFenceStatus spin", raw_spin)
        timeit("raw submit + spin 2000 then block", raw_spin_then_block)
        timeit("raw submit + vkWaitForFences(0) poll", raw_wait0_poll)
        t = []
        for _ in range(200):
            s = time.perf_counter_ns()
            lib.vkGetFenceStatus(dev, fence)
            t.append(time.perf_counter_ns() - s)
        print(f"one vkGetFenceStatus call: {np.median(t) / 1e3:.2f} us", flush=True)
        seq.destroy()
        algo.destroy()
        out.destroy()


def torch_side(args, sampler, rows):
    import torch

    x = torch.zeros(1, device="cuda")
    for _ in range(50):
        x.add_(1)
        torch.cuda.synchronize()
    t = []
    t0 = time.perf_counter()
    for _ in range(300):
        s = time.perf_counter_ns()
        x.add_(1)
        torch.cuda.synchronize()
        t.append(time.perf_counter_ns() - s)
    a = np.asarray(t, float)
    print(f"roundtrip {'torch tiny add_ + synchronize':40s} med {np.median(a) / 1e3:7.1f} us  p10 "
          f"{np.percentile(a, 10) / 1e3:7.1f}  p90 {np.percentile(a, 90) / 1e3:7.1f}  "
          f"{sampler.window(t0, time.perf_counter())}", flush=True)
    rows.append({"section": "roundtrip", "test": "torch", "ns": t})
    n = (1 << 20) if args.small else (256 << 20)
    a_, b_, o_ = (torch.randn(n, device="cuda") for _ in range(3))
    for name, fn, nb in (("torch add", lambda: torch.add(a_, b_, out=o_), 12 * n),
                         ("torch copy", lambda: o_.copy_(a_), 8 * n)):
        ns = []
        t0 = time.perf_counter()
        for _ in range(24):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            ns.append(s.elapsed_time(e) * 1e6)
        print(fmt(name, ns, nb, sampler.window(t0, time.perf_counter())), flush=True)
        rows.append({"section": "large", "tag": "torch", "test": name, "ns": ns})
    return (a_, b_, o_)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--only", default="large,roundtrip,torch")
    args = ap.parse_args()
    sampler = ClockSampler()
    rows: list = []
    only = args.only.split(",")
    try:
        if "roundtrip" in only:
            roundtrip(args, sampler, rows)
        if "large" in only:
            large(args, sampler, rows)
        if "torch" in only:
            keep = torch_side(args, sampler, rows)
            if "large" in only:
                large(args, sampler, rows, torch_alive=keep)
    finally:
        sampler.stop()
        if args.out:
            with open(f"{args.out}/probe_h200.json", "w") as f:
                json.dump({"rows": rows, "clock_samples": sampler.samples[-20000:]}, f)


if __name__ == "__main__":
    main()
