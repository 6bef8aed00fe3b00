"""Where a case runs: a Target is one device opened in one queue configuration.

A target has one or more lanes. A lane is one place work can be issued independently: a
ComputeBackend bound to one queue (backend cases) and/or a kbench.runtime Manager plus the
queue index its sequences use (runtime cases). A case instance is split across the lanes: each
lane runs its own shard (own inputs), all shards are issued before any is awaited, and each
shard's result is checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Lane:
    """One independent stream of work."""

    backend: Any = None          # ComputeBackend (backend cases)
    kp: Any = None               # the kbench.runtime module (runtime cases)
    manager: Any = None          # kp.Manager (runtime cases, peaks)
    queue_index: int = 0         # index into the Manager's queues (sequence(queue_index))
    family: int = 0              # queue family index on the device
    queue: int = 0               # queue index inside the family

    @property
    def queue_id(self) -> list[int]:
        return [int(self.family), int(self.queue)]


@dataclass
class Target:
    """A device in one queue configuration, ready to run cases."""

    backend_name: str                          # "vulkan", "numpy", "torch-cuda"
    device_index: int
    props: dict[str, Any]                      # device properties (runtime's dict, or a stand-in)
    queue_config: str
    lanes: list[Lane]
    #: GPU timer: fn(lane, launch, repeats) -> list of ns per call, or None when not available
    gpu_timer: Callable[..., Any] | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)
    #: live SM clock reader (kbench.bench.clocks.SmClock) for warm-up and clock records
    sm_clock: Any = None
    #: ClockKeeper keeping the GPU out of idle clocks between measurements (paused while timing)
    keeper: Any = None

    @property
    def queues(self) -> list[list[int]]:
        """[family, queue] of every lane, without repeats (async lanes share one queue)."""
        seen: list[list[int]] = []
        for lane in self.lanes:
            if lane.queue_id not in seen:
                seen.append(lane.queue_id)
        return seen

    @property
    def features(self) -> dict[str, bool]:
        """Device features, plus "timestamps" (compute-queue timestamps supported)."""
        out = dict(self.props.get("features") or {})
        out.setdefault("timestamps", bool(self.props.get("timestamps_supported", False)))
        return out

    def close(self) -> None:
        """Release backends and managers (most recent first); errors are swallowed because a
        lost device cannot be closed cleanly and the run must go on."""
        while self.closers:
            fn = self.closers.pop()
            try:
                fn()
            except Exception:  # noqa: BLE001
                pass
