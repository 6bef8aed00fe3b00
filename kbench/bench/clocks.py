"""GPU clocks at measurement time, or a note saying why they could not be read.

A throughput figure means little without the clocks it ran at (boost, throttling, idle clocks
after a short run). NVIDIA devices are read through nvidia-smi; other vendors have no portable
interface from Vulkan, and the record says so.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

NVIDIA_VENDOR_ID = 0x10DE


def read_clocks(props: dict[str, Any]) -> dict[str, Any] | str:
    """{"sm_mhz", "mem_mhz", "source"} for NVIDIA GPUs (nvidia-smi), else a note (str)."""
    if str(props.get("device_type", "")).lower() == "cpu":
        return f"not read: {props.get('device_name', 'CPU device')} is a CPU device"
    vendor = props.get("vendor_id")
    if vendor != NVIDIA_VENDOR_ID and "nvidia" not in str(props.get("vendor_name", "")).lower():
        return f"not read: no clock interface for vendor {props.get('vendor_name', vendor)}"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "not read: nvidia-smi not found"
    try:
        out = subprocess.run([smi, "--query-gpu=clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"not read: nvidia-smi failed ({exc})"
    if out.returncode != 0 or not out.stdout.strip():
        return f"not read: nvidia-smi exit {out.returncode}: {out.stderr.strip()[:200]}"
    # one line per GPU; kbench does not map Vulkan indices to CUDA ones, so take the first line
    # when there is one GPU and all lines otherwise
    rows = [[v.strip() for v in line.split(",")] for line in out.stdout.strip().splitlines()]

    def num(v: str) -> float | None:
        try:
            return float(v)
        except ValueError:
            return None

    if len(rows) == 1:
        sm, mem, sm_max, temp = (num(v) for v in (rows[0] + [""] * 4)[:4])
        return {"sm_mhz": sm, "mem_mhz": mem, "sm_max_mhz": sm_max, "temperature_c": temp, "source": "nvidia-smi"}
    return {"per_gpu": [{"sm_mhz": num(r[0]), "mem_mhz": num(r[1])} for r in rows], "source": "nvidia-smi"}


# ---- live SM clock, and keeping it up between measurements ---------------------------------

class SmClock:
    """The current and the maximum SM clock of an NVIDIA GPU through NVML (the nvidia-ml-py
    package), for warm-up decisions and per-sample clock records. ``available`` is False (and
    ``why`` says why) on other vendors, CPU devices or where NVML is missing."""

    def __init__(self, props: dict[str, Any]) -> None:
        self.available = False
        self.why = ""
        self.max_mhz: float | None = None
        if str(props.get("device_type", "")).lower() == "cpu":
            self.why = "CPU device"
            return
        vendor = props.get("vendor_id")
        if vendor != NVIDIA_VENDOR_ID and "nvidia" not in str(props.get("vendor_name", "")).lower():
            self.why = f"no clock interface for vendor {props.get('vendor_name', vendor)}"
            return
        try:
            import pynvml  # nvidia-ml-py: pip install 'kbench[nvml]'
        except ImportError:
            self.why = "NVML bindings not installed (pip install 'kbench[nvml]', i.e. nvidia-ml-py)"
            return
        try:

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() != 1:
                self.why = "several NVIDIA GPUs: the Vulkan device is not mapped to an NVML index"
                return
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.max_mhz = float(pynvml.nvmlDeviceGetMaxClockInfo(self._handle, pynvml.NVML_CLOCK_SM))
            self.available = True
        except Exception as exc:  # noqa: BLE001 - no NVML means no live clock, not a failure
            self.why = f"NVML unavailable ({type(exc).__name__}: {exc})"

    def mhz(self) -> float | None:
        if not self.available:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001
            return None

    def boosted(self, fraction: float = 0.9) -> bool:
        """True when the SM clock is at least ``fraction`` of its maximum (or cannot be read)."""
        now = self.mhz()
        return now is None or not self.max_mhz or now >= fraction * self.max_mhz

    def ready_check(self) -> "ClockReady":
        """A fresh "is the clock up" test for one measurement (see ClockReady)."""
        return ClockReady(self.mhz, self.max_mhz)


class ClockReady:
    """Whether the SM clock is where sustained work leaves it: boosted (at least ``boosted`` of
    the maximum), or held at a plateau of at least ``plateau`` of the maximum for ``hold_s``.

    The plateau is the power limit: on the H200 fp16 tensor-core matmuls run at 1470-1575 of
    1980 MHz however long they run, and waiting for a boost that never comes cost up to
    settle_max_s (10 s) per warm-up loop. A low plateau is not accepted: from idle (345 MHz)
    the clock climbs in steps held for seconds (345, 435, ... 1965 MHz)."""

    def __init__(self, read, max_mhz: float | None, *, boosted: float = 0.9, plateau: float = 0.6,
                 hold_s: float = 0.25, tol: float = 0.02, now=None) -> None:
        import time

        self._read, self.max_mhz = read, max_mhz
        self.boosted, self.plateau, self.hold_s, self.tol = boosted, plateau, hold_s, tol
        self._now = now or time.perf_counter
        self._level: float | None = None
        self._since = 0.0

    def __call__(self) -> bool:
        mhz = self._read()
        if mhz is None or not self.max_mhz:
            return True
        if mhz >= self.boosted * self.max_mhz:
            return True
        t = self._now()
        if self._level is None or abs(mhz - self._level) > self.tol * self._level:
            self._level, self._since = mhz, t  # a new level: the hold starts again
            return False
        return mhz >= self.plateau * self.max_mhz and t - self._since >= self.hold_s


class ClockKeeper:
    """Keeps a GPU out of its idle clocks while the host prepares the next measurement.

    Measured on an H200 under Vulkan (kbench probe h200, NVML sampling every 2 ms): after
    about 0.5 s without work the SM clock falls from 1980 to 345 MHz, and under sustained large
    kernels it takes about 5.5 s to come back; at 345 MHz a three-stream kernel such as a 1 GiB
    add runs at 1.86 TB/s instead of 4.4 TB/s. So while a case generates inputs, computes its
    reference or checks results, a thread on its own device submits a one-invocation dispatch
    back to back (as a stream of small kernels keeps the clock up); it is paused while a case is
    warmed up and timed, so it never shares the GPU with measured work.
    """

    def __init__(self, device_index: int = 0) -> None:
        import threading

        import kbench.runtime as kp
        from kbench.shaders import load_spirv

        self._mgr = kp.Manager(device_index)
        self._mgr.wait_spin_ns = 0  # block in the driver: the GIL stays free for the main thread
        self._out = self._mgr.buffer(16)
        self._algo = self._mgr.algorithm([self._out], load_spirv("peak_noop"), (1, 1, 1))
        self._seq = self._mgr.sequence(0)
        self._seq.record(kp.OpAlgoDispatch(self._algo))
        self._run = threading.Event()
        self._busy = threading.Lock()  # held while a submission is in flight
        self._stop = False
        self.submissions = 0
        self._thread = threading.Thread(target=self._loop, name="kbench-clock-keeper", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop:
            if not self._run.wait(0.05):
                continue
            with self._busy:
                if not self._run.is_set():
                    continue
                try:
                    self._seq.eval()
                    self.submissions += 1
                except Exception:  # noqa: BLE001 - a lost device ends the keeper, not the run
                    return

    def resume(self) -> None:
        self._run.set()

    def pause(self) -> None:
        """Stop submitting; returns once the submission in flight (if any) has finished."""
        self._run.clear()
        with self._busy:
            pass

    def close(self) -> None:
        self._stop = True
        self._run.clear()
        self._thread.join(timeout=2.0)
        for obj in (self._seq, self._algo, self._out):
            try:
                obj.destroy()
            except Exception:  # noqa: BLE001
                pass
        self._mgr.destroy()
