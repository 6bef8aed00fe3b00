"""The table of ComputeBackend ops: every op's name, which buffers it reads and writes, whether
its output may alias an input, and whether it is device work only.

One table for everyone: the argument checks (backend/base.py), the cases' ``ops`` declarations,
the PyTorch peer's CUDA-graph capture and any further implementation read it from here. Adding
an op starts with a row here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Op:
    """One ComputeBackend op."""

    name: str
    #: buffer argument -> "r" (read), "w" (written) or "rw"
    buffers: Mapping[str, str] = field(default_factory=dict)
    #: an output may be the same buffer as an input: each output element depends only on inputs
    #: the op has finished reading (elementwise, or a reduction done before any write)
    may_alias: bool = False
    #: device work only (no host copy, no wait): a run of such ops can be recorded once and
    #: replayed (a Vulkan command buffer, a CUDA graph)
    device_only: bool = False
    #: beyond the Rust trait ``yule_gpu::ComputeBackend`` (a backend may lack it)
    extension: bool = False


def _compute(name: str, may_alias: bool = False, extension: bool = False, **buffers: str) -> Op:
    return Op(name, buffers, may_alias=may_alias, device_only=True, extension=extension)


_TABLE = (
    Op("name"),
    Op("device_info"),
    Op("allocate"),
    Op("free"),
    Op("copy_to_device", {"handle": "w"}),
    Op("copy_from_device", {"handle": "r"}),
    Op("copy_buffer", {"src": "r", "dst": "w"}, device_only=True),
    Op("copy_buffer_offset", {"src": "r", "dst": "w"}, device_only=True),
    Op("synchronize"),
    _compute("matmul", a="r", b="r", out="w"),
    _compute("softmax", may_alias=True, input="r", output="w"),
    _compute("rms_norm", may_alias=True, input="r", weight="r", output="w"),
    _compute("rope", q="rw", k="rw"),
    _compute("silu", may_alias=True, input="r", output="w"),
    _compute("element_mul", may_alias=True, a="r", b="r", output="w"),
    _compute("add", may_alias=True, a="r", b="r", output="w"),
    _compute("attn_score", q="r", k_cache="r", scores="w"),
    _compute("attn_value", weights="r", v_cache="r", output="w"),
    _compute("quantized_matmul", weights="r", input="r", output="w"),
    # VulkanBackend / NumpyBackend / the peer's matmul_f16; see backend.base.check_matmul_f16
    _compute("matmul_f16", extension=True, a="r", b="r", out="w"),
    _compute("matmul_bf16", extension=True, a="r", b="r", out="w"),
    # fused decode attention over all heads; see backend.base.check_attention
    _compute("attention", extension=True, q="r", k_cache="r", v_cache="r", out="w"),
)

#: every op by name, in the trait's order
OPS: Mapping[str, Op] = {op.name: op for op in _TABLE}

#: which buffer arguments each op reads ("r"), writes ("w") or both ("rw"); ops of ALIASING_OPS
#: may be given the same buffer twice, for the others a written buffer must differ from the rest
OP_BUFFER_ACCESS: Mapping[str, Mapping[str, str]] = {op.name: op.buffers for op in _TABLE if op.buffers}

#: ops whose output may alias an input
ALIASING_OPS = frozenset(op.name for op in _TABLE if op.may_alias)

#: ops that are device work only: a case made of these can be recorded once and replayed
DEVICE_ONLY_OPS = frozenset(op.name for op in _TABLE if op.device_only)

#: the ops of the trait (without the extensions)
TRAIT_OPS = tuple(op.name for op in _TABLE if not op.extension)


def get_op(name: str) -> Op:
    """The op called ``name``; ValueError naming the known ops otherwise."""
    try:
        return OPS[name]
    except KeyError:
        raise ValueError(f"unknown ComputeBackend op {name!r}; known: {', '.join(OPS)}") from None
