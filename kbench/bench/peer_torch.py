"""The CUDA peer (`kbench bench --peer torch`): the backend cases on TorchBackend
(kbench.backend.torch_backend), timed with CUDA events around the same repeat loop, and the peer's
own peaks; `implementation()` is its entry in kbench.bench.implementations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kbench.backend.op_table import DEVICE_ONLY_OPS
from kbench.backend.torch_backend import PEER_NAME, TorchBackend, availability

from .targets import Lane, Target
from .timing import GpuSamples, gpu_repeats

if TYPE_CHECKING:
    from .implementations import Implementation


def peer_properties() -> dict[str, Any]:
    """Device-properties stand-in for the CUDA device PyTorch uses."""
    import torch

    p = torch.cuda.get_device_properties(0)
    feats = ("float64", "int64", "int16", "float16", "int8", "storage_buffer_8bit", "storage_buffer_16bit")
    return {
        "index": 0, "device_name": p.name, "vendor_name": "NVIDIA", "vendor_id": 0x10DE, "device_id": 0,
        "device_type": "discrete_gpu", "driver_name": PEER_NAME,
        "driver_info": f"PyTorch {torch.__version__}, CUDA {torch.version.cuda}",
        "driver_version": str(torch.version.cuda or ""), "api_version": f"CUDA {torch.version.cuda}",
        "queue_families": [{"index": 0, "flags": ["compute"], "count": 1, "timestamp_valid_bits": 64}],
        "features": {f: True for f in feats}, "memory_bytes": int(p.total_memory),
        "device_local_bytes": int(p.total_memory), "timestamps_supported": True,
    }


#: backend ops that are device work only (no host copies, no synchronize): a case made of these
#: can be captured into a CUDA graph
GRAPH_OPS = DEVICE_ONLY_OPS


def _capture_graph(torch: Any, launch, repeats: int) -> Any:
    """A CUDA graph of `repeats` calls of `launch`, or None where capture fails."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as graph capture asks
        launch()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(repeats):
                launch()
    except Exception:  # noqa: BLE001 - an op the graph cannot hold: time the stream instead
        torch.cuda.synchronize()
        return None
    return graph


#: samples of the peer's eager timing taken first where a CUDA graph is timed too; the rest of
#: policy.samples are taken only when eager turns out the faster
EAGER_PROBE_SAMPLES = 3


def cuda_event_timer(torch: Any):
    """GPU timer from CUDA events around `repeats` launches (the peer's counterpart of Vulkan
    timestamps).  Every case is timed as PyTorch runs eagerly: the calls issued from Python per
    sample ("stream").  Cases made only of GRAPH_OPS are also captured into a CUDA graph once and
    the graph replayed per sample ("replay", as the Vulkan side resubmits one command buffer), and
    the peer keeps the faster of the two: a graph is what a user would reach for where Python's
    issue rate limits the GPU, but it is not always faster (on the H200 a graph ran 1 GiB copies at
    2.7 TB/s against 4.2 eager, and 1 GiB silu 27% slower than eager launches), and a kbench
    figure is only claimed against the peer's best.  Where both run, eager is first timed with
    EAGER_PROBE_SAMPLES samples and gets the rest of its samples only when it beats the graph:
    the loser's median (``GpuSamples.other``) is all the report keeps of it."""
    import statistics
    import time

    def elapsed_ns(run) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e6  # ms -> ns

    def replayed(graph, repeats: int, policy, watch, ready) -> GpuSamples:
        graph.replay()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        while ready is not None and not ready() and time.perf_counter() - t0 < policy.settle_max_s:
            graph.replay()
            torch.cuda.synchronize()
        out, wall = [], []
        for _ in range(policy.samples):
            t1 = time.perf_counter_ns()
            out.append(elapsed_ns(graph.replay) / repeats)
            wall.append((time.perf_counter_ns() - t1) / repeats)
            if watch is not None:
                watch()
        return GpuSamples(out, "replay", wall, repeats=repeats)

    def streamed(launch, repeats: int, n: int, watch) -> list[float]:
        out = []
        for _ in range(n):
            def run() -> None:
                for i in range(repeats):
                    launch()
                    if i == 0 and watch is not None:
                        watch()
            out.append(elapsed_ns(run) / repeats)
        return out

    def timer(lane: Lane, launch, wait, repeats: int, policy, *, watch=None, ready=None,
              ops: tuple[str, ...] = ()) -> GpuSamples:
        phases: dict[str, float] = {}
        t0 = time.perf_counter()
        if not (ops and set(ops) <= GRAPH_OPS):
            eager = GpuSamples(streamed(launch, repeats, policy.samples, watch), "stream")
            eager.phases = {"peer_eager": time.perf_counter() - t0}
            return eager
        probe = min(EAGER_PROBE_SAMPLES, policy.samples)
        eager_ns = streamed(launch, repeats, probe, watch)
        t1 = time.perf_counter()
        phases["peer_eager"] = t1 - t0
        # the graph holds as many calls as keep the device busy for a sample (timing.gpu_repeats;
        # the eager calls' time, host gaps included, bounds a call's from above)
        n = gpu_repeats(repeats, min(eager_ns), policy)
        graph = _capture_graph(torch, launch, n)
        replay = None
        if graph is not None:
            try:
                replay = replayed(graph, n, policy, watch, ready)
            finally:
                del graph
        t2 = time.perf_counter()
        phases["peer_graph"] = t2 - t1
        if replay is None or statistics.median(eager_ns) < statistics.median(replay.ns):
            eager_ns += streamed(launch, repeats, policy.samples - probe, watch)
            phases["peer_eager"] += time.perf_counter() - t2
            best, other = GpuSamples(eager_ns, "stream"), replay
        else:
            best, other = replay, GpuSamples(eager_ns, "stream")
        if other is not None:
            best.other = {"method": other.method, "median_ns": statistics.median(other.ns)}
        best.phases = phases
        return best

    return timer


