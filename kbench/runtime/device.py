"""Instance creation, physical-device discovery and the properties a cross-vendor harness needs."""
from __future__ import annotations

import atexit
import os
import threading
from typing import Any

from . import _vk
from ._vk import ffi, lib, vk

VENDORS = {
    0x1002: "AMD",
    0x1010: "ImgTec",
    0x106B: "Apple",
    0x10DE: "NVIDIA",
    0x13B5: "ARM",
    0x1AE0: "Google",
    0x5143: "Qualcomm",
    0x8086: "Intel",
    0x10005: "Mesa",
    0x10006: "Mesa",  # VK_VENDOR_ID_POCL: listed for completeness
}

DEVICE_TYPES = {0: "other", 1: "integrated_gpu", 2: "discrete_gpu", 3: "virtual_gpu", 4: "cpu"}

QUEUE_FLAGS = [
    (vk.VK_QUEUE_GRAPHICS_BIT, "graphics"),
    (vk.VK_QUEUE_COMPUTE_BIT, "compute"),
    (vk.VK_QUEUE_TRANSFER_BIT, "transfer"),
    (vk.VK_QUEUE_SPARSE_BINDING_BIT, "sparse_binding"),
    (0x20, "video_decode"),
    (0x40, "video_encode"),
]

MEMORY_PROPERTY_FLAGS = [
    (vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, "device_local"),
    (vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, "host_visible"),
    (vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, "host_coherent"),
    (vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT, "host_cached"),
    (vk.VK_MEMORY_PROPERTY_LAZILY_ALLOCATED_BIT, "lazily_allocated"),
]

SUBGROUP_OPS = [(1, "basic"), (2, "vote"), (4, "arithmetic"), (8, "ballot"), (16, "shuffle"),
                (32, "shuffle_relative"), (64, "clustered"), (128, "quad")]

COOPMAT_EXT = "VK_KHR_cooperative_matrix"
COOPMAT2_EXT = "VK_NV_cooperative_matrix2"
BFLOAT16_EXT = "VK_KHR_shader_bfloat16"
#: per-pipeline statistics of the driver's compiled code (registers, spills, ...): Manager.pipeline_statistics
PIPELINE_EXEC_EXT = "VK_KHR_pipeline_executable_properties"
#: shader clocks (clockARB per subgroup, clockRealtimeEXT across the device): kernels' own timelines (probes)
CLOCK_EXT = "VK_KHR_shader_clock"
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"

_COMPONENT_TYPES = {0: "f16", 1: "f32", 2: "f64", 3: "s8", 4: "s16", 5: "s32", 6: "s64", 7: "u8",
                    8: "u16", 9: "u32", 10: "u64", 1000141000: "bf16"}


# structure types of structs the `vulkan` bindings predate (vulkan_core.h)
_STYPE_BFLOAT16_FEATURES = 1000141000
_STYPE_COOPMAT2_FEATURES = 1000593000
_STYPE_COOPMAT_FLEXIBLE_DIMENSIONS_PROPERTIES = 1000593001
_STYPE_COOPMAT2_PROPERTIES = 1000593002

#: VkPhysicalDeviceCooperativeMatrix2FeaturesNV members -> feature keys
COOPMAT2_FEATURES = {
    "cooperativeMatrixWorkgroupScope": "cooperative_matrix2_workgroup_scope",
    "cooperativeMatrixFlexibleDimensions": "cooperative_matrix2_flexible_dimensions",
    "cooperativeMatrixReductions": "cooperative_matrix2_reductions",
    "cooperativeMatrixConversions": "cooperative_matrix2_conversions",
    "cooperativeMatrixPerElementOperations": "cooperative_matrix2_per_element_operations",
    "cooperativeMatrixTensorAddressing": "cooperative_matrix2_tensor_addressing",
    "cooperativeMatrixBlockLoads": "cooperative_matrix2_block_loads",
}
#: VkPhysicalDeviceShaderBfloat16FeaturesKHR members -> feature keys
BFLOAT16_FEATURES = {
    "shaderBFloat16Type": "bfloat16",
    "shaderBFloat16DotProduct": "bfloat16_dot_product",
    "shaderBFloat16CooperativeMatrix": "bfloat16_cooperative_matrix",
}


