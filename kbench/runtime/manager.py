"""Manager: owns the Vulkan instance, device, queues and everything made from them."""
from __future__ import annotations

import atexit
import os
import threading
import time
import warnings
import weakref
from typing import Any, Iterable

import numpy as np

from . import _vk, validation as _validation
from ._vk import lib, vk
from .algorithm import Algorithm, Pipeline, check_device_support, reflect_compute, specialize, spirv_target_env
from .descriptors import DescriptorAllocator
from .device import (BFLOAT16_EXT, BFLOAT16_FEATURES, CLOCK_EXT, COOPMAT2_EXT, COOPMAT2_FEATURES, COOPMAT_EXT, PIPELINE_EXEC_EXT,
                     Instance, RawStruct, describe, device_extensions, query_features)
from .errors import DeviceBusyError, DeviceLostError, OutOfDeviceMemoryError, UnsupportedFeatureError, ValidationError
from .executables import ExecutableQueries, PipelineExecutable
from .memory import HOST_IMPORT_EXT, StagingPool, host_import_alignment
from .sequence import Sequence
from .spirv import validate_with_spirv_val
from .tensor import Tensor, TensorTypes, numpy_dtype


#: Managers not destroyed yet: destroyed (waits bounded by destroy_timeout_s) at interpreter exit,
#: before module teardown, also where a reference cycle keeps one alive until then
_LIVE: "weakref.WeakSet[Manager]" = weakref.WeakSet()


@atexit.register
def _destroy_live_managers() -> None:
    for mgr in list(_LIVE):
        try:
            mgr.destroy()
        except Exception:  # noqa: BLE001 - leaving: DeviceBusyError already warned
            pass


def _validation_default() -> bool:
    return os.environ.get("KBENCH_VALIDATION", "").lower() in ("1", "true", "yes", "on")


def list_devices() -> list[dict[str, Any]]:
    """Properties of every physical device the Vulkan loader finds."""
    inst = Instance.acquire(validation=False)
    try:
        return [describe(inst.handle, pd, i) for i, pd in enumerate(inst.physical_devices())]
    finally:
        inst.release()


#: the flags of pipeline_statistics' pipelines: the driver keeps their statistics
_CAPTURE_FLAGS = vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR

# (feature struct key, field names) that kbench enables whenever the device supports them, so
# shaders that need them can run (Kompute cannot enable features: its issue 270)
_ENABLE = {
    "base": ["shaderFloat64", "shaderInt64", "shaderInt16"],
    "f11": ["storageBuffer16BitAccess", "uniformAndStorageBuffer16BitAccess"],
    "f12": ["shaderFloat16", "shaderInt8", "storageBuffer8BitAccess", "uniformAndStorageBuffer8BitAccess",
            "vulkanMemoryModel", "vulkanMemoryModelDeviceScope", "hostQueryReset", "timelineSemaphore"],
    "f13": ["subgroupSizeControl", "computeFullSubgroups", "shaderIntegerDotProduct", "maintenance4", "synchronization2"],
    "coop": ["cooperativeMatrix"],
}


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int (bytes), got {value!r}")
    return value


