"""Case declarations of the backend API around the ops: copies, allocate and free, device info,
issue order and the host's issue rate."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import references as ref
from .base import Arrays, Case, CaseFailure, Params
from .buffers import BackendBuffers
from .compare import GUARD_BYTES, check_guards, guard_pattern
from .op_helpers import (DEFAULT_MAX_COPY, ELEMENTWISE_TOL, MiB, over_default, read_back, sizes, sync_read, teardown,
                         uniform)


# --------------------------------------------------------------------------- copies and memory

def _bytes_generate(key: str):
    def generate(p: Params, rng: np.random.Generator) -> Arrays:
        return {"src": rng.integers(0, 256, int(p[key]), dtype=np.uint8)}
    return generate


def _copy_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "src": bufs.upload(inp["src"]), "dst": bufs.guarded(int(p["size"]))}


def _copy_collect(t: Any, s: dict, p: Params) -> Arrays:
    t.backend.synchronize()
    return {"dst": s["bufs"].read_guarded(s["dst"], "dst")}


COPY_SIZES_VALIDATE = (1, 4, 13, 4096, (1 << 20) + 3)
COPY_SIZES_BENCH = (4 * MiB, 64 * MiB, 1024 * MiB)

COPY_BUFFER = Case(
    name="copy_buffer", layer="backend", description="device copy of `size` bytes, offset 0 to 0",
    generate=_bytes_generate("size"), reference=lambda inp, p: {"dst": inp["src"]},
    setup=_copy_setup,
    launch=lambda t, s, p: t.backend.copy_buffer(s["src"], s["dst"].handle, int(p["size"])),
    collect=_copy_collect, teardown=teardown,
    validate_sizes=sizes("size", COPY_SIZES_VALIDATE), bench_sizes=sizes("size", COPY_SIZES_BENCH),
    full_only=over_default("size", DEFAULT_MAX_COPY), quick={"size": DEFAULT_MAX_COPY},
    ops=("copy_buffer",), comparison="exact",
    buffers=lambda p: {"src": int(p["size"]), "dst": int(p["size"])}, peak="buffer_copy",
)


def _cbo_generate(p: Params, rng: np.random.Generator) -> Arrays:
    return {"src": rng.integers(0, 256, int(p["src_off"]) + int(p["size"]) + 64, dtype=np.uint8)}


def _cbo_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "src": bufs.upload(inp["src"]),
            "dst": bufs.guarded(int(p["size"]), lead=int(p["dst_off"]))}


def _cbo_launch(t: Any, s: dict, p: Params) -> None:
    t.backend.copy_buffer_offset(s["src"], s["dst"].handle, int(p["src_off"]), int(p["dst_off"]), int(p["size"]))


COPY_BUFFER_OFFSET = Case(
    name="copy_buffer_offset", layer="backend",
    description="device copy between byte offsets (KV-cache writes); bytes around the target stay",
    generate=_cbo_generate,
    reference=lambda inp, p: {"dst": inp["src"][int(p["src_off"]):int(p["src_off"]) + int(p["size"])]},
    setup=_cbo_setup, launch=_cbo_launch, collect=_copy_collect, teardown=teardown,
    validate_sizes=tuple({"src_off": a, "dst_off": b, "size": n} for a, b, n in (
        (0, 0, 4), (4, 12, 400), (3, 5, 17), (4096, 8, 65536), (0, 1024, 1))),
    bench_sizes=({"src_off": 4096, "dst_off": 8192, "size": 64 * MiB},
                 {"src_off": 0, "dst_off": 4096 * 16, "size": 8 * 128 * 4}),
    ops=("copy_buffer_offset",), comparison="exact",
    bytes_moved=lambda p: 2 * int(p["size"]), footprint=lambda p: 2 * int(p["size"]) + int(p["src_off"]) + int(p["dst_off"]),
    largest_buffer=lambda p: int(p["size"]) + max(int(p["src_off"]), int(p["dst_off"])) + GUARD_BYTES,
    peak="buffer_copy",
)


def _roundtrip_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    n = int(p["size"])
    dev = bufs.guarded(n)  # guard after: copy_to_device of n bytes must not write past them
    host = guard_pattern(n + 2 * GUARD_BYTES)  # host guards: copy_from_device must stay in its view
    return {"bufs": bufs, "dev": dev, "host": host}


def _roundtrip_collect(t: Any, s: dict, p: Params) -> Arrays:
    bufs: BackendBuffers = s["bufs"]
    n = int(p["size"])
    t.backend.synchronize()
    host = s["host"]
    t.backend.copy_from_device(s["dev"].handle, host[GUARD_BYTES:GUARD_BYTES + n])
    check_guards(host, GUARD_BYTES, GUARD_BYTES + n, "host buffer of copy_from_device")
    bufs.read_guarded(s["dev"], "device buffer of copy_to_device")
    return {"data": host[GUARD_BYTES:GUARD_BYTES + n].copy()}


def _roundtrip_setup_with_upload(t: Any, inp: Arrays, p: Params) -> dict:
    s = _roundtrip_setup(t, inp, p)
    s["src"] = inp["src"]
    return s


COPY_ROUNDTRIP = Case(
    name="copy_roundtrip", layer="backend",
    description="copy_to_device then copy_from_device of random bytes; guards on device and host",
    generate=_bytes_generate("size"), reference=lambda inp, p: {"data": inp["src"]},
    setup=_roundtrip_setup_with_upload,
    launch=lambda t, s, p: t.backend.copy_to_device(s["src"], s["dev"].handle),
    collect=_roundtrip_collect, teardown=teardown,
    validate_sizes=sizes("size", COPY_SIZES_VALIDATE), bench_sizes=sizes("size", (4 * MiB, 64 * MiB, 512 * MiB)),
    full_only=over_default("size", DEFAULT_MAX_COPY), quick={"size": DEFAULT_MAX_COPY},
    ops=("copy_to_device", "copy_from_device"), comparison="exact",
    bytes_moved=lambda p: int(p["size"]), footprint=lambda p: int(p["size"]),
    largest_buffer=lambda p: int(p["size"]), peak="h2d",
)


def _alloc_setup(t: Any, inp: Arrays, p: Params) -> dict:
    return {"bufs": BackendBuffers(t.backend)}


def _alloc_launch(t: Any, s: dict, p: Params) -> None:
    s["h"] = s["bufs"].alloc(int(p["size"]))


def _alloc_collect(t: Any, s: dict, p: Params) -> Arrays:
    t.backend.synchronize()
    return {"data": s["bufs"].read(s["h"], int(p["size"]))}


ALLOCATE = Case(
    name="allocate", layer="backend", description="a new buffer reads back as zeros",
    generate=lambda p, rng: {}, reference=lambda inp, p: {"data": np.zeros(int(p["size"]), np.uint8)},
    setup=_alloc_setup, launch=_alloc_launch, collect=_alloc_collect, teardown=teardown,
    validate_sizes=sizes("size", (1, 3, 4096, (1 << 20) + 1)),
    ops=("allocate",), comparison="exact",
    footprint=lambda p: int(p["size"]), largest_buffer=lambda p: int(p["size"]),
)


def _expect_raises(what: str, fn) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - any clear Python exception is the expected behaviour
        return
    raise CaseFailure(f"{what} did not raise")


def _free_collect(t: Any, s: dict, p: Params) -> Arrays:
    b = t.backend
    bufs: BackendBuffers = s["bufs"]
    h = bufs.alloc(64)
    b.free(h)
    bufs.forget(h)
    _expect_raises("copy_from_device on a freed buffer", lambda: b.copy_from_device(h, np.zeros(64, np.uint8)))
    _expect_raises("free of an already freed buffer", lambda: b.free(h))
    _expect_raises("silu on a freed buffer", lambda: b.silu(h, h, 4))
    # the backend still works after the errors
    h2 = bufs.upload(np.arange(4, dtype=np.float32))
    got = bufs.read(h2, 16).view(np.float32)
    if not np.array_equal(got, np.arange(4, dtype=np.float32)):
        raise CaseFailure(f"backend unusable after rejected calls: read back {got}")
    return {}


FREE = Case(
    name="free", layer="backend",
    description="free releases a buffer; using or freeing it again raises a clear error",
    generate=lambda p, rng: {}, reference=lambda inp, p: {},
    setup=_alloc_setup, launch=lambda t, s, p: None, collect=_free_collect, teardown=teardown,
    validate_sizes=({},), ops=("free",), comparison="check",
)


def _info_collect(t: Any, s: dict, p: Params) -> Arrays:
    b = t.backend
    name = b.name()
    if not isinstance(name, str) or not name:
        raise CaseFailure(f"name() must be a non-empty string, got {name!r}")
    info = b.device_info()
    fields = info if isinstance(info, dict) else getattr(info, "__dict__", {}) or {
        k: getattr(info, k) for k in dir(info) if not k.startswith("_")}
    if not fields:
        raise CaseFailure(f"device_info() returned nothing usable: {info!r}")
    memory = [v for k, v in fields.items() if "memory" in k and isinstance(v, (int, np.integer))]
    if memory and min(memory) < 0:
        raise CaseFailure(f"device_info() memory must be >= 0, got {memory}")
    b.synchronize()  # with nothing issued it returns at once
    return {}


DEVICE_INFO = Case(
    name="device_info", layer="backend", description="name(), device_info() and an idle synchronize()",
    generate=lambda p, rng: {}, reference=lambda inp, p: {},
    setup=lambda t, inp, p: {}, launch=lambda t, s, p: None, collect=_info_collect,
    validate_sizes=({},), ops=("name", "device_info", "synchronize"), comparison="check",
)


def _order_generate(p: Params, rng: np.random.Generator) -> Arrays:
    return {"a": uniform(rng, p["size"]), "b": uniform(rng, p["size"])}


def _order_reference(inp: Arrays, p: Params) -> Arrays:
    a, b = inp["a"].copy(), inp["b"]
    for _ in range(int(p["repeats"])):  # float32 steps, as the device does them
        a = (a + b).astype(np.float32)
    return {"out": a}


def _order_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "b": bufs.upload(inp["b"]), "out": bufs.guarded(inp["a"].nbytes, payload=inp["a"])}


def _order_launch(t: Any, s: dict, p: Params) -> None:
    out = s["out"].handle
    for _ in range(int(p["repeats"])):
        t.backend.add(out, s["b"], out, int(p["size"]))


ORDERING = Case(
    name="ordering", layer="backend",
    description="a chain of dependent in-place adds sees every earlier result (issue order, synchronize)",
    generate=_order_generate, reference=_order_reference, setup=_order_setup, launch=_order_launch,
    collect=read_back("out"), teardown=teardown,
    validate_sizes=({"size": 1000, "repeats": 8}, {"size": 70001, "repeats": 3}),
    ops=("add", "synchronize"), tolerance=0.0, comparison="exact",
    bytes_moved=lambda p: 12 * int(p["size"]) * int(p["repeats"]),
    footprint=lambda p: 8 * int(p["size"]), largest_buffer=lambda p: 4 * int(p["size"]),
)


def _issue_setup(t: Any, inp: Arrays, p: Params) -> dict:
    bufs = BackendBuffers(t.backend)
    return {"bufs": bufs, "a": bufs.upload(inp["a"]), "b": bufs.upload(inp["b"]), "out": bufs.guarded(4 * int(p["size"]))}


def _issue_launch(t: Any, s: dict, p: Params) -> None:
    add, a, b, out, n = t.backend.add, s["a"], s["b"], s["out"].handle, int(p["size"])
    for _ in range(int(p["ops"])):
        add(a, b, out, n)


ISSUE_RATE = Case(
    name="issue_rate", layer="backend",
    description="host cost of issuing ops through the Python API: `ops` tiny independent adds per call "
                "(ops per second = ops / time per call)",
    generate=lambda p, rng: {"a": uniform(rng, p["size"]), "b": uniform(rng, p["size"])},
    reference=lambda inp, p: {"out": ref.f64(inp["a"]) + ref.f64(inp["b"])},
    setup=_issue_setup, launch=_issue_launch,
    collect=read_back("out"), teardown=teardown,
    validate_sizes=({"size": 64, "ops": 16},), bench_sizes=({"size": 64, "ops": 1000},),
    ops=("add",), tolerance=ELEMENTWISE_TOL,
    bytes_moved=lambda p: 12 * int(p["size"]) * int(p["ops"]),
    footprint=lambda p: 12 * int(p["size"]), largest_buffer=lambda p: 4 * int(p["size"]),
)


#: the backend-API cases in report order
BACKEND_API_CASES: tuple[Case, ...] = (
    COPY_BUFFER, COPY_BUFFER_OFFSET, COPY_ROUNDTRIP, ALLOCATE, FREE, DEVICE_INFO, ORDERING, ISSUE_RATE,
)