class RawStruct:
    """A Vulkan structure the `vulkan` bindings lack: sType, pNext, then 32-bit members (the
    layout of every struct here on a 64-bit host: pNext at byte 8, members from byte 16)."""

    def __init__(self, stype: int, members: list[str], pnext: Any = None, **values: int):
        self.members = list(members)
        self.buf = ffi.new("uint32_t[]", 4 + len(self.members))
        self.buf[0] = stype
        if pnext is not None:
            if isinstance(pnext, RawStruct):
                pnext = pnext.buf
            elif ffi.typeof(pnext).kind in ("struct", "union"):
                # the bindings' constructors return structs by value: chain their address
                pnext = ffi.addressof(pnext)
            ffi.cast("void **", self.buf + 2)[0] = pnext
        #: what pNext points at, kept alive as long as this struct
        self.next = pnext
        for name, value in values.items():
            self[name] = value

    def __getitem__(self, name: str) -> int:
        return int(self.buf[4 + self.members.index(name)])

    def __setitem__(self, name: str, value: int) -> None:
        self.buf[4 + self.members.index(name)] = int(value)

    @property
    def ptr(self) -> Any:
        """The struct's owning memory, for a pNext (the bindings' constructors keep it alive)."""
        return self.buf

    @property
    def pnext(self) -> Any:
        """The pNext member as a ``void *``."""
        return ffi.cast("void **", self.buf + 2)[0]


def _s(x) -> str:
    return ffi.string(x).decode("utf-8", "replace") if not isinstance(x, str) else x


def _flags(value: int, table) -> list[str]:
    return [name for bit, name in table if value & bit]


def version_string(v: int) -> str:
    return f"{vk.VK_VERSION_MAJOR(v)}.{vk.VK_VERSION_MINOR(v)}.{vk.VK_VERSION_PATCH(v)}"


def driver_version_string(vendor_id: int, v: int) -> str:
    """Decode driverVersion with each vendor's own packing (it is not standardised)."""
    if vendor_id == 0x10DE:
        return f"{(v >> 22) & 0x3FF}.{(v >> 14) & 0xFF}.{(v >> 6) & 0xFF}.{v & 0x3F}"
    if vendor_id == 0x8086 and os.name == "nt":
        return f"{v >> 14}.{v & 0x3FFF}"
    return version_string(v)


def icd_file() -> str:
    """The ICD manifest(s) the loader was pointed at, or 'system' when it searches defaults."""
    for var in ("VK_DRIVER_FILES", "VK_ICD_FILENAMES"):
        if os.environ.get(var):
            return os.environ[var]
    return "system"


def layer_available(name: str) -> bool:
    with _vk.call("vkEnumerateInstanceLayerProperties"):
        layers = vk.vkEnumerateInstanceLayerProperties()
    return any(_s(layer.layerName) == name for layer in layers)


def instance_api_version() -> int:
    try:
        return vk.vkEnumerateInstanceVersion()
    except Exception:  # loader older than 1.1
        return vk.VK_MAKE_VERSION(1, 0, 0)


def _shared_default() -> bool:
    return os.environ.get("KBENCH_SHARED_INSTANCE", "1").lower() not in ("0", "false", "no", "off")


