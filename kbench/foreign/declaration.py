"""The kernel declaration file: a TOML description of Vulkan kernels kbench did not write.

Schema (docs/foreign-kernels.md has the full reference and a worked example)::

    [source]                      # the third-party tree, never copied into kbench
    name = "yule"                 # implementation name in records: "<name>@<commit[:7]>"
    repository = "https://github.com/..."
    commit = "<40 hex>"           # the pinned commit a user clones ("local": your own, unpinned)
    license = "Apache-2.0"
    root = "yule-gpu/shaders"     # optional: kernel paths are relative to <--source>/<root>

    [op.silu_mul]                 # optional: an op outside the ComputeBackend set
    inputs = { gate = "size", up = "size" }       # float32 elements, uniform in [-1, 1]
    outputs = { out = "size" }
    reference = { out = "silu(gate) * up" }       # float64 NumPy expression
    validate = [{ size = 1 }, { size = 4097 }]
    bench = [{ size = 16777216 }]
    tolerance = 1e-7
    bytes = "12 * size"
    flops = "6 * size"

    [[kernel]]
    name = "add"                  # unique in the file
    op = "add"                    # a ComputeBackend op, or an op declared under [op.*]
    glsl = "add.comp"             # or spirv = "compiled/add.spv" (exactly one)
    dtypes = ["Q4_0"]             # quantized_matmul only
    bindings = [{ binding = 0, arg = "a", type = "float32" }, ...]   # or scratch = "<bytes>"
    push_constants = [{ name = "size", type = "uint32", value = "size" }]
    spec_constants = [{ id = 0, type = "uint32", value = 256 }]
    grid = ["ceil_div(size, local_size_x)", 1, 1]
    local_size = [256]            # optional: where the shader's local size is a spec constant
    covers = "size"               # optional: invocations the grid must reach
    covers_workgroups = "n_rows"  # optional: workgroups the grid must reach

Every error names the file, the line and the key (``yule.toml:41: kernel 'add': bindings[2].arg:
...``). Checks that need the shader (reflected binding count, push-constant block size and
members, specialization ids) are made when the kernel set is loaded, before any GPU work.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kbench.quant import DType

from . import formula as fx
from .ops import BACKEND_OP_ARGS, QUANT_ENV_NAMES, buffer_args, scalar_args

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: element types a binding may declare (what the shader's array is; compute buffers hold float32)
ELEMENT_TYPES = ("float32", "float16", "uint32", "int32", "uint16", "int16", "uint8", "int8", "vec4", "uvec4")
#: push-constant and specialization-constant scalar types: numpy format and reflected kind
SCALAR_TYPES = {"uint32": ("<u4", "u"), "int32": ("<i4", "i"), "float32": ("<f4", "f")}
#: names every formula may use besides the op's own
LAUNCH_NAMES = ("local_size_x", "local_size_y", "local_size_z")


#: ``commit = "local"``: kernels of the user's own, not pinned; the run records the tree's git
#: HEAD where it has one
LOCAL = "local"


class DeclarationError(ValueError):
    """A declaration that kbench refuses, with file, line and key."""


@dataclass(frozen=True)
class Source:
    name: str
    repository: str
    commit: str
    license: str
    root: str = ""


@dataclass(frozen=True)
class BindingDecl:
    binding: int
    type: str
    arg: str | None = None           # an op buffer argument
    scratch: fx.Formula | None = None  # or a zeroed scratch buffer of this many bytes
    layout: str = "dense"            # "dense", or "gguf" (raw GGUF blocks, quantized_matmul weights)


@dataclass(frozen=True)
class ConstDecl:
    name: str
    type: str
    value: fx.Formula


@dataclass(frozen=True)
class CustomOp:
    """An op outside the ComputeBackend set, with its own float64 NumPy reference."""

    name: str
    description: str
    inputs: Mapping[str, fx.Formula]
    outputs: Mapping[str, fx.Formula]
    reference: Mapping[str, fx.Formula]
    validate: tuple[Mapping[str, Any], ...]
    bench: tuple[Mapping[str, Any], ...]
    tolerance: float
    bytes: fx.Formula | None
    flops: fx.Formula | None
    peak: str | None
    params: tuple[str, ...]

    @property
    def buffers(self) -> tuple[str, ...]:
        return tuple(self.inputs) + tuple(self.outputs)


@dataclass(frozen=True)
class KernelDecl:
    name: str
    op: str
    path: str
    is_glsl: bool
    bindings: tuple[BindingDecl, ...]
    push_constants: tuple[ConstDecl, ...]
    spec_constants: tuple[ConstDecl, ...]
    grid: tuple[fx.Formula, fx.Formula, fx.Formula]
    covers: fx.Formula | None = None
    covers_workgroups: fx.Formula | None = None
    dtypes: tuple[DType, ...] = ()
    defines: Mapping[str, str] = field(default_factory=dict)
    target_env: str = "vulkan1.1"
    note: str = ""
    #: kernels of one group form one implementation ("yule", "yule/fast"): alternatives for an op
    #: that the same file also implements go in a group of their own
    group: str = ""
    #: the workgroup size where the shader takes it from specialization constants (reflection
    #: then sees only the defaults); None: the shader's literal local_size
    local_size: tuple[fx.Formula, fx.Formula, fx.Formula] | None = None
    where: str = ""  # "file:line" of its [[kernel]] header, for later errors


@dataclass(frozen=True)
class Declaration:
    path: Path
    source: Source
    kernels: tuple[KernelDecl, ...]
    custom_ops: Mapping[str, CustomOp]

    def groups(self) -> tuple[str, ...]:
        """Kernel groups in order of first appearance ("" is the default group)."""
        return tuple(dict.fromkeys(k.group for k in self.kernels))

    def implementation(self, group: str, commit: str) -> str:
        """The implementation name records carry, e.g. ``yule@1ef0762`` or ``yule/fast@1ef0762``."""
        base = f"{self.source.name}/{group}" if group else self.source.name
        return f"{base}@{commit[:7]}"


class _Lines:
    """Where keys sit in the TOML text (tomllib gives no positions)."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.kernel_starts = [i for i, ln in enumerate(self.lines) if re.match(r"\s*\[\[\s*kernel\s*\]\]", ln)]

    def _table_start(self, header: str) -> int | None:
        pat = re.compile(r"\s*\[\s*" + r"\s*\.\s*".join(map(re.escape, header.split("."))) + r"\s*\]")
        for i, ln in enumerate(self.lines):
            if pat.match(ln):
                return i
        return None

    def find(self, key: str, *, kernel: int | None = None, table: str | None = None) -> int:
        """1-based line of ``key`` inside kernel #``kernel`` or ``[table]`` (or of the block)."""
        if kernel is not None and kernel < len(self.kernel_starts):
            start = self.kernel_starts[kernel]
            end = self.kernel_starts[kernel + 1] if kernel + 1 < len(self.kernel_starts) else len(self.lines)
        elif table is not None and self._table_start(table) is not None:
            start = self._table_start(table)
            end = next((i for i in range(start + 1, len(self.lines)) if re.match(r"\s*\[", self.lines[i])),
                       len(self.lines))
        else:
            start, end = 0, len(self.lines)
        top = key.split(".")[0].split("[")[0]
        pat = re.compile(r"\s*" + re.escape(top) + r"\s*=")
        for i in range(start, end):
            if pat.match(self.lines[i]):
                return i + 1
        return start + 1


