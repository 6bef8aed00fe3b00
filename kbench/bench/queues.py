"""Queue configurations: how a device's queues are used to run the cases.

- ``single``: one queue of the first compute family (what a plain Kompute Manager does).
- ``multi_queue``: several queues of one compute family (up to 4), one lane per queue.
- ``multi_family``: one queue in each compute-capable family, one lane per family.
- ``async``: one queue, several sequences in flight at once (4 lanes on the same queue).

A configuration the device cannot provide is still listed, with the reason, so that a run can
report it as unsupported instead of silently dropping it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QUEUE_CONFIGS = ("single", "multi_queue", "multi_family", "async")
MAX_LANES = 4
ASYNC_LANES = 4


@dataclass(frozen=True)
class QueueConfig:
    """One way of using a device's queues."""

    name: str
    #: argument for kp.Manager(family_queue_indices=...): one entry per queue created
    family_queue_indices: tuple[int, ...]
    #: per lane: (Manager queue index, family, queue index inside the family)
    lanes: tuple[tuple[int, int, int], ...]
    unsupported: str = ""

    @property
    def queues(self) -> list[list[int]]:
        out: list[list[int]] = []
        for _, fam, q in self.lanes:
            if [fam, q] not in out:
                out.append([fam, q])
        return out


def _is_compute(family: dict[str, Any]) -> bool:
    flags = family.get("flags", ())
    if isinstance(flags, int):
        return bool(flags & 0x2)  # VK_QUEUE_COMPUTE_BIT
    return "compute" in [str(f).lower() for f in flags]


def compute_families(props: dict[str, Any]) -> list[dict[str, Any]]:
    """Queue families with the compute bit, in index order."""
    return [f for f in props.get("queue_families", []) if _is_compute(f) and int(f.get("count", 0)) > 0]


def queue_configs(props: dict[str, Any]) -> list[QueueConfig]:
    """Every configuration in QUEUE_CONFIGS for a device, unsupported ones with their reason."""
    fams = compute_families(props)
    if not fams:
        return [QueueConfig(n, (), (), "the device has no compute queue family") for n in QUEUE_CONFIGS]
    first = int(fams[0]["index"])
    out = [QueueConfig("single", (first,), ((0, first, 0),))]
    multi = next((f for f in fams if int(f.get("count", 0)) >= 2), None)
    if multi is None:
        counts = ", ".join(f"family {f['index']}: {f.get('count')}" for f in fams)
        out.append(QueueConfig("multi_queue", (), (), f"no compute family has 2 or more queues ({counts})"))
    else:
        fam, k = int(multi["index"]), min(MAX_LANES, int(multi["count"]))
        out.append(QueueConfig("multi_queue", (fam,) * k, tuple((i, fam, i) for i in range(k))))
    if len(fams) < 2:
        out.append(QueueConfig("multi_family", (), (),
                               f"only one compute-capable queue family (family {first})"))
    else:
        chosen = [int(f["index"]) for f in fams[:MAX_LANES]]
        out.append(QueueConfig("multi_family", tuple(chosen), tuple((i, f, 0) for i, f in enumerate(chosen))))
    out.append(QueueConfig("async", (first,), tuple((0, first, 0) for _ in range(ASYNC_LANES))))
    return out


def parse_queue_configs(text: str | None) -> list[str] | None:
    """'single,async' -> ['single', 'async']; 'all' -> every configuration; None or '' -> None
    (the mode's default). ValueError for unknown names."""
    if text is None or not text.strip():
        return None
    if text.strip() == "all":
        return list(QUEUE_CONFIGS)
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in QUEUE_CONFIGS]
    if unknown:
        raise ValueError(f"unknown queue configuration {', '.join(repr(u) for u in unknown)}; "
                         f"choose from {', '.join(QUEUE_CONFIGS)} or all")
    return names
