"""The torch peer's GPU timer (kbench.bench.peer_torch.cuda_event_timer) on a stand-in for
torch.cuda: eager and CUDA-graph timings, and which one the peer keeps."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

from kbench.bench.peer_torch import cuda_event_timer
from kbench.bench.timing import TimingPolicy


class _FakeCuda:
    """A GPU clock in ms that launches advance; a graph replays its captured launches at
    `graph_ms` each."""

    def __init__(self, eager_ms: float, graph_ms: float, capture_fails: bool = False):
        self.now, self.eager_ms, self.graph_ms = 0.0, eager_ms, graph_ms
        self.capturing: list | None = None
        self.capture_fails = capture_fails
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.t = None

            def record(self):
                self.t = cuda.now

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return end.t - self.t

        class Graph:
            def __init__(self):
                self.calls = 0

            def replay(self):
                cuda.now += self.calls * cuda.graph_ms

        class Stream:
            def wait_stream(self, other):
                pass

        self.Event, self.CUDAGraph, self.Stream = Event, Graph, Stream

    def launch(self):
        if self.capturing is not None:
            if self.capture_fails:
                raise RuntimeError("operation not permitted when stream is capturing")
            self.capturing.append(1)
        else:
            self.now += self.eager_ms

    def synchronize(self):
        pass

    def current_stream(self):
        return self.Stream()

    @contextlib.contextmanager
    def stream(self, s):
        yield

    @contextlib.contextmanager
    def graph(self, g):
        self.capturing = []
        try:
            yield
        finally:
            g.calls, self.capturing = len(self.capturing), None


def _time(eager_ms, graph_ms, ops=("add",), capture_fails=False):
    cuda = _FakeCuda(eager_ms, graph_ms, capture_fails)
    timer = cuda_event_timer(SimpleNamespace(cuda=cuda))
    policy = TimingPolicy(samples=3, settle_max_s=0.0)
    return timer(None, cuda.launch, None, 4, policy, ops=ops)


def test_the_faster_graph_is_kept_and_the_eager_figure_recorded():
    got = _time(eager_ms=0.010, graph_ms=0.004)
    assert got.method == "replay" and abs(got.ns[0] - 4000) < 1, f"expected the graph's 4 us per call, got {got}"
    assert got.other["method"] == "stream" and abs(got.other["median_ns"] - 10000) < 1, got.other
    assert got.wall_ns is not None and len(got.wall_ns) == 3


def test_the_faster_eager_launches_are_kept_when_the_graph_is_slower():
    got = _time(eager_ms=0.5, graph_ms=0.7)
    assert got.method == "stream" and abs(got.ns[0] - 5e5) < 1, f"expected eager 500 us per call, got {got}"
    assert got.other["method"] == "replay" and abs(got.other["median_ns"] - 7e5) < 1, got.other


def test_cases_with_host_work_are_not_captured():
    got = _time(eager_ms=0.010, graph_ms=0.001, ops=("copy_to_device", "copy_from_device"))
    assert got.method == "stream" and got.other is None, got


def test_a_capture_that_fails_falls_back_to_eager():
    got = _time(eager_ms=0.010, graph_ms=0.001, capture_fails=True)
    assert got.method == "stream" and got.other is None and abs(got.ns[0] - 1e4) < 1, got
