"""Buffers, memory-type choice and the pooled staging memory used for host<->device transfers."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from . import _vk
from ._vk import ffi, lib, vk

if TYPE_CHECKING:  # pragma: no cover
    from .manager import Manager

DEVICE_LOCAL = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
HOST_VISIBLE = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
HOST_COHERENT = vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
HOST_CACHED = vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT

# Allocations at least this large get their own VkDeviceMemory (VK_KHR_dedicated_allocation,
# core in 1.1): drivers can then back them with large pages and place them optimally.
DEDICATED_THRESHOLD = 64 << 20

USAGE_ALL = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
             | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)

# (required flags, preferred flags, avoided flags) per purpose
PURPOSES = {
    "device": (DEVICE_LOCAL, 0, HOST_VISIBLE),
    "host": (HOST_VISIBLE | HOST_COHERENT, HOST_CACHED, DEVICE_LOCAL),
    "device_and_host": (DEVICE_LOCAL | HOST_VISIBLE | HOST_COHERENT, 0, 0),
    "staging": (HOST_VISIBLE | HOST_COHERENT, HOST_CACHED, DEVICE_LOCAL),
}


def choose_memory_type(mem_props, type_bits: int, purpose: str) -> int:
    """Index of the best memory type for ``purpose`` among ``type_bits``, or -1."""
    required, preferred, avoided = PURPOSES[purpose]
    best, best_score = -1, -1
    for i in range(mem_props.memoryTypeCount):
        if not type_bits & (1 << i):
            continue
        flags = mem_props.memoryTypes[i].propertyFlags
        if flags & required != required:
            continue
        score = (2 if flags & preferred == preferred and preferred else 0) + (1 if not flags & avoided else 0)
        heap = mem_props.memoryHeaps[mem_props.memoryTypes[i].heapIndex]
        # among equals, the bigger heap (e.g. the 140 GiB VRAM heap rather than a 256 MiB BAR window)
        if score > best_score or (score == best_score and best >= 0 and heap.size > mem_props.memoryHeaps[mem_props.memoryTypes[best].heapIndex].size):
            best, best_score = i, score
    return best


class Buffer:
    """One VkBuffer bound to its own VkDeviceMemory (optionally persistently mapped)."""

    __slots__ = ("mgr", "size", "handle", "memory", "ptr", "purpose", "memory_type", "host_visible", "_freed")

    def __init__(self, mgr: "Manager", size: int, purpose: str):
        self.mgr = mgr
        self.size = size
        self.purpose = purpose
        self.handle = None
        self.memory = None
        self.ptr = None
        self._freed = False
        dev = mgr._device
        alloc_size = max(4, (size + 3) // 4 * 4)  # fills and copies work in 4-byte words
        with _vk.call("vkCreateBuffer"):
            self.handle = vk.vkCreateBuffer(dev, vk.VkBufferCreateInfo(
                size=alloc_size, usage=USAGE_ALL, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        try:
            req = vk.vkGetBufferMemoryRequirements(dev, self.handle)
            idx = choose_memory_type(mgr._mem_props, req.memoryTypeBits, purpose)
            if idx < 0 and purpose == "device_and_host":
                raise ValueError("TensorTypes.device_and_host needs a memory type that is both device-local "
                                 "and host-visible; this device has none (no ReBAR/UMA)")
            if idx < 0:
                raise RuntimeError(f"no memory type for {purpose} buffers on this device")
            self.memory_type = idx
            flags = mgr._mem_props.memoryTypes[idx].propertyFlags
            self.host_visible = bool(flags & HOST_VISIBLE)
            dedicated = None
            if alloc_size >= DEDICATED_THRESHOLD:
                dedicated = vk.VkMemoryDedicatedAllocateInfo(buffer=self.handle)
            info = vk.VkMemoryAllocateInfo(pNext=dedicated, allocationSize=req.size, memoryTypeIndex=idx)
            if req.size > mgr._max_allocation_size:
                from .errors import OutOfDeviceMemoryError

                raise OutOfDeviceMemoryError(
                    f"buffer of {size} bytes exceeds the device's maxMemoryAllocationSize "
                    f"({mgr._max_allocation_size} bytes)", "VK_ERROR_OUT_OF_DEVICE_MEMORY")
            with _vk.call(f"vkAllocateMemory({req.size} bytes)"):
                self.memory = vk.vkAllocateMemory(dev, info, None)
            with _vk.call("vkBindBufferMemory"):
                vk.vkBindBufferMemory(dev, self.handle, self.memory, 0)
            if self.host_visible and purpose != "device":
                pp = ffi.new("void**")
                _vk.check(lib.vkMapMemory(dev, self.memory, 0, alloc_size, 0, pp), "vkMapMemory")
                self.ptr = pp[0]
        except BaseException:
            self.free()
            raise
        mgr._stats["buffers"] += 1
        mgr._stats["buffer_bytes"] += alloc_size

    def address(self) -> int:
        return int(ffi.cast("uintptr_t", self.ptr))

    def give_back(self) -> None:
        """Return a staging buffer to its Manager's pool (Recorder.staging lent it)."""
        self.mgr._staging.release(self)

    def view(self) -> memoryview:
        return memoryview(ffi.buffer(self.ptr, self.size))

    def free(self) -> None:
        if self._freed:
            return
        self._freed = True
        dev = self.mgr._device
        if dev is None:  # an abandoned Manager: the GPU may still use the memory, so it stays
            self.handle = self.memory = self.ptr = None
            return
        if self.handle is not None:
            vk.vkDestroyBuffer(dev, self.handle, None)
        if self.memory is not None:
            if self.ptr is not None:
                lib.vkUnmapMemory(dev, self.memory)
            vk.vkFreeMemory(dev, self.memory, None)
            self.mgr._stats["buffers"] -= 1
            self.mgr._stats["buffer_bytes"] -= max(4, (self.size + 3) // 4 * 4)
        self.handle = self.memory = self.ptr = None


class StagingPool:
    """Host-visible buffers lent to transfer ops while they are recorded, then reused.

    Kompute keeps a full mapped staging copy per device tensor for its whole life (kp issue 420);
    here staging exists only while a recorded op holds it, and idle buffers are kept up to a
    budget so that repeated transfers do not reallocate.
    """

    def __init__(self, mgr: "Manager", idle_budget: int = 256 << 20):
        self.mgr = mgr
        self.idle_budget = idle_budget
        self._idle: list[Buffer] = []
        self._lent = 0
        self._lock = threading.Lock()

    def acquire(self, nbytes: int) -> Buffer:
        with self._lock:
            fits = [b for b in self._idle if b.size >= nbytes]
            if fits:
                buf = min(fits, key=lambda b: b.size)
                if buf.size <= 2 * nbytes or buf.size - nbytes < (1 << 20):
                    self._idle.remove(buf)
                    self._lent += 1
                    return buf
        buf = Buffer(self.mgr, max(nbytes, 4096), "staging")
        with self._lock:
            self._lent += 1
        return buf

    def release(self, buf: Buffer) -> None:
        with self._lock:
            self._lent -= 1
            if self.mgr._device is None:
                return
            self._idle.append(buf)
            self._idle.sort(key=lambda b: -b.size)
            total = 0
            keep = []
            for b in self._idle:
                if total + b.size <= self.idle_budget:
                    keep.append(b)
                    total += b.size
                else:
                    b.free()
            self._idle = keep

    @property
    def idle_bytes(self) -> int:
        return sum(b.size for b in self._idle)

    def destroy(self) -> None:
        with self._lock:
            for b in self._idle:
                b.free()
            self._idle = []


class ManagedObject:
    """Base of the Manager's objects: a dropped Python object frees its Vulkan objects, as
    Kompute's shared_ptr does (subclasses set ``_mgr`` and ``_destroyed`` and define destroy)."""

    _destroyed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        # `with mgr.sequence() as seq:` frees the object at the block's end, even on error
        self.destroy()

    def __del__(self):
        try:
            # also while the Manager tears down: a cycle collected mid-teardown must still free
            if not self._destroyed and self._mgr._device is not None:
                self.destroy()
        except Exception:
            pass


HOST_IMPORT_EXT = "VK_EXT_external_memory_host"
_HOST_ALLOCATION = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT


def host_import_alignment(physical) -> int:
    """minImportedHostPointerAlignment of ``physical`` (VK_EXT_external_memory_host)."""
    p = vk.VkPhysicalDeviceExternalMemoryHostPropertiesEXT()
    vk.vkGetPhysicalDeviceProperties2(physical, vk.VkPhysicalDeviceProperties2(pNext=p))
    return int(p.minImportedHostPointerAlignment)


class HostImport:
    """A VkBuffer over host memory the caller owns (VK_EXT_external_memory_host): the GPU's DMA
    reads and writes that memory itself, so a transfer needs no staging copy on the host.

    ``address`` and ``nbytes`` must be multiples of the device's minImportedHostPointerAlignment,
    the memory must outlive this object, and only host-coherent memory types are taken (raises
    RuntimeError otherwise, or with the driver's error where it refuses the import).
    """

    __slots__ = ("mgr", "size", "handle", "memory", "_freed")

    def __init__(self, mgr: "Manager", address: int, nbytes: int):
        self.mgr, self.size, self.handle, self.memory, self._freed = mgr, nbytes, None, None, False
        align = mgr._host_import_align
        if not align:
            raise RuntimeError(f"{HOST_IMPORT_EXT} is not enabled on this device")
        if address % align or nbytes % align or nbytes <= 0:
            raise ValueError(f"host import of {nbytes} bytes at {address:#x}: address and size must be "
                             f"positive multiples of {align}")
        dev = mgr._device
        ptr = ffi.cast("void*", address)
        try:
            props = vk.VkMemoryHostPointerPropertiesEXT()
            with _vk.call("vkGetMemoryHostPointerPropertiesEXT"):
                mgr._host_pointer_properties(dev, _HOST_ALLOCATION, ptr, props)
            ext = vk.VkExternalMemoryBufferCreateInfo(handleTypes=_HOST_ALLOCATION)
            with _vk.call("vkCreateBuffer"):
                self.handle = vk.vkCreateBuffer(dev, vk.VkBufferCreateInfo(
                    pNext=ext, size=nbytes, usage=USAGE_ALL, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
            req = vk.vkGetBufferMemoryRequirements(dev, self.handle)
            types = mgr._mem_props.memoryTypes
            wanted = HOST_VISIBLE | HOST_COHERENT
            usable = [i for i in range(mgr._mem_props.memoryTypeCount)
                      if props.memoryTypeBits & req.memoryTypeBits & (1 << i) and types[i].propertyFlags & wanted == wanted]
            if not usable or req.size > nbytes:
                raise RuntimeError(f"no host-coherent memory type can import host memory on this device "
                                   f"(types {props.memoryTypeBits:#x}, buffer needs {req.size} bytes)")
            info = vk.VkMemoryAllocateInfo(
                pNext=vk.VkImportMemoryHostPointerInfoEXT(handleType=_HOST_ALLOCATION, pHostPointer=ptr),
                allocationSize=nbytes, memoryTypeIndex=usable[0])
            with _vk.call(f"vkAllocateMemory(import of {nbytes} host bytes)"):
                self.memory = vk.vkAllocateMemory(dev, info, None)
            with _vk.call("vkBindBufferMemory"):
                vk.vkBindBufferMemory(dev, self.handle, self.memory, 0)
        except BaseException:
            self.free()
            raise
        mgr._stats["host_imports"] += 1

    def free(self) -> None:
        if self._freed:
            return
        self._freed = True
        dev = self.mgr._device
        if dev is not None:
            if self.handle is not None:
                vk.vkDestroyBuffer(dev, self.handle, None)
            if self.memory is not None:
                vk.vkFreeMemory(dev, self.memory, None)
                self.mgr._stats["host_imports"] -= 1
        self.handle = self.memory = None
