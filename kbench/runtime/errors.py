"""Exceptions raised by kbench.runtime.

Vulkan result codes are translated into these so that callers can tell a lost device from an
out-of-memory condition from a bad argument without parsing messages.
"""
from __future__ import annotations


class VulkanError(RuntimeError):
    """A Vulkan call failed; ``result`` holds the VkResult name."""

    def __init__(self, message: str, result: str | None = None):
        super().__init__(message)
        self.result = result


class DeviceLostError(VulkanError):
    """The device was lost (driver reset, hang, crash); the Manager is unusable afterwards."""


class DeviceBusyError(VulkanError):
    """Submitted GPU work did not finish within a bounded wait of a destroy (an endless or very
    long shader). From ``Manager.destroy``, ``Sequence.destroy`` and the destroy of a tensor or
    algorithm in use, the Manager is then abandoned: its Vulkan objects stay allocated (freeing
    memory the GPU still uses would crash) until the process exits, and the Manager is unusable."""


class OutOfDeviceMemoryError(VulkanError, MemoryError):
    """The device (or host memory the driver needs) ran out of memory."""


class UnsupportedFeatureError(VulkanError):
    """A shader or tensor needs a device feature the device does not have; ``feature`` names it."""

    def __init__(self, message: str, feature: str):
        super().__init__(message, None)
        self.feature = feature


class ShaderCompileError(RuntimeError):
    """GLSL did not compile; the message carries the compiler's diagnostics."""


class ValidationError(RuntimeError):
    """The Khronos validation layer reported errors (raised by ``Manager.check_validation``)."""
