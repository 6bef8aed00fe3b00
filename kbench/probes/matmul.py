"""Probe kbench's matmul kernels on one Vulkan device: tile variants of the fp32 SGEMM
(shaders/matmul.comp) and of the fp16 / bf16 cooperative-matrix matmuls (shaders/matmul_coop.comp
on VK_KHR_cooperative_matrix, shaders/matmul_coop2.comp on VK_NV_cooperative_matrix2), with
PyTorch's fp32 (TF32 off), fp16 and bf16 matmul beside them when CUDA is there.

    kbench probe matmul            # on the GPU: 4096^3 and 8192^3, a few minutes (--budget cuts it)
    kbench probe matmul --small    # tiny sizes (lavapipe / CI smoke test)
    kbench probe matmul --kinds fp16,bf16   # only the cooperative-matrix kernels

It first prints the device's cooperative-matrix properties (the KHR configurations with 16-bit
inputs, VK_NV_cooperative_matrix2's limits and flexible-dimension configurations, the features).

Each variant is timed with GPU timestamps (VulkanBackend.measure_gpu_ns: one op per sample, warm-up
first, median of --repeats), and checked on a few sampled rows against float64 NumPy (fp16: of the
rounded inputs).  Variants are selected through KernelPolicy options on one backend, so the inputs
are uploaded once per size.  Columns: variant, ms (median), TFLOP/s, NMSE on the sample.

fp32 variants are matmul_tile = (BM, BN, BK, TM, TN, GROUP_M) with matmul_warp_n and flags (named
"BMxBNxBKxTMxTNxGROUP_M wWARP_N [FLAG...]", FP32_FLAGS); spec constants of matmul.comp: (invocations,
BM, BN, BK, TM, TN, VEC4, STAGES, GROUP_M, WARP_N, SPLIT), STAGES = 2 where two slices fit in shared
memory.  Every variant runs at the first size; the larger sizes take the default and the --top
fastest of the first.  The end ranks the fp32 variants per size with their ratio to torch fp32 of the
same run (--fp32-only: no fp16 or bf16 part).  The H200's driver takes about 6 s to compile each fp32
variant's pipeline (over a minute for the 128-accumulator tiles, listed last).  fp16 variants are matmul_f16_tile = (WG_M, WG_N, SG_M, SG_N, BK, GROUP_M); spec
constants of matmul_coop.khr.spv: (invocations, WG_M, WG_N, SG_M, SG_N, BK, VEC, STAGES, GROUP_M).
coopmat2 variants ("cm2 ...") are matmul_f16_cm2_tile = (BM, BN, BK, THREADS, GROUP_M, UNROLL);
"cm2t ..." the same kernel reading B transposed (matmul_f16_cm2_b="transposed": a transpose pass writes B^T
once, which the backend keeps while B is not written, as it keeps repacked weights; both operands are then
read along k): the timed calls are the product's, the note gives the pass's own time.
Each is also run once on a shape that is not a multiple of its tile (the clamped loads and clipped
stores), whose NMSE over the whole output is the note "edge NMSE".  bf16 inputs are float32 values rounded to
bfloat16 (kbench.quant), the reference the float64 product of those exact values.
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
FP32_VARIANTS: list[tuple] = [
    (KernelPolicy.MATMUL_GPU_TILE + (KernelPolicy.MATMUL_GPU_GROUP_M,), KernelPolicy.MATMUL_GPU_WARP_N),
    ((128, 128, 8, 8, 8, 8), 4, "checked"),  # the same with bounds checks (VEC4 = 1)
    ((128, 128, 8, 8, 8, 8), 4, "split"),    # A's and B's next slices fetched half a slice apart
    ((128, 128, 16, 8, 8, 8), 4, "split"),   # BK 16 holding only one of them at a time
    ((128, 128, 8, 8, 8, 8), 0),     # 256 invocations of 8x8, row-major (16 x 2 per subgroup)
    ((128, 128, 8, 8, 8, 8), 8),     # 4 x 8 patches
    ((128, 128, 8, 8, 8, 8), 4),     # 8 x 4 patches
    ((128, 128, 16, 8, 8, 8), 4),    # BK 16 at 256 invocations
    ((128, 128, 4, 8, 8, 8), 4),     # BK 4: fewer staging registers, twice the barriers
    ((64, 128, 8, 8, 8, 8), 4),      # 128 invocations of 8x8 (finer occupancy steps)
    ((64, 128, 16, 8, 8, 8), 4),
    ((128, 64, 8, 8, 8, 8), 4),
    ((128, 128, 8, 8, 8, 4), 4),     # block-row grouping 4 / 16 / none
    ((128, 128, 8, 8, 8, 16), 4),
    ((128, 128, 8, 8, 8, 1), 4),
    # 128 accumulators per invocation: the H200's driver took over a minute to compile each
    ((128, 128, 8, 8, 16, 8), 0),    # 128 invocations of 8x16 (4 x 8 row-major)
    ((128, 128, 8, 16, 8, 8), 8),    # 128 invocations of 16x8
    ((128, 128, 16, 8, 16, 8), 0),
    ((128, 256, 8, 8, 16, 8), 8),    # 256 invocations of 8x16
    ((256, 128, 8, 16, 8, 8), 8),    # 256 invocations of 16x8
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
#: coopmat2 variants (BM, BN, BK, THREADS, GROUP_M, UNROLL); a device lists the workgroup sizes and
#: granularities it accepts, the others are reported as rejected
CM2_TILES = [
    (128, 256, 32, 256, 8, 1),
    (128, 256, 32, 256, 8, 4),
    (128, 128, 32, 128, 8, 4),
    (128, 256, 16, 256, 8, 8),
    (128, 256, 64, 256, 8, 2),
    (128, 128, 16, 128, 8, 8),
    (256, 128, 32, 256, 8, 4),
    (128, 256, 32, 256, 8, 8),
    (64, 64, 32, 128, 8, 4),
]
#: how many of CM2_TILES the bf16 sweep runs
BF16_CM2_TILES = 2
#: the KHR kernel beside them: its default tile first (bf16 runs that one only)
KHR_COOP_TILES = F16_TILES
EDGE_SIZE = (333, 517, 259)
SAMPLE_ROWS = 8


#: fp32 variant flags: "checked" keeps the bounds checks where the sizes are whole tiles
#: (KernelPolicy.matmul_unchecked off), "split" staggers A's and B's fetches (matmul_split),
#: "nosplit" turns that off where the default has it
FP32_FLAGS = ("checked", "split", "nosplit")


def fp32_name(tile: tuple[int, ...], warp_n: int, flags: str = "") -> str:
    """A variant's name in the probe's rows: "BMxBNxBKxTMxTNxGROUP_M wWARP_N[ FLAG...]"."""
    return " ".join(["x".join(map(str, tile)), f"w{warp_n}"] + flags.split())


def bf16_round(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bfloat16 bit patterns as uint16, their float32 values) of float32 ``x``."""
    from kbench.quant import DType, dequantize, quantize

    bits = np.frombuffer(quantize(np.asarray(x, np.float32).ravel(), DType.BF16), "<u2").reshape(np.shape(x))
    return bits.copy(), dequantize(bits.tobytes(), DType.BF16, np.shape(x)).astype(np.float32)


