"""Algorithm: a compute shader bound to tensors, with checked push and specialization constants."""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Sequence as Seq

import numpy as np

from . import _vk
from .memory import ManagedObject
from ._vk import ffi, vk
from .errors import UnsupportedFeatureError
from .spirv import Scalar, ShaderInfo, reflect, unsupported_capabilities, validate_with_spirv_val
from .tensor import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from .manager import Manager

_KIND = {"f": "f", "i": "i", "u": "u", "b": "u"}


def _as_constants(values: Any, what: str) -> np.ndarray:
    """Kompute's rule: Python lists are float32, NumPy arrays keep their dtype."""
    if values is None:
        return np.zeros(0, np.float32)
    if isinstance(values, np.ndarray):
        if values.dtype.names is not None:
            if values.size != 1:
                raise ValueError(f"{what}: a structured array must hold exactly one record, got {values.size}")
            return values.reshape(1)
        if values.dtype.kind not in "fiub":
            raise TypeError(f"{what}: dtype {values.dtype} is not a number type")
        return np.ascontiguousarray(values.reshape(-1))
    if isinstance(values, (list, tuple)):
        try:
            return np.asarray(values, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{what}: expected numbers, got {values!r}") from e
    raise TypeError(f"{what}: expected a list or numpy array, got {type(values).__name__}")


def _scalar_of(dt: np.dtype) -> Scalar:
    kind = {"f": "f", "i": "i", "u": "u", "b": "u"}[dt.kind]
    return Scalar(kind, dt.itemsize * 8)


def _describe(s: Scalar) -> str:
    return {"f": "float", "i": "int", "u": "uint"}[_KIND[s.kind]] + str(s.width)


def check_push_constants(info: ShaderInfo, values: np.ndarray, where: str) -> bytes:
    """Check ``values`` against the shader's push-constant block; return the bytes to push."""
    if values.size == 0:
        return b""
    # the verdict depends only on the dtype and size, so backends issuing thousands of
    # dispatches with fresh arrays of one layout pay for the check once
    key = (values.dtype, values.nbytes)
    checked = info.push_layouts_checked
    if key in checked:
        return values.tobytes()
    _check_push_layout(info, values, where)
    checked.add(key)
    return values.tobytes()


def _check_push_layout(info: ShaderInfo, values: np.ndarray, where: str) -> None:
    if not info.push_members:
        raise ValueError(f"{where}: push constants given ({values.nbytes} bytes) but the shader declares none")
    if values.dtype.names is not None:
        fields = [values.dtype.fields[n] for n in values.dtype.names]
        if len(fields) != len(info.push_members):
            raise ValueError(f"{where}: push-constant record has {len(fields)} fields, the shader block has "
                             f"{len(info.push_members)} members ({', '.join(m.name for m in info.push_members)})")
        for (fdt, foff, *_), m in zip(fields, info.push_members):
            base = fdt.base
            got = _scalar_of(base)
            count = int(np.prod(fdt.shape)) if fdt.shape else 1
            if foff != m.offset or _KIND[got.kind] != _KIND[m.scalar.kind] or got.width != m.scalar.width or (m.count and count != m.count):
                raise TypeError(f"{where}: push-constant member '{m.name}' is {_describe(m.scalar)} x{m.count} at offset "
                                f"{m.offset}, got {_describe(got)} x{count} at offset {foff}")
    else:
        got = _scalar_of(values.dtype)
        for m in info.push_members:
            if m.count == 0:
                continue
            if _KIND[got.kind] != _KIND[m.scalar.kind] or got.width != m.scalar.width:
                raise TypeError(f"{where}: push-constant dtype {values.dtype} does not match the shader's member "
                                f"'{m.name}' ({_describe(m.scalar)}); pass a numpy array of the matching dtype "
                                "(or a structured array for mixed blocks)")
    if values.nbytes != info.push_size:
        raise ValueError(f"{where}: push constants are {values.nbytes} bytes, the shader's block is {info.push_size} bytes")


def check_spec_constants(info: ShaderInfo, values: np.ndarray, where: str) -> None:
    if values.dtype.names is not None:
        raise TypeError(f"{where}: specialization constants must be a plain list or array")
    got = _scalar_of(values.dtype)
    for i in range(values.size):
        sc = info.spec_constants.get(i)
        if sc is None:
            continue
        if _KIND[got.kind] != _KIND[sc.scalar.kind] or got.width != (sc.scalar.width if sc.scalar.kind != "b" else 32):
            raise TypeError(f"{where}: specialization constant {i} is {_describe(sc.scalar)} in the shader, got {values.dtype}")


def _check_local_size(info: ShaderInfo, spec: np.ndarray, props: dict) -> None:
    """The shader's local size (after specialization) within the device's limits."""
    size = info.local_size_with([int(v) for v in spec.tolist()] if spec.dtype.kind in "iu" else
                                [int(v) if float(v).is_integer() else -1 for v in spec.tolist()])
    if size is None:
        return
    limits = props.get("max_work_group_size", ())
    for axis, (n, lim) in enumerate(zip(size, limits)):
        if not 1 <= n <= lim:
            raise ValueError(f"the shader's local size {tuple(size)} is outside the device's "
                             f"maxComputeWorkGroupSize {tuple(limits)} on axis {axis}")
    total = int(np.prod(size, dtype=np.int64))
    if total > props.get("max_work_group_invocations", total):
        raise ValueError(f"the shader's local size {tuple(size)} is {total} invocations, more than the device's "
                         f"maxComputeWorkGroupInvocations ({props['max_work_group_invocations']})")


def reflect_compute(spirv: Any) -> tuple[bytes, ShaderInfo]:
    """``spirv`` as bytes and its reflection, checked to be a compute shader kbench can bind:
    TypeError for anything but bytes-like, ValueError for invalid SPIR-V or foreign bindings."""
    spirv = bytes(spirv) if isinstance(spirv, (bytes, bytearray, memoryview)) else spirv
    info = reflect(spirv)
    if "main" not in info.entry_points:
        raise ValueError(f"SPIR-V has no entry point 'main' (found {info.entry_points})")
    for b in info.bindings:
        if b.set != 0 or b.kind != "storage":
            raise ValueError(f"the shader's binding {b.binding} is a {b.kind} resource in descriptor set {b.set}; "
                             "kbench binds storage buffers in set 0 only (binding i is tensor i)")
    return spirv, info


def check_device_support(info: ShaderInfo, props: dict) -> None:
    """Refuse a shader needing a capability kbench does not enable, or a feature the device
    (``props``: the Manager's device properties) lacks (UnsupportedFeatureError)."""
    odd = unsupported_capabilities(info.capabilities)
    if odd:
        raise ValueError(f"the shader declares SPIR-V capability {', '.join(map(str, odd))}, which kbench does not "
                         "enable for compute shaders (not every device has it)")
    feats = props["features"]
    for key, human in info.required_features():
        if not feats.get(key, False):
            raise UnsupportedFeatureError(f"the shader needs {human}, which {props['device_name']} does not support", human)


def specialize(info: ShaderInfo, spec_consts: Any, props: dict, where: str) -> np.ndarray:
    """The specialization constants as an array, checked against the shader's types and, with
    them applied, its local size against the device's limits."""
    spec = _as_constants(spec_consts, "spec_consts")
    check_spec_constants(info, spec, where)
    _check_local_size(info, spec, props)
    return spec


def spirv_target_env(props: dict) -> str:
    """spirv-val's --target-env for a device of these properties."""
    return "vulkan1.3" if props["api_version"] >= "1.3" else "vulkan1.1"


class Pipeline:
    """Shader module + layouts + compute pipeline; shared by every Algorithm with the same key.
    ``flags``: VkPipelineCreateFlags (Manager.pipeline_statistics' throwaway pipelines capture
    statistics; the shared ones take none)."""

    def __init__(self, mgr: "Manager", spirv: bytes, info: ShaderInfo, n_bindings: int, spec: np.ndarray,
                 flags: int = 0):
        self.mgr = mgr
        self.refs = 0
        dev = mgr._device
        self.module = self.layout = self.pipeline = None
        self.set_layout = mgr._set_layout(n_bindings)
        try:
            with _vk.call("vkCreateShaderModule"):
                self.module = vk.vkCreateShaderModule(dev, vk.VkShaderModuleCreateInfo(codeSize=len(spirv), pCode=spirv), None)
            ranges = []
            if info.push_size:
                ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=info.push_size)]
            with _vk.call("vkCreatePipelineLayout"):
                self.layout = vk.vkCreatePipelineLayout(dev, vk.VkPipelineLayoutCreateInfo(
                    setLayoutCount=1, pSetLayouts=[self.set_layout],
                    pushConstantRangeCount=len(ranges), pPushConstantRanges=ranges or None), None)
            # Sub-structs and the strings they point to must outlive the create call (the
            # `vulkan` package frees temporaries early otherwise; see vulkan-python-notes.md).
            spec_info = None
            if spec.size:
                width = spec.dtype.itemsize
                entries = [vk.VkSpecializationMapEntry(constantID=i, offset=i * width, size=width) for i in range(spec.size)]
                self._spec_data = ffi.from_buffer(spec.tobytes())
                spec_info = vk.VkSpecializationInfo(mapEntryCount=len(entries), pMapEntries=entries,
                                                    dataSize=spec.nbytes, pData=self._spec_data)
            self._entry = "main"
            stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.module,
                                                       pName=self._entry, pSpecializationInfo=spec_info)
            create = vk.VkComputePipelineCreateInfo(flags=flags, stage=stage, layout=self.layout)
            with _vk.call("vkCreateComputePipelines"):
                self.pipeline = vk.vkCreateComputePipelines(dev, mgr._pipeline_cache, 1, [create], None)[0]
        except BaseException:
            self.destroy()
            raise
        mgr._stats["pipelines"] += 1

    def destroy(self) -> None:
        dev = self.mgr._device
        if dev is None:  # an abandoned Manager keeps its objects
            self.pipeline = self.layout = self.module = None
            return
        if self.pipeline is not None:
            vk.vkDestroyPipeline(dev, self.pipeline, None)
            self.mgr._stats["pipelines"] -= 1
        if self.layout is not None:
            vk.vkDestroyPipelineLayout(dev, self.layout, None)
        if self.module is not None:
            vk.vkDestroyShaderModule(dev, self.module, None)
        self.pipeline = self.layout = self.module = None


