"""Compute backends: the table of ops, the ComputeBackend contract, the NumPy reference and the
Vulkan backend.

``VulkanBackend`` is imported lazily (module ``__getattr__``), so importing this package does
not need the ``vulkan`` bindings or a Vulkan loader.
"""

from __future__ import annotations

from typing import Any

from kbench.backend.base import (
    BackendClosedError,
    BufferHandle,
    ComputeBackend,
    DeviceInfo,
    InvalidHandleError,
    UnsupportedDTypeError,
)
from kbench.backend.op_table import ALIASING_OPS, OP_BUFFER_ACCESS, OPS
from kbench.backend.numpy_backend import NumpyBackend
from kbench.quant import DType

# VulkanBackend is left out of __all__ so that `from kbench.backend import *` works where the
# Vulkan bindings cannot load; `kbench.backend.VulkanBackend` still resolves lazily.
__all__ = [
    "ALIASING_OPS",
    "BACKEND_KINDS",
    "BackendClosedError",
    "BufferHandle",
    "ComputeBackend",
    "DType",
    "DeviceInfo",
    "InvalidHandleError",
    "NumpyBackend",
    "OP_BUFFER_ACCESS",
    "OPS",
    "UnsupportedDTypeError",
    "create_backend",
]

#: the kinds create_backend() accepts
BACKEND_KINDS: tuple[str, ...] = ("vulkan", "numpy")


def create_backend(kind: str, device: int = 0, **options: Any) -> ComputeBackend:
    """Open a backend of ``kind`` ("vulkan" or "numpy") on device index ``device``.

    ``options`` go to the backend's constructor (the NumPy backend takes none).
    """
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a string, one of {', '.join(BACKEND_KINDS)}; got {kind!r}")
    kind_key = kind.strip().lower()
    if kind_key == "vulkan":
        from kbench.backend.vulkan_backend import VulkanBackend

        return VulkanBackend(device=device, **options)
    if kind_key == "numpy":
        if options:
            raise TypeError(f"the numpy backend takes no options, got {', '.join(sorted(options))}")
        if device != 0:
            raise ValueError(f"the numpy backend has only device 0, got device={device!r}")
        return NumpyBackend()
    raise ValueError(f"unknown backend kind {kind!r}; known kinds: {', '.join(BACKEND_KINDS)}")


def __getattr__(name: str) -> Any:
    if name == "VulkanBackend":
        from kbench.backend.vulkan_backend import VulkanBackend

        return VulkanBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "VulkanBackend"])
