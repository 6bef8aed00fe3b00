"""Run one case instance on a target: check it, optionally time it, return its result record.

This is the single place where a declaration meets a device; the runner (worker subprocess),
the pytest suites and the CLI all call `run_instance`.
"""

from __future__ import annotations

import time
import traceback
import zlib
from contextlib import contextmanager
from typing import Any

import numpy as np

from kbench.cases.base import CaseFailure, Instance
from kbench.cases.compare import Verdict, judge_exact, judge_nmse
from kbench.results.records import case_record, phase_fields

from . import host_cache
from .clocks import read_clocks
from .targets import Lane, Target
from .timing import CPU_POLICY, GPU_POLICY, Phases, TimingPolicy, host_samples, stats, throughput

#: kbench feature keys -> the Vulkan feature a user would look for
VULKAN_FEATURE_NAMES = {
    "float64": "shaderFloat64", "int64": "shaderInt64", "int16": "shaderInt16",
    "float16": "shaderFloat16", "int8": "shaderInt8",
    "storage_buffer_8bit": "storageBuffer8BitAccess", "storage_buffer_16bit": "storageBuffer16BitAccess",
    "subgroup_arithmetic": "subgroup arithmetic", "cooperative_matrix": "VK_KHR_cooperative_matrix",
}

#: exception class names that mean "this device/backend cannot do it" rather than "it broke"
UNSUPPORTED_EXCEPTIONS = {"UnsupportedCase", "UnsupportedFeatureError", "UnsupportedDTypeError"}

STATUS_ORDER = ("pass", "xfail", "unsupported", "fail", "error")


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def device_memory_bytes(props: dict[str, Any]) -> int | None:
    """Sum of device-local heaps (or None when the properties do not say)."""
    heaps = props.get("memory_heaps")
    if not heaps:
        return props.get("memory_bytes")
    total = 0
    for h in heaps:
        flags = h.get("flags", 0)
        local = h.get("device_local", bool(flags & 1) if isinstance(flags, int) else "DEVICE_LOCAL" in str(flags))
        if local:
            total += int(h.get("size", 0))
    return total or None


def unsupported_reason(inst: Instance, target: Target, max_bytes: int | None = None) -> str:
    """Why `inst` cannot run on `target` (missing feature, too big), or "" when it can."""
    case = inst.case
    lane = target.lanes[0]
    if case.layer == "backend" and lane.backend is None:
        return f"backend cases need a ComputeBackend; the {target.backend_name} target has none"
    if case.layer in ("runtime", "peak") and lane.manager is None:
        return f"runtime cases need the kbench.runtime Vulkan manager; the {target.backend_name} backend has none"
    features = target.features
    missing = [f for f in inst.features if not features.get(f, False)]
    if missing:
        names = ", ".join(f"{VULKAN_FEATURE_NAMES.get(f, f)} ({f})" for f in missing)
        return f"missing device feature: {names}"
    return size_reason(inst, target.props, max_bytes, len(target.lanes))


def size_reason(inst: Instance, props: dict[str, Any], max_bytes: int | None = None, lanes: int = 1) -> str:
    """Why `inst` is too big for the device `props` describe (a buffer over its
    maxStorageBufferRange, more memory than it has, over `max_bytes`), or "" when it fits."""
    case = inst.case
    largest = int(case.largest_buffer(inst.params))
    limit = props.get("max_storage_buffer_range")
    if largest and limit and largest > int(limit):
        return (f"needs a {_fmt_bytes(largest)} buffer; the device's maxStorageBufferRange is "
                f"{_fmt_bytes(int(limit))}")
    need = int(case.footprint(inst.params)) * lanes
    memory = device_memory_bytes(props)
    # leave a quarter of the memory to the driver, staging and other allocations
    if need and memory and need > 0.75 * memory:
        return f"needs {_fmt_bytes(need)} of device memory; the device has {_fmt_bytes(memory)}"
    if need and max_bytes is not None and need > max_bytes:
        return f"needs {_fmt_bytes(need)}, over the size limit of {_fmt_bytes(max_bytes)} for this device (--max-bytes)"
    return ""


#: bench on a CPU device (lavapipe) reports instances needing more memory than this as
#: unsupported unless a limit is given: it keeps CPU-driver benchmark runs quick
CPU_BENCH_MAX_BYTES = 16 << 20


