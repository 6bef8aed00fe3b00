"""Finding devices, choosing them with --device, and opening one in a queue configuration."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .queues import QueueConfig, queue_configs
from .targets import Lane, Target
from .timing import GpuSamples, gpu_repeats

if TYPE_CHECKING:
    from .implementations import Implementation

BACKENDS = ("vulkan", "numpy")


def numpy_properties() -> dict[str, Any]:
    """Device-properties stand-in for the NumPy backend (the host CPU, every feature)."""
    from kbench.backend import NumpyBackend

    info = NumpyBackend().device_info()
    feats = ("float64", "int64", "int16", "float16", "int8", "storage_buffer_8bit", "storage_buffer_16bit")
    return {
        "index": 0, "device_name": info.name, "vendor_name": "cpu", "vendor_id": 0, "device_id": 0,
        "device_type": "cpu", "driver_name": "numpy", "driver_info": f"numpy on {platform.machine()}",
        "driver_version": "", "api_version": "",
        "queue_families": [{"index": 0, "flags": ["compute"], "count": 1, "timestamp_valid_bits": 0}],
        "features": {f: True for f in feats}, "memory_bytes": info.memory_bytes,
        "timestamps_supported": False,
    }


def enumerate_devices(backend: str = "vulkan") -> list[dict[str, Any]]:
    """Device property dicts (the runtime's list_devices()) for `backend`."""
    if backend == "numpy":
        return [numpy_properties()]
    if backend == "vulkan":
        import kbench.runtime as kp

        devices = kp.list_devices()
        for i, d in enumerate(devices):
            d.setdefault("index", i)
        return devices
    raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")


def describe(props: dict[str, Any]) -> str:
    return f"{props.get('index', '?')}: {props.get('device_name', '?')} ({props.get('vendor_name', '?')}, {props.get('driver_name', '?')})"


def select_devices(devices: list[dict[str, Any]], spec: str | None) -> list[dict[str, Any]]:
    """The devices `spec` names: None/"all" = every device; otherwise comma-separated items,
    each an index, a vendor name ("nvidia", "mesa"), or a substring of the device or driver name
    (case-insensitive). Raises ValueError listing the devices when an item matches none."""
    if not devices:
        raise ValueError("no device found (is a Vulkan driver such as mesa-vulkan-drivers installed?)")
    if spec is None or spec.strip().lower() in ("", "all"):
        return list(devices)
    chosen: list[dict[str, Any]] = []
    available = "; ".join(describe(d) for d in devices)
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if item.isdigit():
            idx = int(item)
            match = [d for d in devices if int(d.get("index", -1)) == idx]
            if not match:
                raise ValueError(f"--device {item}: no device with index {idx}; available: {available}")
        else:
            low = item.lower()
            match = [d for d in devices if low == str(d.get("vendor_name", "")).lower()
                     or low in str(d.get("device_name", "")).lower()
                     or low in str(d.get("driver_name", "")).lower()]
            if not match:
                raise ValueError(f"--device {item!r} matches no device name, vendor or driver; available: {available}")
        for d in match:
            if d not in chosen:
                chosen.append(d)
    return chosen


def backend_options() -> dict[str, Any]:
    """Extra VulkanBackend options from the environment.

    KBENCH_VALIDATION=1 turns on the validation layers; KBENCH_MATMUL_TILE=BMxBNxBKxTMxTN[xGROUP_M]
    overrides the fp32 matmul tile; KBENCH_QMATVEC=key=value[,key=value...] sets quantized_matmul
    kernel knobs (KernelPolicy.configure_qmatvec, e.g. ``layout=packed,rows=2``; values that read
    as integers or true/false become those).  The run header records these as ``backend_options``."""
    opts: dict[str, Any] = {}
    if os.environ.get("KBENCH_VALIDATION") == "1":
        opts["validation"] = True
    tile = os.environ.get("KBENCH_MATMUL_TILE", "").strip()
    if tile:
        try:
            opts["matmul_tile"] = tuple(int(v) for v in tile.lower().split("x"))
        except ValueError:
            raise ValueError(f"KBENCH_MATMUL_TILE={tile!r}: expected integers joined by 'x', "
                             "e.g. 128x128x16x8x8x8") from None
    knobs = os.environ.get("KBENCH_QMATVEC", "").strip()
    if knobs:
        opts["qmatvec"] = parse_knobs(knobs, "KBENCH_QMATVEC")
    return opts


def parse_knobs(text: str, where: str) -> dict[str, Any]:
    """``key=value[,key=value...]`` as a dict; integers and true/false converted."""
    out: dict[str, Any] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise ValueError(f"{where}={text!r}: expected key=value pairs joined by commas, e.g. layout=packed,rows=2")
        low = value.lower()
        out[key] = True if low == "true" else False if low == "false" else int(value) if value.isdigit() else value
    return out


def recorded_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The kernel-choice options of ``opts`` as the run header keeps them (JSON types)."""
    out: dict[str, Any] = {}
    if opts.get("matmul_tile"):
        out["matmul_tile"] = list(opts["matmul_tile"])
    if opts.get("qmatvec"):
        out["qmatvec"] = dict(opts["qmatvec"])
    return out


def open_target(backend: str, props: dict[str, Any], config: QueueConfig, *, kernel_set: Any = None,
                group: str = "") -> Target:
    """Open device `props` for `config`. Raises on failure (the caller records it). With
    ``kernel_set`` (kbench.foreign.KernelSet) the backend runs that set's ``group`` of kernels."""
    index = int(props.get("index", 0))
    if config.unsupported:
        raise ValueError(f"queue configuration {config.name} is not available: {config.unsupported}")
    if backend == "numpy":
        from kbench.backend import NumpyBackend

        if config.name != "single":
            raise ValueError("the numpy backend has a single queue only")
        be = NumpyBackend()
        t = Target("numpy", index, props, "single", [Lane(backend=be)])
        t.closers.append(be.close)
        return t
    if backend != "vulkan":
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    import kbench.runtime as kp
    from kbench.backend import VulkanBackend

    opts = backend_options()
    if config.name in ("single", "async"):
        # async: one op per submission and a ring of sequences, so several are in flight at once
        extra = {"batch_ops": 1, "ring_size": len(config.lanes)} if config.name == "async" else {}
        if kernel_set is not None:
            from kbench.foreign.backend import ForeignBackend

            be = ForeignBackend(kernel_set, group, device=index, **extra,
                                **{k: v for k, v in opts.items() if k != "qmatvec"})
        else:
            be = VulkanBackend(device=index, **extra, **opts)
        mgr = be.manager
        fam, q = mgr.queues[0]
        lanes = [Lane(backend=be, kp=kp, manager=mgr, queue_index=0, family=fam, queue=q) for _ in config.lanes]
        t = Target("vulkan", index, be.device_properties, config.name, lanes, gpu_timer=gpu_timer_for(be))
        t.closers.append(be.close)
        return t
    # several queues: runtime cases split across the queues; the backend runs on one queue of its
    # own Manager, so backend cases are reported unsupported in these configurations
    mgr = kp.Manager(index, list(config.family_queue_indices), **opts)
    lanes = []
    for qi, (fam, q) in enumerate(mgr.queues):
        lanes.append(Lane(backend=None, kp=kp, manager=mgr, queue_index=qi, family=fam, queue=q))
    t = Target("vulkan", index, mgr.get_device_properties(), config.name, lanes)
    t.closers.append(mgr.destroy)
    return t


def gpu_timer_for(backend: Any):
    """A GPU timer for `backend` when it offers ``measure_gpu_ns(issue) -> ns`` (issue the ops
    `issue()` makes, wait, return device time from sequence timestamps); None otherwise.

    Where the backend can also replay (``replay_gpu_ns``), a sample's calls are recorded once and
    the recording is submitted once per sample (``GpuSamples.method`` "replay"): Python issues a
    small dispatch in tens of microseconds, so kernels shorter than that would otherwise be timed
    on a GPU that idles between them and never leaves its low clocks.  A replayed sample holds as
    many calls as keep the device busy for the policy's min_sample_s (timing.gpu_repeats, from the
    least of three replayed runs of the host calibration's calls; sized again, once, on the timed
    calls where their samples came out under half of that), within the backend's
    ``replay_max_ops``.  Cases whose calls need the host midway (reads, synchronize) fall back to
    timing batches as they are issued ("stream")."""
    measure = getattr(backend, "measure_gpu_ns", None)
    if measure is None:
        return None
    replay = getattr(backend, "replay_gpu_ns", None)

    def timer(lane: Lane, launch, wait, repeats: int, policy, *, watch=None, ready=None,
              ops: tuple[str, ...] = ()) -> GpuSamples | None:
        def calls(n: int):
            def issue(on_first=None) -> None:
                for i in range(n):
                    launch()
                    if i == 0 and on_first is not None:
                        on_first()  # the first call's work is running by now
            return issue

        if replay is not None:
            # runs of the host calibration's calls say how long a call takes on the device (the least
            # of three: a first run that waits for the device's threads or clocks would size the
            # samples too short); the timed samples then hold enough calls to keep it busy for
            # policy.min_sample_s
            first = replay(calls(repeats), 3)
            if first:
                cap = getattr(backend, "replay_max_ops", None)
                max_calls = cap * repeats // first.ops if cap and first.ops else None
                n = gpu_repeats(repeats, min(first.gpu_ns) / repeats, policy, max_calls)

                def timed(n: int):  # watched after each replayed run, not while recording
                    return replay(calls(n), policy.samples, warm_until=ready, warm_max_s=policy.settle_max_s,
                                  after_run=watch)

                got = timed(n)
                if got and min(got.gpu_ns) < 0.5 * policy.min_sample_s * 1e9:
                    # a few calls can cost more each than many (a CPU driver's fixed cost per run lands
                    # in their timestamps): sized again on the timed calls, once, where that gives more
                    more = gpu_repeats(repeats, min(got.gpu_ns) / n, policy, max_calls)
                    if more > n:
                        n = more
                        got = timed(n)
                if got:
                    return GpuSamples([ns / n for ns in got.gpu_ns], "replay", [ns / n for ns in got.wall_ns],
                                      repeats=n)
        issue = calls(repeats)
        out = []
        for _ in range(policy.samples):
            ns = measure(lambda: issue(watch))
            if ns is None:
                return None
            out.append(ns / repeats)
        return GpuSamples(out, "stream")

    return timer


def configs_for(backend: str, props: dict[str, Any]) -> list[QueueConfig]:
    """Queue configurations of a device for `backend` (numpy: single only)."""
    if backend == "numpy":
        return [QueueConfig("single", (0,), ((0, 0, 0),))]
    return queue_configs(props)


# -- the built-in implementations (kbench.bench.implementations) --------------------------------

def vulkan_implementation() -> "Implementation":
    """kbench's own kernels: VulkanBackend for the backend cases, kbench.runtime for the runtime
    cases, and kbench's peak measurements."""
    from .implementations import Implementation
    from .peaks import PEAKS

    return Implementation(
        kind="vulkan", name="kbench", backend="vulkan",
        description="kbench's Vulkan kernels (VulkanBackend) and the kbench.runtime Kompute API",
        devices=lambda: enumerate_devices("vulkan"), configs=queue_configs,
        open=lambda props, config: open_target("vulkan", props, config),
        layers=("backend", "runtime"), peaks=tuple(p.name for p in PEAKS), measure_peak=_vulkan_peak,
        header=_vulkan_header)


def _vulkan_peak(target: Target, name: str) -> dict[str, Any]:
    from .peaks import get_peak, run_peak

    lane = target.lanes[0]
    return run_peak(get_peak(name), lane.kp, lane.manager, target.props)


def _vulkan_header() -> dict[str, Any]:
    chosen = recorded_options(backend_options())
    return {"backend_options": chosen} if chosen else {}


def load_foreign(declaration: str, source: str | None) -> Any:
    """The kernel set (kbench.foreign.KernelSet) a declaration file or shipped set's name and a
    source tree give, loaded and checked (every shader compiled) once per process and declaration
    text: a run builds one implementation per kernel group from it."""
    from kbench.foreign import DeclarationError, declaration_path

    path = declaration_path(declaration)
    try:
        text = path.read_bytes()
    except OSError:
        raise DeclarationError(f"{path}: no such declaration file") from None
    return _load_foreign(str(path), source, text)


@functools.lru_cache(maxsize=8)
def _load_foreign(path: str, source: str | None, _text: bytes) -> Any:
    from kbench.foreign.kernelset import load_kernel_set

    return load_kernel_set(path, source)


def foreign_implementation(declaration: str, source: str | None, group: str = "") -> "Implementation":
    """One kernel group of a declared third-party kernel set (kbench.foreign) on the Vulkan
    devices: kbench's backend cases whose ops the group declares, and its custom ops."""
    from .implementations import Implementation
    from .peaks import PEAKS

    ks = load_foreign(declaration, source)
    kernels = ks.group(group)
    # quantized_matmul instances of weight types the group has no kernel for are not planned
    dtypes = {d.name for k in kernels.get("quantized_matmul", ()) for d in k.decl.dtypes}

    def cases() -> list[Any]:
        from kbench.cases import ALL_CASES
        from kbench.foreign.cases import cases_for

        return cases_for(ks.declaration, frozenset(kernels), ALL_CASES)

    def accepts(inst: Any) -> bool:
        return "dtype" not in inst.params or inst.case.name != "quantized_matmul" or inst.params["dtype"] in dtypes

    return Implementation(
        kind="foreign", name=ks.implementation(group), backend="vulkan",
        description=f"declared kernels of {ks.declaration.path}" + (f" (group {group})" if group else ""),
        devices=lambda: enumerate_devices("vulkan"), configs=queue_configs,
        open=lambda props, config: open_target("vulkan", props, config, kernel_set=ks, group=group),
        layers=("backend", "runtime"), cases=cases, accepts=accepts,
        peaks=tuple(p.name for p in PEAKS), measure_peak=_vulkan_peak,
        header=lambda: {"foreign": ks.provenance(group)},
        args={"declaration": declaration, "source": source, "group": group})


def foreign_implementations(declaration: str | Path, source: str | Path | None) -> list["Implementation"]:
    """An implementation per kernel group of a declared set (every refusal of the declaration
    is raised here, before any GPU work)."""
    from .implementations import resolve

    ks = load_foreign(str(declaration), None if source is None else str(source))
    args = {"declaration": str(ks.declaration.path), "source": str(ks.source.path)}
    return [resolve("foreign", **args, group=group) for group in ks.groups()]


def numpy_implementation() -> "Implementation":
    """The NumPy reference backend on the host CPU (runtime cases are recorded unsupported)."""
    from .implementations import Implementation

    return Implementation(
        kind="numpy", name="numpy", backend="numpy", description="the NumPy reference backend (host CPU)",
        devices=lambda: enumerate_devices("numpy"), configs=lambda props: configs_for("numpy", props),
        open=lambda props, config: open_target("numpy", props, config), layers=("backend", "runtime"),
        describes_device=False)
