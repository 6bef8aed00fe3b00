"""The CUDA peer (`kbench bench --peer torch`): the same backend cases through PyTorch on CUDA.

`TorchBackend` implements the ComputeBackend ops with PyTorch on one CUDA device, so the very
same case declarations (inputs, references, byte and FLOP counts) run on it; timings come from
CUDA events around the same repeat loop. Results are recorded under the backend name
"torch-cuda". Where PyTorch or CUDA is missing, `availability()` says why and the runner records
the peer as unavailable.

Choices that make the peer the path a user would otherwise pick: TF32 is off for fp32 matmul
(kbench's fp32 matmul is held to float32 accuracy); quantized weights are dequantized once per
weight buffer (cached until the buffer is written again) and multiplied in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kbench.backend.base import BufferHandle, ComputeBackend, DeviceInfo
from kbench.backend.op_table import DEVICE_ONLY_OPS
from kbench.quant import DType

from .targets import Lane, Target
from .timing import GpuSamples

PEER_NAME = "torch-cuda"


def availability() -> tuple[bool, str]:
    """(True, "") when PyTorch with a CUDA device is usable, else (False, why not)."""
    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed (pip install torch)"
    except Exception as exc:  # noqa: BLE001 - a broken install is "unavailable", with the reason
        return False, f"PyTorch failed to import: {type(exc).__name__}: {exc}"
    if not torch.cuda.is_available():
        return False, f"CUDA is not available to PyTorch {torch.__version__}"
    return True, ""


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


class TorchBackend(ComputeBackend):
    """ComputeBackend on PyTorch/CUDA: buffers are uint8 CUDA tensors viewed as float32."""

    def __init__(self, device: int = 0) -> None:
        import torch

        super().__init__()
        self.torch = torch
        self.dev = torch.device("cuda", device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self._bufs: dict[int, Any] = {}
        self._writes: dict[int, int] = {}
        self._dequant: dict[tuple, tuple[int, Any]] = {}
        self._angles: dict[tuple, tuple[Any, Any]] = {}

    def name(self) -> str:
        return PEER_NAME

    def device_info(self) -> DeviceInfo:
        p = self.torch.cuda.get_device_properties(self.dev)
        return DeviceInfo(p.name, PEER_NAME, int(p.total_memory), int(p.multi_processor_count))

    # -- storage -----------------------------------------------------------------------------------
    def _raw(self, h: BufferHandle) -> Any:
        return self._bufs[h.id]

    def _f32(self, h: BufferHandle, start: int = 0, count: int | None = None) -> Any:
        raw = self._bufs[h.id]
        if count is None:
            count = h.size_elems - start
        return raw[4 * start:4 * (start + count)].view(self.torch.float32)

    def _touch(self, h: BufferHandle) -> None:
        self._writes[h.id] = self._writes.get(h.id, 0) + 1

    def _allocate(self, handle: BufferHandle) -> None:
        padded = -(-handle.size_bytes // 4) * 4
        self._bufs[handle.id] = self.torch.zeros(padded, dtype=self.torch.uint8, device=self.dev)

    def _free(self, handle: BufferHandle) -> None:
        self._bufs.pop(handle.id, None)
        self._writes.pop(handle.id, None)
        self._dequant = {k: v for k, v in self._dequant.items() if k[0] != handle.id}

    def _close(self) -> None:
        self._bufs.clear()
        self._dequant.clear()

    def _copy_to_device(self, data: memoryview, handle: BufferHandle) -> None:
        src = self.torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
        self._raw(handle)[:src.numel()].copy_(src)
        self._touch(handle)

    def _copy_from_device(self, handle: BufferHandle, data: memoryview) -> None:
        n = len(data)
        host = self._raw(handle)[:n].cpu().numpy()  # .cpu() waits for the stream
        np.frombuffer(data, dtype=np.uint8)[:] = host

    def _copy_buffer(self, src: BufferHandle, dst: BufferHandle, size: int) -> None:
        self._raw(dst)[:size].copy_(self._raw(src)[:size])
        self._touch(dst)

    def _copy_buffer_offset(self, src: BufferHandle, dst: BufferHandle, src_offset: int, dst_offset: int,
                            size: int) -> None:
        self._raw(dst)[dst_offset:dst_offset + size].copy_(self._raw(src)[src_offset:src_offset + size])
        self._touch(dst)

    def _synchronize(self) -> None:
        self.torch.cuda.synchronize(self.dev)

    # -- ops -----------------------------------------------------------------------------------------
    def _matmul(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        t = self.torch
        t.matmul(self._f32(a, 0, m * k).view(m, k), self._f32(b, 0, k * n).view(k, n),
                 out=self._f32(out, 0, m * n).view(m, n))
        self._touch(out)

    def matmul_f16(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        """The peer of VulkanBackend.matmul_f16: torch.matmul on float16 tensors, as a user would
        write it, so the result is float16 (cuBLAS accumulates in fp32 and rounds the output once
        to half: an NMSE of about 8e-8, inside matmul_f16's 1e-6), then stored as float32 in out.
        The fp16 -> fp32 copy is part of the timed op (one extra elementwise pass over m*n)."""
        from kbench.backend.base import check_matmul_f16

        ha, hb, ho, m, n, k = check_matmul_f16(self, a, b, out, m, n, k)
        t = self.torch
        A = self._raw(ha)[:2 * m * k].view(t.float16).view(m, k)
        B = self._raw(hb)[:2 * k * n].view(t.float16).view(k, n)
        self._f32(ho, 0, m * n).view(m, n).copy_(t.matmul(A, B))
        self._touch(ho)

    def _softmax(self, input: BufferHandle, output: BufferHandle, size: int) -> None:
        self._f32(output, 0, size).copy_(self.torch.softmax(self._f32(input, 0, size), dim=0))
        self._touch(output)

    def _rms_norm(self, input: BufferHandle, weight: BufferHandle, output: BufferHandle, size: int,
                  eps: float) -> None:
        x = self._f32(input, 0, size)
        scale = self.torch.rsqrt(self.torch.mean(x * x) + float(np.float32(eps)))
        self._f32(output, 0, size).copy_(x * scale * self._f32(weight, 0, size))
        self._touch(output)

    def _cos_sin(self, pos: int, head_dim: int, freq_base: float) -> tuple[Any, Any]:
        key = (pos, head_dim, float(np.float32(freq_base)))
        if key not in self._angles:
            i = np.arange(head_dim // 2, dtype=np.float64)
            theta = pos * key[2] ** (-2.0 * i / head_dim)  # float64 angles: accurate at long contexts
            cos = self.torch.from_numpy(np.cos(theta).astype(np.float32)).to(self.dev)
            sin = self.torch.from_numpy(np.sin(theta).astype(np.float32)).to(self.dev)
            if len(self._angles) > 64:
                self._angles.clear()
            self._angles[key] = (cos, sin)
        return self._angles[key]

    def _rope(self, q: BufferHandle, k: BufferHandle, pos: int, head_dim: int, freq_base: float,
              n_heads_q: int, n_heads_k: int) -> None:
        cos, sin = self._cos_sin(pos, head_dim, freq_base)
        for h, heads in ((q, n_heads_q), (k, n_heads_k)):
            v = self._f32(h, 0, heads * head_dim).view(heads, head_dim // 2, 2)
            x0, x1 = v[..., 0].clone(), v[..., 1].clone()
            v[..., 0] = x0 * cos - x1 * sin
            v[..., 1] = x0 * sin + x1 * cos
            self._touch(h)

    def _silu(self, input: BufferHandle, output: BufferHandle, size: int) -> None:
        self._f32(output, 0, size).copy_(self.torch.nn.functional.silu(self._f32(input, 0, size)))
        self._touch(output)

    def _element_mul(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        self.torch.mul(self._f32(a, 0, size), self._f32(b, 0, size), out=self._f32(output, 0, size))
        self._touch(output)

    def _add(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        self.torch.add(self._f32(a, 0, size), self._f32(b, 0, size), out=self._f32(output, 0, size))
        self._touch(output)

    def _cache_rows(self, h: BufferHandle, seq_len: int, head_dim: int, offset: int, stride: int) -> Any:
        return self._f32(h).as_strided((seq_len, head_dim), (stride, 1), self._f32(h).storage_offset() + offset)

    def _attn_score(self, q: BufferHandle, k_cache: BufferHandle, scores: BufferHandle, head_dim: int,
                    seq_len: int, head_offset: int, kv_offset: int, kv_stride: int) -> None:
        keys = self._cache_rows(k_cache, seq_len, head_dim, kv_offset, kv_stride)
        qh = self._f32(q, head_offset, head_dim)
        self.torch.mv(keys, qh, out=self._f32(scores, 0, seq_len))
        self._f32(scores, 0, seq_len).mul_(1.0 / math.sqrt(head_dim))
        self._touch(scores)

    def _attn_value(self, weights: BufferHandle, v_cache: BufferHandle, output: BufferHandle, head_dim: int,
                    seq_len: int, kv_offset: int, kv_stride: int, out_offset: int) -> None:
        values = self._cache_rows(v_cache, seq_len, head_dim, kv_offset, kv_stride)
        w = self._f32(weights, 0, seq_len)
        self.torch.mv(values.t(), w, out=self._f32(output, out_offset, head_dim))
        self._touch(output)

    def _weights(self, h: BufferHandle, n_rows: int, n_cols: int, dtype: DType) -> Any:
        if dtype == DType.F32:
            return self._f32(h, 0, n_rows * n_cols).view(n_rows, n_cols)
        key = (h.id, int(dtype), n_rows, n_cols)
        version = self._writes.get(h.id, 0)
        cached = self._dequant.get(key)
        if cached is None or cached[0] != version:
            from kbench.quant import dequantize, row_bytes

            raw = self._raw(h)[:n_rows * row_bytes(dtype, n_cols)].cpu().numpy().tobytes()
            w = self.torch.from_numpy(np.ascontiguousarray(dequantize(raw, dtype, (n_rows, n_cols)),
                                                           dtype=np.float32)).to(self.dev)
            self._dequant[key] = (version, w)
        return self._dequant[key][1]

    def _quantized_matmul(self, weights: BufferHandle, input: BufferHandle, output: BufferHandle, n_rows: int,
                          n_cols: int, dtype: DType) -> None:
        w = self._weights(weights, n_rows, n_cols, dtype)
        self.torch.mv(w, self._f32(input, 0, n_cols), out=self._f32(output, 0, n_rows))
        self._touch(output)


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


def cuda_event_timer(torch: Any):
    """GPU timer from CUDA events around `repeats` launches (the peer's counterpart of Vulkan
    timestamps).  Every case is timed as PyTorch runs eagerly: the calls issued from Python per
    sample ("stream").  Cases made only of GRAPH_OPS are also captured into a CUDA graph once and
    the graph replayed per sample ("replay", as the Vulkan side resubmits one command buffer), and
    the peer keeps the faster of the two: a graph is what a user would reach for where Python's
    issue rate limits the GPU, but it is not always faster (on the H200 a graph ran 1 GiB copies at
    2.7 TB/s against 4.2 eager, and 1 GiB silu 27% slower than eager launches), and a kbench
    figure is only claimed against the peer's best."""
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
        return GpuSamples(out, "replay", wall)

    def streamed(launch, repeats: int, policy, watch) -> GpuSamples:
        out = []
        for _ in range(policy.samples):
            def run() -> None:
                for i in range(repeats):
                    launch()
                    if i == 0 and watch is not None:
                        watch()
            out.append(elapsed_ns(run) / repeats)
        return GpuSamples(out, "stream")

    def timer(lane: Lane, launch, wait, repeats: int, policy, *, watch=None, ready=None,
              ops: tuple[str, ...] = ()) -> GpuSamples:
        eager = streamed(launch, repeats, policy, watch)
        graph = _capture_graph(torch, launch, repeats) if ops and set(ops) <= GRAPH_OPS else None
        if graph is None:
            return eager
        try:
            replay = replayed(graph, repeats, policy, watch, ready)
        finally:
            del graph
        best, other = sorted((eager, replay), key=lambda g: statistics.median(g.ns))
        best.other = {"method": other.method, "median_ns": statistics.median(other.ns)}
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
