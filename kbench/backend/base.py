"""The ComputeBackend contract: handles, device info, and argument checking for every op.

The public methods of :class:`ComputeBackend` check every argument (handle ownership and
liveness, element and byte ranges, sizes, dtype ids, aliasing) and only then call the
protected hook of the same name (``_matmul``, ``_softmax``, ...), which a subclass implements.
Hooks receive plain Python ints, a :class:`DType`, live handles, and flat ``uint8``
memoryviews for host data, so every backend rejects bad input identically and before it has
recorded any GPU work.

Units follow the Rust trait ``yule_gpu::ComputeBackend``: sizes, offsets and strides of the
compute ops count float32 elements; allocate and the copy methods count bytes.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from kbench.backend.op_table import ALIASING_OPS, OP_BUFFER_ACCESS
from kbench.quant import DType, row_bytes

__all__ = [
    "BufferHandle",
    "DeviceInfo",
    "ComputeBackend",
    "InvalidHandleError",
    "BackendClosedError",
    "UnsupportedDTypeError",
    "FLOAT_BYTES",
    "U32_MAX",
]

#: bytes per element of the compute buffers (little-endian float32)
FLOAT_BYTES = 4
#: the ops' integer arguments are u32 in the trait (and in the shaders' push constants)
U32_MAX = 2**32 - 1

_handle_ids = itertools.count(1)  # global, so a handle of one backend is unknown to another


@dataclass(frozen=True)
class BufferHandle:
    """Opaque reference to a device buffer: a process-wide unique id and its size in bytes."""

    id: int
    size_bytes: int

    @property
    def size_elems(self) -> int:
        """Whole float32 elements that fit in the buffer."""
        return self.size_bytes // FLOAT_BYTES


@dataclass(frozen=True)
class DeviceInfo:
    """What a backend runs on.

    memory_bytes: device-local memory (Vulkan: sum of device-local heaps; NumPy: host RAM).
    compute_units: number of compute units or CPU threads, 0 where it cannot be told.
    """

    name: str
    backend: str
    memory_bytes: int
    compute_units: int


class InvalidHandleError(KeyError):
    """A handle that is freed, or was never allocated by this backend."""

    def __str__(self) -> str:  # KeyError would show the message quoted
        return str(self.args[0]) if self.args else ""


class BackendClosedError(RuntimeError):
    """The backend was closed; no further ops can be issued."""


class UnsupportedDTypeError(NotImplementedError):
    """A valid dtype for which this backend has no quantized_matmul kernel."""


# ---------------------------------------------------------------------------------------------
# argument checks (module functions so subclasses and suites can reuse them)

def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def check_int(op: str, name: str, value: Any, *, minimum: int = 1, maximum: int | None = U32_MAX) -> int:
    """``value`` as an int in [minimum, maximum]; TypeError/ValueError naming ``op`` and ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{op}: {name} must be an integer, got {_describe(value)}")
    value = int(value)
    if value < minimum:
        if minimum == 1:
            raise ValueError(f"{op}: {name} must be positive, got {value}")
        raise ValueError(f"{op}: {name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{op}: {name} must be <= {maximum} (u32), got {value}")
    return value


