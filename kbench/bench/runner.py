"""The run loop: devices x queue configurations x case instances, each device's cases in a
worker subprocess with a per-case time limit, every result written as it completes.

A case that hangs past the time limit is recorded as an error and its worker is killed; a
worker that crashes (segfault in a driver, lost device) has the case it was running recorded as
an error with the exit status and the end of its stderr; in both cases a fresh worker carries
on with the next case. A device that cannot be opened has its cases recorded as errors and the
run goes on with the next device.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kbench.cases.base import SIZE_SETS, pick_quick
from kbench.results.records import case_error, case_record

from . import expectations as expect
from . import host_cache
from .devices import foreign_implementations, select_devices
from .execute import default_max_bytes, size_reason
from .implementations import Implementation, main_kinds, peer_kinds, resolve
from .peaks import peak_fraction
from .queues import QUEUE_CONFIGS, QueueConfig
from .timing import TimingPolicy
from .worker import PARENT_ENV

#: time allowed for a worker to open its device
OPEN_TIMEOUT_S = 120.0


class Progress(Protocol):
    """What the runner reports while it works (the CLI shows a progress bar)."""

    def begin(self, total: int, label: str) -> None: ...
    def start(self, case_id: str) -> None: ...
    def advance(self, record: dict[str, Any]) -> None: ...
    def note(self, text: str) -> None: ...
    def end(self) -> None: ...


class _Quiet:
    def begin(self, total: int, label: str) -> None:
        pass

    def start(self, case_id: str) -> None:
        pass

    def advance(self, record: dict[str, Any]) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def end(self) -> None:
        pass


@dataclass
class RunOptions:
    """Everything `kbench validate` / `kbench bench` can be told."""

    mode: str = "validate"
    backend: str = "vulkan"
    devices: str | None = None
    queue_configs: list[str] | None = None   # None: validate -> all, bench -> single
    patterns: list[str] = field(default_factory=list)
    out_dir: Path = Path("results")
    timeout: float = 300.0
    expectation_files: list[Path] = field(default_factory=list)
    default_expectations: bool = True
    max_bytes: int | None = None             # None: execute.default_max_bytes (cap for CPU devices in bench)
    seed: int = 0
    peer: str | None = None
    peaks: bool = True
    #: False: no cases, the device's peaks alone (`kbench peaks`)
    cases: bool = True
    policy: TimingPolicy | None = None
    #: a kernel declaration file (or a shipped set's name) and the source tree it refers to: run
    #: the declared third-party kernels instead of kbench's own (kbench.foreign)
    kernels: str | Path | None = None
    source: str | Path | None = None
    #: the ggml peer's test-backend-ops binary (default: $KBENCH_GGML_BIN, then PATH)
    ggml_bin: str | Path | None = None
    #: which bench instances: "default", "quick" (the headline cases, one size each per device)
    #: or "full" (also the largest sizes); kbench.cases.base.SIZE_SETS
    sizes: str = "default"

    def __post_init__(self) -> None:
        if self.mode not in ("validate", "bench"):
            raise ValueError(f"mode must be 'validate' or 'bench', got {self.mode!r}")
        if self.backend not in main_kinds():
            raise ValueError(f"backend must be {' or '.join(repr(k) for k in main_kinds())}, got {self.backend!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if self.sizes not in SIZE_SETS:
            raise ValueError(f"sizes must be one of {', '.join(SIZE_SETS)}, got {self.sizes!r}")
        if self.peer is not None and self.peer not in peer_kinds():
            raise ValueError(f"unknown peer {self.peer!r}; peers: {', '.join(peer_kinds())} (torch: PyTorch on CUDA)")
        if self.queue_configs:
            bad = [q for q in self.queue_configs if q not in QUEUE_CONFIGS]
            if bad:
                raise ValueError(f"unknown queue configuration {', '.join(bad)}; choose from {', '.join(QUEUE_CONFIGS)}")
        self.out_dir = Path(self.out_dir)


@dataclass
class RunResult:
    summary: expect.Summary
    files: list[Path]
    interrupted: bool = False
    #: each part of the run (a device in a queue configuration, a peer): its label, its wall
    #: seconds and the seconds its worker took to start and open the device
    sections: list[dict[str, Any]] = field(default_factory=list)


class _LineReader:
    """Lines from a pipe with a deadline (the worker's event stream)."""

    def __init__(self, pipe: Any):
        self.fd = pipe.fileno()
        os.set_blocking(self.fd, False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ)
        self.buf = b""
        self.eof = False

    def readline(self, deadline: float) -> str | None:
        """Next line; "" at end of stream; None when the deadline passed first."""
        while True:
            nl = self.buf.find(b"\n")
            if nl >= 0:
                line, self.buf = self.buf[:nl], self.buf[nl + 1:]
                return line.decode("utf-8", "replace")
            if self.eof:
                return ""
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not self.sel.select(min(left, 1.0)):
                continue
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self.eof = True
            self.buf += chunk

    def close(self) -> None:
        self.sel.close()


def _tail(err: Any, n: int = 600) -> str:
    """The last ``n`` characters of the worker's stderr (an open file), whitespace folded."""
    try:
        err.flush()
        size = os.fstat(err.fileno()).st_size
        err.seek(max(0, size - 4 * n))
        text = err.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""
    return " ".join(text[-n:].split())


class _Terminated(KeyboardInterrupt):
    """SIGTERM reached the runner: it stops as on Ctrl-C (worker ended, summary written)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


class Runner:
    """Runs one `kbench validate` or `kbench bench`."""

    def __init__(self, options: RunOptions, progress: Progress | None = None):
        self.options = options
        self.progress = progress or _Quiet()
        self.summary = expect.Summary()
        self.files: list[Path] = []
        self.sections: list[dict[str, Any]] = []
        self._host_cache = ""  # the run's kbench.bench.host_cache directory while it runs
        self.expectations = expect.load(options.expectation_files, default=options.default_expectations)
        if options.kernels is not None:
            if options.backend != "vulkan":
                raise ValueError("--kernels runs declared Vulkan kernels; it needs --backend vulkan")
            # one implementation per kernel group; a bad declaration is refused here, before any GPU work
            mains = foreign_implementations(options.kernels, options.source)
        else:
            mains = [resolve(options.backend)]
        #: (implementation, its planned instances): what the run is of, then its peers
        self.plan = [(impl, impl.instances(options.mode, options.patterns, options.sizes) if options.cases else [])
                     for impl in mains]
        peer_args = {"binary": str(options.ggml_bin)} if options.peer == "ggml" and options.ggml_bin else {}
        self.peers = [resolve(options.peer, **peer_args)] if options.peer else []
        self._by_id: dict[str, Any] = {}

    @property
    def instances(self) -> list[Any]:
        """Every planned instance of the implementations the run is of."""
        return [i for _, insts in self.plan for i in insts]

    # -- planning ---------------------------------------------------------------------------------
    def devices(self) -> list[dict[str, Any]]:
        return select_devices(self.plan[0][0].devices(), self.options.devices)

    def _config_names(self) -> list[str]:
        if self.options.queue_configs:
            return list(self.options.queue_configs)
        return list(QUEUE_CONFIGS) if self.options.mode == "validate" else ["single"]

    @staticmethod
    def _instances_for(config: str, insts: list[Any]) -> list[Any]:
        # backend cases run on the backend's own queue: they are generated for "single" and
        # "async"; the multi-queue configurations split the runtime cases across queues
        if config in ("multi_queue", "multi_family"):
            return [i for i in insts if i.case.layer == "runtime"]
        return list(insts)

    # -- running ----------------------------------------------------------------------------------
    def run(self) -> RunResult:
        interrupted = False
        previous = None
        try:
            # SIGTERM stops the run as Ctrl-C does: the worker is killed, the summary written
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:
            pass  # not the main thread: signals stay as they are
        # inputs and references slow to make, kept for the run's other implementations (the peer)
        cache = host_cache.new_directory()
        self._host_cache = str(cache)
        try:
            devices = self.devices()
            for impl, insts in self.plan:
                for props in devices:
                    self._run_device(impl, props, insts)
            for peer in self.peers:
                self._run_peer(peer)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            self._host_cache = ""
            host_cache.remove(cache)
        self.progress.end()
        return RunResult(self.summary, self.files, interrupted, self.sections)

    def _provenance(self, impl: Implementation, props: dict[str, Any] | None) -> dict[str, Any]:
        """The run header of one device's run file (kbench.results.collect_provenance)."""
        from kbench.results import collect_provenance

        prov = collect_provenance(props if impl.describes_device else None, impl.backend, impl.name)
        prov.update(impl.header())
        return prov

    def _run_device(self, impl: Implementation, props: dict[str, Any], insts: list[Any]) -> None:
        """One run file: every available queue configuration of one device of `impl`."""
        from kbench.results import RunWriter

        insts = self._for_device(insts, props)
        names = self._config_names() if not impl.peer else ["single"]
        configs = [c for c in impl.configs(props) if c.name in names]
        missing = [n for n in names if n not in [c.name for c in configs]]
        for n in (missing if self.options.queue_configs and not impl.peer else []):
            self.progress.note(f"{props.get('device_name')}: queue configuration {n} not available for the {impl.backend} backend")
        available = []
        for c in configs:
            if c.unsupported:
                self.progress.note(f"{props.get('device_name')}: {c.name} not available: {c.unsupported}")
                self.summary.notes.append(f"{props.get('device_name')}: {c.name} not generated: {c.unsupported}")
            else:
                available.append(c)
        with RunWriter(self.options.out_dir, self._provenance(impl, props)) as writer:
            self.files.append(writer.path)
            for c in configs:
                if c.unsupported:  # kept in the results, so a report shows what was not run
                    writer.write(case_record("queue_config", {"name": c.name}, mode=self.options.mode,
                                             status="unsupported", reason=c.unsupported,
                                             queue_config=c.name, queues=[], layer="runner"))
            peaks: dict[str, float] = {}
            for n, c in enumerate(available):
                chosen = self._instances_for(c.name, insts)
                # peaks once per device, in its first configuration
                peak_names = list(impl.peaks) if (self.options.mode == "bench" and self.options.peaks and n == 0) else []
                if not chosen and not peak_names:
                    continue
                self._run_config(writer, impl, props, c, chosen, peak_names, peaks)

    def _for_device(self, insts: list[Any], props: dict[str, Any] | None) -> list[Any]:
        """The planned instances a device runs: with --quick one size per case, the largest of
        the headline size and those before it that fits the device (kbench.cases.base.pick_quick)."""
        if self.options.mode != "bench" or self.options.sizes != "quick":
            return insts
        if props is None:
            return pick_quick(insts)
        max_bytes = self._max_bytes(props)
        return pick_quick(insts, lambda inst: not size_reason(inst, props, max_bytes))

    def _max_bytes(self, props: dict[str, Any]) -> int | None:
        return self.options.max_bytes if self.options.max_bytes is not None else default_max_bytes(props, self.options.mode)

    def _run_config(self, writer: Any, impl: Implementation, props: dict[str, Any], config: QueueConfig,
                    insts: list[Any], peak_names: list[str], peaks: dict[str, float]) -> None:
        who = f" {impl.label}" if impl.label else ""
        label = f"{props.get('device_name', impl.backend)}{who} [{config.name}]"
        self.progress.begin(len(insts) + len(peak_names), label)
        # the worker gets what was resolved here: the implementation, the device's properties,
        # the configuration and each instance's case and parameters (literal_eval keeps tuples)
        job = {
            "implementation": impl.job(), "props": props, "queue_config": asdict(config),
            "mode": self.options.mode, "seed": self.options.seed, "max_bytes": self._max_bytes(props),
            "policy": None if self.options.policy is None else self.options.policy.__dict__,
            "cases": {i.case_id: [i.case.name, repr(dict(i.params))] for i in insts},
        }
        by_id = {i.case_id: i for i in insts}
        self._by_id = by_id
        driver, device = str(props.get("driver_name", "")), str(props.get("device_name", ""))
        context = {"queue_config": config.name, "queues": [], "mode": self.options.mode}

        def on_record(rec: dict[str, Any]) -> None:
            if rec.get("kind") == "peak":
                peaks[rec["peak"]] = float(rec["value"])
                self.summary.peaks += 1
                rec = {k: v for k, v in rec.items()}
                self.progress.advance(writer.write(rec))
                return
            for key, value in context.items():
                rec.setdefault(key, value)
            rec["device_index"] = int(props.get("index", 0))
            inst = by_id.get(rec.get("case_id", ""))
            if inst is not None and rec.get("status") == "pass":
                peak_fraction(rec, inst.case.peak, peaks)
            expect.apply(rec, self.expectations, driver, device)
            rec = self._write(writer, rec)
            self.summary.add({**rec, "device_name": device})
            self.progress.advance(rec)

        section = {"label": label, "wall_s": 0.0, "open_s": 0.0}
        self.sections.append(section)
        t0 = time.monotonic()

        def on_ready(event: dict[str, Any]) -> None:
            context["queues"] = event.get("queues", [])
            if not section["open_s"]:  # the first worker's start and device open
                section["open_s"] = round(time.monotonic() - t0, 3)

        ids = peak_names + [i.case_id for i in insts]
        try:
            self._drive(job, ids, set(peak_names), on_record, on_ready)
        finally:
            section["wall_s"] = round(time.monotonic() - t0, 3)

    def _write(self, writer: Any, rec: dict[str, Any]) -> dict[str, Any]:
        from kbench.results.schema import RecordError

        try:
            return writer.write(rec)
        except RecordError as exc:
            # a record kbench made does not follow its own schema: keep the result as an error
            params, queues = rec.get("params"), rec.get("queues")
            fixed = case_record(rec.get("case"), params if isinstance(params, dict) else {},
                                case_id=rec.get("case_id"), mode=rec.get("mode"), status="error",
                                reason=f"result record rejected by the schema: {exc}",
                                queue_config=rec.get("queue_config"),
                                queues=queues if isinstance(queues, list) else [])
            return writer.write(fixed)

    def _error_record(self, cid: str, reason: str) -> dict[str, Any]:
        inst = self._by_id.get(cid)
        return case_error(cid, self.options.mode, reason, params=dict(inst.params) if inst else {},
                          layer=inst.case.layer if inst else "peak")

    def _drive(self, job: dict[str, Any], ids: list[str], peak_ids: set[str], on_record, on_ready) -> None:
        """Run `ids` through worker processes until each has a result."""
        remaining = list(ids)
        while remaining:
            sub = dict(job, peaks=[i for i in remaining if i in peak_ids],
                       case_ids=[i for i in remaining if i not in peak_ids])
            sub["cases"] = {i: job["cases"][i] for i in sub["case_ids"]}
            done = self._one_worker(sub, remaining, on_record, on_ready)
            if done:
                return

    def _one_worker(self, job: dict[str, Any], remaining: list[str], on_record, on_ready) -> bool:
        """One worker process; returns True when no restart is needed."""
        # the worker's stderr: a temporary file without a name (nothing left behind even when
        # this process is killed), read back for the end of a crash's messages
        err_file = tempfile.TemporaryFile("w+b", prefix="kbench-worker-", suffix=".err")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH")]))
        env[PARENT_ENV] = str(os.getpid())
        if self._host_cache:
            env[host_cache.CACHE_ENV] = self._host_cache
        try:
            proc = subprocess.Popen([sys.executable, "-m", "kbench.bench.worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err_file, env=env, start_new_session=True)
        except BaseException:
            err_file.close()
            raise
        reader = _LineReader(proc.stdout)
        current: str | None = None
        ready = False
        results = 0

        def fail_current(reason: str) -> bool:
            """The running case gets an error record; a fresh worker takes the rest."""
            on_record(self._error_record(current, reason))
            remaining.remove(current)
            return False

        def fail_rest(reason: str) -> bool:
            """Every case not run yet gets an error record; no restart."""
            for cid in list(remaining):
                on_record(self._error_record(cid, reason))
            remaining.clear()
            return True
        try:
            assert proc.stdin is not None
            # the job is one line; stdin stays open while this process lives (the worker ends
            # itself at its end of file: kbench.bench.worker)
            proc.stdin.write(json.dumps(job, default=str).encode() + b"\n")
            proc.stdin.flush()
            deadline = time.monotonic() + max(OPEN_TIMEOUT_S, self.options.timeout)
            while True:
                line = reader.readline(deadline)
                if line is None:  # deadline passed
                    self._kill(proc)
                    if current is not None:
                        return fail_current(f"timed out after {self.options.timeout:g} s (per-case limit --timeout); "
                                            f"the worker was killed and the run went on with the next case")
                    return fail_rest(f"the device did not open within {max(OPEN_TIMEOUT_S, self.options.timeout):g} s")
                if line == "":  # worker exited
                    rc = proc.wait()
                    if current is not None:
                        return fail_current(f"worker process crashed ({_exit_text(rc)}) while running this case; the "
                                            f"run went on with a fresh worker. stderr: {_tail(err_file)}")
                    if not ready or not results:
                        # nothing ran: restarting would loop, so the rest is recorded as errors
                        what = "before opening the device" if not ready else "before running any case"
                        return fail_rest(f"worker exited {what} ({_exit_text(rc)}): {_tail(err_file)}")
                    return not remaining
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                kind = event.get("event")
                if kind == "ready":
                    ready = True
                    on_ready(event)
                    deadline = time.monotonic() + self.options.timeout
                elif kind == "start":
                    current = event.get("case_id")
                    deadline = time.monotonic() + self.options.timeout
                    started = getattr(self.progress, "start", None)  # older Progress objects lack it
                    if started is not None and current:
                        started(current)
                elif kind == "result":
                    rec = event["record"]
                    cid = rec.get("peak") or rec.get("case_id")
                    on_record(rec)
                    results += 1
                    if cid in remaining:
                        remaining.remove(cid)
                    current = None
                    deadline = time.monotonic() + self.options.timeout
                elif kind == "open_failed":
                    return fail_rest(f"could not open the device: {event.get('reason')}")
                elif kind == "done":
                    return True
        except KeyboardInterrupt:
            self._kill(proc)
            raise
        finally:
            reader.close()
            try:
                proc.stdin.close()  # a worker still running ends at this end of file
            except OSError:
                pass
            if proc.poll() is None:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self._kill(proc)
            if proc.stdout is not None:
                proc.stdout.close()
            err_file.close()

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """Kill the worker and whatever it started (its own process group, made at start)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    # -- peers ------------------------------------------------------------------------------------
    def _run_peer(self, peer: Implementation) -> None:
        """A peer on each of its devices; where it cannot run, one run file saying why, with its
        cases recorded unsupported."""
        ok, why = peer.availability()
        devices: list[dict[str, Any]] = []
        if ok:
            try:
                devices = peer.devices()
            except Exception as exc:  # noqa: BLE001 - recorded as the reason, the run goes on
                ok, why = False, f"{type(exc).__name__}: {exc}"
        insts = peer.instances(self.options.mode, self.options.patterns, self.options.sizes)
        if ok and peer.drive is not None:
            try:
                self._run_external(peer, insts)
                return
            except RuntimeError as exc:
                ok, why = False, str(exc)
        elif ok and devices:
            for props in devices:
                self._run_device(peer, props, insts)
            return
        from kbench.results import RunWriter

        why = why or "no device"
        with RunWriter(self.options.out_dir, self._provenance(peer, None)) as writer:
            self.files.append(writer.path)
            self.progress.note(f"peer {peer.name} unavailable: {why}")
            self.summary.notes.append(f"peer {peer.name} unavailable: {why}")
            insts = self._for_device(insts, None)
            self.progress.begin(len(insts), f"{peer.name} (unavailable)")
            for inst in insts:
                rec = case_record(inst.case.name, inst.params, case_id=inst.case_id, mode=self.options.mode,
                                  status="unsupported", reason=f"peer {peer.name} unavailable: {why}",
                                  queue_config="single", queues=[], layer=inst.case.layer, peer=True)
                rec = writer.write(rec)
                self.summary.add(rec)
                self.progress.advance(rec)

    def _run_external(self, peer: Implementation, insts: list[Any]) -> None:
        """A peer that is its own program (``Implementation.drive``), on the run's first device."""
        from kbench.results import RunWriter, collect_provenance

        devices = self.devices()
        props = devices[0] if devices else None
        insts = self._for_device(insts, props)
        self.progress.begin(len(insts), peer.name)
        t0 = time.monotonic()
        try:
            name, records = peer.drive(self.options.mode, insts, props, self.options.timeout)
        finally:
            self.sections.append({"label": peer.name, "wall_s": round(time.monotonic() - t0, 3), "open_s": 0.0})
        prov = collect_provenance(props, peer.backend, name)
        prov.update(peer.header())
        with RunWriter(self.options.out_dir, prov) as writer:
            self.files.append(writer.path)
            if self.options.mode == "validate" and records:
                self.progress.begin(len(records), f"{name} (its own test mode)")
            for rec in records:
                rec = self._write(writer, rec)
                self.summary.add(rec)
                self.progress.advance(rec)


def run(options: RunOptions, progress: Progress | None = None) -> RunResult:
    """Run the suite described by `options`; see Runner."""
    return Runner(options, progress).run()

