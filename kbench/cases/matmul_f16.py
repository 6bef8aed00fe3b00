"""The matmul_f16 and matmul_bf16 cases: out[m,n] = A[m,k] @ B[k,n] with A and B float16 (or
bfloat16), out float32.

The reduced-precision path that tensor cores / cooperative matrices serve (VulkanBackend.matmul_f16
on VK_KHR_cooperative_matrix, 16x16x16 -> f32, or VK_NV_cooperative_matrix2's workgroup-scope
matrices, chosen from the device's properties: kernels.py KernelPolicy.matmul_f16_plan).  The inputs
are generated as float32 and rounded once (to float16, or to bfloat16 bit patterns stored as
uint16, kbench.quant's round-to-nearest-even); the reference is the float64 product of the
*rounded* values, so the NMSE measures the accumulation (and output rounding) only, not the input
rounding.

matmul_bf16 runs where the device has bfloat16 cooperative matrices (VK_KHR_shader_bfloat16);
elsewhere its Vulkan op raises UnsupportedFeatureError and the case is recorded unsupported with
the reason.  Its tolerance MATMUL_BF16_TOL = 2e-5 admits a peer whose output is bfloat16 (one
rounding: NMSE about (2^-8)^2 / 3 = 5e-6, torch's bf16 matmul) and fails bfloat16 accumulation.

Tolerance MATMUL_F16_TOL = 1e-6 NMSE: products of two halves are exact in float32 and float32
accumulation measures about 1e-11 to 1e-10 here (as for the fp32 matmul); 1e-6 also admits a peer
whose output is float16 (one rounding to half: NMSE about (2^-11)^2 / 3 = 8e-8, the torch peer's
fp16 matmul) but fails float16 *accumulation*, whose error grows with k far beyond it.

Features: the case declares none, although the Vulkan kernel needs the cooperative-matrix
feature: the NumPy reference target (and the torch peer, whose properties list no Vulkan features)
must run it.  A Vulkan device without the feature reports the case unsupported all the same: its
matmul_f16 raises kbench.runtime.UnsupportedFeatureError before any GPU work, and the runner
records that exception as "unsupported"; a backend without a matmul_f16 op raises UnsupportedCase.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kbench.backend.base import has_matmul_f16
from kbench.quant import DType, quantize

from .base import Arrays, Case, Params, UnsupportedCase
from .buffers import BackendBuffers

#: NMSE threshold of matmul_f16 (see the module docstring)
MATMUL_F16_TOL = 1e-6
#: NMSE threshold of matmul_bf16 (see the module docstring)
MATMUL_BF16_TOL = 2e-5


def _mnk(p: Params) -> tuple[int, int, int]:
    return int(p["m"]), int(p["n"]), int(p["k"])


def _generate(p: Params, rng: np.random.Generator) -> Arrays:
    m, n, k = _mnk(p)
    a = rng.uniform(-1.0, 1.0, m * k).astype(np.float32).astype(np.float16)
    b = rng.uniform(-1.0, 1.0, k * n).astype(np.float32).astype(np.float16)
    return {"a": a, "b": b}


def _reference(inp: Arrays, p: Params) -> Arrays:
    m, n, k = _mnk(p)
    a = np.asarray(inp["a"], dtype=np.float64).reshape(m, k)
    b = np.asarray(inp["b"], dtype=np.float64).reshape(k, n)
    return {"out": (a @ b).ravel()}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest, ties to even), as uint16 bit patterns."""
    return np.frombuffer(quantize(np.asarray(x, np.float32).ravel(), DType.BF16), "<u2").copy()


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """The float64 values of bfloat16 bit patterns (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _generate_bf16(p: Params, rng: np.random.Generator) -> Arrays:
    m, n, k = _mnk(p)
    a = bf16_bits(rng.uniform(-1.0, 1.0, m * k).astype(np.float32))
    b = bf16_bits(rng.uniform(-1.0, 1.0, k * n).astype(np.float32))
    return {"a": a, "b": b}


def _reference_bf16(inp: Arrays, p: Params) -> Arrays:
    m, n, k = _mnk(p)
    a = bf16_values(inp["a"]).reshape(m, k)
    b = bf16_values(inp["b"]).reshape(k, n)
    return {"out": (a @ b).ravel()}


def _setup(t: Any, inp: Arrays, p: Params, op: str = "matmul_f16") -> dict:
    if not has_matmul_f16(t.backend, op):
        raise UnsupportedCase(f"the {t.backend.name()} backend has no {op} op")
    bufs = BackendBuffers(t.backend)
    m, n, _ = _mnk(p)
    return {"bufs": bufs, "a": bufs.upload(inp["a"]), "b": bufs.upload(inp["b"]),
            "out": bufs.guarded(4 * m * n)}


def _launch(t: Any, s: dict, p: Params) -> None:
    t.backend.matmul_f16(s["a"], s["b"], s["out"].handle, *_mnk(p))


def _setup_bf16(t: Any, inp: Arrays, p: Params) -> dict:
    return _setup(t, inp, p, "matmul_bf16")


def _launch_bf16(t: Any, s: dict, p: Params) -> None:
    t.backend.matmul_bf16(s["a"], s["b"], s["out"].handle, *_mnk(p))


def _collect(t: Any, s: dict, p: Params) -> Arrays:
    t.backend.synchronize()
    return {"out": s["bufs"].read_f32(s["out"], "out")}


def _teardown(_t: Any, state: Any) -> None:
    if isinstance(state, dict) and "bufs" in state:
        state["bufs"].free_all()


def _bytes(p: Params) -> int:
    m, n, k = _mnk(p)
    return 2 * (m * k + k * n) + 4 * m * n


MATMUL_F16 = Case(
    name="matmul_f16", layer="backend",
    description="out[m,n] = A[m,k] @ B[k,n], A and B float16, out float32 (fp32 accumulation; "
                "cooperative matrices on Vulkan)",
    generate=_generate, reference=_reference, setup=_setup, launch=_launch,
    collect=_collect, teardown=_teardown,
    validate_sizes=tuple({"m": m, "n": n, "k": k} for m, n, k in (
        (1, 1, 1), (16, 16, 16), (5, 3, 7), (33, 17, 65), (64, 64, 64), (100, 70, 130), (2, 300, 257),
        (128, 136, 40))),
    bench_sizes=tuple({"m": s, "n": s, "k": s} for s in (4096, 8192)), quick={"m": 4096},
    ops=("matmul_f16",), tolerance=MATMUL_F16_TOL,
    bytes_moved=_bytes, flops=lambda p: 2 * int(p["m"]) * int(p["n"]) * int(p["k"]),
    footprint=_bytes,
    largest_buffer=lambda p: max(2 * int(p["m"]) * int(p["k"]), 2 * int(p["k"]) * int(p["n"]),
                                 4 * int(p["m"]) * int(p["n"])),
    peak="coopmat_fp16",
)


MATMUL_BF16 = Case(
    name="matmul_bf16", layer="backend",
    description="out[m,n] = A[m,k] @ B[k,n], A and B bfloat16 (uint16 bit patterns), out float32 (fp32 "
                "accumulation; cooperative matrices on Vulkan where the device has bfloat16 ones)",
    generate=_generate_bf16, reference=_reference_bf16, setup=_setup_bf16, launch=_launch_bf16,
    collect=_collect, teardown=_teardown,
    validate_sizes=MATMUL_F16.validate_sizes, bench_sizes=MATMUL_F16.bench_sizes,
    # not a headline case, and 8192^3 only in --full runs: the main job stays short (kbench probe
    # matmul times both sizes beside torch)
    full_only=lambda p: int(p["m"]) >= 8192,
    ops=("matmul_bf16",), tolerance=MATMUL_BF16_TOL,
    bytes_moved=_bytes, flops=MATMUL_F16.flops, footprint=_bytes, largest_buffer=MATMUL_F16.largest_buffer,
    # the same matrix units at the same rate as fp16 on the GPUs that have both (NVIDIA, AMD RDNA3+)
    peak="coopmat_fp16",
)
