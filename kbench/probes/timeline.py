"""Workgroup timelines: what a kernel's TIMELINE twin records about each of its workgroups.

A timeline twin (shaders/qmatmul_coop.comp's TIMELINE, ``kbench probe qmatvec --vecs 8 --knobs
coop=true --cut timeline``) writes four 32-bit words per workgroup in place of its results: the
low word of the device clock (``clockRealtime2x32EXT``, nanoseconds on NVIDIA) at its start and
at the end of its work, the subgroup clock's ticks between the two (``clock2x32ARB``: the compute
unit's cycles) and the steps it took.  From these, :func:`summarize` says how many workgroups were
resident at once (per compute unit, where the device says how many it has), how many started
only after the first had finished (a second wave), and how long one step took: the facts that tell
a latency-bound kernel from an occupancy-bound one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: device features a timeline twin reads its clocks by (VK_KHR_shader_clock)
CLOCK_FEATURES = ("shader_device_clock", "shader_subgroup_clock")


def unsupported(features: dict) -> str:
    """Why a device cannot run timeline twins ("" where it can)."""
    missing = [f for f in CLOCK_FEATURES if not features.get(f)]
    return f"timeline twins need VK_KHR_shader_clock's {' and '.join(missing)}" if missing else ""


@dataclass(frozen=True)
class Timeline:
    """Start and end (ns, from the earliest start) of each workgroup, its ticks and steps."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    ticks: np.ndarray
    steps: np.ndarray


def parse(words: np.ndarray, n_groups: int) -> Timeline:
    """The records of ``n_groups`` workgroups from the twin's output words (uint32, four per
    workgroup).  The device clock's low word wraps every 4.3 s: times are taken relative to the
    first workgroup's start, modulo 2^32, as signed offsets (a kernel is far shorter)."""
    if words.size < 4 * n_groups:
        raise ValueError(f"timeline: {words.size} words hold no records for {n_groups} workgroups (4 each)")
    rec = words[: 4 * n_groups].astype(np.uint32).reshape(n_groups, 4)

    def rel(t: np.ndarray) -> np.ndarray:
        d = (t.astype(np.int64) - int(rec[0, 0])) % (1 << 32)
        return np.where(d >= 1 << 31, d - (1 << 32), d)

    start, end = rel(rec[:, 0]), rel(rec[:, 1])
    if np.any(end < start):
        bad = int(np.argmax(end < start))
        raise ValueError(f"timeline: workgroup {bad} ends ({end[bad]} ns) before it starts ({start[bad]} ns): "
                         "not a timeline twin's records")
    base = start.min()
    return Timeline(start - base, end - base, rec[:, 2].astype(np.int64), rec[:, 3].astype(np.int64))


def max_concurrent(t: Timeline) -> int:
    """The most workgroups alive at one instant (an end at the same nanosecond as a start counts first)."""
    events = np.concatenate([np.stack([t.start_ns, np.ones_like(t.start_ns)], 1),
                             np.stack([t.end_ns, -np.ones_like(t.end_ns)], 1)])
    order = np.lexsort((events[:, 1], events[:, 0]))  # by time, ends (-1) before starts (+1)
    return int(np.cumsum(events[order, 1]).max())


def summarize(t: Timeline, compute_units: int | None = None) -> str:
    """One line: span, workgroups alive at once (and per compute unit), late starters, time and ticks
    per workgroup and per step (medians)."""
    n = len(t.start_ns)
    conc = max_concurrent(t)
    first_end = t.end_ns.min()
    late = int(np.sum(t.start_ns >= first_end))
    dur = t.end_ns - t.start_ns
    steps = np.maximum(t.steps, 1)
    median_steps = int(np.median(t.steps))
    per_cu = f" ({conc / compute_units:.2f} per compute unit of {compute_units})" if compute_units else ""
    return (f"{n} workgroups over {(t.end_ns.max()) / 1e3:.1f} us; at most {conc} at once{per_cu}; "
            f"{late} started after the first had ended; each {np.median(dur) / 1e3:.2f} us "
            f"({np.percentile(dur, 10) / 1e3:.2f}-{np.percentile(dur, 90) / 1e3:.2f}), "
            f"{median_steps} step{'' if median_steps == 1 else 's'}, a step {np.median(dur / steps):.0f} ns = "
            f"{np.median(t.ticks / steps):.0f} ticks; starts spread over {t.start_ns.max() / 1e3:.1f} us")
