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
