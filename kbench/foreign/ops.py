"""Which ComputeBackend ops a declared kernel may implement, and their argument names.

The names come from the ComputeBackend methods themselves (their signatures are the contract),
so a declaration binds ``a``, ``b``, ``output`` for ``add`` exactly as the ABC names them.
"""

from __future__ import annotations

import inspect

from kbench.backend.base import ComputeBackend
from kbench.backend.op_table import OPS

#: ops a kernel can implement: every op of the trait that is device work only (allocation, host
#: transfers, synchronize and the informational methods stay kbench's)
DECLARABLE_OPS = tuple(name for name, op in OPS.items() if op.device_only and not op.extension)

#: names a quantized_matmul kernel's formulas may use besides its arguments
QUANT_ENV_NAMES = ("block_elems", "block_bytes", "row_bytes", "blocks_per_row", "dtype_id")


def _signature(op: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    params = list(inspect.signature(getattr(ComputeBackend, op)).parameters.values())[1:]
    names = tuple(p.name for p in params)
    buffers = tuple(p.name for p in params if "BufferHandle" in str(p.annotation))
    scalars = tuple(n for n in names if n not in buffers)
    return names, buffers, scalars


#: op -> (every argument in call order, buffer arguments, scalar arguments)
BACKEND_OP_ARGS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    op: _signature(op) for op in DECLARABLE_OPS
}


def call_args(op: str) -> tuple[str, ...]:
    """Every argument of ``op`` in the order the backend passes them."""
    return BACKEND_OP_ARGS[op][0]


def buffer_args(op: str) -> tuple[str, ...]:
    return BACKEND_OP_ARGS[op][1]


def scalar_args(op: str) -> tuple[str, ...]:
    return BACKEND_OP_ARGS[op][2]