class Instance:
    """A VkInstance, optionally with the Khronos validation layer and a debug messenger.

    Managers take the process's shared instance (:meth:`acquire`) rather than one each: the
    NVIDIA driver (580 on an H200) fails every vkCreateInstance of a process with
    VK_ERROR_INCOMPATIBLE_DRIVER after about 30 create/destroy cycles, and other users of that
    driver report corrupted subgroup invocation ids after about 11 (kbench probe lifetimes
    reproduces the first). ``KBENCH_SHARED_INSTANCE=0`` gives each Manager its own again."""

    _shared: dict[bool, "Instance"] = {}
    _shared_lock = threading.Lock()

    def __init__(self, validation: bool = False, handle: Any = None):
        self.owned = handle is None
        self.is_shared = False
        self.users = 0
        self.validation = validation
        self.messenger = None
        self._destroy_messenger = None
        self.api_version = min(instance_api_version(), vk.VK_MAKE_VERSION(1, 3, 0))
        if handle is not None:
            self.handle = handle
            return
        layers, exts = [], []
        if validation:
            if not layer_available(VALIDATION_LAYER):
                raise RuntimeError(
                    f"validation requested but {VALIDATION_LAYER} is not installed "
                    "(Debian: apt-get install vulkan-validationlayers)"
                )
            layers.append(VALIDATION_LAYER)
            exts.append(vk.VK_EXT_DEBUG_UTILS_EXTENSION_NAME)
        self._app = vk.VkApplicationInfo(
            pApplicationName="kbench", applicationVersion=1, pEngineName="kbench",
            engineVersion=1, apiVersion=self.api_version,
        )
        chain = None
        if validation:
            # synchronization validation catches missing barriers, the defect kbench exists to fix
            self._enables = ffi.new("VkValidationFeatureEnableEXT[]", [vk.VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT])
            chain = vk.VkValidationFeaturesEXT(enabledValidationFeatureCount=1, pEnabledValidationFeatures=self._enables)
        info = vk.VkInstanceCreateInfo(
            pNext=chain, pApplicationInfo=self._app,
            enabledLayerCount=len(layers), ppEnabledLayerNames=layers,
            enabledExtensionCount=len(exts), ppEnabledExtensionNames=exts,
        )
        with _vk.call("vkCreateInstance"):
            self.handle = vk.vkCreateInstance(info, None)
        if validation:
            from .validation import create_messenger

            self.messenger, self._destroy_messenger = create_messenger(self.handle)

    def physical_devices(self) -> list:
        with _vk.call("vkEnumeratePhysicalDevices"):
            return list(vk.vkEnumeratePhysicalDevices(self.handle))

    @classmethod
    def acquire(cls, validation: bool = False) -> "Instance":
        """An instance for one user (a Manager, list_devices): the shared one for this validation
        setting, created on first use, or with KBENCH_SHARED_INSTANCE=0 a new one. Hand it back
        with :meth:`release`."""
        if not _shared_default():
            return cls(validation)
        with cls._shared_lock:
            inst = cls._shared.get(validation)
            if inst is None or inst.handle is None:
                inst = cls(validation)
                inst.is_shared = True
                cls._shared[validation] = inst
            inst.users += 1
            return inst

    def release(self) -> None:
        """The user is done: a shared instance stays for the next one, any other is destroyed."""
        if not self.is_shared:
            self.destroy()
            return
        with self._shared_lock:
            self.users = max(0, self.users - 1)

    @classmethod
    def destroy_shared(cls) -> int:
        """Destroy the shared instances no Manager uses (at interpreter exit, or to start afresh);
        returns how many are still in use and kept."""
        kept = 0
        with cls._shared_lock:
            for key, inst in list(cls._shared.items()):
                if inst.users:
                    kept += 1
                    continue
                inst.destroy()
                del cls._shared[key]
        return kept

    def destroy(self) -> None:
        if self.messenger is not None:
            self._destroy_messenger(self.handle, self.messenger, None)
            self.messenger = None
        if self.owned and self.handle is not None:
            vk.vkDestroyInstance(self.handle, None)
        self.handle = None


def device_extensions(pd) -> set[str]:
    with _vk.call("vkEnumerateDeviceExtensionProperties"):
        return {_s(e.extensionName) for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)}


