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