def check_float(op: str, name: str, value: Any, *, positive: bool) -> float:
    """A finite real number (> 0 if ``positive``, else >= 0) that float32 can hold."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: {name} must be a real number, got {_describe(value)}")
    value = float(value)
    if not math.isfinite(value) or abs(value) > float(np.finfo(np.float32).max):
        raise ValueError(f"{op}: {name} must be finite in float32, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{op}: {name} must be > 0, got {value}")
    if not positive and value < 0:
        raise ValueError(f"{op}: {name} must be >= 0, got {value}")
    return value


def readable_bytes(op: str, data: Any) -> memoryview:
    """A flat read-only uint8 view of a bytes-like object or C-contiguous numpy array."""
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise TypeError(f"{op}: data must hold plain numbers, got a numpy array of {data.dtype}")
        if not data.flags.c_contiguous:
            raise ValueError(f"{op}: data must be C-contiguous, got a numpy array with strides {data.strides}")
        return memoryview(data.reshape(-1).view(np.uint8)).toreadonly()
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(
            f"{op}: data must be a bytes-like object or a numpy array, got {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        raise ValueError(f"{op}: data must be C-contiguous")
    return view.cast("B").toreadonly() if (view.ndim, view.format) != (1, "B") else view.toreadonly()


def writable_bytes(op: str, data: Any) -> memoryview:
    """A flat writable uint8 view of a writable bytes-like object or numpy array."""
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject:
            raise TypeError(f"{op}: data must hold plain numbers, got a numpy array of {data.dtype}")
        if not data.flags.writeable:
            raise TypeError(f"{op}: data must be writable, got a read-only numpy array")
        if not data.flags.c_contiguous:
            raise ValueError(f"{op}: data must be C-contiguous, got a numpy array with strides {data.strides}")
        return memoryview(data.reshape(-1).view(np.uint8))
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(
            f"{op}: data must be a writable bytes-like object (bytearray, memoryview) or a numpy "
            f"array, got {type(data).__name__}"
        ) from None
    if view.readonly:
        raise TypeError(
            f"{op}: data must be writable, got a read-only {type(data).__name__} "
            "(use a bytearray or numpy array)"
        )
    if not view.c_contiguous:
        raise ValueError(f"{op}: data must be C-contiguous")
    return view.cast("B") if (view.ndim, view.format) != (1, "B") else view


#: bytes per element of matmul_f16's inputs (IEEE half)
HALF_BYTES = 2


def check_matmul_f16(backend: "ComputeBackend", a: Any, b: Any, out: Any, m: Any, n: Any,
                     k: Any, op: str = "matmul_f16") -> tuple[BufferHandle, BufferHandle, BufferHandle, int, int, int]:
    """Argument checks of the optional ``matmul_f16`` op (``out[m,n] = A[m,k] @ B[k,n]`` with A and
    B row-major float16, out float32), in the style of the trait's ops: the backend is open, the
    handles are live and the written buffer is distinct, m, n, k are u32 >= 1, and the buffers
    hold 2*m*k, 2*k*n and 4*m*n bytes.  matmul_f16 is not one of the trait's methods: backends
    that have it (VulkanBackend, NumpyBackend, the torch peer) define ``matmul_f16`` calling this
    and then their ``_matmul_f16``; :func:`has_matmul_f16` tells whether a backend has it.
    ``op="matmul_bf16"``: the same checks for bfloat16 inputs (also 2 bytes an element)."""
    elem = {"matmul_f16": "float16", "matmul_bf16": "bfloat16"}[op]
    backend._check_open(op)
    ha, hb, ho = backend._handles(op, a=a, b=b, out=out)
    m = check_int(op, "m", m)
    n = check_int(op, "n", n)
    k = check_int(op, "k", k)
    backend._byte_range(op, "a", ha, 0, HALF_BYTES * m * k, f"{elem} m*k = {m}*{k}")
    backend._byte_range(op, "b", hb, 0, HALF_BYTES * k * n, f"{elem} k*n = {k}*{n}")
    backend._elem_range(op, "out", ho, 0, m * n, f"m*n = {m}*{n}")
    return ha, hb, ho, m, n, k


def has_matmul_f16(backend: Any, op: str = "matmul_f16") -> bool:
    """Whether the backend has the optional op (``matmul_f16`` or ``matmul_bf16``)."""
    return callable(getattr(backend, op, None))


def check_attention(backend: "ComputeBackend", q: Any, k_cache: Any, v_cache: Any, out: Any, head_dim: Any,
                    seq_len: Any, n_heads: Any, n_kv_heads: Any
                    ) -> tuple[BufferHandle, BufferHandle, BufferHandle, BufferHandle, int, int, int, int]:
    """Argument checks of the optional fused ``attention`` op (decode attention of one query
    position over every head):

        out[h*hd + d] = sum_t softmax_t(q_h . K[t, kvh] / sqrt(hd)) * V[t, kvh, d],
        kvh = h // (n_heads // n_kv_heads),  K[t, kvh, d] = k_cache[t*n_kv_heads*hd + kvh*hd + d]

    (V alike), all float32.  The backend is open, the handles are live, out differs from the
    inputs, every size is a u32 >= 1, n_heads is a multiple of n_kv_heads, and the buffers hold
    n_heads*hd (q, out) and seq_len*n_kv_heads*hd (k_cache, v_cache) float32 elements.
    Backends that have the op (VulkanBackend, NumpyBackend, the torch peer) define ``attention``
    calling this and then their ``_attention``; :func:`has_attention` tells which do."""
    op = "attention"
    backend._check_open(op)
    hq, hk, hv, ho = backend._handles(op, q=q, k_cache=k_cache, v_cache=v_cache, out=out)
    hd = check_int(op, "head_dim", head_dim)
    t = check_int(op, "seq_len", seq_len)
    nh = check_int(op, "n_heads", n_heads)
    nkv = check_int(op, "n_kv_heads", n_kv_heads)
    if nh % nkv:
        raise ValueError(f"{op}: n_heads={nh} is not a multiple of n_kv_heads={nkv} (grouped-query "
                         "attention shares each kv head among n_heads // n_kv_heads query heads)")
    rows = f"seq_len*n_kv_heads*head_dim = {t}*{nkv}*{hd}"
    backend._elem_range(op, "q", hq, 0, nh * hd, f"n_heads*head_dim = {nh}*{hd}")
    backend._elem_range(op, "k_cache", hk, 0, t * nkv * hd, rows)
    backend._elem_range(op, "v_cache", hv, 0, t * nkv * hd, rows)
    backend._elem_range(op, "out", ho, 0, nh * hd, f"n_heads*head_dim = {nh}*{hd}")
    return hq, hk, hv, ho, hd, t, nh, nkv


def has_attention(backend: Any) -> bool:
    return callable(getattr(backend, "attention", None))


class ComputeBackend(ABC):
    """A device that runs kbench's LLM inference ops on float32 buffers.

    Subclasses implement :meth:`name`, :meth:`device_info` and the protected hooks; the
    public methods (the trait's 19 methods plus :meth:`close`) must not be overridden.
    Ops are observed in issue order; :meth:`synchronize` waits for all issued work.
    """

    def __init__(self) -> None:
        self._live: dict[int, BufferHandle] = {}
        self._freed: set[int] = set()
        self._closed = False

    # -- identity --------------------------------------------------------------------------
    @abstractmethod
    def name(self) -> str:
        """Short backend name, e.g. ``"vulkan"`` or ``"numpy"``."""

    @abstractmethod
    def device_info(self) -> DeviceInfo:
        """Name, backend kind, memory in bytes and compute units of the device."""

    def quantized_dtypes(self) -> frozenset[DType]:
        """Weight dtypes that :meth:`quantized_matmul` supports here (default: all of DType)."""
        return frozenset(DType)

    # -- lifetime ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def live_buffers(self) -> tuple[BufferHandle, ...]:
        """Handles allocated and not yet freed."""
        return tuple(self._live.values())

    def close(self) -> None:
        """Free every live buffer and release the device; later calls raise BackendClosedError.

        Calling close() again does nothing.
        """
        if self._closed:
            return
        try:
            for handle in list(self._live.values()):
                self._free(handle)
                del self._live[handle.id]
                self._freed.add(handle.id)
        finally:
            self._closed = True
            self._close()

    def __enter__(self) -> "ComputeBackend":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- memory --------------------------------------------------------------------------------
    def allocate(self, size_bytes: int) -> BufferHandle:
        """A new zero-filled buffer of ``size_bytes`` bytes."""
        self._check_open("allocate")
        size = check_int("allocate", "size_bytes", size_bytes, maximum=None)
        handle = BufferHandle(next(_handle_ids), size)
        self._allocate(handle)
        self._live[handle.id] = handle
        return handle

    def free(self, handle: BufferHandle) -> None:
        """Release a buffer; the handle is invalid afterwards."""
        self._check_open("free")
        h = self._handle("free", "handle", handle)
        self._free(h)
        del self._live[h.id]
        self._freed.add(h.id)

    def copy_to_device(self, data: Any, handle: BufferHandle) -> None:
        """Write all bytes of ``data`` (bytes-like or C-contiguous numpy array) at offset 0."""
        op = "copy_to_device"
        self._check_open(op)
        h = self._handle(op, "handle", handle)
        view = readable_bytes(op, data)
        self._fits_bytes(op, "data", view.nbytes, h)
        self._copy_to_device(view, h)

    def copy_from_device(self, handle: BufferHandle, data: Any) -> None:
        """Read ``len(data)`` bytes from offset 0 of ``handle`` into the writable ``data``.

        Waits for every op issued before it.
        """
        op = "copy_from_device"
        self._check_open(op)
        h = self._handle(op, "handle", handle)
        view = writable_bytes(op, data)
        self._fits_bytes(op, "data", view.nbytes, h)
        self._copy_from_device(h, view)

    def copy_buffer(self, src: BufferHandle, dst: BufferHandle, size: int) -> None:
        """Copy ``size`` bytes from offset 0 of ``src`` to offset 0 of ``dst``."""
        op = "copy_buffer"
        self._check_open(op)
        s = self._handle(op, "src", src)
        d = self._handle(op, "dst", dst)
        n = check_int(op, "size", size, maximum=None)
        self._byte_range(op, "src", s, 0, n)
        self._byte_range(op, "dst", d, 0, n)
        if s.id == d.id:
            raise ValueError(f"{op}: src and dst are the same buffer #{s.id}; the ranges would overlap")
        self._copy_buffer(s, d, n)

    def copy_buffer_offset(
        self, src: BufferHandle, dst: BufferHandle, src_offset: int, dst_offset: int, size: int
    ) -> None:
        """Copy ``size`` bytes from byte ``src_offset`` of ``src`` to byte ``dst_offset`` of ``dst``."""
        op = "copy_buffer_offset"
        self._check_open(op)
        s = self._handle(op, "src", src)
        d = self._handle(op, "dst", dst)
        so = check_int(op, "src_offset", src_offset, minimum=0, maximum=None)
        do = check_int(op, "dst_offset", dst_offset, minimum=0, maximum=None)
        n = check_int(op, "size", size, maximum=None)
        self._byte_range(op, "src", s, so, n)
        self._byte_range(op, "dst", d, do, n)
        if s.id == d.id and so < do + n and do < so + n:
            raise ValueError(
                f"{op}: source bytes [{so}, {so + n}) and destination bytes [{do}, {do + n}) "
                f"overlap in the same buffer #{s.id}"
            )
        self._copy_buffer_offset(s, d, so, do, n)

    def synchronize(self) -> None:
        """Return when all issued work has finished."""
        self._check_open("synchronize")
        self._synchronize()

    # -- compute ops -------------------------------------------------------------------------
    def matmul(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        """``out[m,n] = A[m,k] @ B[k,n]``, all row-major float32."""
        op = "matmul"
        self._check_open(op)
        ha, hb, ho = self._handles(op, a=a, b=b, out=out)
        m = check_int(op, "m", m)
        n = check_int(op, "n", n)
        k = check_int(op, "k", k)
        self._elem_range(op, "a", ha, 0, m * k, f"m*k = {m}*{k}")
        self._elem_range(op, "b", hb, 0, k * n, f"k*n = {k}*{n}")
        self._elem_range(op, "out", ho, 0, m * n, f"m*n = {m}*{n}")
        self._matmul(ha, hb, ho, m, n, k)

    def softmax(self, input: BufferHandle, output: BufferHandle, size: int) -> None:
        """``output = exp(x - max x) / sum(exp(x - max x))`` over ``size`` elements; may be in place."""
        op = "softmax"
        self._check_open(op)
        hi, ho = self._handles(op, input=input, output=output)
        size = check_int(op, "size", size)
        self._elem_range(op, "input", hi, 0, size)
        self._elem_range(op, "output", ho, 0, size)
        self._softmax(hi, ho, size)

    def rms_norm(
        self, input: BufferHandle, weight: BufferHandle, output: BufferHandle, size: int, eps: float
    ) -> None:
        """``output_i = x_i * w_i / sqrt(mean(x^2) + eps)`` over ``size`` elements."""
        op = "rms_norm"
        self._check_open(op)
        hi, hw, ho = self._handles(op, input=input, weight=weight, output=output)
        size = check_int(op, "size", size)
        eps = check_float(op, "eps", eps, positive=False)
        self._elem_range(op, "input", hi, 0, size)
        self._elem_range(op, "weight", hw, 0, size)
        self._elem_range(op, "output", ho, 0, size)
        self._rms_norm(hi, hw, ho, size, eps)

    def rope(
        self,
        q: BufferHandle,
        k: BufferHandle,
        pos: int,
        head_dim: int,
        freq_base: float,
        n_heads_q: int,
        n_heads_k: int,
    ) -> None:
        """Rotate interleaved pairs of q (n_heads_q heads) and k (n_heads_k heads) in place.

        For pair i of a head: ``theta = pos * freq_base ** (-2i / head_dim)``.
        """
        op = "rope"
        self._check_open(op)
        hq, hk = self._handles(op, q=q, k=k)
        pos = check_int(op, "pos", pos, minimum=0)
        head_dim = check_int(op, "head_dim", head_dim)
        if head_dim % 2:
            raise ValueError(f"{op}: head_dim must be even (rope rotates pairs), got {head_dim}")
        freq_base = check_float(op, "freq_base", freq_base, positive=True)
        n_heads_q = check_int(op, "n_heads_q", n_heads_q)
        n_heads_k = check_int(op, "n_heads_k", n_heads_k)
        self._elem_range(op, "q", hq, 0, n_heads_q * head_dim, f"n_heads_q*head_dim = {n_heads_q}*{head_dim}")
        self._elem_range(op, "k", hk, 0, n_heads_k * head_dim, f"n_heads_k*head_dim = {n_heads_k}*{head_dim}")
        self._rope(hq, hk, pos, head_dim, freq_base, n_heads_q, n_heads_k)

    def silu(self, input: BufferHandle, output: BufferHandle, size: int) -> None:
        """``output = x / (1 + exp(-x))`` over ``size`` elements."""
        op = "silu"
        self._check_open(op)
        hi, ho = self._handles(op, input=input, output=output)
        size = check_int(op, "size", size)
        self._elem_range(op, "input", hi, 0, size)
        self._elem_range(op, "output", ho, 0, size)
        self._silu(hi, ho, size)

    def element_mul(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        """``output = a * b`` over ``size`` elements."""
        self._binary("element_mul", a, b, output, size)

    def add(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        """``output = a + b`` over ``size`` elements."""
        self._binary("add", a, b, output, size)

    def _binary(self, op: str, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        self._check_open(op)
        ha, hb, ho = self._handles(op, a=a, b=b, output=output)
        size = check_int(op, "size", size)
        self._elem_range(op, "a", ha, 0, size)
        self._elem_range(op, "b", hb, 0, size)
        self._elem_range(op, "output", ho, 0, size)
        getattr(self, f"_{op}")(ha, hb, ho, size)

    def attn_score(
        self,
        q: BufferHandle,
        k_cache: BufferHandle,
        scores: BufferHandle,
        head_dim: int,
        seq_len: int,
        head_offset: int,
        kv_offset: int,
        kv_stride: int,
    ) -> None:
        """``scores[t] = q[head_offset:+hd] . k_cache[t*kv_stride + kv_offset:+hd] / sqrt(hd)``."""
        op = "attn_score"
        self._check_open(op)
        hq, hk, hs = self._handles(op, q=q, k_cache=k_cache, scores=scores)
        hd = check_int(op, "head_dim", head_dim)
        t = check_int(op, "seq_len", seq_len)
        ho = check_int(op, "head_offset", head_offset, minimum=0)
        kvo = check_int(op, "kv_offset", kv_offset, minimum=0)
        kvs = check_int(op, "kv_stride", kv_stride, minimum=0)
        self._elem_range(op, "q", hq, ho, hd, "head_offset + head_dim")
        self._elem_range(
            op, "k_cache", hk, kvo, (t - 1) * kvs + hd, "(seq_len-1)*kv_stride + kv_offset + head_dim"
        )
        self._elem_range(op, "scores", hs, 0, t, "seq_len")
        self._attn_score(hq, hk, hs, hd, t, ho, kvo, kvs)

    def attn_value(
        self,
        weights: BufferHandle,
        v_cache: BufferHandle,
        output: BufferHandle,
        head_dim: int,
        seq_len: int,
        kv_offset: int,
        kv_stride: int,
        out_offset: int,
    ) -> None:
        """``output[out_offset + d] = sum_t weights[t] * v_cache[t*kv_stride + kv_offset + d]``."""
        op = "attn_value"
        self._check_open(op)
        hw, hv, ho = self._handles(op, weights=weights, v_cache=v_cache, output=output)
        hd = check_int(op, "head_dim", head_dim)
        t = check_int(op, "seq_len", seq_len)
        kvo = check_int(op, "kv_offset", kv_offset, minimum=0)
        kvs = check_int(op, "kv_stride", kv_stride, minimum=0)
        oo = check_int(op, "out_offset", out_offset, minimum=0)
        self._elem_range(op, "weights", hw, 0, t, "seq_len")
        self._elem_range(
            op, "v_cache", hv, kvo, (t - 1) * kvs + hd, "(seq_len-1)*kv_stride + kv_offset + head_dim"
        )
        self._elem_range(op, "output", ho, oo, hd, "out_offset + head_dim")
        self._attn_value(hw, hv, ho, hd, t, kvo, kvs, oo)

    def quantized_matmul(
        self,
        weights: BufferHandle,
        input: BufferHandle,
        output: BufferHandle,
        n_rows: int,
        n_cols: int,
        dtype: Union[DType, int],
        n_vecs: int = 1,
    ) -> None:
        """``output[r] = sum_c dequant(weights)[r, c] * input[c]``; weights are GGUF blocks, row-major.

        ``n_vecs`` > 1: a batch (the tokens of a small-batch decode): ``input`` holds ``n_vecs``
        vectors of ``n_cols`` back to back and ``output[v * n_rows + r] = sum_c W[r, c] *
        input[v * n_cols + c]``, the weights read once for all of them where the backend can."""
        op = "quantized_matmul"
        self._check_open(op)
        hw, hi, ho = self._handles(op, weights=weights, input=input, output=output)
        n_rows = check_int(op, "n_rows", n_rows)
        n_cols = check_int(op, "n_cols", n_cols)
        n_vecs = check_int(op, "n_vecs", n_vecs)
        if n_vecs > self.QUANTIZED_MATMUL_MAX_VECS:
            raise ValueError(f"{op}: n_vecs must be <= {self.QUANTIZED_MATMUL_MAX_VECS} (a small batch of vectors), "
                             f"got {n_vecs}")
        if isinstance(dtype, str) or not isinstance(dtype, (int, np.integer)) or isinstance(dtype, (bool, np.bool_)):
            raise TypeError(f"{op}: dtype must be a DType or an integer GGUF type id, got {_describe(dtype)}")
        try:
            dt = DType.coerce(dtype)
        except ValueError as exc:
            raise ValueError(f"{op}: {exc}") from None
        if n_cols % dt.block_elems:
            raise ValueError(
                f"{op}: n_cols={n_cols} is not a multiple of the {dt.name} block size {dt.block_elems}"
            )
        if dt not in self.quantized_dtypes():
            supported = ", ".join(d.name for d in sorted(self.quantized_dtypes()))
            raise UnsupportedDTypeError(
                f"{op}: the {self.name()} backend has no kernel for {dt.name}; supported: {supported}"
            )
        self._byte_range(op, "weights", hw, 0, n_rows * row_bytes(dt, n_cols),
                         f"n_rows*row_bytes = {n_rows}*{row_bytes(dt, n_cols)}")
        batch = "n_vecs*" if n_vecs > 1 else ""
        self._elem_range(op, "input", hi, 0, n_vecs * n_cols, batch + "n_cols")
        self._elem_range(op, "output", ho, 0, n_vecs * n_rows, batch + "n_rows")
        if n_vecs == 1:
            self._quantized_matmul(hw, hi, ho, n_rows, n_cols, dt)
        else:
            self._quantized_matmul_vecs(hw, hi, ho, n_rows, n_cols, dt, n_vecs)

    #: the largest batch :meth:`quantized_matmul` takes (small-batch decode; larger batches are GEMMs)
    QUANTIZED_MATMUL_MAX_VECS = 64

    def _quantized_matmul_vecs(self, weights: BufferHandle, input: BufferHandle, output: BufferHandle,
                               n_rows: int, n_cols: int, dtype: DType, n_vecs: int) -> None:
        raise NotImplementedError(f"quantized_matmul: the {self.name()} backend has no kernel for a batch of "
                                      f"vectors (n_vecs={n_vecs}); call it once per vector")

    # -- checking helpers ----------------------------------------------------------------------
    def _check_open(self, op: str) -> None:
        if self._closed:
            raise BackendClosedError(f"{op}: the {self.name()} backend is closed")

    def _handle(self, op: str, name: str, handle: Any) -> BufferHandle:
        if not isinstance(handle, BufferHandle):
            raise TypeError(f"{op}: {name} must be a BufferHandle, got {_describe(handle)}")
        live = self._live.get(handle.id)
        if live is None or live != handle:
            if handle.id in self._freed:
                raise InvalidHandleError(f"{op}: {name} is buffer #{handle.id}, which was already freed")
            raise InvalidHandleError(
                f"{op}: {name} is buffer #{handle.id}, which is unknown to this {self.name()} backend"
            )
        return live

    def _handles(self, op: str, **named: Any) -> tuple[BufferHandle, ...]:
        handles = {name: self._handle(op, name, h) for name, h in named.items()}
        if op not in ALIASING_OPS:
            access = OP_BUFFER_ACCESS[op]
            for name, h in handles.items():
                if "w" not in access[name]:
                    continue
                for other, oh in handles.items():
                    if other != name and oh.id == h.id:
                        raise ValueError(
                            f"{op}: {name} and {other} are the same buffer #{h.id}; {op} cannot "
                            f"write {name} in place"
                        )
        return tuple(handles.values())

    @staticmethod
    def _elem_range(op: str, name: str, h: BufferHandle, start: int, count: int, how: str = "size") -> None:
        end = start + count
        if end > h.size_elems:
            raise ValueError(
                f"{op}: {name} needs float32 elements [{start}, {end}) ({how}) but buffer "
                f"#{h.id} holds {h.size_elems} elements ({h.size_bytes} bytes)"
            )

    @staticmethod
    def _byte_range(op: str, name: str, h: BufferHandle, start: int, count: int, how: str = "size") -> None:
        end = start + count
        if end > h.size_bytes:
            raise ValueError(
                f"{op}: {name} needs bytes [{start}, {end}) ({how}) but buffer #{h.id} holds "
                f"{h.size_bytes} bytes"
            )

    @staticmethod
    def _fits_bytes(op: str, name: str, nbytes: int, h: BufferHandle) -> None:
        if nbytes == 0:
            raise ValueError(f"{op}: {name} is empty (0 bytes)")
        if nbytes > h.size_bytes:
            raise ValueError(f"{op}: {name} is {nbytes} bytes but buffer #{h.id} holds {h.size_bytes} bytes")

    # -- hooks for subclasses (arguments already checked) ------------------------------------
    @abstractmethod
    def _allocate(self, handle: BufferHandle) -> None:
        """Create zero-filled storage of ``handle.size_bytes`` bytes for ``handle``."""

    @abstractmethod
    def _free(self, handle: BufferHandle) -> None:
        """Release the storage of ``handle``."""

    def _close(self) -> None:
        """Release the device after every buffer has been freed (default: nothing to do)."""

    @abstractmethod
    def _copy_to_device(self, data: memoryview, handle: BufferHandle) -> None:
        """Write the flat uint8 ``data`` (non-empty, fits) at byte 0 of ``handle``."""

    @abstractmethod
    def _copy_from_device(self, handle: BufferHandle, data: memoryview) -> None:
        """Fill the flat writable uint8 ``data`` from byte 0 of ``handle``, after all issued work."""

    @abstractmethod
    def _copy_buffer(self, src: BufferHandle, dst: BufferHandle, size: int) -> None: ...

    @abstractmethod
    def _copy_buffer_offset(
        self, src: BufferHandle, dst: BufferHandle, src_offset: int, dst_offset: int, size: int
    ) -> None: ...

    @abstractmethod
    def _synchronize(self) -> None: ...

    @abstractmethod
    def _matmul(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None: ...

    @abstractmethod
    def _softmax(self, input: BufferHandle, output: BufferHandle, size: int) -> None: ...

    @abstractmethod
    def _rms_norm(
        self, input: BufferHandle, weight: BufferHandle, output: BufferHandle, size: int, eps: float
    ) -> None: ...

    @abstractmethod
    def _rope(
        self, q: BufferHandle, k: BufferHandle, pos: int, head_dim: int, freq_base: float,
        n_heads_q: int, n_heads_k: int,
    ) -> None: ...

    @abstractmethod
    def _silu(self, input: BufferHandle, output: BufferHandle, size: int) -> None: ...

    @abstractmethod
    def _element_mul(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None: ...

    @abstractmethod
    def _add(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None: ...

    @abstractmethod
    def _attn_score(
        self, q: BufferHandle, k_cache: BufferHandle, scores: BufferHandle, head_dim: int,
        seq_len: int, head_offset: int, kv_offset: int, kv_stride: int,
    ) -> None: ...

    @abstractmethod
    def _attn_value(
        self, weights: BufferHandle, v_cache: BufferHandle, output: BufferHandle, head_dim: int,
        seq_len: int, kv_offset: int, kv_stride: int, out_offset: int,
    ) -> None: ...

    @abstractmethod
    def _quantized_matmul(
        self, weights: BufferHandle, input: BufferHandle, output: BufferHandle, n_rows: int,
        n_cols: int, dtype: DType,
    ) -> None: ...
