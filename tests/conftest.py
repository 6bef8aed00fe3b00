"""Shared fixtures: a Manager per test with the Khronos validation layer on where installed.

Any validation warning or error during a test fails it (KBENCH_VALIDATION=0 turns this off)."""
from __future__ import annotations

import os

import pytest


def _validation_wanted() -> bool:
    if os.environ.get("KBENCH_VALIDATION", "1").lower() in ("0", "false", "no", "off"):
        return False
    try:
        from kbench.runtime.device import VALIDATION_LAYER, layer_available

        return layer_available(VALIDATION_LAYER)
    except Exception:
        return False


VALIDATION = _validation_wanted()


@pytest.fixture
def mgr():
    import kbench.runtime as kp

    m = kp.Manager(validation=VALIDATION)
    yield m
    messages = m.validation_messages()
    m.destroy()
    import gc

    gc.collect()
    assert m._device is None, f"the device outlived Manager.destroy(): {m.get_stats()}"
    assert not messages, "validation layer reported:\n" + "\n".join(messages)


@pytest.fixture(scope="session")
def compile_glsl():
    """Compile GLSL with a per-session cache (glslangValidator costs ~50 ms per call)."""
    import kbench.runtime as kp

    cache: dict[str, bytes] = {}

    def compile_(src: str) -> bytes:
        if src not in cache:
            cache[src] = kp.compile_source(src)
        return cache[src]

    return compile_


def _no_device() -> str | None:
    try:
        import kbench.runtime as kp

        if not kp.list_devices():
            return "the Vulkan loader finds no device (install mesa-vulkan-drivers for lavapipe)"
    except Exception as exc:  # noqa: BLE001 - no loader / no ICD
        return f"no Vulkan available here: {exc}"
    return None


#: why no Vulkan device can be used here, or None
NO_DEVICE = _no_device()
#: marks a test that needs a Vulkan device (skipped with the reason otherwise)
needs_device = pytest.mark.skipif(NO_DEVICE is not None, reason=NO_DEVICE or "")


def nmse(got, ref) -> float:
    """sum((got - ref)^2) / sum(ref^2) in float64."""
    import numpy as np

    ref = np.asarray(ref, np.float64)
    return float(np.sum((np.asarray(got, np.float64) - ref) ** 2) / np.sum(ref ** 2))


#: guard floats (of value BATCH_GUARD_VALUE) after quantized_matmul's outputs, to catch out-of-bounds writes
BATCH_GUARD = 16
BATCH_GUARD_VALUE = 7.0


def batch_problem(dtype, n_rows: int, n_cols: int, n_vecs: int, seed: int, w_scale: float = 1.0,
                  x_scale: float = 1.0):
    """Uniform weights quantized to ``dtype`` and ``n_vecs`` vectors of x: (raw, x, float64 reference y)."""
    import numpy as np

    from kbench.quant import dequantize, quantize

    rng = np.random.default_rng(seed)
    raw = quantize((w_scale * rng.uniform(-1, 1, (n_rows, n_cols))).astype(np.float32), dtype)
    x = (x_scale * rng.uniform(-1, 1, (n_vecs, n_cols))).astype(np.float32)
    ref = x.astype(np.float64) @ dequantize(raw, dtype, (n_rows, n_cols)).astype(np.float64).T
    return raw, x, ref


def run_batch(be, dtype, raw: bytes, x, n_rows: int, n_cols: int, n_vecs: int):
    """``be.quantized_matmul`` of a batch into an output buffer with BATCH_GUARD guard floats after it:
    returns every float of that buffer, the guards included."""
    import numpy as np

    n_out = n_vecs * n_rows + BATCH_GUARD
    hw, hx, hy = be.allocate(len(raw)), be.allocate(x.nbytes), be.allocate(4 * n_out)
    try:
        be.copy_to_device(raw, hw)
        be.copy_to_device(x.tobytes(), hx)
        be.copy_to_device(np.full(n_out, BATCH_GUARD_VALUE, np.float32).tobytes(), hy)
        be.quantized_matmul(hw, hx, hy, n_rows, n_cols, dtype, n_vecs=n_vecs)
        out = bytearray(4 * n_out)
        be.copy_from_device(hy, out)
        return np.frombuffer(bytes(out), np.float32).copy()
    finally:
        for h in (hw, hx, hy):
            be.free(h)
