"""Worker subprocess: opens one device in one queue configuration and runs a list of cases.

Run as ``python -m kbench.bench.worker`` with a JSON job on stdin. It writes one JSON event per
line on its original stdout (everything else the process prints goes to stderr):

    {"event": "ready", "props": {...}, "queues": [[family, queue], ...]}
    {"event": "start", "case_id": "..."}
    {"event": "result", "record": {...}}        (a case record or a peak record)
    {"event": "open_failed", "reason": "..."}
    {"event": "done"}

The parent (kbench.bench.runner) enforces the per-case time limit and restarts a worker that
crashed or hung, skipping the case it was running. A lost device ends the worker (exit code 3)
so that the next case starts on a fresh device.

The job is the first line on stdin; the parent keeps stdin open for the worker's life, so the
worker ends itself when stdin reaches end of file: the parent is gone (killed, even with
SIGKILL, whose end closes the pipe). On Linux a parent-death signal backs that up.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, TextIO

EXIT_OPEN_FAILED = 2
EXIT_DEVICE_LOST = 3
#: exit status of a worker that ended because its parent went away
EXIT_ORPHANED = 4
#: the parent's pid, so that a worker whose parent died before it could ask for a parent-death
#: signal still notices
PARENT_ENV = "KBENCH_WORKER_PARENT"

#: Fault injection for testing the runner's robustness: ``hang:<glob>`` sleeps and
#: ``crash:<glob>`` aborts the worker when it starts a case whose id matches the glob.
FAULT_ENV = "KBENCH_INJECT_FAULT"


def _inject_fault(case_id: str) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    kind, _, pattern = spec.partition(":")
    if not pattern:
        return
    from kbench.cases.base import glob_match

    if glob_match(pattern, case_id):
        if kind == "hang":
            import time

            time.sleep(3600)
        elif kind == "crash":
            os.abort()


def _json_safe(value: Any) -> Any:
    from kbench.results.schema import to_json_value

    try:
        return to_json_value(value)
    except Exception:  # noqa: BLE001 - exotic property values become text
        return json.loads(json.dumps(value, default=str))


def emit(stream: TextIO, event: dict[str, Any]) -> None:
    stream.write(json.dumps(_json_safe(event), allow_nan=False) + "\n")
    stream.flush()


def run_job(job: dict[str, Any], out: TextIO) -> int:
    """Run `job` (made by kbench.bench.runner.Runner._run_config), emitting events to `out`;
    returns the exit code."""
    from kbench.results.records import case_error

    from .execute import run_instance
    from .implementations import from_job
    from .queues import QueueConfig
    from .timing import TimingPolicy

    mode = job["mode"]
    try:
        impl = from_job(job["implementation"])
        raw = job["queue_config"]
        config = QueueConfig(raw["name"], tuple(raw["family_queue_indices"]),
                             tuple(tuple(lane) for lane in raw["lanes"]), raw.get("unsupported", ""))
        target = impl.open(job["props"], config)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which records it
        emit(out, {"event": "open_failed", "reason": f"{type(exc).__name__}: {exc}"})
        return EXIT_OPEN_FAILED
    try:
        if mode == "bench":
            _watch_clocks(target, impl.backend)
        emit(out, {"event": "ready", "props": target.props, "queues": target.queues})
        policy = TimingPolicy(**job["policy"]) if job.get("policy") else None
        for name in job.get("peaks", []):
            emit(out, {"event": "start", "case_id": name})
            t0 = time.perf_counter()
            if target.keeper is not None:
                target.keeper.pause()
            try:
                rec = impl.measure_peak(target, name)
            finally:
                if target.keeper is not None:
                    target.keeper.resume()
            rec.setdefault("wall_s", round(time.perf_counter() - t0, 4))
            emit(out, {"event": "result", "record": rec})
        for cid in job["case_ids"]:
            emit(out, {"event": "start", "case_id": cid})
            _inject_fault(cid)
            inst = _instance(impl, cid, job["cases"].get(cid))
            if inst is None:
                rec = case_error(cid, mode, f"unknown case id {cid!r} for mode {mode}",
                                 queue_config=target.queue_config, queues=target.queues)
            else:
                rec = run_instance(inst, target, mode, seed=int(job.get("seed", 0)), policy=policy,
                                   max_bytes=job.get("max_bytes"))
            emit(out, {"event": "result", "record": rec})
            if rec.get("device_lost"):
                return EXIT_DEVICE_LOST
        emit(out, {"event": "done"})
        return 0
    finally:
        target.close()


def _instance(impl: Any, case_id: str, resolved: list[str] | None) -> Any:
    """The Instance the runner resolved as [case name, repr of its params] among `impl`'s cases,
    or None when the case is unknown here or its id does not come out the same."""
    import ast

    from kbench.cases import Instance

    case = impl.case(resolved[0]) if resolved else None
    if case is None:
        return None
    try:
        inst = Instance(case, ast.literal_eval(resolved[1]))
    except (ValueError, SyntaxError):
        return None
    return inst if inst.case_id == case_id else None


#: set to 0 to run without the ClockKeeper (the GPU then idles between measurements)
KEEPER_ENV = "KBENCH_CLOCK_KEEPER"


def _watch_clocks(target: Any, backend: str) -> None:
    """Give a bench target its live clock reader and, for Vulkan GPUs whose clock can be read,
    a ClockKeeper (see kbench.bench.clocks)."""
    from .clocks import ClockKeeper, SmClock

    clock = SmClock(target.props)
    target.sm_clock = clock
    if not clock.available or backend != "vulkan" or os.environ.get(KEEPER_ENV, "1") == "0":
        return
    try:
        keeper = ClockKeeper(int(target.device_index))
    except Exception as exc:  # noqa: BLE001 - without a keeper the settle phase still waits for the clock
        print(f"kbench: no clock keeper ({type(exc).__name__}: {exc})", file=sys.stderr)
        return
    keeper.resume()
    target.keeper = keeper
    target.closers.insert(0, keeper.close)  # closed last, after the target's own objects


def _die_with_parent() -> None:
    """End this process when the parent does: SIGKILL on the parent's death (Linux prctl
    PR_SET_PDEATHSIG), and a thread that exits when stdin, kept open by the parent, ends."""
    import threading

    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the stdin watch below still works
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(EXIT_ORPHANED)  # the parent died before the signal was asked for

    def watch() -> None:
        try:
            while os.read(sys.stdin.fileno(), 1 << 12):
                pass
        except OSError:
            pass
        os._exit(EXIT_ORPHANED)  # from any thread: also while the main thread waits on a GPU

    threading.Thread(target=watch, name="kbench-parent-watch", daemon=True).start()


def _read_job() -> dict[str, Any]:
    """The job: stdin's first line (older parents close stdin after it instead)."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(sys.stdin.fileno(), 1)
        if not chunk:
            break
        line += chunk
    return json.loads(line)


def main() -> int:
    # keep the protocol stream clean: anything printed by drivers or libraries goes to stderr
    proto = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    job = _read_job()
    _die_with_parent()
    return run_job(job, proto)


if __name__ == "__main__":
    sys.exit(main())
