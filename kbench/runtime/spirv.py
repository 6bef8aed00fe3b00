"""Just enough SPIR-V reflection to check user input against a compute shader before recording.

Kompute hands SPIR-V to the driver unchecked, so a missing binding or a push constant of the wrong
type shows up as garbage results or a crash. Reading the module's decorations lets the runtime
reject those mistakes with a message, and tells it which bindings a shader only reads (so that
barriers are placed only where a real dependency exists).
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

MAGIC = 0x07230203

# opcodes used below
_OP_NAME = 5
_OP_MEMBER_NAME = 6
_OP_ENTRY_POINT = 15
_OP_EXECUTION_MODE = 16
_OP_CAPABILITY = 17
_OP_TYPE_BOOL = 20
_OP_TYPE_INT = 21
_OP_TYPE_FLOAT = 22
_OP_TYPE_VECTOR = 23
_OP_TYPE_MATRIX = 24
_OP_TYPE_ARRAY = 28
_OP_TYPE_RUNTIME_ARRAY = 29
_OP_TYPE_STRUCT = 30
_OP_TYPE_POINTER = 32
_OP_CONSTANT = 43
_OP_CONSTANT_COMPOSITE = 44
_OP_SPEC_CONSTANT_COMPOSITE = 51
_OP_SPEC_CONSTANT_TRUE = 48
_OP_SPEC_CONSTANT_FALSE = 49
_OP_SPEC_CONSTANT = 50
_OP_VARIABLE = 59
_OP_DECORATE = 71
_OP_MEMBER_DECORATE = 72
_OP_FUNCTION_END = 56

_DEC_SPEC_ID = 1
_DEC_BUILTIN = 11
_BUILTIN_WORKGROUP_SIZE = 25
_DEC_BLOCK = 2
_DEC_BUFFER_BLOCK = 3
_DEC_NON_WRITABLE = 24
_DEC_NON_READABLE = 25
_DEC_BINDING = 33
_DEC_DESCRIPTOR_SET = 34
_DEC_OFFSET = 35

_SC_UNIFORM = 2
_SC_PUSH_CONSTANT = 9
_SC_STORAGE_BUFFER = 12

_EXEC_LOCAL_SIZE = 17
_EXEC_LOCAL_SIZE_ID = 38

# capability number -> (feature key in device properties, human name)
CAPABILITY_FEATURES: dict[int, tuple[str, str]] = {
    9: ("float16", "shaderFloat16"),
    10: ("float64", "shaderFloat64"),
    11: ("int64", "shaderInt64"),
    22: ("int16", "shaderInt16"),
    39: ("int8", "shaderInt8"),
    4433: ("storage_buffer_16bit", "storageBuffer16BitAccess"),
    4434: ("uniform_and_storage_buffer_16bit", "uniformAndStorageBuffer16BitAccess"),
    4448: ("storage_buffer_8bit", "storageBuffer8BitAccess"),
    4449: ("uniform_and_storage_buffer_8bit", "uniformAndStorageBuffer8BitAccess"),
    61: ("subgroup_basic", "subgroup basic operations"),
    62: ("subgroup_vote", "subgroup vote operations"),
    63: ("subgroup_arithmetic", "subgroup arithmetic operations"),
    64: ("subgroup_ballot", "subgroup ballot operations"),
    65: ("subgroup_shuffle", "subgroup shuffle operations"),
    66: ("subgroup_shuffle_relative", "subgroup relative shuffle operations"),
    6022: ("cooperative_matrix", "VK_KHR_cooperative_matrix cooperativeMatrix"),
    6016: ("integer_dot_product", "shaderIntegerDotProduct"),
    6019: ("integer_dot_product", "shaderIntegerDotProduct"),
    6018: ("integer_dot_product", "shaderIntegerDotProduct"),
    5116: ("bfloat16", "shaderBFloat16Type"),
    5117: ("bfloat16_dot_product", "shaderBFloat16DotProduct"),
    5118: ("bfloat16_cooperative_matrix", "shaderBFloat16CooperativeMatrix"),
    5430: ("cooperative_matrix2_reductions", "VK_NV_cooperative_matrix2 cooperativeMatrixReductions"),
    5431: ("cooperative_matrix2_conversions", "VK_NV_cooperative_matrix2 cooperativeMatrixConversions"),
    5432: ("cooperative_matrix2_per_element_operations",
           "VK_NV_cooperative_matrix2 cooperativeMatrixPerElementOperations"),
    5433: ("cooperative_matrix2_tensor_addressing", "VK_NV_cooperative_matrix2 cooperativeMatrixTensorAddressing"),
    5434: ("cooperative_matrix2_block_loads", "VK_NV_cooperative_matrix2 cooperativeMatrixBlockLoads"),
    5439: ("cooperative_matrix2_tensor_addressing", "VK_NV_cooperative_matrix2 cooperativeMatrixTensorAddressing"),
    5345: ("vulkan_memory_model", "vulkanMemoryModel"),
    5346: ("vulkan_memory_model_device_scope", "vulkanMemoryModelDeviceScope"),
    # ShaderClockKHR: reads at device scope need shaderDeviceClock as well (kbench/probes/timeline.py asks)
    5055: ("shader_subgroup_clock", "VK_KHR_shader_clock shaderSubgroupClock"),
    67: ("subgroup_clustered", "subgroup clustered operations"),
    68: ("subgroup_quad", "subgroup quad operations"),
}

#: capabilities every Vulkan device supports for a compute shader (the SPIR-V environment
#: appendix of the Vulkan spec): Matrix, Shader, the image and sampler basics, DeviceGroup,
#: ShaderNonUniform. Any other capability without an entry above is refused: the device may lack
#: it and kbench enables no feature for it (Tessellation, Geometry, ...).
ALWAYS_AVAILABLE = frozenset({0, 1, 40, 43, 44, 46, 47, 49, 50, 51, 4437, 5301})


def unsupported_capabilities(capabilities: set[int]) -> list[int]:
    """The capabilities of a module that kbench neither checks against a device feature nor
    knows every device to have."""
    return sorted(c for c in capabilities if c not in CAPABILITY_FEATURES and c not in ALWAYS_AVAILABLE)


@dataclass(frozen=True)
class Scalar:
    """A scalar type: kind is 'f', 'i', 'u' or 'b'; width in bits."""

    kind: str
    width: int


@dataclass
class PushMember:
    name: str
    offset: int
    scalar: Scalar
    count: int  # scalars in this member (vector/array length)

    @property
    def nbytes(self) -> int:
        return self.count * self.scalar.width // 8


@dataclass
class Binding:
    set: int
    binding: int
    readonly: bool
    writeonly: bool
    #: "storage" (a storage buffer, what kbench binds), "uniform" (a uniform buffer) or "other"
    #: (images, samplers, ...)
    kind: str = "storage"


@dataclass
class SpecConstant:
    spec_id: int
    scalar: Scalar


@dataclass
class ShaderInfo:
    """What the runtime needs to know about a compute shader."""

    bindings: list[Binding] = field(default_factory=list)
    push_members: list[PushMember] = field(default_factory=list)
    push_size: int = 0
    spec_constants: dict[int, SpecConstant] = field(default_factory=dict)
    capabilities: set[int] = field(default_factory=set)
    local_size: tuple[int, int, int] | None = None
    #: the local size as (spec constant id or None, default) per axis, where a WorkgroupSize
    #: built-in or LocalSizeId sets it (specialization may change it); None otherwise
    local_size_spec: tuple[tuple[int | None, int], ...] | None = None
    entry_points: list[str] = field(default_factory=list)
    # push-constant (dtype, nbytes) layouts already checked against this shader
    push_layouts_checked: set = field(default_factory=set, repr=False, compare=False)

    @property
    def binding_count(self) -> int:
        """Number of tensors the shader expects (highest binding of set 0, plus one)."""
        ids = [b.binding for b in self.bindings if b.set == 0]
        return max(ids) + 1 if ids else 0

    def local_size_with(self, spec: list[int]) -> tuple[int, ...] | None:
        """The local size once specialized with ``spec`` (spec constant i = spec[i])."""
        if self.local_size_spec is None:
            return self.local_size
        return tuple(int(spec[k]) if k is not None and k < len(spec) else d for k, d in self.local_size_spec)

    def readonly_bindings(self) -> set[int]:
        return {b.binding for b in self.bindings if b.set == 0 and b.readonly}

    def writeonly_bindings(self) -> set[int]:
        return {b.binding for b in self.bindings if b.set == 0 and b.writeonly}

    def required_features(self) -> list[tuple[str, str]]:
        """(feature key, human name) for every capability that maps to an optional feature."""
        out = []
        for cap in sorted(self.capabilities):
            if cap in CAPABILITY_FEATURES and CAPABILITY_FEATURES[cap] not in out:
                out.append(CAPABILITY_FEATURES[cap])
        return out


def _string(words: list[int]) -> str:
    raw = struct.pack(f"<{len(words)}I", *words)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def words_of(spirv: bytes) -> list[int]:
    """Split a SPIR-V binary into 32-bit words, checking size and magic number."""
    if not isinstance(spirv, (bytes, bytearray, memoryview)):
        raise TypeError(f"spirv must be bytes, got {type(spirv).__name__}")
    data = bytes(spirv)
    if len(data) < 20 or len(data) % 4:
        raise ValueError(f"invalid SPIR-V: {len(data)} bytes is not a whole SPIR-V module")
    (magic,) = struct.unpack_from("<I", data)
    if magic != MAGIC:
        raise ValueError(f"invalid SPIR-V: magic number 0x{magic:08x}, expected 0x{MAGIC:08x}")
    words = list(struct.unpack(f"<{len(data) // 4}I", data))
    # the header: version 1.0-1.6 (0x00MMmm00), an id bound, a zero schema word (drivers such
    # as lavapipe refuse a module otherwise, after the validation layer complained)
    version = words[1]
    if version & 0xFF0000FF or not 0x00010000 <= version <= 0x00010600:
        raise ValueError(f"invalid SPIR-V: version word 0x{version:08x} is not SPIR-V 1.0-1.6")
    if not 0 < words[3] <= 0x3FFFFF:
        raise ValueError(f"invalid SPIR-V: id bound {words[3]} is outside 1..4194303")
    if words[4] != 0:
        raise ValueError(f"invalid SPIR-V: the schema word (word 4) is {words[4]}, must be 0")
    return words


def reflect(spirv: bytes) -> ShaderInfo:
    """Parse ``spirv`` and return its bindings, push-constant layout, spec constants, capabilities.
    ValueError (never IndexError and the like) for a module this cannot read."""
    words = words_of(spirv)
    try:
        return _reflect(words)
    except (IndexError, KeyError, TypeError, RecursionError) as exc:
        raise ValueError(f"invalid SPIR-V: malformed module ({type(exc).__name__}: {exc})") from None


def _reflect(words: list[int]) -> ShaderInfo:
    info = ShaderInfo()
    types: dict[int, tuple] = {}
    decorations: dict[int, dict[int, list[int]]] = {}
    member_decorations: dict[tuple[int, int], dict[int, list[int]]] = {}
    member_names: dict[tuple[int, int], str] = {}
    variables: list[tuple[int, int, int]] = []  # (result id, pointer type, storage class)
    spec_ops: list[tuple[int, int]] = []  # (result type, result id)
    constants: dict[int, int] = {}
    local_size_ids: tuple[int, int, int] | None = None
    composites: dict[int, list[int]] = {}

    i = 5
    n = len(words)
    last_op = -1
    while i < n:
        wc, op = words[i] >> 16, words[i] & 0xFFFF
        if wc == 0 or i + wc > n:
            raise ValueError(f"invalid SPIR-V: malformed instruction at word {i}")
        ops = words[i + 1 : i + wc]
        if op == _OP_CAPABILITY:
            info.capabilities.add(ops[0])
        elif op == _OP_ENTRY_POINT:
            info.entry_points.append(_string(ops[2:]))
        elif op == _OP_EXECUTION_MODE and ops[1] == _EXEC_LOCAL_SIZE:
            info.local_size = (ops[2], ops[3], ops[4])
        elif op == _OP_EXECUTION_MODE and ops[1] == _EXEC_LOCAL_SIZE_ID:
            local_size_ids = (ops[2], ops[3], ops[4])
        elif op == _OP_MEMBER_NAME:
            member_names[(ops[0], ops[1])] = _string(ops[2:])
        elif op == _OP_DECORATE:
            decorations.setdefault(ops[0], {})[ops[1]] = ops[2:]
        elif op == _OP_MEMBER_DECORATE:
            member_decorations.setdefault((ops[0], ops[1]), {})[ops[2]] = ops[3:]
        elif op == _OP_TYPE_BOOL:
            types[ops[0]] = ("scalar", Scalar("b", 32))
        elif op == _OP_TYPE_INT:
            types[ops[0]] = ("scalar", Scalar("i" if ops[2] else "u", ops[1]))
        elif op == _OP_TYPE_FLOAT:
            types[ops[0]] = ("scalar", Scalar("f", ops[1]))
        elif op in (_OP_TYPE_VECTOR, _OP_TYPE_MATRIX):
            types[ops[0]] = ("vector", ops[1], ops[2])
        elif op == _OP_TYPE_ARRAY:
            types[ops[0]] = ("array", ops[1], ops[2])
        elif op == _OP_TYPE_RUNTIME_ARRAY:
            types[ops[0]] = ("runtime_array", ops[1])
        elif op == _OP_TYPE_STRUCT:
            types[ops[0]] = ("struct", list(ops[1:]))
        elif op == _OP_TYPE_POINTER:
            types[ops[0]] = ("pointer", ops[1], ops[2])
        elif op in (_OP_CONSTANT_COMPOSITE, _OP_SPEC_CONSTANT_COMPOSITE):
            composites[ops[1]] = list(ops[2:])
        elif op == _OP_CONSTANT:
            constants[ops[1]] = ops[2]
        elif op in (_OP_SPEC_CONSTANT, _OP_SPEC_CONSTANT_TRUE, _OP_SPEC_CONSTANT_FALSE):
            spec_ops.append((ops[0], ops[1]))
            if op == _OP_SPEC_CONSTANT:
                constants[ops[1]] = ops[2]
        elif op == _OP_VARIABLE:
            variables.append((ops[1], ops[0], ops[2]))
        last_op = op
        i += wc
    if last_op != _OP_FUNCTION_END:
        raise ValueError("invalid SPIR-V: the module does not end with OpFunctionEnd (truncated?)")

    def scalar_and_count(type_id: int) -> tuple[Scalar, int]:
        t = types.get(type_id)
        if t is None:
            raise ValueError(f"invalid SPIR-V: unknown type id {type_id}")
        if t[0] == "scalar":
            return t[1], 1
        if t[0] == "vector":
            s, c = scalar_and_count(t[1])
            return s, c * t[2]
        if t[0] == "array":
            s, c = scalar_and_count(t[1])
            return s, c * constants.get(t[2], 1)
        if t[0] == "struct":
            # nested structs in push constants are rare; treat as opaque bytes of uint32
            return Scalar("u", 32), 0
        raise ValueError(f"invalid SPIR-V: unsupported push-constant member type {t[0]}")

    for var_id, ptr_type, storage in variables:
        ptr = types.get(ptr_type)
        if ptr is None or ptr[0] != "pointer":
            continue
        pointee = ptr[2]
        dec = decorations.get(var_id, {})
        if _DEC_BINDING in dec:
            struct_t = types.get(pointee)
            member_ids = struct_t[1] if struct_t and struct_t[0] == "struct" else []
            mdecs = [member_decorations.get((pointee, m), {}) for m in range(len(member_ids))]
            readonly = _DEC_NON_WRITABLE in dec or (bool(mdecs) and all(_DEC_NON_WRITABLE in d for d in mdecs))
            writeonly = _DEC_NON_READABLE in dec or (bool(mdecs) and all(_DEC_NON_READABLE in d for d in mdecs))
            if storage == _SC_STORAGE_BUFFER or (storage == _SC_UNIFORM and _DEC_BUFFER_BLOCK in decorations.get(pointee, {})):
                kind = "storage"
            else:
                kind = "uniform" if storage == _SC_UNIFORM else "other"
            info.bindings.append(
                Binding(dec.get(_DEC_DESCRIPTOR_SET, [0])[0], dec[_DEC_BINDING][0], readonly, writeonly, kind)
            )
        elif storage == _SC_PUSH_CONSTANT:
            struct_t = types.get(pointee)
            if not struct_t or struct_t[0] != "struct":
                continue
            end = 0
            for m, member_type in enumerate(struct_t[1]):
                off = member_decorations.get((pointee, m), {}).get(_DEC_OFFSET, [0])[0]
                scalar, count = scalar_and_count(member_type)
                pm = PushMember(member_names.get((pointee, m), f"member{m}"), off, scalar, count)
                info.push_members.append(pm)
                end = max(end, off + pm.nbytes)
            info.push_size = end
    for type_id, result_id in spec_ops:
        dec = decorations.get(result_id, {})
        if _DEC_SPEC_ID in dec:
            t = types.get(type_id)
            scalar = t[1] if t and t[0] == "scalar" else Scalar("u", 32)
            info.spec_constants[dec[_DEC_SPEC_ID][0]] = SpecConstant(dec[_DEC_SPEC_ID][0], scalar)
    size_ids = next((composites[c] for c, dec in decorations.items()
                     if c in composites and dec.get(_DEC_BUILTIN, [None])[0] == _BUILTIN_WORKGROUP_SIZE), None)
    if size_ids is None and local_size_ids is not None:
        size_ids = list(local_size_ids)
    if size_ids is not None and len(size_ids) == 3:
        info.local_size_spec = tuple((decorations.get(x, {}).get(_DEC_SPEC_ID, [None])[0], constants.get(x, 1))
                                     for x in size_ids)
        info.local_size = tuple(d for _, d in info.local_size_spec)  # type: ignore[assignment]
    return info


_validated: set[bytes] = set()


def validate_with_spirv_val(spirv: bytes, target_env: str = "vulkan1.1") -> None:
    """Run Khronos' spirv-val on ``spirv`` when it is installed (skipped otherwise, or when
    KBENCH_SPIRV_VAL=0): drivers may crash on invalid modules, so reject them first."""
    import hashlib
    import os
    import shutil

    if os.environ.get("KBENCH_SPIRV_VAL", "1") == "0":
        return
    exe = shutil.which("spirv-val")
    if exe is None:
        return
    key = hashlib.sha256(spirv).digest()
    if key in _validated:
        return
    rc, out = _spirv_val(exe, target_env, spirv)
    if rc != 0 and "Invalid capability operand" in out:
        # an older spirv-val than the module (e.g. Debian 12's, which predates
        # CooperativeMatrixKHR) cannot judge it; the structural checks still ran, and a
        # capability kbench knows has had its device feature checked. Any other capability is
        # refused: spirv-val stops at the first, so it looks again without kbench's own ones.
        rc2, out2 = _spirv_val(exe, target_env, _without_capabilities(spirv, set(CAPABILITY_FEATURES)))
        unknown = sorted({int(n) for n in re.findall(r"Invalid capability operand: (\d+)", out + out2)}
                         - set(CAPABILITY_FEATURES))
        if unknown:
            raise ValueError(f"invalid SPIR-V: capability {', '.join(map(str, unknown))} is unknown to spirv-val "
                             "and to kbench (no driver should be handed it)")
        return
    if rc != 0:
        raise ValueError("invalid SPIR-V (spirv-val): " + out)
    _validated.add(key)


def _spirv_val(exe: str, target_env: str, spirv: bytes) -> tuple[int, str]:
    """(exit status, output) of spirv-val on ``spirv``."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".spv") as f:
        f.write(spirv)
        f.flush()
        proc = subprocess.run([exe, "--target-env", target_env, f.name], capture_output=True)
    # bytes: spirv-val quotes the module's strings, which need not be UTF-8
    return proc.returncode, (proc.stdout + proc.stderr).decode("utf-8", "replace").replace(f.name, "<module>").strip()


def _without_capabilities(spirv: bytes, caps: set[int]) -> bytes:
    """``spirv`` without its OpCapability instructions for ``caps``."""
    words = words_of(spirv)
    out, i = words[:5], 5
    while i < len(words):
        wc = max(1, words[i] >> 16)
        if not (words[i] & 0xFFFF == _OP_CAPABILITY and wc == 2 and i + 1 < len(words) and words[i + 1] in caps):
            out.extend(words[i:i + wc])
        i += wc
    return struct.pack(f"<{len(out)}I", *out)