def query_features(pd, api_version: int, extensions: set[str]) -> tuple[dict[str, bool], dict[str, Any]]:
    """Supported optional features: (flat dict for users, the raw structs to enable them with)."""
    f11 = vk.VkPhysicalDeviceVulkan11Features() if api_version >= vk.VK_MAKE_VERSION(1, 2, 0) else None
    f12 = vk.VkPhysicalDeviceVulkan12Features(pNext=f11) if f11 is not None else None
    f13 = vk.VkPhysicalDeviceVulkan13Features(pNext=f12) if api_version >= vk.VK_MAKE_VERSION(1, 3, 0) and f12 is not None else None
    head = f13 if f13 is not None else f12
    coop = None
    if COOPMAT_EXT in extensions:
        coop = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(pNext=head)
        head = coop
    coop2 = bf16 = None
    if COOPMAT2_EXT in extensions and head is not None:
        coop2 = RawStruct(_STYPE_COOPMAT2_FEATURES, list(COOPMAT2_FEATURES), head)
        head = coop2.ptr
    if BFLOAT16_EXT in extensions and head is not None:
        bf16 = RawStruct(_STYPE_BFLOAT16_FEATURES, list(BFLOAT16_FEATURES), head)
        head = bf16.ptr
    pipeline_exec = None
    if PIPELINE_EXEC_EXT in extensions:
        pipeline_exec = vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(pNext=head)
        head = pipeline_exec
    clock = None
    if CLOCK_EXT in extensions:
        clock = vk.VkPhysicalDeviceShaderClockFeaturesKHR(pNext=head)
        head = clock
    f2 = vk.VkPhysicalDeviceFeatures2(pNext=head)
    vk.vkGetPhysicalDeviceFeatures2(pd, f2)
    base = f2.features
    feats = {
        "float64": bool(base.shaderFloat64),
        "int64": bool(base.shaderInt64),
        "int16": bool(base.shaderInt16),
        "float16": bool(f12.shaderFloat16) if f12 is not None else False,
        "int8": bool(f12.shaderInt8) if f12 is not None else False,
        "storage_buffer_16bit": bool(f11.storageBuffer16BitAccess) if f11 is not None else False,
        "uniform_and_storage_buffer_16bit": bool(f11.uniformAndStorageBuffer16BitAccess) if f11 is not None else False,
        "storage_buffer_8bit": bool(f12.storageBuffer8BitAccess) if f12 is not None else False,
        "uniform_and_storage_buffer_8bit": bool(f12.uniformAndStorageBuffer8BitAccess) if f12 is not None else False,
        "vulkan_memory_model": bool(f12.vulkanMemoryModel) if f12 is not None else False,
        "vulkan_memory_model_device_scope": bool(f12.vulkanMemoryModelDeviceScope) if f12 is not None else False,
        "host_query_reset": bool(f12.hostQueryReset) if f12 is not None else False,
        "buffer_device_address": bool(f12.bufferDeviceAddress) if f12 is not None else False,
        "subgroup_size_control": bool(f13.subgroupSizeControl) if f13 is not None else False,
        "compute_full_subgroups": bool(f13.computeFullSubgroups) if f13 is not None else False,
        "integer_dot_product": bool(f13.shaderIntegerDotProduct) if f13 is not None else False,
        "maintenance4": bool(f13.maintenance4) if f13 is not None else False,
        "cooperative_matrix": bool(coop.cooperativeMatrix) if coop is not None else False,
        "pipeline_executable_info": bool(pipeline_exec.pipelineExecutableInfo) if pipeline_exec is not None else False,
        "shader_subgroup_clock": bool(clock.shaderSubgroupClock) if clock is not None else False,
        "shader_device_clock": bool(clock.shaderDeviceClock) if clock is not None else False,
    }
    for raw, table in ((coop2, COOPMAT2_FEATURES), (bf16, BFLOAT16_FEATURES)):
        for member, key in table.items():
            feats[key] = bool(raw[member]) if raw is not None else False
    return feats, {"base": base, "f11": f11, "f12": f12, "f13": f13, "coop": coop, "coop2": coop2, "bf16": bf16,
                   "pipeline_exec": pipeline_exec, "clock": clock,
                   # base is a view into f2's memory, which cffi does not keep alive for it: without f2
                   # here, enabling base's features read freed memory (validation saw Float64 not enabled)
                   "f2": f2}


def cooperative_matrix_properties(instance, pd, extensions: set[str]) -> list[dict[str, Any]]:
    if COOPMAT_EXT not in extensions:
        return []
    try:
        fn = vk.vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
        props = fn(pd)
    except Exception:
        return []
    out = []
    for p in props:
        out.append({
            "M": p.MSize, "N": p.NSize, "K": p.KSize,
            "a": _COMPONENT_TYPES.get(p.AType, str(p.AType)), "b": _COMPONENT_TYPES.get(p.BType, str(p.BType)),
            "c": _COMPONENT_TYPES.get(p.CType, str(p.CType)), "result": _COMPONENT_TYPES.get(p.ResultType, str(p.ResultType)),
            "saturating": bool(p.saturatingAccumulation), "scope": int(p.scope),
        })
    return out


