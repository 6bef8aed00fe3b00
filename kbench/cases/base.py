"""The `Case` declaration: one record per op or runtime operation.

A case says how to make inputs, how to compute the float64 reference, how close an output must
be, which bytes and FLOPs one call moves and does, which device features it needs and which sizes
to sweep. The runner (kbench.bench) and the pytest suites (suites/) are generated from these.

A case runs in three steps so that the benchmark can repeat the middle one:

    state = case.setup(target, inputs, params)   # allocate, upload, prefill guards
    case.launch(target, state, params)           # issue the work once, no wait
    outputs = case.collect(target, state, params)  # wait, read back, return arrays to check
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kbench.results.records import case_name, make_case_id

Params = Mapping[str, Any]
Arrays = dict[str, np.ndarray]

#: Layers a case can belong to: a ComputeBackend op, a kbench.runtime (Kompute API) operation,
#: or a peak measurement of the device.
LAYERS = ("backend", "runtime", "peak")

#: Comparison kinds: "nmse" compares floats against the float64 reference, "exact" compares
#: bytes/integers for equality (copies, integer arithmetic), "check" means the case's collect step
#: raises `CaseFailure` itself (API behaviour cases such as `free`).
COMPARISONS = ("nmse", "exact", "check")


class CaseFailure(AssertionError):
    """Raised by a case's own checks (guard bytes, API behaviour): the case failed, not crashed."""


class UnsupportedCase(Exception):
    """Raised when a case cannot run on this target; the message names the missing feature/limit."""


def _zero(_: Params) -> int:
    return 0


def _one(_: Params) -> int:
    return 1


def _no_features(_: Params) -> tuple[str, ...]:
    return ()


def _never(_: Params) -> bool:
    return False


#: which bench instances a run takes: "default", "quick" (the headline cases, one size each)
#: or "full" (every declared size, also the full_only ones)
SIZE_SETS = ("default", "quick", "full")


