"""The registry of implementations: whose kernels a run checks and times.

An implementation is what stands behind a ComputeBackend in a run: kbench's own Vulkan kernels
(``vulkan``), the NumPy reference (``numpy``), the PyTorch peer on CUDA (``torch``), and later a
declared set of foreign kernels or a ggml peer. Each is one `Implementation` entry: how to find
its devices, which queue configurations a device offers, how to open one as a Target, which case
layers and peaks it runs, and the two names its records carry (``backend``, ``implementation``).

Adding an implementation is one more entry in ``_KINDS`` (a ``"module:function"`` that builds it,
imported only when that kind is asked for) plus the module holding its backend.
The runner resolves ``--backend`` / ``--peer`` words here; the worker subprocess rebuilds the
same entry from ``(kind, args)`` in its job, so an entry must be built from JSON-able arguments.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .queues import QueueConfig
from .targets import Target


def _always() -> tuple[bool, str]:
    return True, ""


def _none() -> dict[str, Any]:
    return {}


def _all_cases() -> Sequence[Any]:
    from kbench.cases import ALL_CASES

    return ALL_CASES


def _every(_: Any) -> bool:
    return True


@dataclass(frozen=True)
class Implementation:
    """One implementation of the ComputeBackend ops (and, for Vulkan, the runtime cases)."""

    #: registry word (``--backend vulkan``, ``--peer torch``) and its JSON-able arguments
    kind: str
    #: the records' ``implementation`` field: "kbench", "numpy", "torch-cuda", "yule@1ef0762"
    name: str
    #: the records' ``backend`` field (the API it runs on): "vulkan", "numpy", "torch-cuda"
    backend: str
    description: str
    #: device property dicts, each with its "index" (raises when the API cannot be reached)
    devices: Callable[[], list[dict[str, Any]]]
    #: queue configurations of a device (unsupported ones carry their reason)
    configs: Callable[[dict[str, Any]], list[QueueConfig]]
    #: open a device in a configuration; raises on failure (the caller records it)
    open: Callable[[dict[str, Any], QueueConfig], Target]
    #: case layers it runs ("backend": the ComputeBackend ops, "runtime": the Kompute API, ...)
    layers: tuple[str, ...] = ("backend",)
    #: the case declarations it draws from (kbench.cases.ALL_CASES, or a kernel set's own), and
    #: which of their instances it runs (e.g. only the weight types a kernel set declares)
    cases: Callable[[], Sequence[Any]] = _all_cases
    accepts: Callable[[Any], bool] = _every
    #: peak names it measures (kbench.bench.peaks), and how: (target, peak name) -> record
    peaks: tuple[str, ...] = ()
    measure_peak: Callable[[Target, str], dict[str, Any]] | None = None
    #: (True, "") when usable on this machine, else (False, why not); checked for peers
    availability: Callable[[], tuple[bool, str]] = _always
    #: a peer runs beside the run's implementation (``--peer``) on all of its devices; its records
    #: say ``"peer": true``
    peer: bool = False
    #: the run header describes the device from its properties (False: the host CPU, for NumPy)
    describes_device: bool = True
    #: extra run-header fields (JSON types): kernel choices as ``backend_options``, a foreign
    #: set's provenance as ``foreign``
    header: Callable[[], dict[str, Any]] = _none
    args: Mapping[str, Any] = field(default_factory=dict)
    #: an implementation that is an external program rather than a backend kbench opens (ggml's
    #: test-backend-ops): ``drive(mode, instances, device props, timeout)`` runs it and returns
    #: (the implementation name it reported, e.g. with its commit, and its case records); it
    #: raises RuntimeError when the program cannot run at all
    drive: Callable[[str, list[Any], dict[str, Any] | None, float], tuple[str, list[dict[str, Any]]]] | None = None

    def instances(self, mode: str, patterns: Sequence[str] | None = None, sizes: str = "default") -> list[Any]:
        """The case instances this implementation runs in ``mode`` whose ids match ``patterns``;
        ``sizes`` picks the bench set (kbench.cases.base.SIZE_SETS)."""
        from kbench.cases import parse_filter

        keep = parse_filter(patterns or None)
        return [i for c in self.cases() if c.layer in self.layers for i in c.instances(mode, sizes)
                if keep(i.case_id) and self.accepts(i)]

    def case(self, name: str) -> Any:
        """The case declaration called ``name`` among this implementation's cases, or None."""
        return next((c for c in self.cases() if c.name == name), None)

    @property
    def label(self) -> str:
        """How progress lines name it: "" for kbench's own kernels and backends named after
        themselves, else the implementation (``yule@1ef0762``)."""
        return "" if self.name in ("kbench", self.backend) else self.name

    def job(self) -> dict[str, Any]:
        """What a worker subprocess needs to rebuild this entry (`from_job`): the builder itself,
        so that a kind registered at run time is found in a fresh process too."""
        return {"kind": self.kind, "builder": _KINDS[self.kind], "args": dict(self.args)}


#: registry word -> "module:function" building the Implementation (imported on first use)
_KINDS: dict[str, str] = {
    "vulkan": "kbench.bench.devices:vulkan_implementation",
    "numpy": "kbench.bench.devices:numpy_implementation",
    "torch": "kbench.bench.peer_torch:implementation",
    "foreign": "kbench.bench.devices:foreign_implementation",
    "ggml": "kbench.bench.peer_ggml:implementation",
}
#: the words that are peers (``--peer``); the others are what a run is of (``--backend``)
_PEERS: set[str] = {"torch", "ggml"}


def register(kind: str, builder: str, *, peer: bool = False) -> None:
    """Add an implementation kind: ``builder`` is ``"module:function"``; the function takes the
    entry's keyword arguments and returns an `Implementation`. A worker subprocess imports the
    builder's module, so it must be importable there (a kbench module, or one on PYTHONPATH)."""
    if kind in _KINDS and _KINDS[kind] != builder:
        raise ValueError(f"implementation kind {kind!r} is already registered as {_KINDS[kind]}")
    _KINDS[kind] = builder
    if peer:
        _PEERS.add(kind)


#: kinds built from arguments that a plain word cannot give (``--kernels FILE --source DIR``)
_PARAMETERISED: set[str] = {"foreign"}


def main_kinds() -> tuple[str, ...]:
    """The words ``--backend`` takes: implementations a run can be of."""
    return tuple(k for k in _KINDS if k not in _PEERS and k not in _PARAMETERISED)


def peer_kinds() -> tuple[str, ...]:
    """The words ``--peer`` takes: implementations run beside the main one."""
    return tuple(k for k in _KINDS if k in _PEERS)


def resolve(kind: str, **args: Any) -> Implementation:
    """The Implementation registered as ``kind``, built with ``args``."""
    return _build(kind, **args)


def _build(kind: str, **args: Any) -> Implementation:
    try:
        builder = _KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown implementation {kind!r}; known: {', '.join(_KINDS)}") from None
    return _call(builder, args)


def _call(builder: str, args: Mapping[str, Any]) -> Implementation:
    module, _, function = builder.partition(":")
    return getattr(importlib.import_module(module), function)(**args)


def from_job(spec: Mapping[str, Any]) -> Implementation:
    """The Implementation a worker job names (``Implementation.job()``)."""
    return _call(str(spec["builder"]), dict(spec.get("args") or {}))