def compute_units(pd, exts: set[str] | list[str], api: int) -> dict[str, int] | None:
    """How many compute units (NVIDIA SMs, AMD CUs) the device has and how many
    invocations one holds at once, from the vendor extensions that say so; None elsewhere.
    Kernels that launch whole waves of workgroups size their grids from it."""
    if api < vk.VK_MAKE_VERSION(1, 1, 0):
        return None
    if "VK_NV_shader_sm_builtins" in exts:
        nv = vk.VkPhysicalDeviceShaderSMBuiltinsPropertiesNV()
        vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=nv))
        count, threads = int(nv.shaderSMCount), int(nv.shaderWarpsPerSM) * 32
    elif "VK_AMD_shader_core_properties" in exts:
        amd = vk.VkPhysicalDeviceShaderCorePropertiesAMD()
        vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=amd))
        count = int(amd.shaderEngineCount) * int(amd.shaderArraysPerEngineCount) * int(amd.computeUnitsPerShaderArray)
        threads = int(amd.simdPerComputeUnit) * int(amd.wavefrontsPerSimd) * int(amd.wavefrontSize)
    else:
        return None
    return {"count": count, "threads": threads} if count > 0 and threads > 0 else None


def cooperative_matrix2_properties(instance, pd, extensions: set[str]) -> dict[str, Any]:
    """VK_NV_cooperative_matrix2's limits and its flexible-dimension configurations ({} without
    the extension): ``flexible_dimensions`` lists dicts like cooperative_matrix_properties' with
    M/N/K granularities and the workgroup size each needs."""
    if COOPMAT2_EXT not in extensions:
        return {}
    limits = RawStruct(_STYPE_COOPMAT2_PROPERTIES, ["workgroupScopeMaxWorkgroupSize",
                                                    "flexibleDimensionsMaxDimension",
                                                    "workgroupScopeReservedSharedMemory"])
    vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=limits.ptr))
    out: dict[str, Any] = {
        "workgroup_scope_max_workgroup_size": limits["workgroupScopeMaxWorkgroupSize"],
        "flexible_dimensions_max_dimension": limits["flexibleDimensionsMaxDimension"],
        "workgroup_scope_reserved_shared_memory": limits["workgroupScopeReservedSharedMemory"],
        "flexible_dimensions": [],
    }
    fn = lib.vkGetInstanceProcAddr(instance, b"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV")
    if fn == ffi.NULL:
        return out
    query = ffi.cast("VkResult(*)(VkPhysicalDevice, uint32_t *, void *)", fn)
    count = ffi.new("uint32_t *")
    if query(pd, count, ffi.NULL) != 0 or count[0] == 0:
        return out
    members = ["M", "N", "K", "a", "b", "c", "result", "saturating", "scope", "workgroup_invocations"]
    words = 4 + len(members)  # 56 bytes, a multiple of the struct's 8-byte alignment
    buf = ffi.new("uint32_t[]", words * count[0])
    for i in range(count[0]):
        buf[i * words] = _STYPE_COOPMAT_FLEXIBLE_DIMENSIONS_PROPERTIES
    if query(pd, count, buf) not in (0, vk.VK_INCOMPLETE):
        return out
    for i in range(count[0]):
        v = {name: int(buf[i * words + 4 + j]) for j, name in enumerate(members)}
        for key in ("a", "b", "c", "result"):
            v[key] = _COMPONENT_TYPES.get(v[key], str(v[key]))
        v["saturating"] = bool(v["saturating"])
        out["flexible_dimensions"].append(v)
    return out


