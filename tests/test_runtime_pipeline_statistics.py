"""Manager.pipeline_statistics: what the driver compiled a shader into (VK_KHR_pipeline_executable_properties).

lavapipe offers no such statistics, so there the refusals are checked; the statistics themselves
on devices that have them (NVIDIA: "Register Count" and the like)."""
from __future__ import annotations

import numpy as np
import pytest

import kbench.runtime as kp
from kbench.runtime import executables
from kbench.runtime._vk import ffi, lib, vk
from kbench.runtime.device import PIPELINE_EXEC_EXT

from conftest import needs_device

SCALE = """
#version 450
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint N = 1;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) buffer B { float b[]; };
void main() { uint i = gl_GlobalInvocationID.x; if (i < b.length()) b[i] = a[i] * float(N); }
"""


def _has_statistics(mgr) -> bool:
    return bool(mgr.get_device_properties()["features"]["pipeline_executable_info"])


# --- no device needed ----------------------------------------------------------------------------

def _statistic(fmt: int, member: str, value):
    stat = ffi.new("VkPipelineExecutableStatisticKHR *")
    stat.format = fmt
    setattr(stat.value, member, value)
    return stat


@pytest.mark.parametrize("fmt, member, raw, expected", [
    (vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR, "b32", 1, True),
    (vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR, "b32", 0, False),
    (vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR, "i64", -5, -5),
    (vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR, "u64", 2**64 - 1, 2**64 - 1),
    (vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR, "f64", 0.25, 0.25),
])
def test_statistic_values_convert_by_their_format(fmt, member, raw, expected):
    value = executables._value(_statistic(fmt, member, raw))
    assert value == expected and type(value) is type(expected)


def test_enumeration_sets_each_stype_and_asks_again_after_an_incomplete_answer():
    calls = []

    def fake(count, arr):
        calls.append(arr)
        if arr == ffi.NULL:
            count[0] = 2 if len(calls) == 1 else 3  # the count grows after the first answer
            return vk.VK_SUCCESS
        if count[0] < 3:
            return vk.VK_INCOMPLETE
        for i in range(count[0]):
            assert arr[i].sType == vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR
            arr[i].value.u64 = 10 + i
        return vk.VK_SUCCESS

    def result(code, what):
        assert code == vk.VK_SUCCESS, (code, what)

    got = executables._enumerate(fake, "VkPipelineExecutableStatisticKHR",
                                 vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR, "test", result,
                                 lambda s: int(s.value.u64))
    assert got == [10, 11, 12]
    assert len(calls) == 4


def test_pipeline_executables_are_frozen_records():
    exe = kp.PipelineExecutable("SM", "compute", 32, {"Register Count": 24}, {"Register Count": "registers"})
    with pytest.raises(AttributeError):
        exe.name = "other"  # type: ignore[misc]


# --- on this machine's device --------------------------------------------------------------------

@needs_device
def test_the_device_features_report_pipeline_executable_info_as_a_bool(mgr):
    feats = mgr.get_device_properties()["features"]
    assert isinstance(feats["pipeline_executable_info"], bool)
    for dev in kp.list_devices():
        assert isinstance(dev["features"]["pipeline_executable_info"], bool)
        if dev["features"]["pipeline_executable_info"]:
            assert PIPELINE_EXEC_EXT in dev["extensions"]


@needs_device
def test_without_the_extension_pipeline_statistics_raises_unsupported_feature_naming_it(mgr, compile_glsl):
    if _has_statistics(mgr):
        pytest.skip(f"{mgr.get_device_properties()['device_name']} offers {PIPELINE_EXEC_EXT}")
    before = mgr.get_stats()
    with pytest.raises(kp.UnsupportedFeatureError, match=PIPELINE_EXEC_EXT) as info:
        mgr.pipeline_statistics(compile_glsl(SCALE), np.array([3], np.uint32))
    assert info.value.feature == PIPELINE_EXEC_EXT
    assert mgr.get_device_properties()["device_name"] in str(info.value)
    assert mgr.get_stats() == before


@needs_device
@pytest.mark.parametrize("spirv", ["#version 450", [7, 3, 2, 35], None, np.zeros(8, np.uint32)])
def test_spirv_that_is_not_bytes_is_refused_with_type_error(mgr, spirv):
    with pytest.raises(TypeError, match="spirv must be bytes"):
        mgr.pipeline_statistics(spirv)


@needs_device
def test_invalid_spirv_is_refused_with_the_error_algorithm_gives(mgr):
    bad = b"\x01\x02\x03\x04" * 8
    with pytest.raises(ValueError, match="invalid SPIR-V") as from_algorithm:
        mgr.algorithm([mgr.tensor([0.0])], bad)
    with pytest.raises(ValueError, match="invalid SPIR-V") as from_statistics:
        mgr.pipeline_statistics(bad)
    assert str(from_statistics.value) == str(from_algorithm.value)


