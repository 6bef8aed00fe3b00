"""TorchBackend: the ComputeBackend ops through PyTorch on one CUDA device (the CUDA peer).

The very same case declarations (inputs, references, byte and FLOP counts) run on it; results are
recorded under backend and implementation "torch-cuda". Where PyTorch or CUDA is missing,
`availability()` says why and the runner records the peer as unavailable.

Choices that make the peer the path a user would otherwise pick: TF32 is off for fp32 matmul
(kbench's fp32 matmul is held to float32 accuracy); quantized weights are dequantized once per
weight buffer (cached until the buffer is written again) and multiplied in float32.  A buffer
holding the same bytes as the last weights dequantized (the bench's rotating copies of one matrix)
gets a device copy of their float32 weights instead of another dequantization on the host (what
that cost: the README's "Where the main job's time goes").
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kbench.backend.base import BufferHandle, ComputeBackend, DeviceInfo
from kbench.quant import DType

__all__ = ["PEER_NAME", "TorchBackend", "availability"]

PEER_NAME = "torch-cuda"


def availability() -> tuple[bool, str]:
    """(True, "") when PyTorch with a CUDA device is usable, else (False, why not)."""
    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed (pip install torch)"
    except Exception as exc:  # noqa: BLE001 - a broken install is "unavailable", with the reason
        return False, f"PyTorch failed to import: {type(exc).__name__}: {exc}"
    if not torch.cuda.is_available():
        return False, f"CUDA is not available to PyTorch {torch.__version__}"
    return True, ""


class TorchBackend(ComputeBackend):
    """ComputeBackend on PyTorch/CUDA: buffers are uint8 CUDA tensors viewed as float32."""

    def __init__(self, device: int = 0) -> None:
        import torch

        super().__init__()
        self.torch = torch
        self.dev = torch.device("cuda", device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self._bufs: dict[int, Any] = {}
        self._writes: dict[int, int] = {}
        self._dequant: dict[tuple, tuple[int, Any]] = {}
        # the last weights dequantized: (dtype, n_rows, n_cols), a device copy of their bytes, the float32 weights
        self._last_dequant: tuple[tuple, Any, Any] | None = None
        self._angles: dict[tuple, tuple[Any, Any]] = {}

    def name(self) -> str:
        return PEER_NAME

    def device_info(self) -> DeviceInfo:
        p = self.torch.cuda.get_device_properties(self.dev)
        return DeviceInfo(p.name, PEER_NAME, int(p.total_memory), int(p.multi_processor_count))

    # -- storage -----------------------------------------------------------------------------------
    def _raw(self, h: BufferHandle) -> Any:
        return self._bufs[h.id]

    def _f32(self, h: BufferHandle, start: int = 0, count: int | None = None) -> Any:
        raw = self._bufs[h.id]
        if count is None:
            count = h.size_elems - start
        return raw[4 * start:4 * (start + count)].view(self.torch.float32)

    def _touch(self, h: BufferHandle) -> None:
        self._writes[h.id] = self._writes.get(h.id, 0) + 1

    def _allocate(self, handle: BufferHandle) -> None:
        padded = -(-handle.size_bytes // 4) * 4
        self._bufs[handle.id] = self.torch.zeros(padded, dtype=self.torch.uint8, device=self.dev)

    def _free(self, handle: BufferHandle) -> None:
        self._bufs.pop(handle.id, None)
        self._writes.pop(handle.id, None)
        self._dequant = {k: v for k, v in self._dequant.items() if k[0] != handle.id}
        if not self._dequant:
            self._last_dequant = None  # no weights left (a case ended): its memory goes too

    def _close(self) -> None:
        self._bufs.clear()
        self._dequant.clear()
        self._last_dequant = None

    def _copy_to_device(self, data: memoryview, handle: BufferHandle) -> None:
        src = self.torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
        self._raw(handle)[:src.numel()].copy_(src)
        self._touch(handle)

    def _copy_from_device(self, handle: BufferHandle, data: memoryview) -> None:
        n = len(data)
        host = self._raw(handle)[:n].cpu().numpy()  # .cpu() waits for the stream
        np.frombuffer(data, dtype=np.uint8)[:] = host

    def _copy_buffer(self, src: BufferHandle, dst: BufferHandle, size: int) -> None:
        self._raw(dst)[:size].copy_(self._raw(src)[:size])
        self._touch(dst)

    def _copy_buffer_offset(self, src: BufferHandle, dst: BufferHandle, src_offset: int, dst_offset: int,
                            size: int) -> None:
        self._raw(dst)[dst_offset:dst_offset + size].copy_(self._raw(src)[src_offset:src_offset + size])
        self._touch(dst)

    def _synchronize(self) -> None:
        self.torch.cuda.synchronize(self.dev)

    # -- ops -----------------------------------------------------------------------------------------
    def _matmul(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        t = self.torch
        t.matmul(self._f32(a, 0, m * k).view(m, k), self._f32(b, 0, k * n).view(k, n),
                 out=self._f32(out, 0, m * n).view(m, n))
        self._touch(out)

    def matmul_f16(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        """The peer of VulkanBackend.matmul_f16: torch.matmul on float16 tensors, as a user would
        write it, so the result is float16 (cuBLAS accumulates in fp32 and rounds the output once
        to half: an NMSE of about 8e-8, inside matmul_f16's 1e-6), then stored as float32 in out.
        The fp16 -> fp32 copy is part of the timed op (one extra elementwise pass over m*n)."""
        from kbench.backend.base import check_matmul_f16

        ha, hb, ho, m, n, k = check_matmul_f16(self, a, b, out, m, n, k)
        t = self.torch
        A = self._raw(ha)[:2 * m * k].view(t.float16).view(m, k)
        B = self._raw(hb)[:2 * k * n].view(t.float16).view(k, n)
        self._f32(ho, 0, m * n).view(m, n).copy_(t.matmul(A, B))
        self._touch(ho)

    def matmul_bf16(self, a: BufferHandle, b: BufferHandle, out: BufferHandle, m: int, n: int, k: int) -> None:
        """The peer of VulkanBackend.matmul_bf16: torch.matmul on bfloat16 tensors (the result is
        bfloat16, one rounding of the fp32 accumulation: NMSE about (2^-8)^2 / 3 = 5e-6), stored
        as float32 in out."""
        from kbench.backend.base import check_matmul_f16

        ha, hb, ho, m, n, k = check_matmul_f16(self, a, b, out, m, n, k, op="matmul_bf16")
        t = self.torch
        A = self._raw(ha)[:2 * m * k].view(t.bfloat16).view(m, k)
        B = self._raw(hb)[:2 * k * n].view(t.bfloat16).view(k, n)
        self._f32(ho, 0, m * n).view(m, n).copy_(t.matmul(A, B))
        self._touch(ho)

    def _softmax(self, input: BufferHandle, output: BufferHandle, size: int) -> None:
        self._f32(output, 0, size).copy_(self.torch.softmax(self._f32(input, 0, size), dim=0))
        self._touch(output)

    def _rms_norm(self, input: BufferHandle, weight: BufferHandle, output: BufferHandle, size: int,
                  eps: float) -> None:
        x = self._f32(input, 0, size)
        scale = self.torch.rsqrt(self.torch.mean(x * x) + float(np.float32(eps)))
        self._f32(output, 0, size).copy_(x * scale * self._f32(weight, 0, size))
        self._touch(output)

    def _cos_sin(self, pos: int, head_dim: int, freq_base: float) -> tuple[Any, Any]:
        key = (pos, head_dim, float(np.float32(freq_base)))
        if key not in self._angles:
            i = np.arange(head_dim // 2, dtype=np.float64)
            theta = pos * key[2] ** (-2.0 * i / head_dim)  # float64 angles: accurate at long contexts
            cos = self.torch.from_numpy(np.cos(theta).astype(np.float32)).to(self.dev)
            sin = self.torch.from_numpy(np.sin(theta).astype(np.float32)).to(self.dev)
            if len(self._angles) > 64:
                self._angles.clear()
            self._angles[key] = (cos, sin)
        return self._angles[key]

    def _rope(self, q: BufferHandle, k: BufferHandle, pos: int, head_dim: int, freq_base: float,
              n_heads_q: int, n_heads_k: int) -> None:
        cos, sin = self._cos_sin(pos, head_dim, freq_base)
        for h, heads in ((q, n_heads_q), (k, n_heads_k)):
            v = self._f32(h, 0, heads * head_dim).view(heads, head_dim // 2, 2)
            x0, x1 = v[..., 0].clone(), v[..., 1].clone()
            v[..., 0] = x0 * cos - x1 * sin
            v[..., 1] = x0 * sin + x1 * cos
            self._touch(h)

    def _silu(self, input: BufferHandle, output: BufferHandle, size: int) -> None:
        self._f32(output, 0, size).copy_(self.torch.nn.functional.silu(self._f32(input, 0, size)))
        self._touch(output)

    def _element_mul(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        self.torch.mul(self._f32(a, 0, size), self._f32(b, 0, size), out=self._f32(output, 0, size))
        self._touch(output)

    def _add(self, a: BufferHandle, b: BufferHandle, output: BufferHandle, size: int) -> None:
        self.torch.add(self._f32(a, 0, size), self._f32(b, 0, size), out=self._f32(output, 0, size))
        self._touch(output)

    def _cache_rows(self, h: BufferHandle, seq_len: int, head_dim: int, offset: int, stride: int) -> Any:
        return self._f32(h).as_strided((seq_len, head_dim), (stride, 1), self._f32(h).storage_offset() + offset)

    def _attn_score(self, q: BufferHandle, k_cache: BufferHandle, scores: BufferHandle, head_dim: int,
                    seq_len: int, head_offset: int, kv_offset: int, kv_stride: int) -> None:
        keys = self._cache_rows(k_cache, seq_len, head_dim, kv_offset, kv_stride)
        qh = self._f32(q, head_offset, head_dim)
        self.torch.mv(keys, qh, out=self._f32(scores, 0, seq_len))
        self._f32(scores, 0, seq_len).mul_(1.0 / math.sqrt(head_dim))
        self._touch(scores)

    def _attn_value(self, weights: BufferHandle, v_cache: BufferHandle, output: BufferHandle, head_dim: int,
                    seq_len: int, kv_offset: int, kv_stride: int, out_offset: int) -> None:
        values = self._cache_rows(v_cache, seq_len, head_dim, kv_offset, kv_stride)
        w = self._f32(weights, 0, seq_len)
        self.torch.mv(values.t(), w, out=self._f32(output, out_offset, head_dim))
        self._touch(output)

    def attention(self, q: BufferHandle, k_cache: BufferHandle, v_cache: BufferHandle, out: BufferHandle,
                  head_dim: int, seq_len: int, n_heads: int, n_kv_heads: int) -> None:
        """The peer of VulkanBackend.attention: ``torch.nn.functional.scaled_dot_product_attention``
        on float32 views of the caches, no copies.  The query heads that share a kv head are
        given to SDPA as that kv head's n_heads // n_kv_heads query rows (there is no mask, so
        this is the same attention), which keeps the fused kernels (no repeated K/V, no
        ``enable_gqa``); the (1, n_kv, group, hd) result is copied into out."""
        from kbench.backend.base import check_attention

        hq, hk, hv, ho, hd, t, nh, nkv = check_attention(self, q, k_cache, v_cache, out, head_dim, seq_len,
                                                         n_heads, n_kv_heads)
        group = nh // nkv
        Q = self._f32(hq, 0, nh * hd).view(1, nkv, group, hd)
        K = self._f32(hk, 0, t * nkv * hd).view(t, nkv, hd).transpose(0, 1).unsqueeze(0)
        V = self._f32(hv, 0, t * nkv * hd).view(t, nkv, hd).transpose(0, 1).unsqueeze(0)
        o = self.torch.nn.functional.scaled_dot_product_attention(Q, K, V)
        self._f32(ho, 0, nh * hd).view(1, nkv, group, hd).copy_(o)
        self._touch(ho)

    def _weights(self, h: BufferHandle, n_rows: int, n_cols: int, dtype: DType) -> Any:
        if dtype == DType.F32:
            return self._f32(h, 0, n_rows * n_cols).view(n_rows, n_cols)
        key = (h.id, int(dtype), n_rows, n_cols)
        version = self._writes.get(h.id, 0)
        cached = self._dequant.get(key)
        if cached is None or cached[0] != version:
            from kbench.quant import dequantize, row_bytes

            raw = self._raw(h)[:n_rows * row_bytes(dtype, n_cols)]
            what = (int(dtype), n_rows, n_cols)
            last = self._last_dequant
            if last is not None and last[0] == what and self.torch.equal(last[1], raw):
                w = last[2].clone()  # the same bytes: bit for bit what dequantizing them gives
            else:
                w = self.torch.from_numpy(np.ascontiguousarray(
                    dequantize(raw.cpu().numpy().tobytes(), dtype, (n_rows, n_cols)), dtype=np.float32)).to(self.dev)
                self._last_dequant = (what, raw.clone(), w)
            self._dequant[key] = (version, w)
        return self._dequant[key][1]

    def _quantized_matmul(self, weights: BufferHandle, input: BufferHandle, output: BufferHandle, n_rows: int,
                          n_cols: int, dtype: DType) -> None:
        w = self._weights(weights, n_rows, n_cols, dtype)
        self.torch.mv(w, self._f32(input, 0, n_cols), out=self._f32(output, 0, n_rows))
        self._touch(output)

    def _quantized_matmul_vecs(self, weights: BufferHandle, input: BufferHandle, output: BufferHandle, n_rows: int,
                               n_cols: int, dtype: DType, n_vecs: int) -> None:
        w = self._weights(weights, n_rows, n_cols, dtype)
        x = self._f32(input, 0, n_vecs * n_cols).view(n_vecs, n_cols)
        self.torch.mm(x, w.t(), out=self._f32(output, 0, n_vecs * n_rows).view(n_vecs, n_rows))
        self._touch(output)
