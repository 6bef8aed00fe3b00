"""Tensor: a typed buffer with Kompute's four memory types and a zero-copy NumPy view."""
from __future__ import annotations

import enum
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DeviceLostError
from .memory import Buffer, HostImport, ManagedObject

if TYPE_CHECKING:  # pragma: no cover
    from .manager import Manager


class TensorTypes(enum.IntEnum):
    """Where a tensor's memory lives (Kompute's names; ``device_and_host`` is kbench's addition)."""

    device = 0  # device-local buffer; host data moved by OpTensorSyncDevice/Local
    host = 1  # host-visible buffer the shader reads directly
    storage = 2  # device-only, never mapped
    device_and_host = 3  # one device-local, host-visible buffer (ReBAR / unified memory)


class DataTypes(enum.IntEnum):
    """Element types (Kompute's five first, then kbench's additions)."""

    bool = 0
    int = 1
    uint = 2
    float = 3
    double = 4
    half = 5
    int8 = 6
    uint8 = 7
    int16 = 8
    uint16 = 9
    int64 = 10
    uint64 = 11


_NP_TO_DT = {
    np.dtype(np.bool_): DataTypes.bool,
    np.dtype(np.int32): DataTypes.int,
    np.dtype(np.uint32): DataTypes.uint,
    np.dtype(np.float32): DataTypes.float,
    np.dtype(np.float64): DataTypes.double,
    np.dtype(np.float16): DataTypes.half,
    np.dtype(np.int8): DataTypes.int8,
    np.dtype(np.uint8): DataTypes.uint8,
    np.dtype(np.int16): DataTypes.int16,
    np.dtype(np.uint16): DataTypes.uint16,
    np.dtype(np.int64): DataTypes.int64,
    np.dtype(np.uint64): DataTypes.uint64,
}
DT_TO_NP = {v: k for k, v in _NP_TO_DT.items()}

# device feature a shader needs to do arithmetic on each element type
DTYPE_FEATURES = {
    DataTypes.double: ("float64", "shaderFloat64"),
    DataTypes.int64: ("int64", "shaderInt64"),
    DataTypes.uint64: ("int64", "shaderInt64"),
    DataTypes.int16: ("int16", "shaderInt16"),
    DataTypes.uint16: ("int16", "shaderInt16"),
    DataTypes.half: ("float16", "shaderFloat16"),
    DataTypes.int8: ("int8", "shaderInt8"),
    DataTypes.uint8: ("int8", "shaderInt8"),
}


