"""Provenance of a run: what software, which host and which device produced the results."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kbench

from .records import implementation_of
from .schema import DEVICE_IDENTITY_FIELDS, SCHEMA_VERSION, make_device_key, slug

_VERSIONED_PACKAGES = ("numpy", "vulkan", "pandas", "torch")
_NVIDIA_VENDOR_ID = 0x10DE
_DEVICE_TYPES = {0: "other", 1: "integrated_gpu", 2: "discrete_gpu", 3: "virtual_gpu", 4: "cpu"}


def utc_now() -> str:
    """Current UTC time in ISO 8601 with a Z suffix (second resolution is too coarse for
    ordering records of one run, so microseconds are kept)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def git_revision(repo_dir: str | Path | None = None) -> str:
    """``git rev-parse HEAD`` of the kbench checkout (+ "-dirty" with local changes), or "unknown";
    ``$KBENCH_GIT_REVISION`` where set: a tree copied without its history (a Docker image, a remote
    GPU machine that receives the files but a stale ``.git``) cannot say which commit it holds."""
    given = os.environ.get("KBENCH_GIT_REVISION", "").strip()
    if given:
        return given
    where = Path(repo_dir) if repo_dir else Path(kbench.__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                             text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=where, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}-dirty" if dirty else (rev or "unknown")


def package_versions() -> dict[str, str]:
    """Versions of the packages that shape the results, those installed: the loaded module's
    ``__version__``, else the installed distribution's (read without importing it: results
    never import ``vulkan`` or ``torch``)."""
    versions: dict[str, str] = {}
    for name in _VERSIONED_PACKAGES:
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = str(getattr(module, "__version__", "unknown"))
            continue
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # an absent optional package is not listed
            continue
    return versions


def version_text(value: Any, vendor_id: int | None = None, *, driver: bool = False) -> str:
    """Readable form of a Vulkan-packed version number; strings pass through unchanged."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    v = int(value)
    if driver and vendor_id == _NVIDIA_VENDOR_ID:
        # NVIDIA packs driver versions as 10.8.8.6 bits
        return f"{v >> 22}.{(v >> 14) & 0xFF}.{(v >> 6) & 0xFF}.{v & 0x3F}"
    return f"{(v >> 22) & 0x7F}.{(v >> 12) & 0x3FF}.{v & 0xFFF}"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_identity(device_props: Mapping[str, Any] | None, backend: str) -> dict[str, Any]:
    """The identity fields of a device (see DEVICE_IDENTITY_FIELDS) with versions as text.

    Without device properties the NumPy backend's device is the host CPU with NumPy as the
    driver; any other backend without properties had no device ("no device"), e.g. a CUDA peer
    on a host without CUDA.
    """
    if device_props is None and backend != "numpy":
        return {
            "vendor_id": 0, "vendor_name": "", "device_id": 0, "device_name": "no device",
            "device_type": "other", "driver_name": backend, "driver_version": "",
            "driver_info": f"{backend}: no device available", "api_version": "", "icd_file": "",
        }
    if device_props is None:
        import numpy
        return {
            "vendor_id": 0, "vendor_name": "cpu", "device_id": 0, "device_name": _cpu_name(),
            "device_type": "cpu", "driver_name": backend, "driver_version": numpy.__version__,
            "driver_info": f"{backend} on {platform.machine()}", "api_version": "",
            "icd_file": "",
        }
    vendor_id = device_props.get("vendor_id")
    ident: dict[str, Any] = {}
    for name in DEVICE_IDENTITY_FIELDS:
        value = device_props.get(name)
        if name == "driver_version":
            value = version_text(value, vendor_id, driver=True)
        elif name == "api_version":
            value = version_text(value)
        elif name == "device_type" and isinstance(value, int):
            value = _DEVICE_TYPES.get(value, str(value))
        elif name in ("vendor_id", "device_id"):
            value = int(value) if value is not None else 0
        else:
            value = "" if value is None else str(value)
        ident[name] = value
    return ident


def collect_provenance(device_props: Mapping[str, Any] | None, backend: str,
                       implementation: str | None = None) -> dict[str, Any]:
    """Header record ("kind": "run") for a new run, without run_id (RunWriter assigns it).

    ``device_props`` is ``mgr.get_device_properties()`` (or None for the NumPy backend); the
    header keeps the device identity, its features and its main limits. ``implementation``
    names whose kernels the run measures (default: the one ``backend`` stands for); the
    RunWriter copies it into every record of the run.
    """
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"backend must be a non-empty string such as 'vulkan', got {backend!r}")
    if device_props is not None and not isinstance(device_props, Mapping):
        raise TypeError(f"device_props must be a dict or None, got {type(device_props).__name__}")
    ident = device_identity(device_props, backend)
    device: dict[str, Any] = dict(ident)
    if device_props is not None:
        device["features"] = {k: bool(v) for k, v in dict(device_props.get("features") or {}).items()}
        device["limits"] = {k: device_props[k] for k in (
            "subgroup_size", "max_work_group_invocations", "max_work_group_size",
            "max_shared_memory", "max_storage_buffer_range", "timestamp_period",
            "timestamps_supported") if k in device_props}
    else:
        device["features"] = {}
        device["limits"] = {}
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "run",
        "started": utc_now(),
        "kbench_version": kbench.__version__,
        "git_revision": git_revision(),
        "host": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": package_versions(),
        "backend": backend,
        "implementation": implementation or implementation_of({"backend": backend}),
        "device": device,
        "device_key": make_device_key(ident),
        "command": list(sys.argv),
    }


def make_run_id(provenance: Mapping[str, Any]) -> str:
    """``<UTC yyyymmddThhmmss>-<host>-<device slug>`` from a provenance header."""
    started = str(provenance.get("started", ""))
    try:
        when = _dt.datetime.fromisoformat(started.replace("Z", "+00:00"))
    except ValueError:
        when = _dt.datetime.now(_dt.timezone.utc)
    stamp = when.astimezone(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    device = provenance.get("device", {}) or {}
    name = slug(device.get("device_name", "device"), 24)
    backend = provenance.get("backend", "")
    if backend and backend != "vulkan":
        name = f"{name}-{slug(backend, 12)}"
    return f"{stamp}-{slug(provenance.get('host', 'host'), 20)}-{name}"
