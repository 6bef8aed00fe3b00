"""Device properties, bring-your-own Vulkan, validation-layer plumbing and multiple queues."""
from __future__ import annotations

import time

import numpy as np
import pytest

import kbench.runtime as kp
from kbench.runtime._vk import lib, vk

from conftest import VALIDATION

KP_KEYS = {"device_name", "max_work_group_count", "max_work_group_invocations", "max_work_group_size",
           "timestamps_supported"}
HARNESS_KEYS = {"vendor_id", "vendor_name", "device_id", "device_type", "driver_name", "driver_version",
                "driver_info", "api_version", "timestamp_period", "subgroup_size", "queue_families",
                "memory_heaps", "memory_types", "features", "icd_file"}
FEATURES = {"float64", "int64", "int16", "float16", "storage_buffer_8bit", "storage_buffer_16bit",
            "cooperative_matrix", "integer_dot_product"}


def test_properties_have_kompute_and_harness_fields(mgr):
    p = mgr.get_device_properties()
    missing = (KP_KEYS | HARNESS_KEYS) - set(p)
    assert not missing, f"missing property keys: {sorted(missing)}"
    assert FEATURES <= set(p["features"]), f"missing features: {sorted(FEATURES - set(p['features']))}"
    assert len(p["max_work_group_count"]) == 3 and p["max_work_group_invocations"] > 0
    assert p["timestamp_period"] > 0
    fam = p["queue_families"][0]
    assert {"index", "flags", "count", "timestamp_valid_bits"} <= set(fam)
    assert any("compute" in q["flags"] for q in p["queue_families"])
    assert p["memory_heaps"] and all(t["heap"] < len(p["memory_heaps"]) for t in p["memory_types"])
    assert p["api_version"].count(".") == 2


def test_list_devices_describes_every_device(mgr):
    devs = kp.list_devices()
    assert devs and [d["index"] for d in devs] == list(range(len(devs)))
    assert devs[0]["device_name"] == mgr.get_device_properties()["device_name"]
    assert mgr.list_devices()[0]["device_id"] == devs[0]["device_id"]


def test_lavapipe_properties_match_the_measured_facts(mgr):
    p = mgr.get_device_properties()
    if p["driver_name"] != "llvmpipe":
        pytest.skip(f"lavapipe-specific facts; this device is {p['device_name']}")
    assert p["max_work_group_count"][0] == 65535
    assert p["subgroup_size"] == 8 and p["timestamp_period"] == 1.0
    assert len(p["queue_families"]) == 1 and p["queue_families"][0]["count"] == 1
    assert p["features"]["float64"] and p["features"]["int64"] and not p["features"]["cooperative_matrix"]
    assert p["vendor_name"] == "Mesa" and p["device_type"] == "cpu"


def test_float64_shader_runs_because_the_feature_is_enabled(mgr, compile_glsl):
    if not mgr.get_device_properties()["features"]["float64"]:
        pytest.skip("device lacks shaderFloat64")
    src = """
#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer A { double a[]; };
void main() { a[gl_GlobalInvocationID.x] = a[gl_GlobalInvocationID.x] * 3.0LF + 1e-12LF; }
"""
    t = mgr.tensor_t(np.array([1.0, 2.0], np.float64))
    algo = mgr.algorithm([t], compile_glsl(src))
    mgr.sequence().record(kp.OpTensorSyncDevice([t])).record(kp.OpAlgoDispatch(algo)).record(
        kp.OpTensorSyncLocal([t])).eval()
    assert t.data().tolist() == [3.0 + 1e-12, 6.0 + 1e-12]


def test_a_shader_needing_a_missing_feature_names_it(mgr, compile_glsl):
    src = """
#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) buffer A { float a[]; };
void main() {
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c =
        coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(1.0);
    coopMatStore(c, a, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
}
"""
    try:
        spv = compile_glsl(src)
    except (kp.ShaderCompileError, FileNotFoundError) as e:
        pytest.skip(f"this glslang cannot compile cooperative-matrix GLSL: {str(e)[:80]}")
    if mgr.get_device_properties()["features"]["cooperative_matrix"]:
        pytest.skip("device has cooperative matrices")
    with pytest.raises(kp.UnsupportedFeatureError, match="cooperativeMatrix") as info:
        mgr.algorithm([mgr.tensor(np.zeros(256))], spv)
    assert "cooperative" in info.value.feature


def test_manager_on_caller_owned_vulkan_objects_leaves_them_alive():
    app = vk.VkApplicationInfo(pApplicationName="byo", apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
    inst = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
    pd = vk.vkEnumeratePhysicalDevices(inst)[0]
    fam = next(i for i, q in enumerate(vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)) if q.queueFlags & vk.VK_QUEUE_COMPUTE_BIT)
    prio = [1.0]
    qinfo = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=fam, queueCount=1, pQueuePriorities=prio)
    dev = vk.vkCreateDevice(pd, vk.VkDeviceCreateInfo(queueCreateInfoCount=1, pQueueCreateInfos=[qinfo]), None)
    queue = vk.vkGetDeviceQueue(dev, fam, 0)
    m = kp.Manager.from_vulkan(inst, pd, dev, [(fam, queue)])
    a, b, o = m.tensor([3, 4]), m.tensor([5, 6]), m.tensor([0, 0])
    m.sequence().record(kp.OpTensorSyncDevice([a, b])).record(kp.OpMult([a, b, o], m.algorithm())).record(
        kp.OpTensorSyncLocal([o])).eval()
    assert o.data().tolist() == [15, 24]
    m.destroy()
    # the caller's device and instance still work after the Manager is gone
    assert lib.vkDeviceWaitIdle(dev) == vk.VK_SUCCESS
    vk.vkDestroyDevice(dev, None)
    vk.vkDestroyInstance(inst, None)