def open_peer_target() -> Target:
    """A Target on TorchBackend; raises RuntimeError with the reason when unavailable."""
    ok, why = availability()
    if not ok:
        raise RuntimeError(f"peer {PEER_NAME} unavailable: {why}")
    import torch

    be = TorchBackend(0)
    t = Target(PEER_NAME, 0, peer_properties(), "single", [Lane(backend=be)], gpu_timer=cuda_event_timer(torch))
    t.closers.append(be.close)
    return t


# ---- the peer's own peaks: the same figures kbench measures on Vulkan, through CUDA ----------

MiB = 1 << 20
#: the copy peak's buffer size: the size kbench's Vulkan copy peak uses on GPUs, so that the two
#: timers (Vulkan timestamps, CUDA events) see equal-sized copies
PEER_COPY_BYTES = 256 * MiB
PEER_PEAKS = ("peak.copy_bandwidth", "peak.dispatch_latency", "peak.h2d", "peak.d2h")


def _peer_copy_bandwidth(torch: Any) -> dict[str, Any]:
    from .timing import stats

    src = torch.empty(PEER_COPY_BYTES, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(200):  # warm-up: about 30 ms of copies, and the clocks up
        dst.copy_(src)
    # back to back with an event between copies, as the Vulkan copy peak takes a timestamp
    # between dispatches of one submission: a wait per copy would let the GPU idle between
    # samples and time the clock governor as much as the copy
    events = [torch.cuda.Event(enable_timing=True) for _ in range(21)]
    events[0].record()
    for e in events[1:]:
        dst.copy_(src)
        e.record()
    events[-1].synchronize()
    times = [a.elapsed_time(b) * 1e6 for a, b in zip(events, events[1:])]
    s = stats(times, 1)
    return {"value": 2 * PEER_COPY_BYTES / s["median"], "gpu_ns": s, "bytes": 2 * PEER_COPY_BYTES,
            "params": {"buffer_bytes": PEER_COPY_BYTES, "timer": "cuda events"}}


def _peer_dispatch_latency(torch: Any) -> dict[str, Any]:
    import time

    from .timing import stats

    x = torch.zeros(1, device="cuda")
    for _ in range(50):
        x.add_(1)
        torch.cuda.synchronize()
    samples = []
    for _ in range(300):
        t0 = time.perf_counter_ns()
        x.add_(1)  # the smallest kernel launch PyTorch makes, then wait for it
        torch.cuda.synchronize()
        samples.append(float(time.perf_counter_ns() - t0))
    s = stats(samples, 1)
    return {"value": s["median"], "host_ns": s, "params": {"what": "tensor.add_ on 1 element + cuda.synchronize"}}


def _peer_transfer(direction: str):
    """Host-clock transfer of the size kbench's transfer peaks use, between ordinary (pageable)
    host memory, as a NumPy array is, and the GPU; the pinned-memory figure goes in params."""
    def measure(torch: Any) -> dict[str, Any]:
        import time

        from .timing import stats

        gpu = torch.empty(PEER_COPY_BYTES, dtype=torch.uint8, device="cuda").random_()

        def median_ns(host) -> dict:
            def once():
                if direction == "h2d":
                    gpu.copy_(host)
                else:
                    host.copy_(gpu)
                torch.cuda.synchronize()
            for _ in range(3):
                once()
            samples = []
            for _ in range(10):
                t0 = time.perf_counter_ns()
                once()
                samples.append(float(time.perf_counter_ns() - t0))
            return stats(samples, 1)

        pageable = median_ns(torch.empty(PEER_COPY_BYTES, dtype=torch.uint8))
        pinned = median_ns(torch.empty(PEER_COPY_BYTES, dtype=torch.uint8, pin_memory=True))
        return {"value": PEER_COPY_BYTES / pageable["median"], "host_ns": pageable, "bytes": PEER_COPY_BYTES,
                "params": {"bytes": PEER_COPY_BYTES, "host_memory": "pageable",
                           "pinned_gbps": round(PEER_COPY_BYTES / pinned["median"], 2)}}
    return measure


def run_peer_peak(name: str) -> dict[str, Any]:
    """A peak record for the peer (same names and units as kbench.bench.peaks), or an error record."""
    from .peaks import get_peak, measure_peak, peak_failure

    peak = get_peak(name)
    fn = {"peak.copy_bandwidth": _peer_copy_bandwidth, "peak.dispatch_latency": _peer_dispatch_latency,
          "peak.h2d": _peer_transfer("h2d"), "peak.d2h": _peer_transfer("d2h")}.get(name)
    if fn is None:
        return peak_failure(name, "unsupported", f"the {PEER_NAME} peer does not measure {name}")

    def measure() -> dict[str, Any]:
        import torch

        return fn(torch)
    return measure_peak(peak, measure)


def implementation() -> "Implementation":
    """The CUDA peer's entry in kbench.bench.implementations (``--peer torch``)."""
    from .implementations import Implementation
    from .queues import QueueConfig

    def devices() -> list[dict[str, Any]]:
        ok, why = availability()
        if not ok:
            raise RuntimeError(f"peer {PEER_NAME} unavailable: {why}")
        return [peer_properties()]

    return Implementation(
        kind="torch", name=PEER_NAME, backend=PEER_NAME, description="PyTorch on CUDA (the CUDA peer)",
        devices=devices, configs=lambda props: [QueueConfig("single", (0,), ((0, 0, 0),))],
        open=lambda props, config: open_peer_target(), layers=("backend",), peaks=PEER_PEAKS,
        measure_peak=lambda target, name: run_peer_peak(name), availability=availability, peer=True)

