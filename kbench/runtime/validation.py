"""Collect Khronos validation-layer messages through VK_EXT_debug_utils.

The `vulkan` package routes every debug-utils callback through one module-level slot, so one
process-wide callback fans messages out to the live collectors (one per validating Manager).
"""
from __future__ import annotations

import threading
from typing import Any

from ._vk import ffi, vk

_lock = threading.Lock()
_collectors: list[list[str]] = []


def _callback(severity, types, data, user_data):  # called by the driver from any thread
    try:
        msg = ffi.string(data.pMessage).decode("utf-8", "replace")
    except Exception:  # pragma: no cover - malformed callback data
        msg = "<unreadable validation message>"
    level = "ERROR" if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT else "WARNING"
    with _lock:
        for c in _collectors:
            c.append(f"{level}: {msg}")
    return 0


def register(collector: list[str]) -> None:
    with _lock:
        _collectors.append(collector)


def unregister(collector: list[str]) -> None:
    with _lock:
        for i, c in enumerate(_collectors):
            if c is collector:
                del _collectors[i]
                break


def create_messenger(instance) -> tuple[Any, Any]:
    """Create a messenger for warnings and errors; returns (handle, destroy function)."""
    create = vk.vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT")
    destroy = vk.vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT")
    info = vk.VkDebugUtilsMessengerCreateInfoEXT(
        messageSeverity=vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
        messageType=vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
        | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
        pfnUserCallback=_callback,
    )
    return create(instance, info, None), destroy
