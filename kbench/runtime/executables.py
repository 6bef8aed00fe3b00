"""What the driver compiled a pipeline into (VK_KHR_pipeline_executable_properties).

Kernel engineers read register counts, spills and the like here to judge a shader's register
pressure and occupancy; :meth:`kbench.runtime.Manager.pipeline_statistics` is the entry point.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ._vk import ffi, lib, vk

#: a statistic's value, converted by its VkPipelineExecutableStatisticFormatKHR
StatisticValue = int | float | bool

# the queries are enumerations: a count first, then the entries; a count that grew in between
# (VK_INCOMPLETE) is asked for again, this many times at most
_ENUMERATE_TRIES = 4


@dataclass(frozen=True)
class PipelineExecutable:
    """One executable the driver made of a pipeline (a compute pipeline usually has one), with the
    statistics it reports, e.g. NVIDIA's "Register Count"."""

    #: the driver's short name for the executable
    name: str
    #: the driver's longer description of it
    description: str
    #: the subgroup size it runs with (0 where the driver does not say)
    subgroup_size: int
    #: statistic name -> value, in the driver's order, as the driver reports it (NVIDIA 580's
    #: "Local Memory Size" has 0x10 in its upper 32 bits, seen on an H100: the low 32 bits are the bytes)
    statistics: dict[str, StatisticValue] = field(default_factory=dict)
    #: statistic name -> the driver's description of that statistic
    descriptions: dict[str, str] = field(default_factory=dict)


def _text(chars: Any) -> str:
    return ffi.string(chars).decode("utf-8", "replace")


def _value(stat: Any) -> StatisticValue:
    fmt = int(stat.format)
    if fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
        return bool(stat.value.b32)
    if fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
        return int(stat.value.i64)
    if fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
        return int(stat.value.u64)
    if fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR:
        return float(stat.value.f64)
    # a format newer than this code: the raw bits are the most honest reading
    return int(stat.value.u64)


class ExecutableQueries:
    """The extension's two device-level entry points, loaded once per device.

    Called through raw cffi pointers rather than the `vulkan` package's wrappers: those hand the
    driver output arrays whose sType is left 0 (the spec requires each element's sType to be set,
    and the validation layer reports it) and raise on VK_INCOMPLETE."""

    def __init__(self, properties: Any, statistics: Any):
        self._properties = properties
        self._statistics = statistics

    @classmethod
    def load(cls, device: Any) -> "ExecutableQueries | None":
        """The entry points of ``device`` (with the extension enabled), or None where the driver
        returns none: an optional feature missing must not fail the Manager."""
        fns = []
        for name in ("vkGetPipelineExecutablePropertiesKHR", "vkGetPipelineExecutableStatisticsKHR"):
            fn = lib.vkGetDeviceProcAddr(device, name.encode())
            if fn == ffi.NULL:
                return None
            fns.append(ffi.cast("PFN_" + name, fn))
        return cls(*fns)

    def query(self, device: Any, pipeline: Any, result: Callable[[int, str], None]) -> list[PipelineExecutable]:
        """Every executable of ``pipeline`` (created with VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR)
        with its statistics. ``result(code, what)`` raises for a failed VkResult."""
        info = ffi.new("VkPipelineInfoKHR *", {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, "pipeline": pipeline})
        props = _enumerate(lambda n, arr: self._properties(device, info, n, arr), "VkPipelineExecutablePropertiesKHR",
                           vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR,
                           "vkGetPipelineExecutablePropertiesKHR", result,
                           lambda p: (_text(p.name), _text(p.description), int(p.subgroupSize)))
        out = []
        for index, (name, description, subgroup_size) in enumerate(props):
            exe = ffi.new("VkPipelineExecutableInfoKHR *", {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR,
                                                            "pipeline": pipeline, "executableIndex": index})
            stats = _enumerate(lambda n, arr: self._statistics(device, exe, n, arr), "VkPipelineExecutableStatisticKHR",
                               vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR,
                               "vkGetPipelineExecutableStatisticsKHR", result,
                               lambda s: (_text(s.name), _text(s.description), _value(s)))
            out.append(PipelineExecutable(
                name=name, description=description, subgroup_size=subgroup_size,
                statistics={n: v for n, _, v in stats}, descriptions={n: d for n, d, _ in stats}))
        return out


def _enumerate(call: Callable[[Any, Any], int], ctype: str, stype: int, what: str,
               result: Callable[[int, str], None], convert: Callable[[Any], Any]) -> list[Any]:
    """Vulkan's two-call enumeration: the count, then that many entries (sType set on each), each
    passed through ``convert`` while the array still exists (cffi's ``arr[i]`` does not keep it)."""
    count = ffi.new("uint32_t *")
    for _ in range(_ENUMERATE_TRIES):
        result(call(count, ffi.NULL), what)
        n = int(count[0])
        if n == 0:
            return []
        arr = ffi.new(ctype + "[]", n)
        for i in range(n):
            arr[i].sType = stype
        code = call(count, arr)
        if code == vk.VK_INCOMPLETE:
            continue
        result(code, what)
        return [convert(arr[i]) for i in range(min(n, int(count[0])))]
    raise RuntimeError(f"{what} kept returning VK_INCOMPLETE ({_ENUMERATE_TRIES} tries)")
