"""NumpyBackend: the float64 reference implementation of the ComputeBackend API.

Buffers are host byte arrays.  Every op reads its float32 inputs, computes in float64 and
stores the result rounded once to float32, so it serves as the oracle the suites compare GPU
backends with (and as the "cpu" row in reports).  Scalar arguments that the trait passes as
f32 (eps, freq_base) are rounded to float32 first, exactly as a GPU backend receives them.
"""

from __future__ import annotations

import os
import platform

import numpy as np

from kbench.backend.base import BufferHandle, ComputeBackend, DeviceInfo
from kbench.quant import DType, dequantize, row_bytes

__all__ = ["NumpyBackend"]


class NumpyBackend(ComputeBackend):
    """Reference backend on the host CPU (float64 accumulation, float32 storage)."""

    def __init__(self) -> None:
        super().__init__()
        self._store: dict[int, np.ndarray] = {}

    def name(self) -> str:
        return "numpy"

    def device_info(self) -> DeviceInfo:
        threads = os.cpu_count() or 0
        cpu = _cpu_model() or platform.processor() or platform.machine() or "cpu"
        return DeviceInfo(
            name=f"{cpu} ({threads} threads)",
            backend="numpy",
            memory_bytes=_host_memory_bytes(),
            compute_units=threads,
        )

    # -- buffer views ------------------------------------------------------------------------
    def _bytes(self, h: BufferHandle) -> np.ndarray:
        return self._store[h.id]

    def _f32(self, h: BufferHandle, start: int = 0, count: int | None = None) -> np.ndarray:
        """Writable float32 view of elements [start, start + count) of ``h``."""
        raw = self._store[h.id]
        if count is None:
            count = h.size_elems - start
        return raw[start * 4:(start + count) * 4].view("<f4")

    def _read64(self, h: BufferHandle, start: int, count: int) -> np.ndarray:
        return self._f32(h, start, count).astype(np.float64)

    def _write(self, h: BufferHandle, start: int, values: np.ndarray) -> None:
        self._f32(h, start, values.size)[:] = values.astype(np.float32).ravel()

    # -- memory hooks ------------------------------------------------------------------------
    def _allocate(self, handle: BufferHandle) -> None:
        self._store[handle.id] = np.zeros(handle.size_bytes, dtype=np.uint8)

    def _free(self, handle: BufferHandle) -> None:
        del self._store[handle.id]

    def _close(self) -> None:
        self._store.clear()

    def _copy_to_device(self, data: memoryview, handle: BufferHandle) -> None:
        self._bytes(handle)[:data.nbytes] = np.frombuffer(data, dtype=np.uint8)

    def _copy_from_device(self, handle: BufferHandle, data: memoryview) -> None:
        np.frombuffer(data, dtype=np.uint8)[:] = self._bytes(handle)[:data.nbytes]

    def _copy_buffer(self, src: BufferHandle, dst: BufferHandle, size: int) -> None:
        self._bytes(dst)[:size] = self._bytes(src)[:size]

    def _copy_buffer_offset(
        self, src: BufferHandle, dst: BufferHandle, src_offset: int, dst_offset: int, size: int
    ) -> None:
        self._bytes(dst)[dst_offset:dst_offset + size] = self._bytes(src)[src_offset:src_offset + size]

    def _synchronize(self) -> None:
        """Every op has finished when it returns; nothing to wait for."""

    # -- compute hooks -----------------------------------------------------------------------
    def _matmul(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        A = self._read64(a, 0, m * k).reshape(m, k)
        B = self._read64(b, 0, k * n).reshape(k, n)
        self._write(out, 0, A @ B)

    def matmul_f16(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        """``out[m,n] = A[m,k] @ B[k,n]``, A and B float16, out float32: the float64 product of the
        half inputs, rounded once to float32 (the reference of VulkanBackend.matmul_f16)."""
        from kbench.backend.base import check_matmul_f16

        ha, hb, ho, m, n, k = check_matmul_f16(self, a, b, out, m, n, k)
        self._matmul_f16(ha, hb, ho, m, n, k)

    def matmul_bf16(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        """:meth:`matmul_f16` with A and B bfloat16 (16-bit patterns): the float64 product of their
        exact values, rounded once to float32 (the reference of VulkanBackend.matmul_bf16)."""
        from kbench.backend.base import check_matmul_f16

        ha, hb, ho, m, n, k = check_matmul_f16(self, a, b, out, m, n, k, op="matmul_bf16")
        self._matmul_f16(ha, hb, ho, m, n, k, DType.BF16)

    def _matmul_f16(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int,
                    dtype: DType = DType.F16) -> None:
        A = dequantize(self._bytes(a)[:2 * m * k].tobytes(), dtype, (m, k)).astype(np.float64)
        B = dequantize(self._bytes(b)[:2 * k * n].tobytes(), dtype, (k, n)).astype(np.float64)
        self._write(out, 0, A @ B)

    def _softmax(self, input: BufferHandle, output: BufferHandle, size: int) -> None:
        x = self._read64(input, 0, size)
        e = np.exp(x - x.max())
        self._write(output, 0, e / e.sum())

    def _rms_norm(
        self, input: BufferHandle, weight: BufferHandle, output: BufferHandle, size: int, eps: float
    ) -> None:
        x = self._read64(input, 0, size)
        w = self._read64(weight, 0, size)
        eps64 = float(np.float32(eps))
        self._write(output, 0, x * w / np.sqrt(np.mean(x * x) + eps64))

    def _rope(
        self, q: BufferHandle, k: BufferHandle, pos: int, head_dim: int, freq_base: float,
        n_heads_q: int, n_heads_k: int,
    ) -> None:
        half = head_dim // 2
        base = float(np.float32(freq_base))
        theta = pos * base ** (-2.0 * np.arange(half, dtype=np.float64) / head_dim)
        cos, sin = np.cos(theta), np.sin(theta)
        for h, n_heads in ((q, n_heads_q), (k, n_heads_k)):
            v = self._read64(h, 0, n_heads * head_dim).reshape(n_heads, half, 2)
            x0, x1 = v[:, :, 0], v[:, :, 1]
            rotated = np.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
            self._write(h, 0, rotated.reshape(-1))

    def _silu(self, input: BufferHandle, output: BufferHandle, size: int) -> None:
        x = self._read64(input, 0, size)
        with np.errstate(over="ignore"):  # exp(-x) -> inf for x << 0 gives the right limit 0
            self._write(output, 0, x / (1.0 + np.exp(-x)))

    def _element_mul(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        self._write(output, 0, self._read64(a, 0, size) * self._read64(b, 0, size))

    def _add(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        self._write(output, 0, self._read64(a, 0, size) + self._read64(b, 0, size))

    def _kv_rows(self, cache: BufferHandle, head_dim: int, seq_len: int, kv_offset: int, kv_stride: int) -> np.ndarray:
        """Rows t < seq_len of ``cache[t*kv_stride + kv_offset + d]`` as float64 (seq_len, head_dim)."""
        flat = self._f32(cache)
        index = np.arange(seq_len)[:, None] * kv_stride + kv_offset + np.arange(head_dim)[None, :]
        return flat[index].astype(np.float64)

    def _attn_score(
        self, q: BufferHandle, k_cache: BufferHandle, scores: BufferHandle, head_dim: int,
        seq_len: int, head_offset: int, kv_offset: int, kv_stride: int,
    ) -> None:
        qv = self._read64(q, head_offset, head_dim)
        keys = self._kv_rows(k_cache, head_dim, seq_len, kv_offset, kv_stride)
        self._write(scores, 0, keys @ qv / np.sqrt(head_dim))

    def _attn_value(
        self, weights: BufferHandle, v_cache: BufferHandle, output: BufferHandle, head_dim: int,
        seq_len: int, kv_offset: int, kv_stride: int, out_offset: int,
    ) -> None:
        w = self._read64(weights, 0, seq_len)
        values = self._kv_rows(v_cache, head_dim, seq_len, kv_offset, kv_stride)
        self._write(output, out_offset, w @ values)

    def attention(self, q: BufferHandle, k_cache: BufferHandle, v_cache: BufferHandle, out: BufferHandle,
                  head_dim: int, seq_len: int, n_heads: int, n_kv_heads: int) -> None:
        """Fused decode attention over every head (see backend.base.check_attention), in float64
        and rounded once to float32: the reference of VulkanBackend.attention."""
        from kbench.backend.base import check_attention

        self._attention(*check_attention(self, q, k_cache, v_cache, out, head_dim, seq_len, n_heads, n_kv_heads))

    def _attention(self, q: BufferHandle, k_cache: BufferHandle, v_cache: BufferHandle, out: BufferHandle,
                   head_dim: int, seq_len: int, n_heads: int, n_kv_heads: int) -> None:
        hd, t, nkv = head_dim, seq_len, n_kv_heads
        group = n_heads // nkv
        qv = self._read64(q, 0, n_heads * hd).reshape(nkv, group, hd)
        keys = self._read64(k_cache, 0, t * nkv * hd).reshape(t, nkv, hd)
        values = self._read64(v_cache, 0, t * nkv * hd).reshape(t, nkv, hd)
        scores = np.einsum("kgd,tkd->kgt", qv, keys) / np.sqrt(hd)
        with np.errstate(invalid="ignore"):  # a NaN score gives a NaN head, as on the GPU
            p = np.exp(scores - scores.max(axis=-1, keepdims=True))
            o = np.einsum("kgt,tkd->kgd", p, values) / p.sum(axis=-1)[..., None]
        self._write(out, 0, o.reshape(-1))

    def _quantized_matmul(
        self, weights: BufferHandle, input: BufferHandle, output: BufferHandle, n_rows: int,
        n_cols: int, dtype: DType,
    ) -> None:
        self._quantized_matmul_vecs(weights, input, output, n_rows, n_cols, dtype, 1)

    def _quantized_matmul_vecs(
        self, weights: BufferHandle, input: BufferHandle, output: BufferHandle, n_rows: int,
        n_cols: int, dtype: DType, n_vecs: int,
    ) -> None:
        stride = row_bytes(dtype, n_cols)
        raw = self._bytes(weights)
        x = self._read64(input, 0, n_vecs * n_cols).reshape(n_vecs, n_cols)
        y = np.empty((n_vecs, n_rows), dtype=np.float64)
        # row chunks keep the float64 copy of a large weight matrix out of memory
        step = max(1, (1 << 22) // n_cols)
        for r0 in range(0, n_rows, step):
            r1 = min(n_rows, r0 + step)
            W = dequantize(raw[r0 * stride:r1 * stride], dtype, (r1 - r0, n_cols))
            y[:, r0:r1] = x @ W.astype(np.float64).T
        self._write(output, 0, y.reshape(-1))


def _cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else ""."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 0