def numpy_dtype(dtype: Any) -> np.dtype:
    """Normalise and check a dtype; raises TypeError naming the supported ones."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt.newbyteorder("=") not in _NP_TO_DT:
        names = ", ".join(sorted(str(d) for d in _NP_TO_DT))
        raise TypeError(f"unsupported tensor dtype {str(dt) if dt is not None else repr(dtype)}; supported: {names}")
    return dt.newbyteorder("=")


class _HostView:
    """Owner of a NumPy view of mapped memory: keeps the tensor (and so the memory) alive."""

    def __init__(self, tensor: "Tensor", ptr: int, count: int, dtype: np.dtype):
        self.tensor = tensor
        self.__array_interface__ = {"shape": (count,), "typestr": dtype.str, "data": (ptr, False), "version": 3}


class Tensor(ManagedObject):
    """A typed, flat buffer owned by a Manager. Create with ``Manager.tensor``/``tensor_t``."""

    def __init__(self, mgr: "Manager", array: np.ndarray, tensor_type: TensorTypes, zero: bool = False):
        self._mgr = mgr
        self._type = TensorTypes(tensor_type)
        self._dtype = array.dtype
        self._size = int(array.size)
        self._host: np.ndarray | None = None
        self._buffer: Buffer | None = None
        self._live_views = 0
        self._destroyed = False
        self._host_region: np.ndarray | None = None
        self._import = None  # HostImport of _host_region once a sync asked for it; False: refused
        purpose = {TensorTypes.device: "device", TensorTypes.storage: "device",
                   TensorTypes.host: "host", TensorTypes.device_and_host: "device_and_host"}[self._type]
        self._buffer = Buffer(mgr, self.nbytes(), purpose)
        try:
            if self._type == TensorTypes.device:
                self._host, self._host_region = mgr._host_array(array)
            elif self._type in (TensorTypes.host, TensorTypes.device_and_host):
                np.copyto(self._mapped_array(), array, casting="no")
            if zero and self._type != TensorTypes.host:
                mgr._zero_fill(self)
        except BaseException:
            self._buffer.free()
            raise
        mgr._track(self)

    # --- Kompute API ---------------------------------------------------------------------------
    def data(self) -> np.ndarray:
        """Zero-copy view of the host-side data (raises for storage tensors)."""
        self._check()
        if self._type == TensorTypes.storage:
            raise TypeError("storage tensors have no host memory: copy into a host or device tensor to read them")
        if self._type == TensorTypes.device:
            return self._host.view()
        return self._mapped_array()

    def size(self) -> int:
        """Number of elements."""
        return self._size

    def __len__(self) -> int:
        return self._size

    def data_type(self) -> DataTypes:
        return _NP_TO_DT[self._dtype]

    def tensor_type(self) -> TensorTypes:
        return self._type

    def is_init(self) -> bool:
        return not self._destroyed and self._buffer is not None and self._mgr._alive

    def destroy(self) -> None:
        """Free the buffer (deferred while NumPy views of mapped memory are alive)."""
        if self._destroyed:
            return
        self._mgr._before_free(self)
        self._destroyed = True
        if self._import:
            self._import.free()  # before the host memory it covers can go
        self._import = None
        self._host = self._host_region = None
        if self._live_views == 0:
            self._release()
        self._mgr._untrack(self)

    # --- kbench additions ----------------------------------------------------------------------
    def nbytes(self) -> int:
        return self._size * self._dtype.itemsize

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else f"{self._type.name}"
        return f"<kbench.runtime.Tensor {self._size} x {self._dtype} {state}>"

    # --- recording (called by ops with the Recorder they were given) ----------------------------
    def record_copy_from(self, rec, src, size: int | None = None, src_offset: int = 0, dst_offset: int = 0) -> None:
        """Record a copy of ``size`` bytes (default: this tensor's size) from ``src`` (a tensor,
        a staging buffer or imported host memory) into this tensor."""
        rec.copy(src, self, src_offset, dst_offset, self.nbytes() if size is None else size)

    def record_copy_to(self, rec, dst, size: int | None = None, src_offset: int = 0, dst_offset: int = 0) -> None:
        """Record a copy of ``size`` bytes (default: this tensor's size) of this tensor into ``dst``."""
        rec.copy(self, dst, src_offset, dst_offset, self.nbytes() if size is None else size)

    def record_fill(self, rec, value: int, offset: int, size: int) -> None:
        """Record filling bytes [offset, offset + size) (4-byte aligned) with the uint32 ``value``."""
        rec.fill(self, value, offset, size)

    # --- internals -----------------------------------------------------------------------------
    def _mapped_array(self) -> np.ndarray:
        holder = _HostView(self, self._buffer.address(), self._size, self._dtype)
        self._live_views += 1
        weakref.finalize(holder, Tensor._view_gone, weakref.ref(self))
        return np.asarray(holder)

    @staticmethod
    def _view_gone(ref) -> None:
        t = ref()
        if t is None:
            return
        t._live_views -= 1
        if t._destroyed and t._live_views == 0:
            t._release()

    def _release(self) -> None:
        if self._buffer is not None:
            self._buffer.free()
            self._buffer = None
            self._mgr._maybe_finish_destroy()

    def _check(self) -> None:
        if self._destroyed or self._buffer is None:
            raise RuntimeError("tensor has been destroyed")
        if not self._mgr._alive:
            raise RuntimeError("tensor's Manager has been destroyed")

    def _host_import(self):
        """The HostImport of this device tensor's host memory (made on first use), or None where
        the device cannot import it; a refused import is not retried."""
        if self._import is None:
            self._import = False
            if self._host_region is not None:
                try:
                    self._import = HostImport(self._mgr, self._host_region.ctypes.data, self._host_region.nbytes)
                except DeviceLostError:
                    raise
                except (RuntimeError, MemoryError):
                    pass  # staged transfers instead
        return self._import or None

    @property
    def _vk_buffer(self):
        self._check()
        return self._buffer.handle