def coop_properties(props: dict) -> list[str]:
    """Lines describing a device's cooperative-matrix support (for the probe's header)."""
    feats = props.get("features", {})
    lines = ["features: " + ", ".join(f"{k}={int(bool(v))}" for k, v in sorted(feats.items())
                                      if "cooperative" in k or "bfloat16" in k or k in ("float16", "vulkan_memory_model"))]
    khr = [c for c in props.get("cooperative_matrix_properties") or []
           if c.get("a") in ("f16", "bf16") or c.get("result") in ("f16", "bf16")]
    lines.append(f"KHR configurations with 16-bit types ({len(khr)} of "
                 f"{len(props.get('cooperative_matrix_properties') or [])}):")
    lines += [f"  {c['M']}x{c['N']}x{c['K']} {c['a']} x {c['b']} + {c['c']} -> {c['result']} scope {c['scope']}"
              for c in khr]
    c2 = props.get("cooperative_matrix2_properties") or {}
    if not c2:
        lines.append("VK_NV_cooperative_matrix2: absent")
        return lines
    lines.append("VK_NV_cooperative_matrix2: " + ", ".join(f"{k}={v}" for k, v in c2.items()
                                                           if k != "flexible_dimensions"))
    for c in c2.get("flexible_dimensions") or []:
        lines.append(f"  flexible {c['M']}x{c['N']}x{c['K']} {c['a']} x {c['b']} + {c['c']} -> {c['result']} "
                     f"scope {c['scope']} workgroup {c['workgroup_invocations']}")
    return lines


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
        #: also run each cooperative-matrix variant on EDGE_SIZE (GPUs; too slow emulated)
        self.edge_check = not emulate_coop
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
        print(f"{kind:<6} {m}x{n}x{k:<6} {variant:<32} {ms:9.3f} ms {tflops:8.2f} TFLOP/s  "
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
            for tile, warp_n, *flags in variants:
                name = fp32_name(tile, warp_n, *flags)
                flags = " ".join(flags).split()
                if self.late():
                    self.record("fp32", size, name, None, float("nan"), "skipped: time budget")
                    continue
                try:
                    pol = self.use(matmul_tile=tile, matmul_warp_n=warp_n)
                    pol.matmul_unchecked = "checked" not in flags
                    pol.matmul_split = "split" in flags or (pol.matmul_split and "nosplit" not in flags)
                except ValueError as exc:
                    self.record("fp32", size, name, None, float("nan"), f"rejected: {exc}")
                    continue
                be.copy_to_device(np.zeros(m * n, np.float32), ho)
                ns = self.time_op(lambda: be.matmul(ha, hb, ho, m, n, k))
                err = nmse(self.sample_rows(ho, m, n, rows), ref)
                note = f"stages={pol.matmul_stages} vec4={pol.matmul_path(m, n, k)} split={int(pol.matmul_split)}"
                self.record("fp32", size, name, ns, err, note)
        finally:
            for h in (ha, hb, ho):
                be.free(h)

    def coop(self, dtype: str, size: tuple[int, int, int], variants: list[tuple[str, tuple[int, ...]]], rng) -> None:
        """Time each (path, tile) variant of matmul_f16 / matmul_bf16 on one size."""
        be = self.be
        m, n, k = size
        kind = "fp16" if dtype == "f16" else "bf16"
        a, va = half_inputs(dtype, (m, k), rng)
        b, vb = half_inputs(dtype, (k, n), rng)
        rows = np.sort(rng.choice(m, min(SAMPLE_ROWS, m), replace=False))
        ref = va[rows].astype(np.float64) @ vb.astype(np.float64)
        ha, hb, ho = be.allocate(a.nbytes), be.allocate(b.nbytes), be.allocate(4 * m * n)
        op = be.matmul_f16 if dtype == "f16" else be.matmul_bf16
        try:
            be.copy_to_device(a, ha)
            be.copy_to_device(b, hb)
            for path, tile in variants:
                name = COOP_PREFIX[path] + " " + "x".join(map(str, tile))
                if self.emulate_coop:
                    name += " (emulated)"
                if self.late():
                    self.record(kind, size, name, None, float("nan"), "skipped: time budget")
                    continue
                try:
                    if path in ("coopmat2", "coopmat2-bt"):
                        pol = self.use(matmul_f16_path="coopmat2", matmul_f16_cm2_tile=tile,
                                       matmul_f16_cm2_b="transposed" if path == "coopmat2-bt" else "rows")
                    else:
                        pol = self.use(matmul_f16_path="khr", matmul_f16_tile=tile)
                    pol.matmul_f16_plan(m, n, k, dtype)
                except Exception as exc:  # noqa: BLE001 - ValueError or UnsupportedFeatureError: say and go on
                    self.record(kind, size, name, None, float("nan"), f"rejected: {exc}")
                    continue
                be.copy_to_device(np.zeros(m * n, np.float32), ho)
                try:
                    ns = self.time_op(lambda: op(ha, hb, ho, m, n, k))
                    err = nmse(self.sample_rows(ho, m, n, rows), ref)
                    note = f"stages={pol.matmul_f16_stages}" if path == "khr" else ""
                    if pol.matmul_f16_b_transposed(dtype):
                        note += f" transpose of B {self.transpose_us(hb, k, n):.1f} us"
                    if self.edge_check and not self.late():
                        note += f" edge NMSE {self.edge_nmse(op, dtype):.1e}"
                except Exception as exc:  # noqa: BLE001 - report and go on to the next variant
                    self.record(kind, size, name, None, float("nan"), f"error: {type(exc).__name__}: {exc}")
                    continue
                self.record(kind, size, name, ns, err, note.strip())
        finally:
            for h in (ha, hb, ho):
                be.free(h)

    def transpose_us(self, hb, rows: int, cols: int) -> float:
        """GPU time of the transpose pass alone on B (rows x cols 16-bit elements), in us."""
        be = self.be
        ht = be.allocate(2 * rows * cols)
        try:
            ns = self.time_op(lambda: be._transpose16(hb.id, ht.id, rows, cols))  # noqa: SLF001 - the pass alone
        finally:
            be.free(ht)
        return ns / 1e3 if ns else float("nan")

    def edge_nmse(self, op, dtype: str) -> float:
        """NMSE of the current variant over the whole output of EDGE_SIZE (not a multiple of any tile)."""
        be = self.be
        m, n, k = EDGE_SIZE
        a, va = half_inputs(dtype, (m, k), np.random.default_rng(7))
        b, vb = half_inputs(dtype, (k, n), np.random.default_rng(8))
        ref = va.astype(np.float64) @ vb.astype(np.float64)
        ha, hb, ho = be.allocate(a.nbytes), be.allocate(b.nbytes), be.allocate(4 * m * n)
        try:
            be.copy_to_device(a, ha)
            be.copy_to_device(b, hb)
            be.copy_to_device(np.full(m * n, np.nan, np.float32), ho)
            op(ha, hb, ho, m, n, k)
            got = np.empty(m * n, np.float32)
            be.copy_from_device(ho, got)
        finally:
            for h in (ha, hb, ho):
                be.free(h)
        return nmse(got.reshape(m, n), ref)


def half_inputs(dtype: str, shape: tuple[int, int], rng) -> tuple[np.ndarray, np.ndarray]:
    """(what is uploaded, its values as float32): uniform [-1, 1) rounded to fp16 or bf16."""
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    if dtype == "f16":
        h = x.astype(np.float16)
        return h, h
    return bf16_round(x)


def torch_rows(sizes, repeats: int, kinds=("fp32", "fp16", "bf16")) -> list[dict]:
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
        for dtype, label in ((torch.float32, "torch fp32 (TF32 off)"), (torch.float16, "torch fp16"),
                             (torch.bfloat16, "torch bf16")):
            if label.split()[1] not in kinds:
                continue
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
            print(f"{'torch':<6} {m}x{n}x{k:<6} {label:<32} {ns / 1e6:9.3f} ms {tflops:8.2f} TFLOP/s  "
                  f"NMSE {err:9.2e} CUDA events", flush=True)
            del a, b, c
        torch.cuda.empty_cache()
    return out


def parse_fp32_variant(text: str) -> tuple:
    """"128x128x8x8x16x8:w4" (or "... w4", or no warp part: 0; then ":FLAG" for each of FP32_FLAGS
    wanted) -> ((128, 128, 8, 8, 16, 8), 4[, "FLAG ..."])."""
    tile, _, warp = text.replace(" ", ":").partition(":")
    warp, _, flag = warp.partition(":")
    flags = [f for f in flag.split(":") if f]
    try:
        if any(f not in FP32_FLAGS for f in flags):
            raise ValueError(flag)
        parts = tuple(int(v) for v in tile.split("x"))
        warp_n = int(warp.lstrip("w")) if warp else 0
    except ValueError:
        raise argparse.ArgumentTypeError(f"fp32 variant {text!r} is not BMxBNxBKxTMxTNxGROUP_M[:wWARP_N[:FLAG...]] "
                                         f"(flags: {', '.join(FP32_FLAGS)})") from None
    if len(parts) != 6:
        raise argparse.ArgumentTypeError(f"fp32 variant {text!r} needs 6 numbers (BMxBNxBKxTMxTNxGROUP_M)")
    return (parts, warp_n, " ".join(flags)) if flags else (parts, warp_n)


#: a cooperative-matrix variant's path -> the prefix of its name (and of --coop-variant)
COOP_PREFIX = {"coopmat2": "cm2", "coopmat2-bt": "cm2t", "khr": "khr"}


def parse_coop_variant(text: str) -> tuple[str, tuple[int, ...]]:
    """"cm2:128x256x64x256x8x1" -> ("coopmat2", (128, 256, 64, 256, 8, 1)); "cm2t:..." ->
    ("coopmat2-bt", ...) (B transposed first); "khr:2x4x4x2x32x8" -> ("khr", (2, 4, 4, 2, 32, 8)):
    a cooperative-matrix variant for --coop-variant."""
    path, _, tile = text.partition(":")
    cm2 = "BMxBNxBKxTHREADSxGROUP_MxUNROLL"
    want = {"cm2": ("coopmat2", 6, cm2), "cm2t": ("coopmat2-bt", 6, cm2), "khr": ("khr", 6, "WG_MxWG_NxSG_MxSG_NxBKxGROUP_M")}
    if path not in want:
        raise argparse.ArgumentTypeError(f"coop variant {text!r} must start with cm2:, cm2t: or khr:")
    name, count, shape = want[path]
    try:
        parts = tuple(int(v) for v in tile.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"coop variant {text!r} is not {path}:{shape}") from None
    if len(parts) != count:
        raise argparse.ArgumentTypeError(f"coop variant {text!r} needs {count} numbers ({shape})")
    return name, parts


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


def print_coop_ranking(rows: list[dict]) -> None:
    """Per kind (fp16, bf16) and size: the variants fastest first, with the ratio to torch fp16 and
    to torch of the same input type, of the same run."""
    def peer(label: str, size) -> float | None:
        return next((r["tflops"] for r in rows if r["kind"] == "torch" and (r["m"], r["n"], r["k"]) == size
                     and r["variant"] == label), None)

    for kind in ("fp16", "bf16"):
        for size in sorted({(r["m"], r["n"], r["k"]) for r in rows if r["kind"] == kind}):
            p16, same = peer("torch fp16", size), peer(f"torch {kind}", size)
            ran = sorted((r for r in rows if r["kind"] == kind and (r["m"], r["n"], r["k"]) == size
                          and r["tflops"] == r["tflops"]), key=lambda r: -r["tflops"])
            head = ", ".join(f"{lab} {v:.2f} TFLOP/s" for lab, v in (("torch fp16", p16), (f"torch {kind}", same)) if v)
            print(f"{kind} ranking {size[0]}x{size[1]}x{size[2]} ({head or 'no torch peer'}):")
            for i, r in enumerate(ran, 1):
                ratios = "  ".join(f"{r['tflops'] / v:5.3f}x {lab}" for lab, v in (("fp16", p16), (kind, same)) if v)
                print(f"  {i:2d}. {r['variant']:<30} {r['tflops']:8.2f} TFLOP/s  {ratios}  NMSE {r['nmse']:.1e}  "
                      f"{r['note']}", flush=True)


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
            print(f"  {i:2d}. {r['variant']:<32} {r['tflops']:8.2f} TFLOP/s  {ratio}  NMSE {r['nmse']:.1e}",
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
    ap.add_argument("--fp32-variant", action="append", default=[],
                    metavar="BMxBNxBKxTMxTNxGROUP_M[:wWARP_N[:FLAG...]]",
                    type=parse_fp32_variant, help="fp32 variants to run in place of the built-in list (repeat)")
    ap.add_argument("--coop-variant", action="append", default=[], type=parse_coop_variant,
                    metavar="cm2[t]:BMxBNxBKxTHREADSxGROUP_MxUNROLL|khr:WG_MxWG_NxSG_MxSG_NxBKxGROUP_M",
                    help="fp16/bf16 variants to run in place of the built-in lists (repeat)")
    ap.add_argument("--sizes", type=parse_sizes, default=None, metavar="M,N,K[;M,N,K...]",
                    help="sizes in place of 4096^3 and 8192^3")
    ap.add_argument("--top", type=int, default=6,
                    help="fp32 at the larger sizes: the default and the N fastest of the first size")
    ap.add_argument("--kinds", default="fp32,fp16,bf16",
                    help="comma-separated subset of fp32, fp16, bf16 (default: all)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    kinds = ["fp32"] if args.fp32_only else [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = sorted(set(kinds) - {"fp32", "fp16", "bf16"})
    if bad:
        ap.error(f"--kinds: unknown {bad} (choose from fp32, fp16, bf16)")
    start = time.monotonic()
    rng = np.random.default_rng(0)
    if args.small:
        sizes = [(256, 256, 256), (201, 137, 75)]  # aligned, then the general (scalar) paths
        fp32_variants = SMALL_FP32_VARIANTS
        khr_tiles = [F16_TILES[0], F16_TILES[5]]
        cm2_tiles = [CM2_TILES[0], CM2_TILES[-1]]
        repeats = args.repeats or 3
    else:
        sizes = args.sizes or [(4096, 4096, 4096), (8192, 8192, 8192)]
        fp32_variants, khr_tiles, cm2_tiles = args.fp32_variant or FP32_VARIANTS, KHR_COOP_TILES, CM2_TILES
        repeats = args.repeats or 5
    rows: list[dict] = []
    if not args.no_torch:  # first: a later time-out or device loss does not lose the peer's figures
        rows += torch_rows(sizes, repeats, kinds)
    with VulkanBackend(args.device) as be:
        props = be.device_properties
        default = KernelPolicy(props)
        emulate = args.emulate_coop or (args.small and bool(default.matmul_f16_unsupported()))
        print(f"device: {props['device_name']} ({props.get('driver_info', '')}), subgroup "
              f"{props.get('subgroup_size')}, shared {props.get('max_shared_memory')} B", flush=True)
        for line in coop_properties(props):
            print(line, flush=True)
        for dtype in ("f16", "bf16"):
            path = default.matmul_f16_path(dtype)
            tile = default.matmul_f16_cm2_tile(dtype) if path == "coopmat2" else default.matmul_f16_tile
            why = default.matmul_f16_cm2_unsupported(dtype) or "-"
            print(f"default {dtype}: path {path or 'none'} tile {tile if path else '-'} "
                  f"(coopmat2: {why}; khr: {default.matmul_f16_unsupported(dtype) or 'supported'})", flush=True)
        print(f"defaults: matmul_tile {default.matmul_tile} group {default.matmul_group_m} stages "
              f"{default.matmul_stages} warp_n {default.matmul_warp_n}", flush=True)
        probe = Probe(be, repeats, start + args.budget, emulate)
        if "fp32" in kinds:
            auto = (default.matmul_tile[:5] + (default.matmul_group_m,), default.matmul_warp_n)
            variants = [auto] + [v for v in fp32_variants if v != auto]
            for i, size in enumerate(sizes):
                probe.fp32(size, variants, rng)
                if i == 0:  # the larger sizes take the default and the fastest few of the first
                    variants = [auto] + [v for v in fastest_fp32(probe.rows, size, variants) if v != auto][:args.top]
            if not args.small:  # the general path at an odd size: the default and the fastest
                probe.fp32((4095, 4095, 4095), variants[:2], rng)
        for kind, dtype in (("fp16", "f16"), ("bf16", "bf16")):
            if kind not in kinds:
                continue
            # emulated: the KHR kernel stands in for both paths, so only its tiles are run; bf16
            # (the same matrix units) takes the first few coopmat2 tiles only, to save time
            tiles = cm2_tiles if dtype == "f16" else cm2_tiles[:BF16_CM2_TILES]
            khr = khr_tiles if dtype == "f16" else khr_tiles[:1]
            # the first tile once more with B transposed first (as ggml's coopmat2 matmul reads it)
            cm2 = [("coopmat2", t) for t in tiles] + [("coopmat2-bt", t) for t in tiles[:1]]
            variants = [("khr", t) for t in khr] + ([] if emulate else cm2)
            if args.coop_variant:
                variants = [v for v in args.coop_variant if not (emulate and v[0] != "khr")]
            for size in sizes:
                probe.coop(dtype, size, variants, rng)
        rows += probe.rows
    print_fp32_ranking(rows)
    print_coop_ranking(rows)
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