def default_max_bytes(props: dict[str, Any], mode: str) -> int | None:
    """The size limit applied when none is given: CPU_BENCH_MAX_BYTES for bench on CPU devices."""
    if mode == "bench" and str(props.get("device_type", "")).lower() == "cpu":
        return CPU_BENCH_MAX_BYTES
    return None


def shard_seed(seed: int, case_id: str, lane: int) -> list[int]:
    """Seed sequence for one shard: stable across runs and machines."""
    return [int(seed), zlib.crc32(case_id.encode()), int(lane)]


def base_record(inst: Instance, target: Target, mode: str) -> dict[str, Any]:
    """The case record of `inst` on `target` before it ran (status "error" until it does)."""
    return case_record(
        inst.case.name, inst.params, case_id=inst.case_id, mode=mode, backend=target.backend_name,
        queue_config=target.queue_config, queues=target.queues, layer=inst.case.layer,
        lanes=len(target.lanes), bytes=inst.bytes_moved or None, flops=inst.flops or None)


def _judge(inst: Instance, outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> Verdict:
    case = inst.case
    kind = case.comparison_for(inst.params)
    if kind == "exact":
        return judge_exact(outputs, reference)
    if kind == "check":
        return Verdict(True, "", {})
    return judge_nmse(outputs, reference, case.tolerance_for(inst.params))


def _wait(inst: Instance, lane: Lane, state: Any) -> None:
    if inst.case.wait is not None:
        inst.case.wait(lane, state, inst.params)
    else:
        lane.backend.synchronize()


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """(status, reason) for an exception raised while running a case."""
    name = type(exc).__name__
    if isinstance(exc, CaseFailure):
        return "fail", str(exc) or name
    if name in UNSUPPORTED_EXCEPTIONS:
        return "unsupported", f"{name}: {exc}"
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    return "error", f"{name}: {exc}{where}"


def run_instance(inst: Instance, target: Target, mode: str = "validate", *, seed: int = 0,
                 policy: TimingPolicy | None = None, max_bytes: int | None = None,
                 samples: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """Check `inst` on every lane of `target` (and time it when mode == "bench").

    ``samples``, when given, receives the timed samples themselves (ns per call: "gpu" where GPU
    timestamps were read, and "host"), which the record only summarises (the pytest suite hands
    them to pytest-benchmark).

    Returns a case record (see results/SCHEMA.md) with status pass / fail / unsupported / error.
    `max_bytes` None means default_max_bytes (a cap for bench on CPU devices only).
    Never raises for problems of the case itself; KeyboardInterrupt propagates.
    """
    if mode not in ("validate", "bench"):
        raise ValueError(f"mode must be 'validate' or 'bench', got {mode!r}")
    t0 = time.perf_counter()
    phases = Phases()
    rec = base_record(inst, target, mode)
    try:
        return _run_instance(inst, target, mode, rec, phases, seed, policy, max_bytes, samples)
    finally:
        rec.update(phase_fields(time.perf_counter() - t0, phases.seconds))


def _run_instance(inst: Instance, target: Target, mode: str, rec: dict[str, Any], phases: Phases, seed: int,
                  policy: TimingPolicy | None, max_bytes: int | None,
                  samples: dict[str, list[float]] | None) -> dict[str, Any]:
    if max_bytes is None:
        max_bytes = default_max_bytes(target.props, mode)
    why = unsupported_reason(inst, target, max_bytes)
    if why:
        rec.update(status="unsupported", reason=why)
        return rec
    case, params = inst.case, inst.params
    states: list[tuple[Lane, Any]] = []
    managers = _managers(target)
    seen = [len(m.validation_messages()) for m in managers]
    try:
        shards = []
        for k, lane in enumerate(target.lanes):
            rng = np.random.default_rng(shard_seed(seed, inst.case_id, k))
            with phases("inputs"):
                inputs = host_cache.cached(host_cache.key(inst.case_id, seed, k, "inputs"),
                                           lambda: case.generate(params, rng))
            shards.append(inputs)
            with phases("setup"):
                states.append((lane, case.setup(lane, inputs, params)))
        with phases("run"):
            # issue every shard before waiting for any: the lanes' work is in flight together
            for lane, state in states:
                case.launch(lane, state, params)
            outputs = [case.collect(lane, state, params) for lane, state in states]
        verdicts = []
        for k, (inputs, out) in enumerate(zip(shards, outputs)):
            with phases("reference"):
                reference = host_cache.cached(host_cache.key(inst.case_id, seed, k, "reference"),
                                              lambda: case.reference(inputs, params))
            with phases("check"):
                v = _judge(inst, out, reference)
            del reference
            if not v.passed and len(states) > 1:
                lane = states[k][0]
                v.reason = f"lane {k} (family {lane.family} queue {lane.queue}): {v.reason}"
            verdicts.append(v)
        failed = [v for v in verdicts if not v.passed]
        metric: dict[str, float] = {}
        for v in verdicts:
            for key, val in v.metric.items():
                metric[key] = max(metric.get(key, val), val) if not np.isnan(val) else val
        rec["metric"] = metric or None
        if failed:
            rec.update(status="fail", reason=failed[0].reason)
            return rec
        rec.update(status="pass", reason="")
        if mode == "bench":
            del shards, outputs  # the checked call's host arrays: not held while timing
            _time(inst, target, states, rec, policy, samples, phases)
        return rec
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure of a case becomes its status
        status, reason = classify_exception(exc)
        rec.update(status=status, reason=reason)
        if type(exc).__name__ == "DeviceLostError":
            rec["device_lost"] = True
        return rec
    finally:
        if case.teardown is not None:
            with phases("teardown"):
                for lane, state in states:
                    try:
                        case.teardown(lane, state)
                    except Exception:  # noqa: BLE001 - the device may already be gone
                        pass
        _check_validation(rec, managers, seen)


def _managers(target: Target) -> list[Any]:
    """The distinct kbench.runtime Managers the target's lanes use (for validation messages)."""
    out: list[Any] = []
    for lane in target.lanes:
        for m in (lane.manager, getattr(lane.backend, "manager", None)):
            if m is not None and hasattr(m, "validation_messages") and all(m is not o for o in out):
                out.append(m)
    return out


def _check_validation(rec: dict[str, Any], managers: list[Any], seen: list[int]) -> None:
    """A case that made the Khronos validation layer report something did not pass: misuse of
    the API is a bug even when the numbers came out right on this driver."""
    new: list[str] = []
    for m, n in zip(managers, seen):
        try:
            new += list(m.validation_messages())[n:]
        except Exception:  # noqa: BLE001 - a destroyed or lost manager
            pass
    if not new:
        return
    rec["validation_messages"] = new[:10]
    if rec["status"] == "pass":
        rec["status"] = "fail"
        rec["reason"] = f"Vulkan validation layer reported {len(new)} message(s); first: {new[0][:500]}"


@contextmanager
def prepared(inst: Instance, target: Target, *, seed: int = 0):
    """Set the case up on every lane and yield ``run_sample(repeats)`` (issue `repeats` calls on
    every lane, then wait for all): the unit a host-side timer such as pytest-benchmark times.
    Torn down on exit."""
    case, params = inst.case, inst.params
    states: list[tuple[Lane, Any]] = []
    try:
        for k, lane in enumerate(target.lanes):
            rng = np.random.default_rng(shard_seed(seed, inst.case_id, k))
            states.append((lane, case.setup(lane, case.generate(params, rng), params)))

        def run_sample(repeats: int = 1) -> None:
            for lane, state in states:
                for _ in range(repeats):
                    case.launch(lane, state, params)
            for lane, state in states:
                _wait(inst, lane, state)

        yield run_sample
    finally:
        if case.teardown is not None:
            for lane, state in states:
                try:
                    case.teardown(lane, state)
                except Exception:  # noqa: BLE001
                    pass


def default_policy(target: Target) -> TimingPolicy:
    """Short samples on CPU devices (lavapipe, numpy), GPU policy otherwise."""
    kind = str(target.props.get("device_type", "")).lower()
    return CPU_POLICY if ("cpu" in kind or target.backend_name == "numpy") else GPU_POLICY


def _sequence_gpu_samples(inst: Instance, lane: Lane, state: Any, repeats: int,
                          policy: TimingPolicy) -> list[float] | None:
    """GPU ns per call from the timestamps of a runtime case's own sequence (state["seq"]):
    each submission's last minus first timestamp, summed over `repeats` submissions."""
    seq = state.get("seq") if isinstance(state, dict) else None
    if seq is None:
        return None
    out = []
    for _ in range(policy.samples):
        total = 0
        for _ in range(repeats):
            inst.case.launch(lane, state, inst.params)
            _wait(inst, lane, state)
            ts = seq.get_timestamps()
            if len(ts) < 2:
                return None
            total += ts[-1] - ts[0]
        out.append(total / repeats)
    return out


def _time(inst: Instance, target: Target, states: list[tuple[Lane, Any]], rec: dict[str, Any],
          policy: TimingPolicy | None, samples: dict[str, list[float]] | None = None,
          phases: Phases | None = None) -> None:
    case, params = inst.case, inst.params
    policy = policy or default_policy(target)

    def run_sample(repeats: int) -> None:
        for lane, state in states:
            for _ in range(repeats):
                case.launch(lane, state, params)
        for lane, state in states:
            _wait(inst, lane, state)

    phases = phases if phases is not None else Phases()
    clock, keeper = target.sm_clock, target.keeper
    if keeper is not None:
        keeper.pause()
    try:
        settle: dict[str, Any] = {}
        ready = clock.ready_check() if clock is not None and clock.available else None
        host, repeats = host_samples(run_sample, policy, ready=ready, info=settle,
                                     multiple=max(1, int(case.cycle(params))), phases=phases)
        seen_mhz: list[float] = []

        def watch() -> None:
            # once per sample, while (or right after) the sample's work runs
            mhz = clock.mhz() if clock is not None else None
            if mhz is not None:
                seen_mhz.append(mhz)
        lanes = len(states)
        gpu, gpu_method, replay_wall, gpu_other = None, None, None, None
        gpu_calls = repeats
        if case.layer == "runtime" and lanes == 1:
            with phases("gpu_timing"):
                gpu = _sequence_gpu_samples(inst, *states[0], repeats, policy)
            gpu_method = "sequence" if gpu else None
        elif target.gpu_timer is not None and lanes == 1:
            lane, state = states[0]
            t_gpu = time.perf_counter()
            # a fresh readiness test: the host samples may have settled on a clock their own
            # host-bound calls held low, which the GPU-bound replay must not inherit as "ready"
            got = target.gpu_timer(lane, lambda: case.launch(lane, state, params),
                                   lambda: _wait(inst, lane, state), repeats, policy,
                                   watch=watch if clock is not None else None,
                                   ready=clock.ready_check() if ready is not None else None,
                                   ops=tuple(case.ops))
            # a timer that splits its own time (the peer: eager, graph) says how; the rest is gpu_timing
            spent = time.perf_counter() - t_gpu
            own = dict(got.phases or {}) if got is not None else {}
            for name, sec in own.items():
                phases.add(name, sec)
            phases.add("gpu_timing", spent - sum(own.values()))
            if got is not None and got.ns:
                gpu, gpu_method, replay_wall, gpu_other = got.ns, got.method, got.wall_ns, got.other
                gpu_calls = got.repeats or repeats
    finally:
        if keeper is not None:
            keeper.resume()
    rec["host_ns"] = stats(host, repeats)
    if samples is not None:
        samples["host"] = [float(t) for t in host]
        if gpu:
            samples["gpu"] = [float(t) for t in gpu]
    if gpu:
        rec["gpu_ns"] = stats(gpu, gpu_calls)
        median = rec["gpu_ns"]["median"]
    else:
        rec["gpu_ns"] = None
        median = rec["host_ns"]["median"]
    # with several lanes one sample holds every lane's calls: the work per "call" is lanes x
    rec["bytes"] = inst.bytes_moved * lanes or None
    rec["flops"] = inst.flops * lanes or None
    rec.update(throughput(inst.bytes_moved * lanes, inst.flops * lanes, median))
    rec["timer"] = "gpu" if gpu else "host"
    if gpu_method:
        rec["gpu_timing"] = gpu_method
    if gpu_other:
        rec["gpu_timing_other"] = gpu_other
    if gpu:
        # a cross-check of the GPU clock against host time of the same work (which also holds
        # submission and wait overhead, so it is >= GPU time; close to 1 for long kernels); a
        # replayed sample's own wall time is that work, Python's issuing of the calls is not
        wall = replay_wall or host
        if replay_wall:
            rec["replay_wall_ns"] = stats(replay_wall, gpu_calls)
        rec["gpu_host_ratio"] = rec["gpu_ns"]["median"] / float(np.median(wall))
    clocks = read_clocks(target.props)
    if isinstance(clocks, dict):
        # the SM clock seen while the GPU-timed samples ran (read after each call is issued)
        if seen_mhz:
            clocks.update(sm_mhz_min=min(seen_mhz), sm_mhz_max=max(seen_mhz))
        clocks.update(settle)
    elif settle.get("warmup_samples"):
        rec["warmup"] = settle
    rec["clocks"] = clocks