def describe(instance_handle, pd, index: int) -> dict[str, Any]:
    """All properties of physical device ``pd`` as plain Python data."""
    exts = device_extensions(pd)
    base_props = vk.vkGetPhysicalDeviceProperties(pd)
    api = base_props.apiVersion
    v11 = v12 = None
    if api >= vk.VK_MAKE_VERSION(1, 2, 0):
        v11 = vk.VkPhysicalDeviceVulkan11Properties()
        v12 = vk.VkPhysicalDeviceVulkan12Properties(pNext=v11)
        vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=v12))
    props = base_props
    lim = props.limits
    feats, _ = query_features(pd, api, exts)
    subgroup_ops = _flags(v11.subgroupSupportedOperations, SUBGROUP_OPS) if v11 is not None else []
    compute_subgroups = bool(v11.subgroupSupportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT) if v11 is not None else False
    for op in ("basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad"):
        feats["subgroup_" + op] = compute_subgroups and op in subgroup_ops
    mem = vk.vkGetPhysicalDeviceMemoryProperties(pd)
    heaps = [{"index": i, "size": int(mem.memoryHeaps[i].size),
              "device_local": bool(mem.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)}
             for i in range(mem.memoryHeapCount)]
    types = [{"index": i, "heap": int(mem.memoryTypes[i].heapIndex),
              "flags": _flags(mem.memoryTypes[i].propertyFlags, MEMORY_PROPERTY_FLAGS)}
             for i in range(mem.memoryTypeCount)]
    qfs = []
    for i, q in enumerate(vk.vkGetPhysicalDeviceQueueFamilyProperties(pd)):
        qfs.append({"index": i, "flags": _flags(q.queueFlags, QUEUE_FLAGS), "count": int(q.queueCount),
                    "timestamp_valid_bits": int(q.timestampValidBits)})
    vendor_id = int(props.vendorID)
    driver_name = _s(v12.driverName) if v12 is not None else ""
    vendor_name = VENDORS.get(vendor_id, f"0x{vendor_id:04x}")
    if driver_name in ("llvmpipe", "lavapipe") or "Mesa" in (_s(v12.driverInfo) if v12 is not None else ""):
        if vendor_id == 0x10005:
            vendor_name = "Mesa"
    return {
        "index": index,
        "device_name": _s(props.deviceName),
        "vendor_id": vendor_id,
        "vendor_name": vendor_name,
        "device_id": int(props.deviceID),
        "device_type": DEVICE_TYPES.get(int(props.deviceType), "other"),
        "driver_name": driver_name,
        "driver_info": _s(v12.driverInfo) if v12 is not None else "",
        "driver_version": driver_version_string(vendor_id, int(props.driverVersion)),
        "driver_version_raw": int(props.driverVersion),
        "api_version": version_string(api),
        "timestamp_period": float(lim.timestampPeriod),
        "timestamps_supported": bool(lim.timestampComputeAndGraphics) or any(q["timestamp_valid_bits"] for q in qfs if "compute" in q["flags"]),
        "subgroup_size": int(v11.subgroupSize) if v11 is not None else 1,
        "subgroup_operations": subgroup_ops,
        "max_work_group_count": tuple(int(x) for x in lim.maxComputeWorkGroupCount),
        "max_work_group_invocations": int(lim.maxComputeWorkGroupInvocations),
        "max_work_group_size": tuple(int(x) for x in lim.maxComputeWorkGroupSize),
        "max_shared_memory": int(lim.maxComputeSharedMemorySize),
        "max_storage_buffer_range": int(lim.maxStorageBufferRange),
        "max_push_constants_size": int(lim.maxPushConstantsSize),
        "max_memory_allocation_count": int(lim.maxMemoryAllocationCount),
        "min_storage_buffer_offset_alignment": int(lim.minStorageBufferOffsetAlignment),
        "queue_families": qfs,
        "memory_heaps": heaps,
        "memory_types": types,
        "device_local_bytes": sum(h["size"] for h in heaps if h["device_local"]),
        "features": feats,
        "extensions": sorted(exts),
        "cooperative_matrix_properties": cooperative_matrix_properties(instance_handle, pd, exts),
        "compute_units": compute_units(pd, exts, api),
        "cooperative_matrix2_properties": cooperative_matrix2_properties(instance_handle, pd, exts),
        "icd_file": icd_file(),
    }


# devices and queues are gone by then for every Manager that was destroyed; any still alive keep theirs
atexit.register(Instance.destroy_shared)
