"""Issue 7's targets as ratios from one `kbench bench --peer torch` run (the Vulkan file and the
torch-cuda file it wrote), as the Markdown table of the README's performance section.

    python scripts/h200_targets.py results/nvidia-h200/2026120[2]T2[01]*.jsonl
"""
from __future__ import annotations

import json
import sys


def load(path: str) -> tuple[dict, dict]:
    cases, peaks = {}, {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "run" and r.get("backend_options"):
                # the table is of the default kernels; a run with other kernel choices is its own experiment
                print(f"# {path}: skipped, kernel options {r['backend_options']}", file=sys.stderr)
                return {}, {}
            if r.get("kind") == "peak":
                peaks[r["peak"]] = r
            elif (r.get("kind") == "case" and r.get("status") == "pass" and r.get("mode") == "bench"
                  and r.get("queue_config", "single") == "single"):
                cases[r["case_id"]] = r
    return cases, peaks


def spread(r: dict) -> str:
    """'median us [min-max]' of the record's GPU time (host time where it has none; one sample: the median)."""
    g = r.get("gpu_ns") or r.get("host_ns") or {}
    if g.get("n", 2) < 2:
        return f"{g['median'] / 1e3:.1f} us"
    return f"{g['median'] / 1e3:.1f} us [{g['min'] / 1e3:.1f}-{g['max'] / 1e3:.1f}]"


def clock_note(r: dict) -> str:
    """'SM N MHz, not boosted' where the samples ran below 90% of the maximum SM clock."""
    c = r.get("clocks")
    if not isinstance(c, dict) or not c.get("sm_max_mhz") or c.get("sm_mhz_max") is None:
        return ""
    if c["sm_mhz_max"] >= 0.9 * c["sm_max_mhz"]:
        return ""
    lo, hi = c.get("sm_mhz_min", c["sm_mhz_max"]), c["sm_mhz_max"]
    return f"SM {lo:.0f}{'' if lo == hi else f'-{hi:.0f}'} MHz, not boosted"


def main(paths: list[str]) -> None:
    # later runs override earlier ones case by case; a case's two files come from one run
    vk, vpk, pt, ppk = {}, {}, {}, {}
    for path in sorted(paths):
        cases, peaks = load(path)
        (pt if "torch-cuda" in path else vk).update(cases)
        (ppk if "torch-cuda" in path else vpk).update(peaks)
    copy = vpk["peak.copy_bandwidth"]["value"]
    rows = []

    def row(name, cid, metric, target, peer_cid=None, need=None, note=""):
        r = vk.get(cid)
        if r is None:
            rows.append(f"| {name} | not run | | | |")
            return
        p = pt.get(peer_cid or cid)
        val = r.get(metric) or 0
        unit = "GB/s" if metric == "gbps" else "GFLOP/s"
        if target == "peer" and p:
            ratio = val / p[metric]
            verdict = ("met" if ratio >= need else "**not met**") if need else "reported (opt-in path)"
            ref = f"torch {p[metric]:.0f} {unit} ({spread(p)})"
        elif target == "copy":
            ratio = val / copy
            verdict = "met" if ratio >= need else "**not met**"
            ref = f"copy peak {copy:.0f} GB/s" + (f"; torch {p[metric]:.0f} GB/s" if p else "")
        else:
            ratio, verdict, ref = float("nan"), "", ""
        note = "; ".join(x for x in (note, clock_note(r)) if x)
        rows.append(f"| {name} | {val:.0f} {unit}, {spread(r)} | {ref} | {ratio:.2f}x (need {need}x) {verdict} | {note} |")

    for op in ("add", "element_mul", "silu"):
        for n, label in ((16777216, "16M"), (268435456, "256M")):
            row(f"{op} {label}", f"{op}[size={n}]", "gbps", "peer", need=0.95)
    for n, label in ((16777216, "16M"), (268435456, "256M")):
        row(f"copy_buffer {4 * n >> 20} MiB", f"copy_buffer[size={4 * n}]", "gbps", "peer", need=0.95)
    for op, extra in (("softmax", ",scale=1"), ("rms_norm", ",eps=1e-05")):
        for n, label in ((16777216, "16M"), (268435456, "256M")):
            row(f"{op} {label}", f"{op}[size={n}{extra}]", "gbps", "copy", need=0.5)
    for s in (4096, 8192):
        row(f"matmul fp32 {s}^3", f"matmul[m={s},n={s},k={s}]", "gflops", "peer", need=0.7)
    for s in (4096, 8192):
        row(f"matmul_f16 (coop matrix) {s}^3", f"matmul_f16[m={s},n={s},k={s}]", "gflops", "peer", need=0.0,
            note="fp16 inputs, fp32 accumulate; NMSE %.1e vs float64" % ((vk.get(f"matmul_f16[m={s},n={s},k={s}]") or {}).get("metric") or {}).get("nmse", float("nan")))
    for shape in ((14336, 4096), (4096, 14336)):
        for d in ("Q4_0", "Q8_0", "Q4_K", "Q6_K"):
            cid = f"quantized_matmul[n_rows={shape[0]},n_cols={shape[1]},rotate_mib=256,dtype={d}]"
            r = vk.get(cid)
            if r is None:
                rows.append(f"| {d} {shape[0]}x{shape[1]} | not run | | | |")
                continue
            wb = r["bytes"] - 4 * (shape[0] + shape[1])
            tb = wb / r["gpu_ns"]["median"]
            rows.append(f"| {d} {shape[0]}x{shape[1]} | {tb:.0f} GB/s of weights, {spread(r)} | 0.7 x copy = "
                        f"{0.7 * copy:.0f} GB/s | {tb / copy:.2f}x copy {'met' if tb >= 0.7 * copy else '**not met**'} | "
                        f"{clock_note(r)} |")
    rows.append("| attention 8192 x 32 heads (8 kv) | " + (
        f"{vk['attention[head_dim=128,seq_len=8192,n_heads=32,n_kv_heads=8]']['gbps']:.0f} GB/s = "
        f"{vk['attention[head_dim=128,seq_len=8192,n_heads=32,n_kv_heads=8]']['gbps'] / copy:.2f}x copy | | | 96 dispatches per call |"
        if "attention[head_dim=128,seq_len=8192,n_heads=32,n_kv_heads=8]" in vk else "not run | | | |"))
    lat, plat = vpk.get("peak.dispatch_latency"), ppk.get("peak.dispatch_latency")
    if lat and plat:
        ratio = lat["value"] / plat["value"]
        rows.append(f"| dispatch round trip | {lat['value'] / 1e3:.1f} us | torch launch+sync {plat['value'] / 1e3:.1f} us | "
                    f"{ratio:.2f}x (need <= 2x) {'met' if ratio <= 2 else '**not met**'} | |")
    for k, name in (("peak.h2d", "host-to-device"), ("peak.d2h", "device-to-host")):
        if k in vpk:
            v = vpk[k]["value"]
            peer = ppk.get(k)
            peer_txt = (f"; torch {peer['value']:.1f} GB/s from pageable, {peer['params'].get('pinned_gbps', 0):.1f} pinned"
                        if peer else "")
            rows.append(f"| {name} (OpTensorSync of 256 MiB, host clock) | {v:.1f} GB/s, "
                        f"{spread(vpk[k])} | 45 GB/s{peer_txt} | {v / 45:.2f}x {'met' if v >= 45 else '**not met**'} | "
                        f"end to end: host copies streamed with the DMA |")
    ks = vk.get("kp_sync[size=16777216,dtype=float32]")
    if ks:
        rows.append(f"| Kompute sync of 64 MiB up and down (kp_sync), GPU timestamps | {ks['gbps']:.0f} GB/s | | | "
                    f"streamed: the GPU time includes waiting for the host's copies |")
    print("| case | kbench (Vulkan, GPU timestamps, median [min-max]) | against | ratio | note |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1:])