class _Reader:
    def __init__(self, path: Path, text: str):
        self.path = path
        self.lines = _Lines(text)

    def fail(self, msg: str, key: str, *, kernel: int | None = None, table: str | None = None,
             label: str = "") -> DeclarationError:
        line = self.lines.find(key, kernel=kernel, table=table)
        return DeclarationError(f"{self.path}:{line}: {label}{key}: {msg}")


def load(path: str | Path) -> Declaration:
    """Read and check a declaration file (everything that can be checked without the shaders)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DeclarationError(f"{path}: no such declaration file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DeclarationError(f"{path}: cannot read: {exc}") from None
    return parse(text, path)


def parse(text: str, path: str | Path = "<declaration>") -> Declaration:
    """Parse declaration ``text``; ``path`` only names it in errors."""
    path = Path(path)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DeclarationError(f"{path}: not valid TOML: {exc}") from None
    r = _Reader(path, text)
    unknown = sorted(set(doc) - {"source", "op", "kernel"})
    if unknown:
        raise r.fail(f"unknown top-level key(s) {', '.join(unknown)}; expected source, op, kernel", unknown[0])
    source = _source(r, doc.get("source"))
    custom = _custom_ops(r, doc.get("op", {}))
    kernels_raw = doc.get("kernel")
    if not isinstance(kernels_raw, list) or not kernels_raw:
        raise r.fail("the file declares no kernel: add at least one [[kernel]] table", "kernel")
    kernels = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(kernels_raw):
        k = _kernel(r, i, raw, custom)
        if k.name in seen:
            raise r.fail(f"kernel name {k.name!r} is declared twice (kernels #{seen[k.name] + 1} and #{i + 1})",
                         "name", kernel=i)
        seen[k.name] = i
        kernels.append(k)
    _check_dtype_overlap(r, kernels)
    return Declaration(path, source, tuple(kernels), custom)


def _need(r: _Reader, table: Mapping[str, Any], key: str, kind: type | tuple, *, label: str = "",
          kernel: int | None = None, tname: str | None = None) -> Any:
    if key not in table:
        raise r.fail("is required", key, kernel=kernel, table=tname, label=label)
    value = table[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        want = kind.__name__ if isinstance(kind, type) else " or ".join(t.__name__ for t in kind)
        raise r.fail(f"must be a {want}, got {value!r}", key, kernel=kernel, table=tname, label=label)
    return value


def _source(r: _Reader, raw: Any) -> Source:
    if not isinstance(raw, dict):
        raise r.fail("a [source] table is required (name, repository, commit, license)", "source")
    allowed = {"name", "repository", "commit", "license", "root"}
    extra = sorted(set(raw) - allowed)
    if extra:
        raise r.fail(f"unknown key; expected one of {', '.join(sorted(allowed))}", extra[0], table="source")
    name = _need(r, raw, "name", str, tname="source")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise r.fail(f"must be a short identifier (letters, digits, _ . -), got {name!r}", "name", table="source")
    commit = _need(r, raw, "commit", str, tname="source")
    if commit != LOCAL and not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise r.fail(f"must be a full 40-hex-digit commit (or \"{LOCAL}\" for kernels of your own that are not "
                     f"pinned), got {commit!r}", "commit", table="source")
    root = raw.get("root", "")
    if not isinstance(root, str) or Path(root).is_absolute() or ".." in Path(root).parts:
        raise r.fail(f"must be a relative path inside the source tree, got {root!r}", "root", table="source")
    return Source(name, _need(r, raw, "repository", str, tname="source"), commit,
                  _need(r, raw, "license", str, tname="source"), root)


def _formula(r: _Reader, value: Any, key: str, allowed: set[str], *, kernel: int | None = None,
             table: str | None = None, label: str = "", functions=fx.SCALAR_FUNCTIONS) -> fx.Formula:
    try:
        return fx.parse(value, allowed_names=allowed, functions=functions)
    except fx.FormulaError as exc:
        raise r.fail(str(exc), key, kernel=kernel, table=table, label=label) from None


def _custom_ops(r: _Reader, raw: Any) -> dict[str, CustomOp]:
    if not isinstance(raw, dict):
        raise r.fail("must be tables [op.<name>]", "op")
    out = {}
    for name, spec in raw.items():
        t = f"op.{name}"
        if name in BACKEND_OP_ARGS:
            raise r.fail(f"{name!r} is a ComputeBackend op; declare custom ops under other names", name, table="op")
        if not isinstance(spec, dict):
            raise r.fail("must be a table", name, table="op")
        allowed = {"description", "inputs", "outputs", "reference", "validate", "bench", "tolerance",
                   "bytes", "flops", "peak"}
        extra = sorted(set(spec) - allowed)
        if extra:
            raise r.fail(f"unknown key; expected one of {', '.join(sorted(allowed))}", extra[0], table=t)
        validate = _sizes(r, spec, "validate", t, required=True)
        bench = _sizes(r, spec, "bench", t, required=False)
        params = tuple(validate[0])
        for s in validate + bench:
            if tuple(sorted(s)) != tuple(sorted(params)):
                raise r.fail(f"every size must give the same parameters {sorted(params)}, got {sorted(s)}",
                             "validate", table=t)
        inputs = _named_formulas(r, spec, "inputs", t, set(params))
        outputs = _named_formulas(r, spec, "outputs", t, set(params))
        clash = sorted(set(inputs) & set(outputs))
        if clash:
            raise r.fail(f"{clash[0]!r} is both an input and an output", "outputs", table=t)
        ref_raw = _need(r, spec, "reference", dict, tname=t)
        if set(ref_raw) != set(outputs):
            raise r.fail(f"must give one expression per output ({', '.join(outputs)}), got {', '.join(ref_raw)}",
                         "reference", table=t)
        reference = {o: _formula(r, e, "reference", set(inputs) | set(params), table=t,
                                 functions=fx.ARRAY_FUNCTIONS) for o, e in ref_raw.items()}
        tol = spec.get("tolerance", 1e-7)
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0 < tol < 1:
            raise r.fail(f"must be an NMSE threshold in (0, 1), got {tol!r}", "tolerance", table=t)
        out[name] = CustomOp(
            name=name, description=str(spec.get("description", "")), inputs=inputs, outputs=outputs,
            reference=reference, validate=validate, bench=bench, tolerance=float(tol),
            bytes=_formula(r, spec["bytes"], "bytes", set(params), table=t) if "bytes" in spec else None,
            flops=_formula(r, spec["flops"], "flops", set(params), table=t) if "flops" in spec else None,
            peak=spec.get("peak", "copy_bandwidth"), params=params)
    return out


def _sizes(r: _Reader, spec: Mapping[str, Any], key: str, table: str, *, required: bool) -> tuple[dict, ...]:
    raw = spec.get(key)
    if raw is None and not required:
        return ()
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) and s for s in raw):
        raise r.fail("must be a non-empty list of parameter tables, e.g. [{ size = 4097 }]", key, table=table)
    for s in raw:
        for k, v in s.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise r.fail(f"parameter {k!r} must be a number, got {v!r}", key, table=table)
    return tuple(dict(s) for s in raw)


def _named_formulas(r: _Reader, spec: Mapping[str, Any], key: str, table: str, names: set[str]) -> dict:
    raw = _need(r, spec, key, dict, tname=table)
    if not raw:
        raise r.fail("must name at least one buffer", key, table=table)
    return {n: _formula(r, v, key, names, table=table) for n, v in raw.items()}


def _kernel(r: _Reader, i: int, raw: Any, custom: Mapping[str, CustomOp]) -> KernelDecl:
    if not isinstance(raw, dict):
        raise r.fail("must be a table", "kernel", kernel=i)
    allowed = {"name", "op", "glsl", "spirv", "dtypes", "bindings", "push_constants", "spec_constants", "grid",
               "covers", "covers_workgroups", "defines", "target_env", "note", "group", "local_size"}
    extra = sorted(set(raw) - allowed)
    label0 = f"kernel #{i + 1}: "
    if extra:
        raise r.fail(f"unknown key; expected one of {', '.join(sorted(allowed))}", extra[0], kernel=i, label=label0)
    name = _need(r, raw, "name", str, kernel=i, label=label0)
    label = f"kernel {name!r}: "
    op = _need(r, raw, "op", str, kernel=i, label=label)
    if op in BACKEND_OP_ARGS:
        buffers, scalars = set(buffer_args(op)), set(scalar_args(op))
    elif op in custom:
        buffers, scalars = set(custom[op].buffers), set(custom[op].params)
    else:
        raise r.fail(f"unknown op {op!r}: not a ComputeBackend op ({', '.join(sorted(BACKEND_OP_ARGS))}) "
                     "and not declared under [op.<name>]", "op", kernel=i, label=label)
    if ("glsl" in raw) == ("spirv" in raw):
        raise r.fail("give exactly one of glsl = \"path.comp\" or spirv = \"path.spv\"", "glsl", kernel=i, label=label)
    is_glsl = "glsl" in raw
    path = _need(r, raw, "glsl" if is_glsl else "spirv", str, kernel=i, label=label)
    if Path(path).is_absolute() or ".." in Path(path).parts:
        raise r.fail(f"must be a path inside the source tree, got {path!r}", "glsl" if is_glsl else "spirv",
                     kernel=i, label=label)
    dtypes: tuple[DType, ...] = ()
    if op == "quantized_matmul":
        raw_dt = _need(r, raw, "dtypes", list, kernel=i, label=label)
        try:
            dtypes = tuple(DType[str(d).upper()] for d in raw_dt)
        except KeyError as exc:
            raise r.fail(f"unknown GGUF type {exc.args[0]!r}; known: {', '.join(d.name for d in DType)}",
                         "dtypes", kernel=i, label=label) from None
        if not dtypes:
            raise r.fail("must name at least one weight type", "dtypes", kernel=i, label=label)
        scalars |= set(QUANT_ENV_NAMES)
    elif "dtypes" in raw:
        raise r.fail("only quantized_matmul kernels take dtypes", "dtypes", kernel=i, label=label)
    local_size = None
    if "local_size" in raw:
        ls = raw["local_size"]
        if not isinstance(ls, list) or not 1 <= len(ls) <= 3:
            raise r.fail("must list 1 to 3 formulas (x, y, z)", "local_size", kernel=i, label=label)
        local_size = tuple(_formula(r, v, "local_size", scalars, kernel=i, label=label) for v in ls)
        local_size += tuple(fx.parse(1) for _ in range(3 - len(local_size)))
    env_names = scalars | set(LAUNCH_NAMES)
    bindings = _bindings(r, i, label, raw, buffers, env_names, op)
    push = _consts(r, i, label, raw, "push_constants", env_names, key_field="name")
    spec = _consts(r, i, label, raw, "spec_constants", scalars, key_field="id")
    grid_raw = _need(r, raw, "grid", list, kernel=i, label=label)
    if not 1 <= len(grid_raw) <= 3:
        raise r.fail(f"must list 1 to 3 formulas (x, y, z), got {len(grid_raw)}", "grid", kernel=i, label=label)
    grid = tuple(_formula(r, g, "grid", env_names, kernel=i, label=label) for g in grid_raw)
    grid = grid + tuple(fx.parse(1) for _ in range(3 - len(grid)))
    covers = _formula(r, raw["covers"], "covers", env_names, kernel=i, label=label) if "covers" in raw else None
    covers_wg = (_formula(r, raw["covers_workgroups"], "covers_workgroups", env_names, kernel=i, label=label)
                 if "covers_workgroups" in raw else None)
    defines = raw.get("defines", {})
    if not isinstance(defines, dict) or not is_glsl and defines:
        raise r.fail("must be a table of -D macros, and only for glsl kernels", "defines", kernel=i, label=label)
    group = raw.get("group", "")
    if not isinstance(group, str) or group and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", group):
        raise r.fail(f"must be a short identifier (letters, digits, _ -), got {group!r}", "group", kernel=i, label=label)
    target_env = raw.get("target_env", "vulkan1.1")
    if target_env not in ("vulkan1.0", "vulkan1.1", "vulkan1.2", "vulkan1.3"):
        raise r.fail(f"must be vulkan1.0 .. vulkan1.3, got {target_env!r}", "target_env", kernel=i, label=label)
    return KernelDecl(name=name, op=op, path=path, is_glsl=is_glsl, bindings=bindings, push_constants=push,
                      spec_constants=spec, grid=grid, covers=covers, covers_workgroups=covers_wg, dtypes=dtypes,
                      defines={str(k): str(v) for k, v in defines.items()}, target_env=target_env,
                      note=str(raw.get("note", "")), group=group, local_size=local_size, where=f"{r.path}:{r.lines.find('name', kernel=i)}")


def _bindings(r: _Reader, i: int, label: str, raw: Mapping[str, Any], buffers: set[str], env_names: set[str],
              op: str) -> tuple[BindingDecl, ...]:
    items = _need(r, raw, "bindings", list, kernel=i, label=label)
    out: list[BindingDecl] = []
    used: set[str] = set()
    for j, b in enumerate(items):
        key = f"bindings[{j}]"
        if not isinstance(b, dict):
            raise r.fail("must be a table { binding = N, arg = \"name\", type = \"float32\" }", key, kernel=i,
                         label=label)
        extra = sorted(set(b) - {"binding", "arg", "scratch", "type", "layout"})
        if extra:
            raise r.fail(f"unknown key {extra[0]!r}; expected binding, arg | scratch, type, layout", key,
                         kernel=i, label=label)
        num = b.get("binding", j)
        if isinstance(num, bool) or not isinstance(num, int) or num < 0:
            raise r.fail(f"binding must be an int >= 0, got {num!r}", key, kernel=i, label=label)
        typ = b.get("type", "float32")
        if typ not in ELEMENT_TYPES:
            raise r.fail(f"type must be one of {', '.join(ELEMENT_TYPES)}, got {typ!r}", key, kernel=i, label=label)
        layout = b.get("layout", "dense")
        if ("arg" in b) == ("scratch" in b):
            raise r.fail("give exactly one of arg = \"<op argument>\" or scratch = \"<bytes>\"", key, kernel=i,
                         label=label)
        if "arg" in b:
            arg = b["arg"]
            if arg not in buffers:
                raise r.fail(f"arg {arg!r} is not a buffer argument of {op} ({', '.join(sorted(buffers))})", key,
                             kernel=i, label=label)
            if arg in used:
                raise r.fail(f"arg {arg!r} is bound twice", key, kernel=i, label=label)
            used.add(arg)
            gguf_arg = op == "quantized_matmul" and arg == "weights"
            if layout not in ("dense", "gguf") or (layout == "gguf") != gguf_arg:
                raise r.fail("layout must be \"gguf\" for quantized_matmul's weights (raw GGUF blocks) and "
                             f"\"dense\" otherwise, got {layout!r}", key, kernel=i, label=label)
            out.append(BindingDecl(num, typ, arg=arg, layout=layout))
        else:
            out.append(BindingDecl(num, typ, scratch=_formula(r, b["scratch"], key, env_names, kernel=i, label=label)))
    nums = [b.binding for b in out]
    if len(set(nums)) != len(nums):
        raise r.fail(f"binding numbers repeat: {nums}", "bindings", kernel=i, label=label)
    missing = sorted(buffers - used)
    if missing:
        raise r.fail(f"the op's buffer argument(s) {', '.join(missing)} are bound to no binding", "bindings",
                     kernel=i, label=label)
    return tuple(out)


def _consts(r: _Reader, i: int, label: str, raw: Mapping[str, Any], key: str, env_names: set[str], *,
            key_field: str) -> tuple[ConstDecl, ...]:
    items = raw.get(key, [])
    if not isinstance(items, list):
        raise r.fail("must be a list of tables", key, kernel=i, label=label)
    out = []
    for j, c in enumerate(items):
        k = f"{key}[{j}]"
        if not isinstance(c, dict) or set(c) - {key_field, "type", "value"} or key_field not in c or "value" not in c:
            raise r.fail(f"must be {{ {key_field} = ..., type = \"uint32\"|\"int32\"|\"float32\", value = ... }}",
                         k, kernel=i, label=label)
        typ = c.get("type", "uint32")
        if typ not in SCALAR_TYPES:
            raise r.fail(f"type must be one of {', '.join(SCALAR_TYPES)}, got {typ!r}", k, kernel=i, label=label)
        ident = c[key_field]
        if key_field == "id" and (isinstance(ident, bool) or not isinstance(ident, int) or ident < 0):
            raise r.fail(f"id must be an int >= 0, got {ident!r}", k, kernel=i, label=label)
        out.append(ConstDecl(str(ident), typ, _formula(r, c["value"], k, env_names, kernel=i, label=label)))
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise r.fail(f"{key_field}s repeat: {names}", key, kernel=i, label=label)
    return tuple(out)


def _check_dtype_overlap(r: _Reader, kernels: list[KernelDecl]) -> None:
    owner: dict[tuple[str, Any], str] = {}
    for i, k in enumerate(kernels):
        for key in ([(k.group, k.op, d) for d in k.dtypes] if k.dtypes else [(k.group, k.op, None)]):
            if key in owner:
                what = f"{k.op} for {key[2].name}" if key[2] is not None else k.op
                grp = f"group {k.group!r}" if k.group else "the default group"
                raise r.fail(f"{what} is already implemented by kernel {owner[key]!r} in {grp}; one kernel per op "
                             "(and weight type) in a group: put alternatives in a group of their own "
                             "(group = \"fast\")", "op", kernel=i, label=f"kernel {k.name!r}: ")
            owner[key] = k.name