class Algorithm(ManagedObject):
    """A compute shader with its tensors (binding i = tensor i), grid and constants."""

    def __init__(self, mgr: "Manager", tensors: Seq[Tensor], spirv: bytes, workgroup=None,
                 spec_consts=None, push_consts=None):
        self._mgr = mgr
        self._pipeline: Pipeline | None = None
        self._key = None
        self._set = None
        self._destroyed = False
        self._build(tensors, spirv, workgroup, spec_consts, push_consts)
        mgr._track(self)

    # --- Kompute API ---------------------------------------------------------------------------
    def rebuild(self, tensors: Seq[Tensor], spirv: bytes, workgroup=None, spec_consts=None, push_consts=None) -> None:
        """Re-create the algorithm with new tensors/shader/constants (re-record sequences after)."""
        self._check()
        self._mgr._before_free(self)
        self._release()
        self._build(tensors, spirv, workgroup, spec_consts, push_consts)

    def get_tensors(self) -> list[Tensor]:
        return list(self._tensors)

    def get_push_constants(self) -> np.ndarray:
        return self._push.copy()

    def set_push_constants(self, push_consts) -> None:
        values = _as_constants(push_consts, "push_consts")
        check_push_constants(self._info, values, "Algorithm.set_push_constants")
        self._push = values

    def get_spec_constants(self) -> np.ndarray:
        return self._spec.copy()

    def get_workgroup(self) -> tuple[int, int, int]:
        return self._workgroup

    def set_workgroup(self, workgroup, min_size: int = 1) -> None:
        self._workgroup = self._grid(workgroup, min_size)

    def is_init(self) -> bool:
        return not self._destroyed and self._set is not None and self._mgr._alive

    def destroy(self) -> None:
        if self._destroyed:
            return
        if self._mgr._alive:
            self._mgr._before_free(self)
        self._release()
        self._destroyed = True
        self._mgr._untrack(self)

    def record_dispatch(self, rec, push: bytes | None = None) -> None:
        """Record binding this algorithm and dispatching its grid; ``push`` (bytes) replaces its
        push constants for this dispatch."""
        self._check()
        data = push if push is not None else (self._push.tobytes() if self._push.size else b"")
        if self._info.push_size and len(data) != self._info.push_size:
            raise ValueError(f"OpAlgoDispatch: the shader needs {self._info.push_size} bytes of push constants, "
                             f"{len(data)} given (set them on the algorithm or pass push_consts)")
        rec.dispatch(self._pipeline, self._set, data, self._workgroup)

    # --- kbench additions ----------------------------------------------------------------------
    @property
    def shader_info(self) -> ShaderInfo:
        return self._info

    def readonly_tensors(self) -> list[Tensor]:
        ro = self._info.readonly_bindings()
        return [t for i, t in enumerate(self._tensors) if i in ro]

    # --- internals -----------------------------------------------------------------------------
    def _grid(self, workgroup, min_size: int = 1) -> tuple[int, int, int]:
        if workgroup is None:
            workgroup = (0, 0, 0)
        wg = list(workgroup)
        if len(wg) != 3 or not all(isinstance(x, (int, np.integer)) and x >= 0 for x in wg):
            raise ValueError(f"workgroup must be three non-negative integers (the dispatch grid), got {workgroup!r}")
        x = int(wg[0]) or max(self._tensors[0].size(), min_size)
        grid = (x, int(wg[1]) or 1, int(wg[2]) or 1)
        limits = self._mgr._props["max_work_group_count"]
        for axis, (g, lim) in enumerate(zip(grid, limits)):
            if g > lim:
                raise ValueError(f"workgroup[{axis}] = {g} exceeds the device's maxComputeWorkGroupCount[{axis}] = {lim}; "
                                 "spread the grid over more dimensions")
        return grid

    def _build(self, tensors, spirv, workgroup, spec_consts, push_consts) -> None:
        mgr = self._mgr
        mgr._check_alive()
        tensors = list(tensors)
        if not tensors:
            raise ValueError("an algorithm needs at least one tensor")
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise TypeError(f"tensors[{i}] is {type(t).__name__}, expected a kbench.runtime.Tensor")
            t._check()
            if t._mgr is not mgr:
                raise ValueError(f"tensors[{i}] belongs to another Manager")
        spirv, info = reflect_compute(spirv)
        if info.binding_count != len(tensors):
            raise ValueError(f"the shader uses {info.binding_count} bindings but {len(tensors)} tensors were given "
                             f"(binding i is tensor i)")
        max_range = mgr._props["max_storage_buffer_range"]
        for i, t in enumerate(tensors):
            if t.nbytes() > max_range:
                raise ValueError(f"tensors[{i}] is {t.nbytes()} bytes, more than the device's maxStorageBufferRange "
                                 f"({max_range} bytes) a shader can bind")
        check_device_support(info, mgr._props)
        spec = specialize(info, spec_consts, mgr._props, "Algorithm")
        push = _as_constants(push_consts, "push_consts")
        check_push_constants(info, push, "Algorithm")
        self._tensors = tensors
        self._info = info
        self._spec = spec
        self._push = push
        self._spirv = spirv
        self._workgroup = self._grid(workgroup)
        key = (hashlib.sha256(spirv).digest(), spec.dtype.str, spec.tobytes(), len(tensors))
        if key not in mgr._pipelines:
            validate_with_spirv_val(spirv, spirv_target_env(mgr._props))
        self._pipeline = mgr._acquire_pipeline(key, spirv, info, len(tensors), spec)
        self._key = key
        try:
            self._set = mgr._descriptors.allocate(mgr._set_layout(len(tensors)), [t._vk_buffer for t in tensors],
                                                  [max(4, (t.nbytes() + 3) // 4 * 4) for t in tensors])
        except BaseException:
            mgr._release_pipeline(self._key)
            self._pipeline = None
            raise

    def _release(self) -> None:
        if self._set is not None:
            self._mgr._descriptors.free(self._set)
            self._set = None
        if self._pipeline is not None:
            self._mgr._release_pipeline(self._key)
            self._pipeline = None

    def _check(self) -> None:
        if self._destroyed:
            raise RuntimeError("algorithm has been destroyed")
        self._mgr._check_alive()
        for i, t in enumerate(self._tensors):
            if t._destroyed:
                raise RuntimeError(f"algorithm's tensor {i} has been destroyed")