@dataclass(frozen=True)
class Case:
    """One declared op or runtime operation; see the module docstring for the run protocol."""

    name: str
    layer: str
    description: str
    generate: Callable[[Params, np.random.Generator], Arrays]
    reference: Callable[[Arrays, Params], Arrays]
    setup: Callable[[Any, Arrays, Params], Any]
    launch: Callable[[Any, Any, Params], None]
    collect: Callable[[Any, Any, Params], Arrays]
    validate_sizes: tuple[Params, ...]
    bench_sizes: tuple[Params, ...] = ()
    ops: tuple[str, ...] = ()
    #: NMSE threshold, or a function of the params (e.g. per dtype)
    tolerance: float | Callable[[Params], float] = 1e-7
    #: "nmse", "exact" or "check", or a function of the params returning one of them
    comparison: str | Callable[[Params], str] = "nmse"
    #: bytes of each buffer one call reads or writes, by the op's argument names (e.g.
    #: ``{"a": 4*n, "b": 4*n, "out": 4*n}``): where given, `bytes_moved`, `footprint` and
    #: `largest_buffer` left unset are derived from it (the sum, the sum, the largest)
    buffers: Callable[[Params], Mapping[str, int]] | None = None
    bytes_moved: Callable[[Params], int] = _zero
    flops: Callable[[Params], int] = _zero
    features: Callable[[Params], tuple[str, ...]] = _no_features
    #: bytes of device memory one instance needs (for filtering big bench sizes by device limits)
    footprint: Callable[[Params], int] = _zero
    #: largest single buffer in bytes (checked against maxStorageBufferRange)
    largest_buffer: Callable[[Params], int] = _zero
    #: axes crossed with every size, e.g. {"dtype": ("F32", "Q4_0", ...)}
    axes: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    #: which measured peak a benchmark figure is divided by ("copy_bandwidth", "fp32_fma", ...)
    peak: str | None = None
    #: release whatever setup made (called even when launch/collect raised)
    teardown: Callable[[Any, Any], None] | None = None
    #: wait for launched work without reading back (benchmark samples); None means the lane's
    #: backend.synchronize()
    wait: Callable[[Any, Any, Params], None] | None = None
    #: calls after which `launch` comes back to the same inputs (it rotates through copies of
    #: its weights): a timed sample holds whole cycles, so that a sample, replayed or not,
    #: reads every copy as often as the others and none stays in a cache between calls
    cycle: Callable[[Params], int] = _one
    #: bench instances run only with `kbench bench --full` (the largest sizes, the less used
    #: weight types at model shapes: run time, and nothing the default set does not show)
    full_only: Callable[[Params], bool] = _never
    #: parameter sets (a size with axis values) not declared at all, in any mode: a size that
    #: only some axis values have (batches of vectors for the main weight types only)
    omit: Callable[[Params], bool] = _never
    #: the headline instance(s) `kbench bench --quick` runs: parameter values they have (a tuple
    #: value: any of these), one size; None: not a headline case. On a device the size does not
    #: fit (a CPU driver's size limit) the largest bench size before it that fits stands in
    quick: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.layer not in LAYERS:
            raise ValueError(f"case {self.name!r}: layer must be one of {LAYERS}, got {self.layer!r}")
        if not callable(self.comparison) and self.comparison not in COMPARISONS:
            raise ValueError(
                f"case {self.name!r}: comparison must be one of {COMPARISONS}, got {self.comparison!r}"
            )
        if not self.validate_sizes:
            raise ValueError(f"case {self.name!r}: needs at least one validate size")
        if self.buffers is not None:
            sizes = self.buffers
            for name, derived in (("bytes_moved", lambda p: sum(sizes(p).values())),
                                  ("footprint", lambda p: sum(sizes(p).values())),
                                  ("largest_buffer", lambda p: max(sizes(p).values(), default=0))):
                if getattr(self, name) is _zero:
                    object.__setattr__(self, name, derived)

    def tolerance_for(self, params: Params) -> float:
        """The NMSE threshold for `params`."""
        return float(self.tolerance(params) if callable(self.tolerance) else self.tolerance)

    def comparison_for(self, params: Params) -> str:
        """How outputs for `params` are judged: "nmse", "exact" or "check"."""
        kind = self.comparison(params) if callable(self.comparison) else self.comparison
        if kind not in COMPARISONS:
            raise ValueError(f"case {self.name!r}: comparison must be one of {COMPARISONS}, got {kind!r}")
        return kind

    def instances(self, mode: str, sizes: str = "default") -> list["Instance"]:
        """Every (size x axes) parameter set for `mode` ("validate" or "bench"); in bench mode
        `sizes` (SIZE_SETS) says which: "default" leaves out the full_only ones, "quick" keeps
        the instances of the quick marker's axis values at its size and the sizes before it
        (pick_quick chooses one size per device), "full" keeps all."""
        if mode not in ("validate", "bench"):
            raise ValueError(f"mode must be 'validate' or 'bench', got {mode!r}")
        if sizes not in SIZE_SETS:
            raise ValueError(f"sizes must be one of {', '.join(SIZE_SETS)}, got {sizes!r}")
        # a case without bench sizes is a correctness-only case: it has no benchmark instances
        declared = self.validate_sizes if mode == "validate" else self.bench_sizes
        if mode == "bench" and sizes == "quick":
            if self.quick is None:
                return []
            declared = declared[:self.quick_size_index() + 1]
        names = list(self.axes)
        combos = list(itertools.product(*(self.axes[n] for n in names))) or [()]
        out = []
        for size in declared:
            for combo in combos:
                params = dict(size)
                params.update(zip(names, combo))
                if self.omit(params):
                    continue
                if mode == "bench" and sizes != "full" and self.full_only(params):
                    continue
                if mode == "bench" and sizes == "quick" and not self._quick_axes_match(params):
                    continue
                out.append(Instance(self, params))
        return out

    def size_index(self, params: Params) -> int:
        """Which of bench_sizes `params` come from (-1: none)."""
        for i, size in enumerate(self.bench_sizes):
            if all(k in params and params[k] == v for k, v in size.items() if k not in self.axes):
                if all(k in size for k in params if k not in self.axes):
                    return i
        return -1

    def quick_size_index(self) -> int:
        """The bench size the quick marker names (the last one where it names none)."""
        if self.quick is None:
            raise ValueError(f"case {self.name!r} has no quick marker")
        for i, size in enumerate(self.bench_sizes):
            if all(_value_matches(self.quick[k], size[k]) for k in self.quick if k in size):
                return i
        raise ValueError(f"case {self.name!r}: quick marker {dict(self.quick)} names none of its bench sizes")

    def _quick_axes_match(self, params: Params) -> bool:
        return all(_value_matches(want, params[k]) for k, want in (self.quick or {}).items() if k in self.axes)


