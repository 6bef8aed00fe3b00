"""Property-based tests of the backend and runtime APIs (issue 22), run by test_property_based.py
in a subprocess so that a segfault or a hang fails that test instead of ending pytest.

The property: every call either raises a documented kbench exception or gives the right result,
never a crash, a hang or a validation-layer message. "Right" is judged against the NumPy backend
(backend ops) or a byte model of device memory (runtime transfer ops).

KBENCH_PROPERTY_EXAMPLES sets the examples per property (CI default: small, a few minutes at most).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kbench.runtime as kp
from kbench.backend.base import BackendClosedError, BufferHandle, InvalidHandleError, UnsupportedDTypeError
from kbench.backend.numpy_backend import NumpyBackend
from kbench.backend.vulkan_backend import VulkanBackend

EXAMPLES = int(os.environ.get("KBENCH_PROPERTY_EXAMPLES", "40"))
VALIDATION = os.environ.get("KBENCH_VALIDATION", "0") == "1"
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)
SPV = Path(__file__).resolve().parents[1] / "kbench" / "spv"

#: what a bad call may raise: the backend's and the runtime's documented exceptions
BACKEND_ERRORS = (TypeError, ValueError, InvalidHandleError, BackendClosedError, UnsupportedDTypeError,
                  kp.VulkanError)
RUNTIME_ERRORS = (TypeError, ValueError, IndexError, RuntimeError, kp.VulkanError)


def no_validation_messages(mgr: kp.Manager) -> None:
    msgs = mgr.validation_messages()
    assert not msgs, "validation layer reported:\n" + "\n".join(msgs[:5])


# --- the backend ---------------------------------------------------------------------------------

_BACKENDS: dict[str, object] = {}


def backends() -> tuple[VulkanBackend, NumpyBackend, VulkanBackend, VulkanBackend]:
    """(vulkan, numpy, a second vulkan backend, a closed one), made once per process."""
    if not _BACKENDS:
        closed = VulkanBackend(validation=VALIDATION)
        closed.close()
        _BACKENDS.update(vk=VulkanBackend(validation=VALIDATION), np=NumpyBackend(),
                         other=VulkanBackend(validation=VALIDATION), closed=closed)
    b = _BACKENDS
    return b["vk"], b["np"], b["other"], b["closed"]  # type: ignore[return-value]


INTS = st.sampled_from([-1, 0, 1, 2, 3, 4, 5, 8, 16, 17, 32, 64, 100, 256, 1000, 2**32, 2**40])
ODD = st.sampled_from([True, 1.5, "4", None, np.int64(4), np.float32(1.0)])
ARG = st.one_of(INTS, INTS, INTS, ODD)
# buffer slots: 0-3 live buffers, then a freed one, one of another backend, a made-up handle,
# and a handle of a closed backend
SLOT = st.integers(0, 7)
OPS = {
    "silu": ("b", "b", "i"), "add": ("b", "b", "b", "i"), "element_mul": ("b", "b", "b", "i"),
    "softmax": ("b", "b", "i"), "rms_norm": ("b", "b", "b", "i", "f"), "matmul": ("b", "b", "b", "i", "i", "i"),
    "copy_buffer": ("b", "b", "i"), "copy_buffer_offset": ("b", "b", "i", "i", "i"),
    "rope": ("b", "b", "i", "i", "f", "i", "i"),
    "attn_score": ("b", "b", "b", "i", "i", "i", "i", "i"),
    "attn_value": ("b", "b", "b", "i", "i", "i", "i", "i"),
    "copy_to_device": ("d", "b"), "copy_from_device": ("b", "o"), "free": ("b",), "synchronize": (),
    "closed": ("b", "b", "i"),  # silu on a closed backend
}
FLOATS = st.sampled_from([1e-5, 0.0, 1.0, 10000.0, -1.0, float("nan"), float("inf"), 3e38, 1e39])


@st.composite
def backend_program(draw):
    sizes = draw(st.lists(st.sampled_from([4, 12, 64, 256, 1024, 4096]), min_size=4, max_size=4))
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(sorted(OPS)))
        args = []
        for kind in OPS[op]:
            if kind == "b":
                args.append(("b", draw(SLOT)))
            elif kind == "i":
                args.append(("v", draw(ARG)))
            elif kind == "f":
                args.append(("v", draw(FLOATS)))
            elif kind == "d":
                args.append(("d", draw(st.sampled_from([0, 4, 8, 64, 4096, 5000]))))
            else:
                args.append(("o", draw(st.sampled_from([0, 4, 8, 64, 4096, 5000]))))
        steps.append((op, args))
    return sizes, steps


def _resolve(args, handles, data_seed: int):
    out = []
    for kind, v in args:
        if kind == "b":
            out.append(handles[v])
        elif kind == "v":
            out.append(v)
        elif kind == "d":
            out.append(np.random.default_rng(data_seed).uniform(-1, 1, v // 4).astype(np.float32).tobytes() + b"\0" * (v % 4))
        else:
            out.append(bytearray(v))
    return out


@SETTINGS
@given(backend_program())
def test_backend_ops_raise_a_documented_error_or_match_numpy(program):
    vkb, npb, other, closed = backends()
    sizes, steps = program
    rng = np.random.default_rng(1)
    pairs = []
    for size in sizes:
        data = rng.uniform(-1, 1, size // 4).astype(np.float32)
        hv, hn = vkb.allocate(size), npb.allocate(size)
        vkb.copy_to_device(data, hv)
        npb.copy_to_device(data, hn)
        pairs.append((hv, hn))
    fv, fn = vkb.allocate(64), npb.allocate(64)
    vkb.free(fv)
    npb.free(fn)
    foreign = other.allocate(64)
    fake = BufferHandle(10**9, 64)
    vk_handles = [p[0] for p in pairs] + [fv, foreign, fake, BufferHandle(fv.id, 64)]
    np_handles = [p[1] for p in pairs] + [fn, foreign, fake, BufferHandle(fn.id, 64)]
    try:
        for n, (op, args) in enumerate(steps):
            if op == "closed":
                try:
                    closed.silu(*_resolve(args, vk_handles, n))
                except BackendClosedError:
                    continue
                raise AssertionError("a closed backend accepted silu")
            got_vk = got_np = None
            out_vk = out_np = None
            try:
                a = _resolve(args, vk_handles, n)
                getattr(vkb, op)(*a)
                out_vk = [x for x in a if isinstance(x, bytearray)]
            except BACKEND_ERRORS as e:
                got_vk = e
            try:
                a = _resolve(args, np_handles, n)
                getattr(npb, op)(*a)
                out_np = [x for x in a if isinstance(x, bytearray)]
            except BACKEND_ERRORS as e:
                got_np = e
            if (got_vk is None) != (got_np is None):
                # only the Vulkan backend's device limits may refuse what NumPy accepts
                assert got_vk is not None and ("maxStorageBufferRange" in str(got_vk) or "beyond the Vulkan" in str(got_vk)
                                               or isinstance(got_vk, kp.OutOfDeviceMemoryError)), \
                    f"step {n} {op}: vulkan {got_vk!r}, numpy {got_np!r}"
                return  # the two states differ from here on
            if got_vk is not None:
                assert type(got_vk) is type(got_np), f"step {n} {op}: vulkan {got_vk!r}, numpy {got_np!r}"
                continue
            for bv, bn in zip(out_vk, out_np):
                assert _close(bytes(bv), bytes(bn)), f"step {n} {op}: read back differs"
            if op == "free":
                return  # the pools' liveness now differs by design of this driver: stop here
        for hv, hn in pairs:
            bv, bn = bytearray(hv.size_bytes), bytearray(hn.size_bytes)
            vkb.copy_from_device(hv, bv)
            npb.copy_from_device(hn, bn)
            assert _close(bytes(bv), bytes(bn)), f"buffer of {hv.size_bytes} bytes differs after {steps}"
    finally:
        for hv, hn in pairs:
            for b, h in ((vkb, hv), (npb, hn)):
                if h in b.live_buffers():
                    b.free(h)
        other.free(foreign)
        vkb.synchronize()
        no_validation_messages(vkb.manager)


def _close(a: bytes, b: bytes) -> bool:
    x = np.frombuffer(a[: len(a) // 4 * 4], np.float32).astype(np.float64)
    y = np.frombuffer(b[: len(b) // 4 * 4], np.float32).astype(np.float64)
    both_nan = np.isnan(x) & np.isnan(y)
    ok = both_nan | np.isclose(x, y, rtol=2e-4, atol=2e-5) | (np.isinf(x) & (x == y))
    return bool(ok.all()) and a[len(a) // 4 * 4:] == b[len(b) // 4 * 4:]


# --- the runtime -----------------------------------------------------------------------------------

_MGRS: dict[str, kp.Manager] = {}


def managers() -> tuple[kp.Manager, kp.Manager]:
    if not _MGRS:
        _MGRS.update(a=kp.Manager(validation=VALIDATION), b=kp.Manager(validation=VALIDATION))
    return _MGRS["a"], _MGRS["b"]


DTYPES = [np.float32, np.float64, np.int32, np.uint32, np.uint8, np.int8, np.float16, np.int16, np.uint16,
          np.int64, np.uint64, np.bool_]
OFFSETS = st.one_of(st.integers(-8, 600), st.sampled_from([2**31, 2**64, True, 1.0, "3"]))


@st.composite
def runtime_program(draw):
    tensors = [(draw(st.sampled_from(DTYPES)), draw(st.integers(1, 160)),
                draw(st.sampled_from([kp.TensorTypes.device, kp.TensorTypes.storage, kp.TensorTypes.host])))
               for _ in range(3)]
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        op = draw(st.sampled_from(["write", "read", "copy_region", "fill", "destroy", "sync", "foreign"]))
        steps.append((op, draw(st.integers(0, 2)), draw(st.integers(0, 2)), draw(OFFSETS), draw(OFFSETS),
                       draw(st.one_of(st.integers(-4, 700), st.sampled_from([2**40, None])))))
    return tensors, steps


@SETTINGS
@given(runtime_program())
def test_runtime_transfers_raise_a_documented_error_or_match_a_byte_model(program):
    mgr, other = managers()
    specs, steps = program
    rng = np.random.default_rng(2)
    tensors, model = [], []
    for dtype, n, ttype in specs:
        data = rng.integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8).view(dtype)
        if dtype is np.bool_:
            data = data.astype(np.uint8).view(np.bool_) & True
        t = mgr.tensor_t(data, ttype)
        seq = mgr.sequence()
        seq.eval(kp.OpTensorFill(t, 0) if ttype == kp.TensorTypes.storage else kp.OpTensorSyncDevice([t]))
        seq.destroy()
        tensors.append(t)
        # storage tensors ignore their initial data: zero-filled above
        model.append(np.zeros(t.nbytes(), np.uint8) if ttype == kp.TensorTypes.storage
                     else data.reshape(-1).view(np.uint8).copy())
    alien = other.tensor([1.0, 2.0, 3.0])
    seq = mgr.sequence()
    try:
        for op, i, j, off_a, off_b, size in steps:
            src, dst = tensors[i], tensors[j]
            try:
                if op == "write":
                    n = size if isinstance(size, int) and 0 <= size < 4096 else 3
                    payload = rng.integers(0, 256, n, dtype=np.uint8)
                    seq.eval(kp.OpTensorWrite(dst, payload, off_a))
                    model[j][off_a:off_a + n] = payload
                elif op == "read":
                    n = size if isinstance(size, int) and 0 <= size < 4096 else 3
                    out = bytearray(n)
                    seq.eval(kp.OpTensorRead(src, out, off_a))
                    assert bytes(out) == model[i][off_a:off_a + n].tobytes(), f"read of {n} bytes at {off_a} differs"
                elif op == "copy_region":
                    seq.eval(kp.OpTensorCopyRegion(src, dst, off_a, off_b, size))
                    model[j][off_b:off_b + size] = model[i][off_a:off_a + size].copy()
                elif op == "fill":
                    seq.eval(kp.OpTensorFill(dst, 0xA5A5A5A5, off_a, size))
                    total = (dst.nbytes() + 3) // 4 * 4
                    end = min(dst.nbytes(), off_a + (total - off_a if size is None else size))
                    model[j][off_a:end] = 0xA5
                elif op == "destroy":
                    tensors[i].destroy()
                elif op == "sync":
                    seq.eval(kp.OpTensorSyncLocal([src]))
                    if src.tensor_type() != kp.TensorTypes.storage:
                        assert bytes(src.data().reshape(-1).view(np.uint8)) == model[i].tobytes(), "sync differs"
                else:
                    seq.eval(kp.OpTensorCopy([src, alien]))
                    raise AssertionError("a tensor of another Manager was accepted")
            except RUNTIME_ERRORS:
                if seq.is_running():
                    seq.eval_await()
        assert mgr.get_stats()["sequences"] >= 1
    finally:
        seq.destroy()
        alien.destroy()
        for t in tensors:
            t.destroy()
        no_validation_messages(mgr)
        no_validation_messages(other)


# --- SPIR-V ------------------------------------------------------------------------------------------

MODULES = ["case_mul.float32.spv", "elementwise.add.spv", "copy.words.spv"]


@st.composite
def mutated_module(draw):
    name = draw(st.sampled_from(MODULES))
    data = (SPV / name).read_bytes()
    words = list(struct.unpack(f"<{len(data) // 4}I", data))
    for _ in range(draw(st.integers(1, 3))):
        # half of the mutations hit the header and the module's first instructions (capabilities,
        # entry point, execution modes), where a reader of the module is most exposed
        i = draw(st.one_of(st.integers(0, min(40, len(words) - 1)), st.integers(0, len(words) - 1)))
        how = draw(st.sampled_from(["random", "bit", "small", "drop", "dup"]))
        if how == "random":
            words[i] = draw(st.integers(0, 2**32 - 1))
        elif how == "bit":
            words[i] ^= 1 << draw(st.integers(0, 31))
        elif how == "small":
            words[i] = draw(st.integers(0, 70))
        elif how == "drop" and len(words) > 6:
            del words[i]
        else:
            words.insert(i, words[i])
    return name, struct.pack(f"<{len(words)}I", *words)


@SETTINGS
@given(mutated_module())
def test_mutated_spirv_is_refused_with_a_message_or_builds(module):
    mgr, _ = managers()
    name, spirv = module
    # the three modules bind three, three and two buffers
    tensors = [mgr.tensor(np.zeros(64, np.float32)) for _ in range(2 if name.startswith("copy") else 3)]
    log = os.environ.get("KBENCH_PROPERTY_LOG")
    if log:  # the module about to be handed over, for a crash that leaves no report
        Path(log).write_bytes(spirv)
    try:
        algo = mgr.algorithm(tensors, spirv, (1, 1, 1))
    except (ValueError, TypeError, kp.VulkanError):
        pass  # refused before or by the driver, with a message
    else:
        # built: a valid module may still loop or write out of bounds, so it is not run here
        algo.destroy()
    finally:
        for t in tensors:
            t.destroy()
        no_validation_messages(mgr)
