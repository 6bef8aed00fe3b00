"""The one place that imports the `vulkan` bindings, plus result-code translation.

Hot paths use the raw cffi ``lib`` functions: the generated wrappers convert every argument on
every call, which costs microseconds per command.
"""
from __future__ import annotations

import vulkan as vk
from vulkan import ffi, lib  # noqa: F401  (re-exported for the runtime modules)

from .errors import DeviceLostError, OutOfDeviceMemoryError, VulkanError

UINT64_MAX = 0xFFFFFFFFFFFFFFFF

_RESULT_NAMES = {
    getattr(vk, n): n for n in dir(vk) if n.startswith(("VK_ERROR_", "VK_SUCCESS", "VK_TIMEOUT", "VK_NOT_READY", "VK_INCOMPLETE"))
    and isinstance(getattr(vk, n), int)
}


def result_name(code: int) -> str:
    return _RESULT_NAMES.get(code, f"VkResult({code})")


def translate(exc: BaseException, what: str) -> BaseException:
    """Map an exception of the `vulkan` package to kbench's own exception classes."""
    name = type(exc).__name__
    if isinstance(exc, vk.VkErrorDeviceLost):
        return DeviceLostError(f"{what}: the Vulkan device was lost (VK_ERROR_DEVICE_LOST)", "VK_ERROR_DEVICE_LOST")
    if isinstance(exc, (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory)):
        code = "VK_ERROR_OUT_OF_DEVICE_MEMORY" if isinstance(exc, vk.VkErrorOutOfDeviceMemory) else "VK_ERROR_OUT_OF_HOST_MEMORY"
        return OutOfDeviceMemoryError(f"{what}: out of memory ({code})", code)
    if isinstance(exc, (vk.VkError, vk.VkException)):
        return VulkanError(f"{what}: {name}", name)
    return exc


def check(code: int, what: str) -> None:
    """Raise the matching kbench exception for a non-success VkResult from a raw ``lib`` call."""
    if code == 0:
        return
    if code == vk.VK_ERROR_DEVICE_LOST:
        raise DeviceLostError(f"{what}: the Vulkan device was lost (VK_ERROR_DEVICE_LOST)", "VK_ERROR_DEVICE_LOST")
    if code in (vk.VK_ERROR_OUT_OF_DEVICE_MEMORY, vk.VK_ERROR_OUT_OF_HOST_MEMORY):
        raise OutOfDeviceMemoryError(f"{what}: out of memory ({result_name(code)})", result_name(code))
    raise VulkanError(f"{what} failed with {result_name(code)}", result_name(code))


class call:
    """Context manager translating `vulkan` package exceptions raised inside it."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        if ev is not None and isinstance(ev, (vk.VkError, vk.VkException)):
            raise translate(ev, self.what) from ev
        return False
