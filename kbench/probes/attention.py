"""Probe kbench's fused decode attention (shaders/attention.comp) on one Vulkan device: keys per
partial workgroup (the chunk) and the two partial passes (a subgroup per key row, one invocation
per key row), with PyTorch's scaled_dot_product_attention (the torch peer's call) beside them
when CUDA is there.

    kbench probe attention            # seq 8192 and 32768, 32 query / 8 kv heads, head_dim 128
    kbench probe attention --small    # tiny shapes (lavapipe / CI smoke test)

Each variant: the median GPU time of one call (VulkanBackend.measure_gpu_ns after the clock has
settled, as the matmul probe times), GB/s over the K and V bytes, and the NMSE of the output
against float64.  "auto" is KernelPolicy.attention's choice; the others force the chunk
(VulkanBackend's ``attention_chunk``).
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

CHUNKS = [None, 32, 64, 128, 256, 512, 1024]


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
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    if args.small:
        shapes, chunks, repeats = [(64, 300, 8, 2), (128, 1000, 32, 8)], [None, 16, 128], args.repeats or 3
    else:
        shapes, chunks, repeats = [(128, 8192, 32, 8), (128, 32768, 32, 8)], CHUNKS, args.repeats or 7
    rows: list[dict] = []
    with VulkanBackend(args.device) as be:
        props = be.device_properties
        settle_s = 0.05 if props.get("device_type") == "cpu" else 0.6
        print(f"device: {props['device_name']} ({props.get('driver_info', '')}), subgroup "
              f"{props.get('subgroup_size')}, shared {props.get('max_shared_memory')} B", flush=True)
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
            variants = [("sg", c) for c in chunks] + [("tree", None)]
            for kind, chunk in variants:
                # probe only: switch the pass and the chunk on one backend (no re-uploads)
                be._policy = KernelPolicy(props, use_subgroups=False if kind == "tree" else None)  # noqa: SLF001
                be._attention_chunk = chunk  # noqa: SLF001
                try:
                    plan = be._policy.attention(hd, t, nh, nkv, chunk)  # noqa: SLF001
                except ValueError as exc:
                    print(f"{shape}  {kind} chunk {chunk}: {exc}", flush=True)
                    continue
                passes = "sg" if be._policy.use_subgroups else "tree"  # noqa: SLF001
                name = f"{passes} chunk {'auto ' if chunk is None else ''}{plan.chunk}"
                ns = time_settled(be, lambda: be.attention(*hs, out, hd, t, nh, nkv), repeats, settle_s)
                got = np.empty(nh * hd, np.float32)
                be.copy_from_device(out, got)
                err = nmse(got, ref)
                gbps = kv_bytes / ns if ns else float("nan")
                rows.append({"shape": [hd, t, nh, nkv], "variant": name, "chunk": plan.chunk,
                             "n_chunks": plan.n_chunks, "us": ns / 1e3 if ns else None, "kv_gbps": gbps, "nmse": err})
                print(f"{shape}  {name:<22} {plan.n_chunks:5d} chunks  "
                      f"{(ns or float('nan')) / 1e3:9.1f} us  {gbps:8.1f} GB/s (K+V)  NMSE {err:.1e}", flush=True)
            for h in (*hs, out):
                be.free(h)
            if not args.no_torch:
                peer = torch_sdpa_ns(q, kc, vc, hd, t, nh, nkv, repeats)
                if peer is not None:
                    ns, err = peer
                    rows.append({"shape": [hd, t, nh, nkv], "variant": "torch sdpa", "us": ns / 1e3,
                                 "kv_gbps": kv_bytes / ns, "nmse": err})
                    print(f"{shape}  {'torch sdpa':<22} {'':12} {ns / 1e3:9.1f} us  {kv_bytes / ns:8.1f} GB/s "
                          f"(K+V)  NMSE {err:.1e}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": props["device_name"], "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                         "rows": rows}, indent=1))
    return 0