class _BadFill(kp.OpBase):
    """An op that records a command the validation layer must flag (offset not 4-byte aligned)."""

    def __init__(self, t):
        self.t = t

    def record(self, rec):
        lib.vkCmdFillBuffer(rec.command_buffer, self.t._vk_buffer, 2, 4, 0)


@pytest.mark.skipif(not VALIDATION, reason="vulkan-validationlayers not installed (or KBENCH_VALIDATION=0)")
def test_validation_layer_reports_a_bad_command():
    m = kp.Manager(validation=True)
    try:
        t = m.tensor([1, 2, 3, 4])
        m.sequence().record(_BadFill(t)).eval()
        msgs = m.validation_messages()
        assert any("dstOffset" in x or "VUID-vkCmdFillBuffer" in x for x in msgs), msgs
        with pytest.raises(kp.ValidationError, match="validation message"):
            m.check_validation()
    finally:
        m.destroy()


def _families_with_compute(p):
    return [q["index"] for q in p["queue_families"] if "compute" in q["flags"]]


def test_several_queues_give_correct_results_where_the_device_has_them(compile_glsl):
    p = kp.list_devices()[0]
    fams = _families_with_compute(p)
    queues = [fams[0]] * min(2, p["queue_families"][fams[0]]["count"]) + fams[1:2]
    if len(queues) < 2:
        pytest.skip(f"{p['device_name']} has a single compute queue; multi-queue runs on GPUs (device tool)")
    src = """
#version 450
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) buffer A { float a[]; };
void main() { uint i = gl_GlobalInvocationID.x; if (i < a.length()) a[i] = a[i] * 2.0 + 1.0; }
"""
    with kp.Manager(family_queue_indices=queues, validation=VALIDATION) as m:
        spv = compile_glsl(src)
        ts = [m.tensor(np.full(4096, float(i))) for i in range(len(queues))]
        seqs = []
        for qi, t in enumerate(ts):
            algo = m.algorithm([t], spv, (64, 1, 1))
            s = m.sequence(queue_index=qi).record(kp.OpTensorSyncDevice([t])).record(kp.OpAlgoDispatch(algo)).record(
                kp.OpTensorSyncLocal([t]))
            seqs.append(s.eval_async())
        for s in seqs:
            assert s.eval_await()
        for i, t in enumerate(ts):
            assert np.all(t.data() == 2.0 * i + 1.0)
        assert m.queues == [(f, sum(1 for g in queues[:k] if g == f)) for k, f in enumerate(queues)]
        assert not m.validation_messages(), m.validation_messages()


@pytest.mark.gpu
def test_two_compute_families_run_in_parallel(compile_glsl):
    """Kompute expects two sequences on two compute families to take < 0.6 of the serial time."""
    p = kp.list_devices()[0]
    fams = _families_with_compute(p)
    if len(fams) < 2:
        pytest.skip(f"{p['device_name']} has {len(fams)} compute queue family; needs two (runs on the H200)")
    src = """
#version 450
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) buffer A { float a[]; };
layout(push_constant) uniform P { uint iters; } p;
void main() { uint i = gl_GlobalInvocationID.x; float x = a[i];
  for (uint k = 0; k < p.iters; ++k) x = x * 0.9999 + 0.0001; a[i] = x; }
"""
    with kp.Manager(family_queue_indices=fams[:2], validation=False) as m:
        spv = compile_glsl(src)
        # few threads, long loop: each dispatch occupies little of the GPU, so two can overlap
        algos = [m.algorithm([m.tensor(np.ones(32), kp.TensorTypes.storage)], spv, (1, 1, 1), [],
                             np.array([2_000_000], np.uint32)) for _ in range(2)]
        seqs = [m.sequence(queue_index=i).record(kp.OpAlgoDispatch(a)) for i, a in enumerate(algos)]
        for s in seqs:
            s.eval()  # warm-up
        t0 = time.perf_counter()
        for s in seqs:
            s.eval()
        serial = time.perf_counter() - t0
        t0 = time.perf_counter()
        for s in seqs:
            s.eval_async()
        for s in seqs:
            s.eval_await()
        parallel = time.perf_counter() - t0
        print(f"two families: serial {serial * 1e3:.2f} ms, parallel {parallel * 1e3:.2f} ms, ratio {parallel / serial:.2f}")
        assert parallel < 0.6 * serial, f"parallel {parallel:.4f}s vs serial {serial:.4f}s"


def test_the_supported_base_features_outlive_the_query_that_filled_them(mgr):
    """query_features hands back the base VkPhysicalDeviceFeatures it read, a view into its
    VkPhysicalDeviceFeatures2: that struct must live as long as the view, or the features enabled at
    device creation are read from freed memory (seen as Float64 'not enabled' under validation)."""
    import gc

    from kbench.runtime import device

    pd = mgr._physical
    api = vk.vkGetPhysicalDeviceProperties(pd).apiVersion
    feats, supported = device.query_features(pd, api, device.device_extensions(pd))
    gc.collect()
    size = vk.ffi.sizeof("VkPhysicalDeviceFeatures2")
    junk = [vk.ffi.new("VkPhysicalDeviceFeatures2 *") for _ in range(2000)]  # reuse what was freed
    for j in junk:
        vk.ffi.memmove(j, b"\x00" * size, size)
    got = {"float64": supported["base"].shaderFloat64, "int64": supported["base"].shaderInt64,
           "int16": supported["base"].shaderInt16}
    want = {k: feats[k] for k in got}
    assert {k: bool(v) for k, v in got.items()} == want, f"base features changed after the query: {got} vs {want}"
