"""ForeignBackend: the ComputeBackend whose declared ops run a third party's kernels.

It is kbench's VulkanBackend for everything around the kernels (buffers, uploads, read-back,
batching, barriers, replayed timing), so a foreign kernel is checked and timed by exactly the
machinery kbench's own kernels are, and lands in the same tables. Each call evaluates the
declaration's formulas for the call's arguments and refuses, before recording anything, a grid
that is empty, larger than the device allows or (where the declaration says what it must cover)
too small for the output. An op the kernel set does not declare raises
:class:`NotDeclaredError`, which the runner reports as ``unsupported``.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from kbench.backend.base import BufferHandle
from kbench.backend.kernels import Kernel
from kbench.backend.vulkan_backend import VulkanBackend
from kbench.quant import DType, row_bytes
from kbench.runtime.errors import UnsupportedFeatureError

from .formula import FormulaError, f32_bits
from .kernelset import KernelSet, LoadedKernel
from .ops import DECLARABLE_OPS, call_args

#: ops kbench keeps as its own when a kernel set does not declare them (buffer plumbing that
#: cases use to set up and read back, never reported as the set's figures)
PLUMBING_OPS = ("copy_buffer", "copy_buffer_offset")


class NotDeclaredError(UnsupportedFeatureError):
    """The kernel set declares no kernel for this op (or weight type)."""

    def __init__(self, message: str):
        super().__init__(message, feature="declared kernel")


def _foreign_kernel(loaded: LoadedKernel, spec: tuple[int, ...]) -> Kernel:
    """A kbench Kernel whose SPIR-V comes from a declaration instead of kbench/spv/."""
    return Kernel(f"foreign:{loaded.sha256}:{loaded.name}", spec, loaded.push_dtype, code=loaded.spirv)


class ForeignBackend(VulkanBackend):
    """VulkanBackend whose declared ops are one kernel group of ``kernel_set``."""

    def __init__(self, kernel_set: KernelSet, group: str = "", device: int = 0, **options: Any) -> None:
        if group not in kernel_set.groups():
            raise ValueError(f"kernel set {kernel_set.declaration.source.name!r} has no group {group!r}; "
                             f"groups: {', '.join(repr(g) for g in kernel_set.groups())}")
        super().__init__(device, **options)
        self._set = kernel_set
        self._group = group
        self._by_op = kernel_set.group(group)
        self._kernels: dict[tuple[str, tuple[int, ...]], Kernel] = {}
        for op in DECLARABLE_OPS:
            if op in self._by_op:
                setattr(self, f"_{op}", functools.partial(self._run_declared, op))
            elif op not in PLUMBING_OPS:
                setattr(self, f"_{op}", functools.partial(self._not_declared, op))

    @property
    def implementation(self) -> str:
        return self._set.implementation(self._group)

    def name(self) -> str:
        return self.implementation

    def declared_ops(self) -> frozenset[str]:
        """The ops this backend runs on the declared kernels."""
        return frozenset(self._by_op)

    def quantized_dtypes(self) -> frozenset[DType]:
        return frozenset(d for k in self._by_op.get("quantized_matmul", ()) for d in k.decl.dtypes)

    def provenance(self) -> dict[str, Any]:
        return self._set.provenance(self._group)

    # -- the declared calls -------------------------------------------------------------------
    def _not_declared(self, op: str, *args: Any) -> None:
        raise NotDeclaredError(f"{self.implementation} declares no kernel for {op}")

    def _pick(self, op: str, env: dict[str, Any]) -> LoadedKernel:
        kernels = self._by_op[op]
        if op != "quantized_matmul":
            return kernels[0]
        dt = env["dtype"]
        for k in kernels:
            if dt in k.decl.dtypes:
                return k
        raise NotDeclaredError(f"{self.implementation} declares no quantized_matmul kernel for {dt.name}")

    def _run_declared(self, op: str, *args: Any) -> None:
        env = dict(zip(call_args(op), args))
        buffers = {n: v for n, v in env.items() if isinstance(v, BufferHandle)}
        scalars = {n: v for n, v in env.items() if n not in buffers}
        loaded = self._pick(op, scalars)
        if op == "quantized_matmul":
            dt: DType = scalars["dtype"]
            scalars.update(block_elems=dt.block_elems, block_bytes=dt.block_bytes,
                           row_bytes=row_bytes(dt, scalars["n_cols"]),
                           blocks_per_row=scalars["n_cols"] // dt.block_elems, dtype_id=int(dt.value))
            scalars["dtype"] = int(dt.value)
        self._launch(loaded, buffers, scalars)

    def _quantized_matmul_vecs(self, weights: BufferHandle, input: BufferHandle, output: BufferHandle,
                               n_rows: int, n_cols: int, dtype: DType, n_vecs: int) -> None:
        # a declared kernel takes one vector (its formulas know no n_vecs): never kbench's own batch kernel
        self._each_vector(lambda xs, ys: self._quantized_matmul(weights, xs, ys, n_rows, n_cols, dtype),
                          input, output, n_rows, n_cols, n_vecs)

    def run_custom(self, op: str, buffers: dict[str, BufferHandle], params: dict[str, Any]) -> None:
        """Run the declared kernel of custom op ``op`` (declared under ``[op.<name>]``) on
        ``buffers`` (its inputs and outputs by name) for case parameters ``params``."""
        self._check_open(op)
        if op not in self._by_op:
            raise NotDeclaredError(f"{self.implementation} declares no kernel for {op}")
        custom = self._set.declaration.custom_ops.get(op)
        if custom is None:
            raise ValueError(f"{op} is not a custom op of {self.implementation}")
        missing = sorted(set(custom.buffers) - set(buffers))
        if missing:
            raise ValueError(f"{op}: buffers {', '.join(missing)} not given")
        handles = {n: self._handle(op, n, h) for n, h in buffers.items()}
        for n, count in {**custom.inputs, **custom.outputs}.items():
            self._elem_range(op, n, handles[n], 0, count.int_value(params), count.text)
        self._launch(self._by_op[op][0], handles, dict(params))

    def _launch(self, loaded: LoadedKernel, buffers: dict[str, BufferHandle], scalars: dict[str, Any]) -> None:
        """Evaluate the declaration for this call, check the grid, record the dispatch."""
        decl = loaded.decl
        where = f"{decl.where}: kernel {decl.name!r}"
        try:
            local = (tuple(f.int_value(scalars) for f in decl.local_size) if decl.local_size is not None
                     else tuple(loaded.info.local_size or (1, 1, 1)))
            scalars.update(local_size_x=local[0], local_size_y=local[1], local_size_z=local[2])
            grid = tuple(g.int_value(scalars) for g in decl.grid)
            spec = tuple(c.value.int_value(scalars) if c.type != "float32" else f32_bits(c.value(scalars))
                         for c in sorted(decl.spec_constants, key=lambda c: int(c.name)))
            push = self._push(loaded, scalars)
            keys = tuple(self._binding_key(b, buffers, scalars, decl.name) for b in
                         sorted(decl.bindings, key=lambda b: b.binding))
        except FormulaError as exc:
            raise ValueError(f"{where}: {exc}") from None
        self._check_grid(where, grid, local, decl, scalars)
        kernel = self._kernels.get((decl.name, spec))
        if kernel is None:
            kernel = self._kernels[(decl.name, spec)] = _foreign_kernel(loaded, spec)
        self._dispatch(kernel, keys, grid, push)  # type: ignore[arg-type]

    def _push(self, loaded: LoadedKernel, env: dict[str, Any]) -> np.ndarray:
        values = []
        for c in loaded.decl.push_constants:
            v = c.value(env)
            if c.type == "float32":
                values.append(np.float32(v))
                continue
            iv = c.value.int_value(env)
            lo, hi = (0, 2**32 - 1) if c.type == "uint32" else (-2**31, 2**31 - 1)
            if not lo <= iv <= hi:
                raise FormulaError(f"push constant {c.name!r} = {iv} does not fit a {c.type}")
            values.append(iv)
        return np.array([tuple(values)], dtype=loaded.push_dtype)

    def _binding_key(self, b: Any, buffers: dict[str, BufferHandle], env: dict[str, Any], kernel: str) -> int:
        if b.arg is not None:
            return buffers[b.arg].id
        nbytes = b.scratch.int_value(env)
        if nbytes < 1:
            raise FormulaError(f"scratch binding {b.binding} needs {nbytes} bytes; it must be at least 1")
        return self._scratch(nbytes, f"foreign:{kernel}:{b.binding}")

    def _check_grid(self, where: str, grid: tuple[int, ...], local: tuple[int, ...], decl: Any,
                    env: dict[str, Any]) -> None:
        limits = self._policy.max_count
        for axis, (g, lim) in enumerate(zip(grid, limits)):
            if g < 1:
                raise ValueError(f"{where}: grid {grid} has {g} workgroups along {'xyz'[axis]}; the call would do nothing")
            if g > lim:
                raise ValueError(f"{where}: grid {grid} exceeds the device's maxComputeWorkGroupCount "
                                 f"{tuple(limits)} along {'xyz'[axis]}")
        groups = math.prod(grid)
        if decl.covers_workgroups is not None:
            need = decl.covers_workgroups.int_value(env)
            if groups < need:
                raise ValueError(f"{where}: grid {grid} launches {groups} workgroups, but the output needs "
                                 f"{need} ({decl.covers_workgroups.text})")
        if decl.covers is not None:
            need = decl.covers.int_value(env)
            have = groups * math.prod(local)
            if have < need:
                raise ValueError(f"{where}: grid {grid} x local size {tuple(local)} = {have} invocations, but the "
                                 f"output needs {need} ({decl.covers.text})")