class Manager:
    """Kompute's Manager: picks a device, creates queues, and makes tensors, algorithms, sequences.

    ``family_queue_indices``: one queue per entry, of that queue family (repeat an index for
    several queues of one family); empty means one queue of the first compute family.
    ``validation``: enable the Khronos validation layer (default: env ``KBENCH_VALIDATION``).
    """

    #: default for :attr:`wait_spin_ns`: how long eval_await polls before it blocks
    DEFAULT_WAIT_SPIN_NS = 1_000_000
    DEFAULT_STREAM_MIN_BYTES = 16 << 20
    DEFAULT_ZERO_COPY_MIN_BYTES = 16 << 20
    DEFAULT_TRANSFER_CHUNK_BYTES = 8 << 20  # H200: 8 MiB chunks streamed fastest of 1-16 MiB
    #: default for :attr:`destroy_timeout_s`
    DEFAULT_DESTROY_TIMEOUT_S = 10.0

    def __init__(self, device: int = 0, family_queue_indices: Iterable[int] | None = None,
                 desired_extensions: Iterable[str] | None = None, *, validation: bool | None = None):
        self._init_state()
        if not isinstance(device, int) or isinstance(device, bool):
            raise TypeError(f"device must be an int index, got {type(device).__name__}")
        validation = _validation_default() if validation is None else bool(validation)
        self._instance = Instance.acquire(validation=validation)
        try:
            if validation:
                _validation.register(self._messages)
            pds = self._instance.physical_devices()
            if not pds:
                raise RuntimeError("no Vulkan physical device found (is a driver such as mesa-vulkan-drivers installed?)")
            if not 0 <= device < len(pds):
                raise IndexError(f"device index {device} is out of range: {len(pds)} Vulkan device(s) found")
            self._physical = pds[device]
            self._props = describe(self._instance.handle, self._physical, device)
            self._create_device(list(family_queue_indices or []), list(desired_extensions or []))
            self._finish_init()
        except BaseException:
            self._teardown()
            raise

    @classmethod
    def from_vulkan(cls, instance, physical_device, device, queues: list[tuple[int, Any]]) -> "Manager":
        """Wrap a device made elsewhere with the same ``vulkan`` package (Kompute's
        bring-your-own-Vulkan). ``queues``: ``[(family_index, VkQueue), ...]``. Only objects
        this Manager creates are destroyed by it; the instance and device stay the caller's."""
        self = cls.__new__(cls)
        self._init_state()
        if not queues:
            raise ValueError("from_vulkan needs at least one (family_index, VkQueue) pair")
        self._instance = Instance(handle=instance)
        self._physical = physical_device
        self._props = describe(instance, physical_device, 0)
        self._device = device
        self._owns_device = False
        # whether the caller enabled VK_KHR_pipeline_executable_properties is not known here:
        # pipeline_statistics refuses, and the feature key says so
        self._props["features"]["pipeline_executable_info"] = False
        per_family: dict[int, int] = {}
        for fam, q in queues:
            if not 0 <= fam < len(self._props["queue_families"]):
                raise ValueError(f"queue family {fam} does not exist on this device")
            per_family[fam] = per_family.get(fam, -1) + 1
            self._queues.append((q, fam, self._queue_lock(q), per_family[fam]))
        self._finish_init()
        return self

    # --- Kompute API ---------------------------------------------------------------------------
    def tensor(self, data: Any, tensor_type: TensorTypes = TensorTypes.device) -> Tensor:
        """A float32 tensor from ``data`` (flattened)."""
        self._check_alive()
        arr = np.asarray(data, dtype=np.float32).reshape(-1)
        return self._make_tensor(arr, tensor_type)

    def tensor_t(self, data: Any, tensor_type: TensorTypes = TensorTypes.device) -> Tensor:
        """A tensor keeping ``data``'s dtype (float32, float64, int32, uint32, bool and kbench's
        float16, int8, uint8, int16, uint16, int64, uint64)."""
        self._check_alive()
        if not isinstance(data, np.ndarray):
            raise TypeError(f"tensor_t expects a numpy array, got {type(data).__name__} (use tensor() for lists)")
        dt = numpy_dtype(data.dtype)
        return self._make_tensor(np.ascontiguousarray(data, dtype=dt).reshape(-1), tensor_type)

    def buffer(self, nbytes: int, tensor_type: TensorTypes = TensorTypes.storage) -> Tensor:
        """A zero-filled uint8 tensor of ``nbytes`` bytes (raw storage for shaders)."""
        self._check_alive()
        if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes <= 0:
            raise ValueError(f"nbytes must be a positive int, got {nbytes!r}")
        tensor_type = self._tensor_type(tensor_type)
        self.check_allocation(int(nbytes))
        # a zero-stride view: no host memory until a device tensor's host side needs it, so a
        # size the device cannot hold is refused by the device, not by a host-side array
        zeros = np.broadcast_to(np.zeros(1, np.uint8), (int(nbytes),))
        return Tensor(self, zeros, tensor_type, zero=True)

    def algorithm(self, tensors: Iterable[Tensor] | None = None, spirv: bytes | None = None,
                  workgroup=None, spec_consts=None, push_consts=None) -> Algorithm:
        """An algorithm over ``tensors`` (binding i = tensor i). ``workgroup`` is the dispatch grid.
        With no tensors and no SPIR-V: an empty algorithm to be rebuilt (e.g. by OpMult)."""
        self._check_alive()
        if tensors is None and spirv is None:
            algo = Algorithm.__new__(Algorithm)
            algo._mgr, algo._pipeline, algo._key, algo._set, algo._destroyed = self, None, None, None, False
            algo._tensors, algo._push, algo._spec = [], np.zeros(0, np.float32), np.zeros(0, np.float32)
            algo._workgroup, algo._info = (0, 0, 0), None
            self._track(algo)
            return algo
        if spirv is None:
            raise ValueError("algorithm needs SPIR-V (bytes)")
        return Algorithm(self, list(tensors or []), spirv, workgroup, spec_consts, push_consts)

    def sequence(self, queue_index: int = 0, total_timestamps: int = 0) -> Sequence:
        """A sequence on queue ``queue_index`` (index into this Manager's queues)."""
        return Sequence(self, queue_index, total_timestamps)

    def list_devices(self) -> list[dict[str, Any]]:
        self._check_alive()
        return [describe(self._instance.handle, pd, i) for i, pd in enumerate(self._instance.physical_devices())]

    def get_device_properties(self) -> dict[str, Any]:
        return dict(self._props)

    def destroy(self) -> None:
        """Wait for the device, then free everything this Manager made, in dependency order.

        The wait is bounded by :attr:`destroy_timeout_s`: when submitted work has not finished by
        then (an endless shader), the Manager is abandoned (its Vulkan objects stay allocated until
        the process exits, since freeing memory the GPU uses could crash) and DeviceBusyError says so."""
        if self._abandoned or (not self._alive and self._device is None):
            return
        self._alive = False
        self._teardown()

    def __enter__(self) -> "Manager":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()

    def __del__(self):
        try:
            self.destroy()
        except Exception:
            pass

    # --- kbench additions ----------------------------------------------------------------------
    @property
    def queues(self) -> list[tuple[int, int]]:
        """(family, index within family) for each queue, in queue_index order."""
        return [(fam, idx) for _, fam, _, idx in self._queues]

    @property
    def wait_spin_ns(self) -> int:
        """Nanoseconds ``Sequence.eval_await`` polls the fence before a blocking wait (0: block
        at once, saving CPU; the default trades up to 1 ms of one core for a quick wake-up)."""
        return self._wait_spin_ns

    @wait_spin_ns.setter
    def wait_spin_ns(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"wait_spin_ns must be a non-negative int (nanoseconds), got {value!r}")
        self._wait_spin_ns = value

    @property
    def destroy_timeout_s(self) -> float:
        """Seconds a destroy (of the Manager, a sequence, or a tensor or algorithm in use) waits for
        running GPU work before it gives up with DeviceBusyError and abandons the Manager."""
        return self._destroy_timeout_s

    @destroy_timeout_s.setter
    def destroy_timeout_s(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
            raise ValueError(f"destroy_timeout_s must be a non-negative number of seconds, got {value!r}")
        self._destroy_timeout_s = float(value)

    @property
    def abandoned(self) -> bool:
        """True when a destroy gave up waiting for the GPU (see :attr:`destroy_timeout_s`)."""
        return self._abandoned

    def check_allocation(self, nbytes: int) -> None:
        """Raise OutOfDeviceMemoryError when one buffer of ``nbytes`` cannot exist on this device
        (over maxMemoryAllocationSize or the largest memory heap), before anything is allocated."""
        heaps = [int(h["size"]) for h in self._props.get("memory_heaps", []) if isinstance(h, dict) and "size" in h]
        limit = min([self._max_allocation_size] + ([max(heaps)] if heaps else []))
        if nbytes > limit:
            raise OutOfDeviceMemoryError(
                f"a buffer of {nbytes} bytes cannot be allocated on {self._props.get('device_name')}: the most "
                f"is {limit} bytes (maxMemoryAllocationSize {self._max_allocation_size}, largest heap "
                f"{max(heaps) if heaps else 'unknown'})", "VK_ERROR_OUT_OF_DEVICE_MEMORY")

    @property
    def stream_min_bytes(self) -> int:
        """Syncs and reads of at least this many bytes are streamed in chunks, the host's copies
        overlapping the GPU's (kbench.runtime.transfer); KBENCH_STREAM_TRANSFERS=0 turns it off,
        =up or =down keeps it for one direction."""
        return self._stream_min_bytes

    @stream_min_bytes.setter
    def stream_min_bytes(self, value: int) -> None:
        self._stream_min_bytes = _positive_int("stream_min_bytes", value)

    @property
    def transfer_chunk_bytes(self) -> int:
        """Bytes per chunk of a streamed transfer (a multiple of 4096)."""
        return self._transfer_chunk_bytes

    @transfer_chunk_bytes.setter
    def transfer_chunk_bytes(self, value: int) -> None:
        value = _positive_int("transfer_chunk_bytes", value)
        if value % 4096:
            raise ValueError(f"transfer_chunk_bytes must be a multiple of 4096 (chunks start on 4 KiB staging "
                             f"boundaries), got {value}")
        self._transfer_chunk_bytes = value

    @property
    def zero_copy_min_bytes(self) -> int:
        """Device tensors of at least this many bytes sync without staging where the device has
        VK_EXT_external_memory_host: their host memory is imported once and the GPU's DMA reads
        and writes it directly (KBENCH_ZERO_COPY=0 turns it off). As with Kompute's mapped
        staging, the host data must not change while an upload is in flight."""
        return self._zero_copy_min_bytes

    @zero_copy_min_bytes.setter
    def zero_copy_min_bytes(self, value: int) -> None:
        self._zero_copy_min_bytes = _positive_int("zero_copy_min_bytes", value)

    def _zero_copy(self, nbytes: int) -> bool:
        """Whether a device tensor of ``nbytes`` syncs straight from its imported host memory."""
        return (bool(self._host_import_align) and nbytes >= self._zero_copy_min_bytes
                and os.environ.get("KBENCH_ZERO_COPY", "1") != "0")

    def _host_array(self, array: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """A copy of ``array`` for a device tensor's host side, and where the device can import
        host memory, the page-aligned, padded uint8 region holding it (else None)."""
        align = self._host_import_align
        if not align or array.nbytes == 0:
            return np.array(array, copy=True), None
        padded = -(-array.nbytes // align) * align
        raw = np.empty(padded + align, np.uint8)
        start = (-raw.ctypes.data) % align
        region = raw[start:start + padded]
        host = region[:array.nbytes].view(array.dtype)
        np.copyto(host, array.reshape(-1), casting="no")
        return host, region

    def _can_stream(self, direction: str) -> bool:
        """Whether transfers in ``direction`` may be streamed: downloads signal the host with
        vkCmdSetEvent2, which needs synchronization2 (Vulkan 1.3)."""
        allowed = os.environ.get("KBENCH_STREAM_TRANSFERS", "1").lower()
        if allowed not in ("1", "on", "both", direction):
            return False
        if direction == "up":
            return True
        # a device the caller created has no record of its features here: not streamed
        enabled = getattr(self, "_enabled", None)
        f13 = enabled.get("f13") if isinstance(enabled, dict) else None
        return bool(f13 is not None and f13.synchronization2)

    def get_stats(self) -> dict[str, int]:
        """Live object counts (for leak checks)."""
        s = dict(self._stats)
        s["tensors"] = len(self._tensors)
        s["algorithms"] = len(self._algorithms)
        s["staging_idle_bytes"] = self._staging.idle_bytes if self._staging else 0
        s["cached_pipelines"] = len(self._pipelines)
        return s

    def pipeline_statistics(self, spirv: bytes, spec_consts: Any = None) -> list[PipelineExecutable]:
        """What the driver compiled ``spirv`` (specialized with ``spec_consts``, converted and
        checked as Algorithm does) into: one PipelineExecutable per executable, with the driver's
        statistics (on NVIDIA "Register Count" and the like). Needs a device with
        VK_KHR_pipeline_executable_properties (UnsupportedFeatureError otherwise, and for a
        Manager made by from_vulkan). The pipeline is built for this call only and destroyed
        before it returns; no Algorithm shares it."""
        self._check_alive()
        if not isinstance(spirv, (bytes, bytearray, memoryview)):
            raise TypeError(f"pipeline_statistics: spirv must be bytes (a SPIR-V module), got {type(spirv).__name__}")
        # bad input is refused the same way on every device, with or without the extension
        spirv, info = reflect_compute(spirv)
        check_device_support(info, self._props)
        spec = specialize(info, spec_consts, self._props, "Manager.pipeline_statistics")
        validate_with_spirv_val(spirv, spirv_target_env(self._props))
        if self._pipeline_exec is None:
            why = ("this Manager wraps a device made elsewhere (from_vulkan), whose enabled extensions kbench "
                   "cannot see" if not self._owns_device else
                   "the device does not offer it (or its pipelineExecutableInfo feature)")
            raise UnsupportedFeatureError(f"pipeline_statistics needs {PIPELINE_EXEC_EXT} on "
                                          f"{self._props['device_name']}: {why}", PIPELINE_EXEC_EXT)
        # under the lock as every pipeline is made and freed: the set-layout cache and the
        # pipeline count are shared with other threads' algorithms
        with self._lock:
            pipeline = Pipeline(self, spirv, info, info.binding_count, spec, flags=_CAPTURE_FLAGS)
        try:
            return self._pipeline_exec.query(self._device, pipeline.pipeline, self._result)
        finally:
            with self._lock:
                pipeline.destroy()

    def validation_messages(self) -> list[str]:
        """Warnings and errors the validation layer reported so far (empty without validation)."""
        return list(self._messages)

    def check_validation(self) -> None:
        """Raise ValidationError if the validation layer reported anything."""
        if self._messages:
            raise ValidationError(f"{len(self._messages)} validation message(s):\n" + "\n".join(self._messages[:20]))

    def wait_idle(self) -> None:
        """Wait for all submitted work (Ctrl-C interrupts the wait for running sequences)."""
        self._check_alive()
        for seq in list(self._sequences):
            if seq._running:
                seq.eval_await()
        self._result(lib.vkDeviceWaitIdle(self._device), "vkDeviceWaitIdle")

    # --- internals -----------------------------------------------------------------------------
    def _init_state(self) -> None:
        self._alive = False
        self._lost = False
        self._abandoned = False
        self._destroy_timeout_s = self.DEFAULT_DESTROY_TIMEOUT_S
        self._device = None
        self._owns_device = True
        self._instance = None
        self._queues: list = []
        self._messages: list[str] = []
        self._tensors: weakref.WeakSet = weakref.WeakSet()
        self._algorithms: weakref.WeakSet = weakref.WeakSet()
        self._sequences: weakref.WeakSet = weakref.WeakSet()
        self._pipelines: dict = {}
        self._set_layouts: dict = {}
        self._descriptors = None
        self._staging = None
        self._pipeline_cache = None
        self._stats = {"buffers": 0, "buffer_bytes": 0, "pipelines": 0, "descriptor_sets": 0, "sequences": 0, "events": 0,
                       "host_imports": 0}
        self._lock = threading.RLock()
        self._teardown_pending = False
        self._wait_spin_ns = self.DEFAULT_WAIT_SPIN_NS
        self._stream_min_bytes = self.DEFAULT_STREAM_MIN_BYTES
        self._zero_copy_min_bytes = self.DEFAULT_ZERO_COPY_MIN_BYTES
        self._host_import_align = 0
        #: the extension's entry points where it and its feature are enabled (pipeline_statistics)
        self._pipeline_exec: ExecutableQueries | None = None
        self._transfer_chunk_bytes = self.DEFAULT_TRANSFER_CHUNK_BYTES

    def _queue_lock(self, q) -> threading.Lock:
        return threading.Lock()

    def _create_device(self, families: list[int], desired_extensions: list[str]) -> None:
        qfs = self._props["queue_families"]
        if not families:
            compute = [q["index"] for q in qfs if "compute" in q["flags"]]
            if not compute:
                raise RuntimeError(f"{self._props['device_name']} has no compute queue family")
            families = [compute[0]]
        counts: dict[int, int] = {}
        for i, fam in enumerate(families):
            if not isinstance(fam, int) or isinstance(fam, bool):
                raise TypeError(f"family_queue_indices[{i}] must be an int, got {fam!r}")
            if not 0 <= fam < len(qfs):
                raise ValueError(f"family_queue_indices[{i}] = {fam}: no such queue family "
                                 f"(this device has families 0..{len(qfs) - 1})")
            if "compute" not in qfs[fam]["flags"]:
                raise ValueError(f"family_queue_indices[{i}] = {fam}: queue family {fam} has no compute support "
                                 f"(flags: {', '.join(qfs[fam]['flags'])})")
            counts[fam] = counts.get(fam, 0) + 1
        for fam, n in counts.items():
            if n > qfs[fam]["count"]:
                raise ValueError(f"family_queue_indices asks for {n} queues of family {fam}, "
                                 f"which has only {qfs[fam]['count']}")
        available = device_extensions(self._physical)
        exts = []
        for e in desired_extensions:
            if e in available:
                exts.append(e)
            else:
                warnings.warn(f"desired extension {e} is not supported by {self._props['device_name']}; ignored",
                              stacklevel=3)
        # cooperative matrices are enabled whenever the device has them, except under validation,
        # where a layer older than the extension (Debian's 1.3.239) reports it as unknown: ask
        # for it in desired_extensions then
        if COOPMAT_EXT in available and COOPMAT_EXT not in exts and not self._instance.validation:
            exts.append(COOPMAT_EXT)
        # likewise workgroup-scope matrices (NV, on top of KHR) and bfloat16 (types, matrices)
        for ext in (COOPMAT2_EXT, BFLOAT16_EXT):
            if ext in available and ext not in exts and COOPMAT_EXT in exts and not self._instance.validation:
                exts.append(ext)
        # host-memory import: large syncs then DMA straight from/to the tensor's NumPy memory
        if HOST_IMPORT_EXT in available and HOST_IMPORT_EXT not in exts:
            exts.append(HOST_IMPORT_EXT)
        api = vk.vkGetPhysicalDeviceProperties(self._physical).apiVersion
        _, supported = query_features(self._physical, api, available)
        # pipeline statistics: enabling them costs nothing, only pipelines created with the
        # capture flag (pipeline_statistics' own) pay for the driver keeping them
        pipeline_exec = supported["pipeline_exec"]
        if (pipeline_exec is not None and pipeline_exec.pipelineExecutableInfo and PIPELINE_EXEC_EXT in available
                and PIPELINE_EXEC_EXT not in exts):
            exts.append(PIPELINE_EXEC_EXT)
        # shader clocks likewise: only shaders that read them (probes' timeline twins) pay anything
        clock = supported["clock"]
        if (clock is not None and (clock.shaderSubgroupClock or clock.shaderDeviceClock) and CLOCK_EXT in available
                and CLOCK_EXT not in exts):
            exts.append(CLOCK_EXT)
        self._enabled = self._feature_chain(supported, api, COOPMAT_EXT in exts,
                                            COOPMAT2_EXT in exts, BFLOAT16_EXT in exts, PIPELINE_EXEC_EXT in exts,
                                            CLOCK_EXT in exts)
        self._priorities = {fam: [1.0] * n for fam, n in counts.items()}
        qinfos = [vk.VkDeviceQueueCreateInfo(queueFamilyIndex=fam, queueCount=n, pQueuePriorities=self._priorities[fam])
                  for fam, n in counts.items()]
        info = vk.VkDeviceCreateInfo(pNext=self._enabled["head"], queueCreateInfoCount=len(qinfos), pQueueCreateInfos=qinfos,
                                     enabledExtensionCount=len(exts), ppEnabledExtensionNames=exts or None,
                                     pEnabledFeatures=None if self._enabled["head"] is not None else self._enabled["base"])
        with _vk.call("vkCreateDevice"):
            self._device = vk.vkCreateDevice(self._physical, info, None)
        self._extensions = exts
        # what an extension left off (validation, above) offers is not there for the shaders
        feats = self._props["features"]
        for ext, keys in ((COOPMAT_EXT, ["cooperative_matrix"]), (COOPMAT2_EXT, list(COOPMAT2_FEATURES.values())),
                          (CLOCK_EXT, ["shader_subgroup_clock", "shader_device_clock"]),
                          (BFLOAT16_EXT, list(BFLOAT16_FEATURES.values()))):
            if ext not in exts:
                feats.update({key: False for key in keys if key in feats})
        if self._enabled.get("pipeline_exec") is not None:
            self._pipeline_exec = ExecutableQueries.load(self._device)
        # the key tells whether pipeline_statistics works on this Manager, not just on the device
        feats["pipeline_executable_info"] = self._pipeline_exec is not None
        if HOST_IMPORT_EXT in exts:
            self._host_import_align = max(4096, host_import_alignment(self._physical))
            self._host_pointer_properties = vk.vkGetDeviceProcAddr(self._device, "vkGetMemoryHostPointerPropertiesEXT")
        used: dict[int, int] = {}
        locks: dict[tuple[int, int], threading.Lock] = {}
        for fam in families:
            idx = used.get(fam, 0)
            used[fam] = idx + 1
            q = vk.vkGetDeviceQueue(self._device, fam, idx)
            self._queues.append((q, fam, locks.setdefault((fam, idx), threading.Lock()), idx))

    def _feature_chain(self, supported: dict, api: int, coop: bool, coop2: bool = False,
                       bf16: bool = False, pipeline_exec: bool = False, clock: bool = False) -> dict:
        """Feature structs enabling every supported feature kbench's shaders may need."""
        base = vk.VkPhysicalDeviceFeatures(**{f: vk.VK_TRUE for f in _ENABLE["base"] if getattr(supported["base"], f)})
        out: dict[str, Any] = {"base": base, "head": None}
        if supported["f11"] is None:
            return out
        f11 = vk.VkPhysicalDeviceVulkan11Features(**{f: vk.VK_TRUE for f in _ENABLE["f11"] if getattr(supported["f11"], f)})
        f12 = vk.VkPhysicalDeviceVulkan12Features(pNext=f11, **{f: vk.VK_TRUE for f in _ENABLE["f12"] if getattr(supported["f12"], f)})
        head = f12
        f13 = None
        if supported["f13"] is not None:
            f13 = vk.VkPhysicalDeviceVulkan13Features(pNext=f12, **{f: vk.VK_TRUE for f in _ENABLE["f13"] if getattr(supported["f13"], f)})
            head = f13
        c = None
        if coop and supported["coop"] is not None and supported["coop"].cooperativeMatrix:
            c = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(pNext=head, cooperativeMatrix=vk.VK_TRUE)
            head = c
        # the structs the bindings lack: every member the device supports (RawStruct, device.py)
        for key, wanted in (("coop2", coop2 and c is not None), ("bf16", bf16)):
            have = supported.get(key)
            if wanted and have is not None:
                raw = RawStruct(have.buf[0], have.members, head,
                                **{m: 1 for m in have.members if have[m]})
                out[key] = raw
                head = raw.ptr
        pe = None
        have = supported.get("pipeline_exec")
        if pipeline_exec and have is not None and have.pipelineExecutableInfo:
            pe = vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(pNext=head,
                                                                            pipelineExecutableInfo=vk.VK_TRUE)
            head = pe
        out["pipeline_exec"] = pe
        ck = None
        have = supported.get("clock")
        if clock and have is not None:
            ck = vk.VkPhysicalDeviceShaderClockFeaturesKHR(pNext=head, shaderSubgroupClock=have.shaderSubgroupClock,
                                                           shaderDeviceClock=have.shaderDeviceClock)
            head = ck
        out["clock"] = ck
        f2 = vk.VkPhysicalDeviceFeatures2(pNext=head, features=base)
        out.update({"f11": f11, "f12": f12, "f13": f13, "coop": c, "f2": f2, "head": f2})
        return out

    def _finish_init(self) -> None:
        self._max_allocation_size = 1 << 62
        if self._props["api_version"] >= "1.1":
            v3 = vk.VkPhysicalDeviceMaintenance3Properties()
            vk.vkGetPhysicalDeviceProperties2(self._physical, vk.VkPhysicalDeviceProperties2(pNext=v3))
            self._max_allocation_size = int(v3.maxMemoryAllocationSize)
        self._mem_props = vk.vkGetPhysicalDeviceMemoryProperties(self._physical)
        with _vk.call("vkCreatePipelineCache"):
            self._pipeline_cache = vk.vkCreatePipelineCache(self._device, vk.VkPipelineCacheCreateInfo(), None)
        self._descriptors = DescriptorAllocator(self)
        self._staging = StagingPool(self)
        self._alive = True
        _LIVE.add(self)
        self._util_seq: Sequence | None = None

    def _make_tensor(self, arr: np.ndarray, tensor_type) -> Tensor:
        tensor_type = self._tensor_type(tensor_type)
        if arr.size == 0:
            raise ValueError("cannot create a zero-size tensor")
        return Tensor(self, arr, tensor_type)

    @staticmethod
    def _tensor_type(tensor_type) -> TensorTypes:
        try:
            return TensorTypes(tensor_type)
        except ValueError:
            raise ValueError(f"unknown tensor_type {tensor_type!r}; use kbench.runtime.TensorTypes") from None

    def _zero_fill(self, tensor: Tensor) -> None:
        from .ops import OpTensorFill

        if self._util_seq is None:
            self._util_seq = Sequence(self, 0)
        self._util_seq.eval(OpTensorFill(tensor, 0))
        self._util_seq.clear()

    def _set_layout(self, n: int):
        layout = self._set_layouts.get(n)
        if layout is None:
            bindings = [vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                                        descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
                        for i in range(n)]
            with _vk.call("vkCreateDescriptorSetLayout"):
                layout = vk.vkCreateDescriptorSetLayout(self._device, vk.VkDescriptorSetLayoutCreateInfo(
                    bindingCount=n, pBindings=bindings), None)
            self._set_layouts[n] = layout
        return layout

    def _acquire_pipeline(self, key, spirv, info, n_bindings, spec) -> Pipeline:
        with self._lock:
            p = self._pipelines.get(key)
            if p is None:
                p = Pipeline(self, spirv, info, n_bindings, spec)
                self._pipelines[key] = p
            p.refs += 1
            return p

    def _release_pipeline(self, key) -> None:
        with self._lock:
            p = self._pipelines.get(key)
            if p is None:
                return
            p.refs -= 1
            # keep a few idle pipelines so rebuilding the same algorithm is cheap
            idle = [k for k, v in self._pipelines.items() if v.refs == 0]
            while len(idle) > 32:
                k = idle.pop(0)
                self._pipelines.pop(k).destroy()

    def _track(self, obj) -> None:
        if isinstance(obj, Tensor):
            self._tensors.add(obj)
        elif isinstance(obj, Algorithm):
            self._algorithms.add(obj)
        elif isinstance(obj, Sequence):
            self._sequences.add(obj)

    def _untrack(self, obj) -> None:
        for s in (self._tensors, self._algorithms, self._sequences):
            s.discard(obj)

    def _before_free(self, obj) -> None:
        """Wait for running sequences that use ``obj`` before its Vulkan objects go away (at most
        destroy_timeout_s), and mark every sequence that recorded it stale: it will not submit
        commands naming freed objects."""
        if not self._alive:
            return  # tearing down: the device is already idle
        for seq in list(self._sequences):
            if seq.uses(obj):
                if seq._running:
                    seq._finish_within(f"destroying {obj!r}", abandon=True)
                seq._stale = type(obj).__name__.lower()

    def _abandon(self, reason: str) -> None:
        """Give up on this device: GPU work that does not finish still uses its objects, so
        nothing is freed (until the process exits) and every later call says the Manager is gone."""
        warnings.warn(f"kbench.runtime: {reason}; the Manager is abandoned and its Vulkan objects stay "
                      "allocated until the process exits", RuntimeWarning, stacklevel=3)
        self._abandoned = True
        self._alive = False
        self._device = None  # every free path skips Vulkan calls without a device

    def _check_alive(self) -> None:
        if self._abandoned:
            raise DeviceBusyError("this Manager was abandoned: a destroy gave up waiting for GPU work that did not "
                                  "finish (see Manager.destroy_timeout_s); create a new Manager")
        if self._lost:
            raise DeviceLostError("the Vulkan device was lost earlier; create a new Manager", "VK_ERROR_DEVICE_LOST")
        if not self._alive:
            raise RuntimeError("this Manager has been destroyed")

    def _result(self, code: int, what: str) -> None:
        if code == vk.VK_ERROR_DEVICE_LOST:
            self._lost = True
        _vk.check(code, what)

    def _maybe_finish_destroy(self) -> None:
        if self._teardown_pending and self._stats["buffers"] == 0:
            self._destroy_device()

    def _teardown(self) -> None:
        # strong references first: the garbage collector may run while we free things, and an
        # object it collected out of the weak sets would otherwise never be destroyed
        owned = (list(self._sequences), list(self._algorithms), list(self._tensors))
        self._alive = False
        if self._device is not None:
            self._wait_for_sequences(owned[0] + ([self._util_seq] if self._util_seq is not None else []))
            try:
                lib.vkDeviceWaitIdle(self._device)
            except Exception:
                pass
            for seq in owned[0]:
                seq._running = False
                seq.destroy()
            if self._util_seq is not None:
                self._util_seq.destroy()
                self._util_seq = None
            for algo in owned[1]:
                algo.destroy()
            for t in owned[2]:
                t.destroy()
            for p in self._pipelines.values():
                p.destroy()
            self._pipelines = {}
            if self._descriptors is not None:
                self._descriptors.destroy()
            for layout in self._set_layouts.values():
                vk.vkDestroyDescriptorSetLayout(self._device, layout, None)
            self._set_layouts = {}
            if self._staging is not None:
                self._staging.destroy()
            if self._pipeline_cache is not None:
                vk.vkDestroyPipelineCache(self._device, self._pipeline_cache, None)
                self._pipeline_cache = None
            if self._stats["buffers"]:
                # NumPy views of mapped tensor memory are still alive: the device (and the
                # instance) go when the last view does, so those arrays never dangle
                self._teardown_pending = True
                return
        del owned
        self._destroy_device()

    def _wait_for_sequences(self, seqs: list) -> None:
        """Wait for the running ones of ``seqs`` at most destroy_timeout_s in all; abandon the
        Manager and raise DeviceBusyError when one is still running then."""
        deadline = time.monotonic() + self._destroy_timeout_s
        for seq in seqs:
            if not seq._running or getattr(seq, "_fences", None) is None:
                continue
            left = max(0.0, deadline - time.monotonic())
            res = seq._block(int(left * 1e9))
            if res == vk.VK_TIMEOUT:
                self._abandon(f"Manager.destroy: the GPU did not finish within {self._destroy_timeout_s:g} s")
                raise DeviceBusyError(
                    f"Manager.destroy: submitted GPU work did not finish within {self._destroy_timeout_s:g} s "
                    "(Manager.destroy_timeout_s; an endless or very long shader?): the Manager was abandoned and "
                    "its device memory stays allocated until the process exits", "VK_TIMEOUT")

    def _destroy_device(self) -> None:
        self._teardown_pending = False
        if self._device is not None and self._owns_device:
            vk.vkDestroyDevice(self._device, None)
        self._device = None
        if self._instance is not None:
            self._instance.release()
            self._instance = None
        _validation.unregister(self._messages)