@needs_device
def test_specialization_constants_are_checked_against_the_shader(mgr, compile_glsl):
    with pytest.raises(TypeError, match=r"Manager.pipeline_statistics: specialization constant 0 is uint32"):
        mgr.pipeline_statistics(compile_glsl(SCALE), [3.0])  # a list is float32, N is a uint


@needs_device
def test_a_failing_query_still_destroys_the_pipeline(mgr, compile_glsl, monkeypatch):
    import kbench.runtime.manager as manager_module

    if not _has_statistics(mgr):
        # a device without the feature must not be handed the capture flag
        monkeypatch.setattr(manager_module, "_CAPTURE_FLAGS", 0)
    handles = []

    class FailingQuery:
        def query(self, device, pipeline, result):
            handles.append(pipeline)
            assert mgr.get_stats()["pipelines"] == before["pipelines"] + 1
            raise RuntimeError("driver said no")

    before = mgr.get_stats()
    monkeypatch.setattr(mgr, "_pipeline_exec", FailingQuery())
    with pytest.raises(RuntimeError, match="driver said no"):
        mgr.pipeline_statistics(compile_glsl(SCALE), np.array([3], np.uint32))
    assert handles and handles[0] is not None
    assert mgr.get_stats() == before


@needs_device
def test_a_manager_from_vulkan_refuses_pipeline_statistics(compile_glsl):
    app = vk.VkApplicationInfo(pApplicationName="byo", apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
    inst = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
    try:
        pd = vk.vkEnumeratePhysicalDevices(inst)[0]
        fam = next(i for i, q in enumerate(vk.vkGetPhysicalDeviceQueueFamilyProperties(pd))
                   if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT)
        prio = [1.0]
        qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=fam, queueCount=1, pQueuePriorities=prio)
        dev = vk.vkCreateDevice(pd, vk.VkDeviceCreateInfo(queueCreateInfoCount=1, pQueueCreateInfos=[qinfo]), None)
        try:
            m = kp.Manager.from_vulkan(inst, pd, dev, [(fam, vk.vkGetDeviceQueue(dev, fam, 0))])
            try:
                assert m.get_device_properties()["features"]["pipeline_executable_info"] is False
                with pytest.raises(kp.UnsupportedFeatureError, match=f"{PIPELINE_EXEC_EXT}.*from_vulkan"):
                    m.pipeline_statistics(compile_glsl(SCALE), np.array([3], np.uint32))
            finally:
                m.destroy()
            assert lib.vkDeviceWaitIdle(dev) == vk.VK_SUCCESS
        finally:
            vk.vkDestroyDevice(dev, None)
    finally:
        vk.vkDestroyInstance(inst, None)


# --- devices that offer the statistics (NVIDIA, AMD, Intel; not lavapipe) ------------------------

@needs_device
def test_a_small_shader_reports_executables_with_numeric_statistics(mgr, compile_glsl):
    if not _has_statistics(mgr):
        pytest.skip(f"{mgr.get_device_properties()['device_name']} does not offer {PIPELINE_EXEC_EXT}")
    execs = mgr.pipeline_statistics(compile_glsl(SCALE), np.array([3], np.uint32))
    assert execs and all(isinstance(e, kp.PipelineExecutable) for e in execs)
    assert any(e.statistics for e in execs)
    for e in execs:
        assert isinstance(e.name, str) and isinstance(e.subgroup_size, int)
        assert all(isinstance(k, str) and isinstance(v, (bool, int, float)) for k, v in e.statistics.items())
        assert set(e.descriptions) == set(e.statistics)
    print({e.name: e.statistics for e in execs})


@needs_device
def test_repeated_queries_leave_no_pipeline_behind(mgr, compile_glsl):
    if not _has_statistics(mgr):
        pytest.skip(f"{mgr.get_device_properties()['device_name']} does not offer {PIPELINE_EXEC_EXT}")
    spv = compile_glsl(SCALE)
    a, b = mgr.tensor(np.arange(64)), mgr.tensor(np.zeros(64))
    algo = mgr.algorithm([a, b], spv, spec_consts=np.array([3], np.uint32))
    before = mgr.get_stats()
    def shape(execs):
        return [(e.name, sorted(e.statistics)) for e in execs]

    first = shape(mgr.pipeline_statistics(spv, np.array([3], np.uint32)))
    for _ in range(200):
        assert shape(mgr.pipeline_statistics(spv, np.array([3], np.uint32))) == first
    after = mgr.get_stats()
    assert after["pipelines"] == before["pipelines"]
    assert after["cached_pipelines"] == before["cached_pipelines"]
    # the algorithm's own (shared, statistics-free) pipeline is untouched
    mgr.sequence().record(kp.OpTensorSyncDevice([a])).record(kp.OpAlgoDispatch(algo)).record(
        kp.OpTensorSyncLocal([b])).eval()
    assert b.data().tolist() == (np.arange(64) * 3).tolist()
