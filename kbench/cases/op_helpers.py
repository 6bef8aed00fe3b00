"""What the backend-op cases share: inputs, tolerances, size tables, buffer read-back.

Sizes count float32 elements for compute ops and bytes for allocate/copy cases. Validate sizes
are small (they run on lavapipe in CI) and include the edges: 1, sizes that are not a multiple of
a workgroup, sizes larger than one workgroup's reach. Bench sizes are model-like; the runner
reports those that do not fit the device as unsupported.

Tolerances: 1e-7 NMSE for elementwise ops, rms_norm and rope; 1e-6 for softmax (the values
used by llama.cpp's test-backend-ops). Matmul-class ops are held to 1e-8: float32 accumulation
against a float64 oracle measures about 1e-11 to 1e-10 at k = 8192 (the error grows like
k * eps^2), so 1e-8 leaves room for any summation order but catches TF32/fp16 accumulation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .base import Arrays, Params
from .buffers import BackendBuffers

MiB = 1 << 20

#: float32 tolerances (NMSE)
ELEMENTWISE_TOL = 1e-7
SOFTMAX_TOL = 1e-6
MATMUL_TOL = 1e-8

#: dtype axis of quantized_matmul
QMATMUL_DTYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")

#: the weight types quantized_matmul's targets name; the others run at model shapes only with --full
QMATMUL_MAIN_DTYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")

EW_VALIDATE = (1, 3, 64, 1000, 4097, 65537)
EW_BENCH = (1 << 20, 16 << 20, 256 << 20)
REDUCE_VALIDATE = (1, 5, 256, 1000, 4097, 70001)
REDUCE_BENCH = (4096, 65536, 1 << 20, 16 << 20, 256 << 20)
#: the largest elementwise / reduction size of a default bench run: 16M float32 (64 MiB per
#: buffer) is past a GPU's last-level cache and within 0-9% of 256M's GB/s on the H200
#: (README), and a 256M case spends ~18 s generating, checking and uploading 1 GiB buffers
#: for about 10 ms of timed work; the 256M sizes run with `kbench bench --full`
DEFAULT_MAX_ELEMS = 16 << 20
#: the largest copy of a default bench run (bytes), for the same reason
DEFAULT_MAX_COPY = 64 * MiB


def over_default(key: str, limit: int) -> Callable[[Params], bool]:
    """A case's ``full_only``: instances whose ``key`` is above ``limit`` run only with --full."""
    return lambda p: int(p[key]) > limit


def uniform(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    """float32 values uniform in [-scale, scale] (the suites' default input)."""
    return (rng.uniform(-1.0, 1.0, int(n)) * scale).astype(np.float32)


def teardown(_target: Any, state: Any) -> None:
    """Free what a case's setup allocated (its ``state["bufs"]``)."""
    if isinstance(state, dict) and "bufs" in state:
        state["bufs"].free_all()


def sync_read(target: Any, state: dict, names: tuple[str, ...]) -> Arrays:
    """Wait for the backend, then read the guarded outputs ``names`` back (guards checked)."""
    target.backend.synchronize()
    bufs: BackendBuffers = state["bufs"]
    return {n: bufs.read_f32(state[n], n) for n in names}


def read_back(*names: str) -> Callable[[Any, dict, Params], Arrays]:
    """A case's ``collect``: `sync_read` of the outputs ``names``."""
    def collect(target: Any, state: dict, params: Params) -> Arrays:
        return sync_read(target, state, names)
    return collect


def sizes(key: str, values: tuple[int, ...], **extra: Any) -> tuple[dict[str, Any], ...]:
    """``({key: v, **extra} for v in values)``: a size table."""
    return tuple({key: v, **extra} for v in values)


def f32_elems(p: Params, key: str = "size") -> int:
    """Bytes of ``p[key]`` float32 elements."""
    return 4 * int(p[key])
