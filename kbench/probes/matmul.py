"""Probe kbench's matmul kernels on one Vulkan device: tile variants of the fp32 SGEMM
(shaders/matmul.comp) and of the fp16 cooperative-matrix matmul (shaders/matmul_coop.comp), with
PyTorch's fp32 (TF32 off) and fp16 matmul beside them when CUDA is there.

    kbench probe matmul            # on the GPU: 4096^3 and 8192^3, about a minute
    kbench probe matmul --small    # tiny sizes (lavapipe / CI smoke test)

Each variant is timed with GPU timestamps (VulkanBackend.measure_gpu_ns: one op per sample, warm-up
first, median of --repeats), and checked on a few sampled rows against float64 NumPy (fp16: of the
rounded inputs).  Variants are selected through KernelPolicy options on one backend, so the inputs
are uploaded once per size.  Columns: variant, ms (median), TFLOP/s, NMSE on the sample.

fp32 variants are matmul_tile = (BM, BN, BK, TM, TN, GROUP_M) with matmul_warp_n (named
"BMxBNxBKxTMxTNxGROUP_M wWARP_N"); spec constants of matmul.comp: (invocations, BM, BN, BK, TM, TN,
VEC4, STAGES, GROUP_M, WARP_N), STAGES = 2 where two slices fit in shared memory.  Every variant runs
at the first size; the larger sizes take the default and the --top fastest of the first.  The end
ranks the fp32 variants per size with their ratio to torch fp32 of the same run (--fp32-only: no
fp16 part).  fp16 variants are matmul_f16_tile = (WG_M, WG_N, SG_M, SG_N, BK, GROUP_M); spec constants of
matmul_coop.khr.spv: (invocations, WG_M, WG_N, SG_M, SG_N, BK, VEC, STAGES, GROUP_M).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


from kbench.backend import VulkanBackend
from kbench.backend.kernels import KernelPolicy

from .settled import time_settled

#: fp32 variants: (matmul_tile with GROUP_M, matmul_warp_n); the first is the policy's GPU default
FP32_VARIANTS: list[tuple[tuple[int, ...], int]] = [
    (KernelPolicy.MATMUL_GPU_TILE + (KernelPolicy.MATMUL_GPU_GROUP_M,), KernelPolicy.MATMUL_GPU_WARP_N),
    ((128, 128, 8, 8, 8, 8), 0),     # 256 invocations of 8x8, row-major (16 x 2 per subgroup)
    ((128, 128, 8, 8, 8, 8), 8),     # the same in 4 x 8 patches (4 A + 8 B vec4s per subgroup read)
    ((128, 128, 8, 8, 8, 8), 4),     # 8 x 4 patches
    ((128, 128, 8, 8, 16, 8), 0),    # 128 invocations of 8x16 (128 accumulators; 4 x 8 row-major)
    ((128, 128, 8, 8, 16, 8), 4),
    ((128, 128, 8, 16, 8, 8), 0),    # 128 invocations of 16x8 (2 x 16 row-major)
    ((128, 128, 8, 16, 8, 8), 8),
    ((128, 128, 16, 8, 16, 8), 0),   # BK 16 at 128 invocations
    ((128, 128, 16, 16, 8, 8), 8),
    ((128, 128, 16, 8, 8, 8), 8),    # BK 16 at 256 invocations
    ((128, 128, 4, 8, 8, 8), 8),     # BK 4: fewer staging registers, twice the barriers
    ((128, 256, 8, 8, 16, 8), 8),    # 256 invocations of 8x16
    ((256, 128, 8, 16, 8, 8), 8),    # 256 invocations of 16x8
    ((64, 128, 8, 8, 8, 8), 8),      # 128 invocations of 8x8
    ((128, 64, 8, 8, 8, 8), 0),
    ((128, 128, 8, 8, 8, 4), 8),     # block-row grouping 4 / 16 / none
    ((128, 128, 8, 8, 8, 16), 8),
    ((128, 128, 8, 8, 8, 1), 8),
    ((128, 128, 8, 8, 16, 4), 0),    # grouping at 128 invocations of 8x16
    ((128, 128, 8, 8, 16, 16), 0),
    ((128, 256, 8, 16, 8, 8), 8),    # 256 invocations of 16x8 over 128x256
    ((256, 128, 8, 8, 16, 8), 0),    # 256 invocations of 8x16 over 256x128
]
SMALL_FP32_VARIANTS = [FP32_VARIANTS[0], ((128, 128, 8, 8, 8, 1), 8), ((64, 64, 16, 4, 4, 8), 0),
                       ((32, 32, 8, 4, 4, 1), 0), ((128, 128, 8, 8, 16, 2), 4)]
F16_TILES = [
    (2, 4, 4, 2, 32, 8),       # the default: 128x128, 8 subgroups of 64x32
    (2, 4, 4, 2, 32, 1),
    (2, 2, 4, 4, 32, 8),       # 128x128, 4 subgroups of 64x64
    (4, 2, 2, 4, 32, 8),       # 128x128, 8 subgroups of 32x64
    (4, 4, 2, 2, 32, 8),       # 128x128, 16 subgroups of 32x32
    (2, 2, 2, 2, 32, 8),       # 64x64
    (2, 4, 4, 4, 32, 8),       # 128x256 (one stage)
    (2, 4, 4, 2, 64, 8),       # BK 64 (one stage)
    (2, 4, 4, 2, 16, 8),       # BK 16
]
SAMPLE_ROWS = 8


def fp32_name(tile: tuple[int, ...], warp_n: int) -> str:
    """A variant's name in the probe's rows: "BMxBNxBKxTMxTNxGROUP_M wWARP_N"."""
    return "x".join(map(str, tile)) + f" w{warp_n}"


def nmse(got: np.ndarray, ref: np.ndarray) -> float:
    den = float(np.sum(ref * ref))
    return float(np.sum((got.astype(np.float64) - ref) ** 2) / den) if den else float("nan")


class Probe:
    def __init__(self, be: VulkanBackend, repeats: int, deadline: float, emulate_coop: bool):
        self.be = be
        self.props = be.device_properties
        self.repeats = repeats
        self.deadline = deadline
        self.emulate_coop = emulate_coop
        self.rows: list[dict] = []
        self.settle_s = 0.05 if be.device_properties.get("device_type") == "cpu" else 0.6

    def use(self, **options) -> KernelPolicy:
        """Put a KernelPolicy with these options on the backend (probe only: avoids re-uploads)."""
        pol = KernelPolicy(self.props, **options)
        pol.coop_emulate = self.emulate_coop
        self.be._policy = pol  # noqa: SLF001 - the probe's way to switch tiles on one backend
        return pol

    def time_op(self, issue) -> float | None:
        """Median GPU time of one call, after the clock governor has settled (probes.settled)."""
        return time_settled(self.be, issue, self.repeats, self.settle_s)

    def sample_rows(self, out, m: int, n: int, rows: np.ndarray) -> np.ndarray:
        be = self.be
        tmp = be.allocate(4 * n * len(rows))
        try:
            for i, r in enumerate(rows):
                be.copy_buffer_offset(out, tmp, int(r) * n * 4, i * n * 4, n * 4)
            got = np.empty(n * len(rows), np.float32)
            be.copy_from_device(tmp, got)
        finally:
            be.free(tmp)
        return got.reshape(len(rows), n)

    def record(self, kind: str, size: tuple[int, int, int], variant: str, ns: float | None, err: float,
               note: str = "") -> None:
        m, n, k = size
        ms = ns / 1e6 if ns else float("nan")
        tflops = 2 * m * n * k / ns / 1e3 if ns else float("nan")
        self.rows.append({"kind": kind, "m": m, "n": n, "k": k, "variant": variant, "ms": ms,
                          "tflops": tflops, "nmse": err, "note": note})
        print(f"{kind:<6} {m}x{n}x{k:<6} {variant:<26} {ms:9.3f} ms {tflops:8.2f} TFLOP/s  "
              f"NMSE {err:9.2e} {note}", flush=True)

    def late(self) -> bool:
        return time.monotonic() > self.deadline

    def fp32(self, size: tuple[int, int, int], variants, rng) -> None:
        """Time each (tile, warp_n) of ``variants`` at ``size``; rows named "BMxBNxBKxTMxTNxGROUP_M wWARP_N"."""
        be = self.be
        m, n, k = size
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        rows = np.sort(rng.choice(m, min(SAMPLE_ROWS, m), replace=False))
        ref = a[rows].astype(np.float64) @ b.astype(np.float64)
        ha, hb, ho = be.allocate(a.nbytes), be.allocate(b.nbytes), be.allocate(4 * m * n)
        try:
            be.copy_to_device(a, ha)
            be.copy_to_device(b, hb)
            del a, b
            for tile, warp_n in variants:
                name = fp32_name(tile, warp_n)
                if self.late():
                    self.record("fp32", size, name, None, float("nan"), "skipped: time budget")
                    continue
                try:
                    pol = self.use(matmul_tile=tile, matmul_warp_n=warp_n)
                except ValueError as exc:
                    self.record("fp32", size, name, None, float("nan"), f"rejected: {exc}")
                    continue
                be.copy_to_device(np.zeros(m * n, np.float32), ho)
                ns = self.time_op(lambda: be.matmul(ha, hb, ho, m, n, k))
                err = nmse(self.sample_rows(ho, m, n, rows), ref)
                note = f"stages={pol.matmul_stages} vec4={int(pol.matmul_vec4(n, k))}"
                self.record("fp32", size, name, ns, err, note)
        finally:
            for h in (ha, hb, ho):
                be.free(h)

    def f16(self, size: tuple[int, int, int], tiles, rng) -> None:
        be = self.be
        m, n, k = size
        why = KernelPolicy(self.props).matmul_f16_unsupported()
        if why and not self.emulate_coop:
            self.record("fp16", size, "-", None, float("nan"), f"unsupported: {why}")
            return
        a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
        rows = np.sort(rng.choice(m, min(SAMPLE_ROWS, m), replace=False))
        ref = a[rows].astype(np.float64) @ b.astype(np.float64)
        ha, hb, ho = be.allocate(a.nbytes), be.allocate(b.nbytes), be.allocate(4 * m * n)
        try:
            be.copy_to_device(a, ha)
            be.copy_to_device(b, hb)
            for tile in tiles:
                name = "x".join(map(str, tile)) + (" (emulated)" if self.emulate_coop else "")
                if self.late():
                    self.record("fp16", size, name, None, float("nan"), "skipped: time budget")
                    continue
                try:
                    pol = self.use(matmul_f16_tile=tile)
                except ValueError as exc:
                    self.record("fp16", size, name, None, float("nan"), f"rejected: {exc}")
                    continue
                be.copy_to_device(np.zeros(m * n, np.float32), ho)
                try:
                    ns = self.time_op(lambda: be.matmul_f16(ha, hb, ho, m, n, k))
                except Exception as exc:  # noqa: BLE001 - report and go on to the next variant
                    self.record("fp16", size, name, None, float("nan"), f"error: {type(exc).__name__}: {exc}")
                    continue
                err = nmse(self.sample_rows(ho, m, n, rows), ref)
                self.record("fp16", size, name, ns, err, f"stages={pol.matmul_f16_stages}")
        finally:
            for h in (ha, hb, ho):
                be.free(h)


def torch_rows(sizes, repeats: int, fp16: bool = True) -> list[dict]:
    try:
        import torch
    except ImportError:
        print("torch: not installed", flush=True)
        return []
    if not torch.cuda.is_available():
        print("torch: CUDA not available", flush=True)
        return []
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = []
    for m, n, k in sizes:
        kinds = ((torch.float32, "torch fp32 (TF32 off)"), (torch.float16, "torch fp16"))
        for dtype, label in kinds if fp16 else kinds[:1]:
            a = torch.rand(m, k, device="cuda", dtype=dtype) * 2 - 1
            b = torch.rand(k, n, device="cuda", dtype=dtype) * 2 - 1
            for _ in range(3):
                c = a @ b
            torch.cuda.synchronize()
            times = []
            for _ in range(repeats):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                c = a @ b
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) * 1e6)
            rows = torch.arange(0, m, max(1, m // SAMPLE_ROWS), device="cuda")[:SAMPLE_ROWS]
            ref = (a[rows].double() @ b.double())
            err = float(((c[rows].double() - ref) ** 2).sum() / (ref ** 2).sum())
            ns = statistics.median(times)
            tflops = 2 * m * n * k / ns / 1e3
            row = {"kind": "torch", "m": m, "n": n, "k": k, "variant": label, "ms": ns / 1e6,
                   "tflops": tflops, "nmse": err, "note": "CUDA events"}
            out.append(row)
            print(f"{'torch':<6} {m}x{n}x{k:<6} {label:<26} {ns / 1e6:9.3f} ms {tflops:8.2f} TFLOP/s  "
                  f"NMSE {err:9.2e} CUDA events", flush=True)
            del a, b, c
        torch.cuda.empty_cache()
    return out


def parse_fp32_variant(text: str) -> tuple[tuple[int, ...], int]:
    """"128x128x8x8x16x8:w4" (or "... w4", or no warp part: 0) -> ((128, 128, 8, 8, 16, 8), 4)."""
    tile, _, warp = text.replace(" ", ":").partition(":")
    try:
        parts = tuple(int(v) for v in tile.split("x"))
        warp_n = int(warp.lstrip("w")) if warp else 0
    except ValueError:
        raise argparse.ArgumentTypeError(f"fp32 variant {text!r} is not BMxBNxBKxTMxTNxGROUP_M[:wWARP_N]") from None
    if len(parts) != 6:
        raise argparse.ArgumentTypeError(f"fp32 variant {text!r} needs 6 numbers (BMxBNxBKxTMxTNxGROUP_M)")
    return parts, warp_n


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    """"4096,4096,4096;8192,8192,8192" -> [(4096, 4096, 4096), (8192, 8192, 8192)]."""
    try:
        sizes = [tuple(int(v) for v in part.split(",")) for part in text.split(";") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(len(sz) != 3 or min(sz) < 1 for sz in sizes):
        raise argparse.ArgumentTypeError(f"sizes {text!r} are not M,N,K[;M,N,K...] of positive ints")
    return sizes


def fastest_fp32(rows: list[dict], size: tuple[int, int, int], variants) -> list:
    """``variants`` that ran at ``size``, fastest first."""
    speed = {r["variant"]: r["tflops"] for r in rows
             if r["kind"] == "fp32" and (r["m"], r["n"], r["k"]) == size and r["tflops"] == r["tflops"]}
    ran = [v for v in variants if fp32_name(*v) in speed]
    return sorted(ran, key=lambda v: -speed[fp32_name(*v)])


def print_fp32_ranking(rows: list[dict]) -> None:
    """Per size: the fp32 variants fastest first, with the ratio to torch fp32 of the same run."""
    sizes = sorted({(r["m"], r["n"], r["k"]) for r in rows if r["kind"] == "fp32"})
    for size in sizes:
        peer = next((r["tflops"] for r in rows if r["kind"] == "torch" and (r["m"], r["n"], r["k"]) == size
                     and "fp32" in r["variant"]), None)
        ran = sorted((r for r in rows if r["kind"] == "fp32" and (r["m"], r["n"], r["k"]) == size
                      and r["tflops"] == r["tflops"]), key=lambda r: -r["tflops"])
        head = f"torch fp32 {peer:.2f} TFLOP/s" if peer else "no torch peer"
        print(f"fp32 ranking {size[0]}x{size[1]}x{size[2]} ({head}):")
        for i, r in enumerate(ran, 1):
            ratio = f"{r['tflops'] / peer:5.3f}x" if peer else "   -  "
            print(f"  {i:2d}. {r['variant']:<26} {r['tflops']:8.2f} TFLOP/s  {ratio}  NMSE {r['nmse']:.1e}",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="tiny sizes and few variants (CPU drivers)")
    ap.add_argument("--device", type=int, default=0, help="Vulkan device index")
    ap.add_argument("--repeats", type=int, default=None, help="timed samples per variant (median)")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds; later variants are skipped")
    ap.add_argument("--emulate-coop", action="store_true",
                    help="run the fp16 variants on the emulated kernel (no cooperative matrices needed)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--fp32-only", action="store_true", help="only the fp32 variants (and torch fp32)")
    ap.add_argument("--fp32-variant", action="append", default=[], metavar="BMxBNxBKxTMxTNxGROUP_M[:wWARP_N]",
                    type=parse_fp32_variant, help="fp32 variants to run in place of the built-in list (repeat)")
    ap.add_argument("--sizes", type=parse_sizes, default=None, metavar="M,N,K[;M,N,K...]",
                    help="sizes in place of 4096^3 and 8192^3")
    ap.add_argument("--top", type=int, default=6,
                    help="fp32 at the larger sizes: the default and the N fastest of the first size")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    start = time.monotonic()
    rng = np.random.default_rng(0)
    if args.small:
        sizes = [(256, 256, 256), (201, 137, 75)]  # aligned, then the general (scalar) paths
        fp32_variants = SMALL_FP32_VARIANTS
        f16_tiles = [F16_TILES[0], F16_TILES[5]]
        repeats = args.repeats or 3
    else:
        sizes = args.sizes or [(4096, 4096, 4096), (8192, 8192, 8192)]
        fp32_variants, f16_tiles = args.fp32_variant or FP32_VARIANTS, F16_TILES
        repeats = args.repeats or 5
    rows: list[dict] = []
    with VulkanBackend(args.device) as be:
        props = be.device_properties
        default = KernelPolicy(props)
        emulate = args.emulate_coop or (args.small and bool(default.matmul_f16_unsupported()))
        print(f"device: {props['device_name']} ({props.get('driver_info', '')}), subgroup "
              f"{props.get('subgroup_size')}, shared {props.get('max_shared_memory')} B", flush=True)
        print(f"defaults: matmul_tile {default.matmul_tile} group {default.matmul_group_m} stages "
              f"{default.matmul_stages} warp_n {default.matmul_warp_n}; matmul_f16_tile {default.matmul_f16_tile} "
              f"({'supported' if not default.matmul_f16_unsupported() else default.matmul_f16_unsupported()})",
              flush=True)
        probe = Probe(be, repeats, start + args.budget, emulate)
        auto = (default.matmul_tile[:5] + (default.matmul_group_m,), default.matmul_warp_n)
        variants = [auto] + [v for v in fp32_variants if v != auto]
        for i, size in enumerate(sizes):
            probe.fp32(size, variants, rng)
            if i == 0:  # the larger sizes take the default and the fastest few of the first
                variants = [auto] + [v for v in fastest_fp32(probe.rows, size, variants) if v != auto][:args.top]
        if not args.small:  # the general path at an odd size: the default and the fastest
            probe.fp32((4095, 4095, 4095), variants[:2], rng)
        if not args.fp32_only:
            for size in sizes:
                probe.f16(size, f16_tiles, rng)
        rows += probe.rows
    if not args.no_torch:
        rows += torch_rows(sizes, repeats, fp16=not args.fp32_only)
    print_fp32_ranking(rows)
    best = {}
    for r in rows:
        key = (r["kind"], r["m"], r["n"], r["k"])
        if r["tflops"] == r["tflops"] and r["tflops"] > best.get(key, (0.0, ""))[0]:
            best[key] = (r["tflops"], r["variant"])
    print("best:", "; ".join(f"{k[0]} {k[1]}x{k[2]}x{k[3]}: {v[1]} {v[0]:.2f} TFLOP/s" for k, v in best.items()))
    print(f"total {time.monotonic() - start:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
