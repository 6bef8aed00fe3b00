"""kbench/probes/timeline.py: reading a timeline twin's records (four words per workgroup: device
clock at start and end, subgroup-clock ticks, steps) and what the summary says of them."""

from __future__ import annotations

import numpy as np
import pytest

from kbench.probes import timeline


def _words(rows):
    return np.asarray([w for r in rows for w in r], dtype=np.uint64).astype(np.uint32)


def test_records_are_taken_relative_to_the_earliest_start_across_the_clock_wrapping():
    base = (1 << 32) - 500  # the device clock's low word wraps in the middle of the kernel
    rows = [(base + 100, base + 900, 1600, 4), (base, base + 400, 800, 4), ((base + 700) % (1 << 32), (base + 2000) % (1 << 32), 2600, 4)]
    t = timeline.parse(_words(rows), 3)
    assert t.start_ns.tolist() == [100, 0, 700], t.start_ns
    assert t.end_ns.tolist() == [900, 400, 2000], t.end_ns
    assert t.ticks.tolist() == [1600, 800, 2600] and t.steps.tolist() == [4, 4, 4]


def test_most_workgroups_alive_at_once_counts_an_end_before_a_start_at_the_same_instant():
    rows = [(0, 10, 1, 1), (10, 20, 1, 1), (5, 15, 1, 1), (12, 30, 1, 1)]
    t = timeline.parse(_words(rows), 4)
    assert timeline.max_concurrent(t) == 3, "expected 3 alive over 12..15 (the one ending at 10 has gone)"


def test_summary_says_residency_per_compute_unit_late_starters_and_time_per_step():
    # two compute units, two workgroups each at once, then a second wave of two
    rows = [(0, 1000, 2000, 10), (0, 1000, 2000, 10), (0, 1000, 2000, 10), (0, 1000, 2000, 10),
            (1000, 2000, 2000, 10), (1000, 2000, 2000, 10)]
    line = timeline.summarize(timeline.parse(_words(rows), 6), compute_units=2)
    for part in ("6 workgroups over 2.0 us", "at most 4 at once (2.00 per compute unit of 2)",
                 "2 started after the first had ended", "a step 100 ns = 200 ticks"):
        assert part in line, f"expected {part!r} in {line!r}"


def test_records_that_end_before_they_start_or_too_few_words_are_refused():
    with pytest.raises(ValueError, match="workgroup 1 ends"):
        timeline.parse(_words([(0, 10, 1, 1), (50, 20, 1, 1)]), 2)
    with pytest.raises(ValueError, match="no records for 3 workgroups"):
        timeline.parse(np.zeros(8, np.uint32), 3)


def test_a_device_without_the_clocks_is_told_which_it_lacks():
    assert timeline.unsupported({"shader_device_clock": True, "shader_subgroup_clock": True}) == ""
    why = timeline.unsupported({"shader_device_clock": False, "shader_subgroup_clock": True})
    assert "shader_device_clock" in why and "shader_subgroup_clock" not in why
