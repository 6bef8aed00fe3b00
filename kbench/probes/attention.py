"""Probe kbench's fused decode attention (shaders/attention.comp) on one Vulkan device: the
streaming partial pass (lanes per key row, keys loaded per team before use, workgroup size, the
workgroup count its chunk aims at) and the split passes (a subgroup or one invocation per key row,
keys per workgroup), with PyTorch's scaled_dot_product_attention (the torch peer's call) beside
them when CUDA is there.

    kbench probe attention            # seq 8192 and 32768, 32 query / 8 kv heads, head_dim 128
    kbench probe attention --small    # tiny shapes (lavapipe / CI smoke test)

Each variant: the median GPU time of one call (VulkanBackend.measure_gpu_ns after the clock has
settled, as the matmul probe times), GB/s over the K and V bytes, its ratio to the copy bandwidth
(kbench's peak.copy_bandwidth, measured in the same run), and the NMSE of the output against
float64.  "auto" is KernelPolicy.attention's choice; the others force KernelPolicy.configure_attention
knobs (stream) or the chunk (VulkanBackend's ``attention_chunk``, split).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np

from kbench.backend import VulkanBackend
from kbench.backend.kernels import KernelPolicy

from .settled import time_settled

#: (label, KernelPolicy options, configure_attention knobs, forced chunk) of the full run
def _variants(small: bool) -> list[tuple[str, dict, dict, int | None]]:
    if small:
        return [("auto", {}, {}, None), ("stream lanes 4 unroll 2 prefetch", {},
                                         {"kernel": "stream", "lanes": 4, "unroll": 2, "prefetch": True}, None),
                ("split sg chunk 16", {}, {"kernel": "split"}, 16), ("split tree", {"use_subgroups": False}, {}, None)]
    out: list[tuple[str, dict, dict, int | None]] = [("auto", {}, {}, None)]

    def stream(label: str, **knobs) -> None:
        out.append((f"stream {label}", {}, {"kernel": "stream", **knobs}, None))

    # the H200's first sweep (2026-12-04): 32 lanes a row and 4 keys a batch were the only fast
    # ones (8 keys: 3x slower, the loops left rolled); now with every register loop unrolled
    for wg in (256, 128):
        for groups in (264, 528, 1056, 2112):
            stream(f"lanes 32 unroll 4 wg {wg} groups {groups}", lanes=32, unroll=4, wg=wg, groups=groups)
    for unroll, groups in ((2, 1056), (3, 1056), (6, 1056), (8, 528), (8, 1056)):
        stream(f"lanes 32 unroll {unroll} wg 256 groups {groups}", lanes=32, unroll=unroll, wg=256, groups=groups)
    for unroll, groups in ((2, 528), (2, 1056), (4, 528), (4, 1056)):
        stream(f"lanes 32 unroll {unroll} wg 256 groups {groups} prefetch", lanes=32, unroll=unroll, wg=256,
               groups=groups, prefetch=True)
    stream("lanes 32 unroll 4 wg 256 groups 1056 heads first", lanes=32, unroll=4, wg=256, groups=1056,
           heads_first=True)
    for lanes, unroll, wg in ((16, 2, 256), (16, 4, 128), (8, 1, 256), (8, 2, 128)):
        stream(f"lanes {lanes} unroll {unroll} wg {wg} groups 528", lanes=lanes, unroll=unroll, wg=wg, groups=528)
    for cols in (8, 16):
        stream(f"lanes 32 unroll 4 wg 256 groups 1056 combine {cols}", lanes=32, unroll=4, wg=256, groups=1056,
               combine_cols=cols)
    out += [("split sg auto", {}, {"kernel": "split"}, None), ("split sg chunk 128", {}, {"kernel": "split"}, 128)]
    return out


#: variants also timed without the combine pass
PARTIAL_ALONE = ("auto", "split sg auto", "stream lanes 32 unroll 4 wg 256 groups 528")


def copy_gbps(be) -> float | None:
    """kbench's copy bandwidth (peak.copy_bandwidth, read + write) on this backend's device."""
    import kbench.runtime as kp
    from kbench.bench.peaks import get_peak

    try:
        return max(get_peak("peak.copy_bandwidth").measure(kp, be.manager, be.device_properties)["value"]
                   for _ in range(2))
    except RuntimeError:  # no timestamps
        return None


def reference(q, kc, vc, hd: int, t: int, nh: int, nkv: int) -> np.ndarray:
    g = nh // nkv
    qv = q.astype(np.float64).reshape(nkv, g, hd)
    keys = kc.astype(np.float64).reshape(t, nkv, hd)
    s = np.einsum("kgd,tkd->kgt", qv, keys) / math.sqrt(hd)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    del keys
    o = np.einsum("kgt,tkd->kgd", p, vc.astype(np.float64).reshape(t, nkv, hd))
    return (o / p.sum(axis=-1)[..., None]).reshape(-1)


def nmse(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.sum((got.astype(np.float64) - ref) ** 2) / np.sum(ref * ref))


def torch_sdpa_ns(q, kc, vc, hd: int, t: int, nh: int, nkv: int, repeats: int) -> tuple[float, float] | None:
    """(median ns per call, NMSE) of the torch peer's attention on CUDA, or None without CUDA."""
    from kbench.backend.torch_backend import TorchBackend, availability

    if not availability()[0]:
        return None
    import torch

    with TorchBackend() as be:
        hs = [be.allocate(a.nbytes) for a in (q, kc, vc)]
        out = be.allocate(4 * nh * hd)
        for h, a in zip(hs, (q, kc, vc)):
            be.copy_to_device(a, h)
        for _ in range(20):
            be.attention(*hs, out, hd, t, nh, nkv)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                be.attention(*hs, out, hd, t, nh, nkv)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e6 / 20)
        got = np.empty(nh * hd, np.float32)
        be.copy_from_device(out, got)
    return statistics.median(times), nmse(got, reference(q, kc, vc, hd, t, nh, nkv))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny shapes and few variants (CPU drivers)")
    ap.add_argument("--device", type=int, default=0, help="Vulkan device index")
    ap.add_argument("--repeats", type=int, default=None, help="timed samples per variant (median)")
    ap.add_argument("--seq", type=int, action="append", help="sequence length(s) (default 8192 and 32768)")
    ap.add_argument("--match", default="", help="only variants whose label contains this text")
    ap.add_argument("--settle", type=float, default=None,
                    help="seconds of load before each variant's samples (the first gets at least 0.6 on a GPU)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    if args.small:
        shapes, repeats = [(64, 300, 8, 2), (128, 260, 8, 2)], args.repeats or 3
    else:
        shapes, repeats = [(128, t, 32, 8) for t in (args.seq or [8192, 32768])], args.repeats or 7
    variants = [v for v in _variants(args.small) if args.match in v[0]]
    rows: list[dict] = []
    with VulkanBackend(args.device) as be:
        props = be.device_properties
        cpu = props.get("device_type") == "cpu"
        print(f"device: {props['device_name']} ({props.get('driver_info', '')}), subgroup "
              f"{props.get('subgroup_size')}, shared {props.get('max_shared_memory')} B", flush=True)
        copy = None
        first = True
        for hd, t, nh, nkv in shapes:
            q = rng.uniform(-1, 1, nh * hd).astype(np.float32)
            kc = rng.uniform(-1, 1, t * nkv * hd).astype(np.float32)
            vc = rng.uniform(-1, 1, t * nkv * hd).astype(np.float32)
            ref = reference(q, kc, vc, hd, t, nh, nkv)
            kv_bytes = 2 * kc.nbytes
            hs = [be.allocate(a.nbytes) for a in (q, kc, vc)]
            out = be.allocate(4 * nh * hd)
            for h, a in zip(hs, (q, kc, vc)):
                be.copy_to_device(a, h)
            shape = f"hd {hd} seq {t} heads {nh}/{nkv}"
            seen: dict = {}
            for label, opts, knobs, chunk in variants:
                # probe only: switch the pass and the chunk on one backend (no re-uploads)
                be._policy = KernelPolicy(props, **opts)  # noqa: SLF001
                be._attention_chunk = chunk  # noqa: SLF001
                try:
                    be._policy.configure_attention(knobs)  # noqa: SLF001
                    plan = be._policy.attention(hd, t, nh, nkv, chunk)  # noqa: SLF001
                except ValueError as exc:
                    print(f"{shape}  {label}: {exc}", flush=True)
                    continue
                kernel = plan.partial.spv.split(".")[2]
                key = (plan.partial, plan.combine, plan.chunk, plan.partial_grid)
                if key in seen:
                    print(f"{shape}  {label}: the same launch as {seen[key]}", flush=True)
                    continue
                seen[key] = label
                settle_s = 0.05 if cpu else (max(0.6, args.settle or 0) if first else (args.settle or 0.2))
                first = False
                ns = time_settled(be, lambda: be.attention(*hs, out, hd, t, nh, nkv), repeats, settle_s)
                if copy is None and ns is not None:
                    copy = copy_gbps(be)  # right after the settled variant: at the boosted clock
                    print(f"copy bandwidth {copy:.0f} GB/s" if copy else "copy bandwidth: no timestamps", flush=True)
                got = np.empty(nh * hd, np.float32)
                be.copy_from_device(out, got)
                err = nmse(got, ref)
                gbps = kv_bytes / ns if ns else float("nan")
                ratio = gbps / copy if copy else float("nan")
                rows.append({"shape": [hd, t, nh, nkv], "variant": label, "kernel": kernel,
                             "spec": list(plan.partial.spec), "chunk": plan.chunk, "n_chunks": plan.n_chunks,
                             "groups": plan.n_chunks * plan.partial_grid[1], "us": ns / 1e3 if ns else None,
                             "kv_gbps": gbps, "copy_ratio": ratio, "nmse": err})
                print(f"{shape}  {label:<36} {kernel:<6} spec {plan.partial.spec} chunk {plan.chunk:5d} "
                      f"x{plan.n_chunks:4d}  {(ns or float('nan')) / 1e3:8.1f} us  {gbps:7.0f} GB/s "
                      f"{ratio:5.2f}x copy  NMSE {err:.1e}", flush=True)
                if label in PARTIAL_ALONE and ns:
                    # the partial pass without the combine: what the second dispatch and its barrier cost
                    pns = time_settled(be, lambda: be._attention(*hs, out, hd, t, nh, nkv, combine=False),  # noqa: SLF001
                                       repeats, settle_s)
                    if pns:
                        rows.append({"shape": [hd, t, nh, nkv], "variant": f"{label}: partial pass alone",
                                     "kernel": kernel, "us": pns / 1e3, "kv_gbps": kv_bytes / pns,
                                     "copy_ratio": kv_bytes / pns / copy if copy else None})
                        print(f"{shape}  {label + ': partial pass alone':<48} {pns / 1e3:8.1f} us  "
                              f"{kv_bytes / pns:7.0f} GB/s", flush=True)
            for h in (*hs, out):
                be.free(h)
            _write(args.json, props, copy, rows)
            if not args.no_torch:
                peer = torch_sdpa_ns(q, kc, vc, hd, t, nh, nkv, repeats)
                if peer is not None:
                    ns, err = peer
                    ratio = kv_bytes / ns / copy if copy else float("nan")
                    rows.append({"shape": [hd, t, nh, nkv], "variant": "torch sdpa", "us": ns / 1e3,
                                 "kv_gbps": kv_bytes / ns, "copy_ratio": ratio, "nmse": err})
                    print(f"{shape}  {'torch sdpa':<36} {'':52} {ns / 1e3:8.1f} us  {kv_bytes / ns:7.0f} GB/s "
                          f"{ratio:5.2f}x copy  NMSE {err:.1e}", flush=True)
    _write(args.json, props, copy, rows)
    return 0


def _write(path: Path | None, props: dict, copy: float | None, rows: list[dict]) -> None:
    """The rows so far as JSON (after every shape: a run cut short keeps what it measured)."""
    if path:
        path.write_text(json.dumps({"device": props["device_name"], "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                    "copy_gbps": copy, "rows": rows}, indent=1))