def _value_matches(want: Any, value: Any) -> bool:
    return value in want if isinstance(want, (tuple, list, frozenset, set)) else value == want


def pick_quick(instances: Sequence["Instance"], fits: Callable[["Instance"], bool] | None = None) -> list["Instance"]:
    """One size per case of `instances` (Case.instances(..., "quick")): the quick marker's size,
    or where `fits` says its instances do not fit a device, the largest size before it whose
    instances fit; where none fits, the marker's size (its records then say why it cannot run)."""
    by_case: dict[str, list[Instance]] = {}
    for inst in instances:
        by_case.setdefault(inst.case.name, []).append(inst)
    out: list[Instance] = []
    for insts in by_case.values():
        case = insts[0].case
        marked = case.quick_size_index() if case.quick is not None else max(case.size_index(i.params) for i in insts)
        chosen = [i for i in insts if case.size_index(i.params) == marked]
        if fits is not None:
            for idx in range(marked, -1, -1):
                at = [i for i in insts if case.size_index(i.params) == idx]
                if at and all(fits(i) for i in at):
                    chosen = at
                    break
        out.extend(chosen)
    return out


@dataclass(frozen=True)
class Instance:
    """A case with concrete parameters."""

    case: Case
    params: Mapping[str, Any]

    @property
    def case_id(self) -> str:
        """Stable identifier, e.g. ``quantized_matmul[n_rows=64,n_cols=256,dtype=Q4_0]``."""
        return make_case_id(self.case.name, self.params)

    @property
    def bytes_moved(self) -> int:
        return int(self.case.bytes_moved(self.params))

    @property
    def flops(self) -> int:
        return int(self.case.flops(self.params))

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(self.case.features(self.params))


def glob_match(pattern: str, text: str, *, ignore_case: bool = False) -> bool:
    """fnmatch with ``*`` and ``?`` where brackets match themselves (case ids contain them)."""
    import fnmatch

    if ignore_case:
        pattern, text = pattern.lower(), text.lower()
    return fnmatch.fnmatchcase(text, pattern.replace("[", "[[]"))


def parse_filter(patterns: Sequence[str] | str | None) -> Callable[[str], bool]:
    """Turn -k style filters into a predicate over case ids.

    Each pattern is a substring or a glob with ``*``/``?`` (brackets match themselves); a
    leading ``not `` or ``!`` excludes (case ids contain commas, so give one pattern per -k). A case
    id is selected when it matches any including pattern (or there are none) and no excluding one.
    """
    if patterns is None:
        patterns = []
    if isinstance(patterns, str):
        patterns = [patterns]
    include: list[str] = []
    exclude: list[str] = []
    for raw in patterns:
        p = str(raw).strip()
        if not p:
            continue
        if p.startswith("not "):
            exclude.append(p[4:].strip())
        elif p.startswith("!"):
            exclude.append(p[1:].strip())
        else:
            include.append(p)

    def match(pattern: str, cid: str) -> bool:
        if "*" in pattern or "?" in pattern:
            return glob_match(pattern, cid) or glob_match(pattern, case_name(cid))
        return pattern in cid

    def predicate(cid: str) -> bool:
        if include and not any(match(p, cid) for p in include):
            return False
        return not any(match(p, cid) for p in exclude)

    return predicate
