"""Cross-checks of kbench's timer against independent clocks on the same work (issue 7):

- GPU timestamps against host wall time for long kernels (>= LONG_NS), where submission and
  wait overhead is small: the ratio gpu/host must be within TOLERANCE of 1;
- Vulkan-timestamp copy bandwidth against the CUDA-event copy bandwidth of the peer on
  equal-sized copies (``peak.copy_bandwidth`` of both): two timers on the same hardware limit.
"""
from __future__ import annotations

from typing import Any, Iterable

LONG_NS = 1_000_000
#: cases whose call is mostly host work (transfers through host memory, many tiny dispatches
#: issued from Python): their host time is not the same work as their GPU time
HOST_BOUND = frozenset({"copy_roundtrip", "issue_rate", "kp_sync", "kp_copy", "attention"})
TOLERANCE = 0.05


def timer_checks(records: Iterable[dict[str, Any]]) -> list[str]:
    """One line per check, each saying what was compared and whether it agrees within 5%."""
    recs = list(records)
    lines = []
    long = [r for r in recs if r.get("kind") == "case" and r.get("status") == "pass" and r.get("timer") == "gpu"
            and r.get("gpu_host_ratio") and (r.get("gpu_ns") or {}).get("median", 0) >= LONG_NS
            and r.get("lanes", 1) == 1
            # a replayed case's ratio is against the wall time of its own submissions: fine for
            # any case; a streamed host-bound case's host time is mostly other work
            and (r.get("gpu_timing") == "replay" or r.get("case") not in HOST_BOUND)]
    if long:
        ratios = sorted(float(r["gpu_host_ratio"]) for r in long)
        bad = [r for r in long if abs(float(r["gpu_host_ratio"]) - 1) > TOLERANCE]
        verdict = "agree within 5%" if not bad else (
            f"{len(bad)} outside 5%: " + ", ".join(f"{r['case_id']} {r['gpu_host_ratio']:.3f}" for r in bad[:5]))
        lines.append(f"GPU timestamps vs host wall time, {len(long)} kernels >= {LONG_NS / 1e6:.0f} ms: "
                     f"gpu/host {ratios[0]:.3f} .. {ratios[-1]:.3f}: {verdict}")
    copies = {}
    backend = "vulkan"
    for r in recs:  # a run's records follow its "run" record, which names the backend
        if r.get("kind") == "run":
            backend = r.get("backend", "vulkan")
        elif r.get("kind") == "peak" and r.get("peak") == "peak.copy_bandwidth":
            copies[backend] = r
    if "vulkan" in copies and "torch-cuda" in copies:
        v, t = copies["vulkan"], copies["torch-cuda"]
        vb, tb = (v.get("params") or {}).get("buffer_bytes"), (t.get("params") or {}).get("buffer_bytes")
        ratio = float(v["value"]) / float(t["value"])
        ok = abs(ratio - 1) <= TOLERANCE and vb == tb
        lines.append(f"copy of {vb} bytes: Vulkan timestamps {v['value']:.0f} GB/s vs CUDA events {t['value']:.0f} GB/s "
                     f"(ratio {ratio:.3f}): {'agree within 5%' if ok else 'DISAGREE'}"
                     + ("" if vb == tb else f" (sizes differ: {tb} bytes on the peer)"))
    return lines
