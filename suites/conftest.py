"""pytest plumbing for the kbench suites: one test per device x queue configuration x case.

    pytest suites/test_validate.py                       # every Vulkan device, every configuration
    pytest suites/test_validate.py --kbench-device 0 -k "softmax"
    pytest suites/test_bench.py --kbench-cases "add[size=1048576]" --kbench-out runs --benchmark-json b.json

The tests are generated from the case declarations (kbench.cases) and run through the same
`kbench.bench.execute.run_instance` as `kbench validate|bench`; `--kbench-out` writes every
result as a kbench results file (one run per device). Test ids are the case ids
(``add[size=1048576]``, with ``-async`` for another queue configuration and ``-dev1`` when
several devices run), so pytest's ``-k`` selects cases; tests on a GPU carry the ``gpu`` marker,
bench cases of 256 MiB and more ``slow`` (``-m "not slow"``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, NamedTuple

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("kbench")
    g.addoption("--kbench-device", default=None, metavar="SPEC",
                help="devices: index, vendor or name substring (comma-separated); default all")
    g.addoption("--kbench-backend", default="vulkan", choices=("vulkan", "numpy"))
    g.addoption("--kbench-queue-config", default=None, metavar="LIST",
                help="single, multi_queue, multi_family, async (comma-separated) or all; "
                     "default all for validate, single for bench")
    g.addoption("--kbench-cases", action="append", default=[], metavar="PATTERN",
                help="kbench's own case filter (as `kbench -k`: substring or glob of case ids, 'not X' "
                     "excludes); pytest's -k cannot take the '=' inside case ids")
    g.addoption("--kbench-out", default=None, metavar="DIR", help="write every result to a results file in DIR")
    g.addoption("--kbench-expectations", action="append", default=[], metavar="FILE",
                help="extra expectations TOML (known failures per driver and case)")
    g.addoption("--kbench-kernels", default=None, metavar="FILE",
                help="test third-party kernels declared in FILE (or a shipped set: yule) instead of kbench's "
                     "own, one implementation per kernel group (docs/foreign-kernels.md)")
    g.addoption("--kbench-source", default=None, metavar="DIR", help="the source tree --kbench-kernels refers to")


def _implementations(config: pytest.Config) -> list[Any]:
    """kbench's kernels on --kbench-backend, or one implementation per group of --kbench-kernels
    (a bad declaration stops collection with its file:line reason)."""
    from kbench.bench.devices import foreign_implementations
    from kbench.bench.implementations import resolve

    kernels = config.getoption("--kbench-kernels")
    if kernels:
        from kbench.foreign import declaration_path

        return foreign_implementations(declaration_path(kernels), config.getoption("--kbench-source"))
    return [resolve(config.getoption("--kbench-backend"))]


def _devices(config: pytest.Config, impl: Any) -> list[dict[str, Any]]:
    from kbench.bench.devices import select_devices

    try:
        return select_devices(impl.devices(), config.getoption("--kbench-device"))
    except Exception as exc:  # noqa: BLE001 - no device: the suite collects nothing, says why
        warnings.warn(f"kbench: no device to test: {exc}")
        return []


#: a bench case whose data passes this many bytes is marked slow (the 256M-element and 1 GiB sizes)
SLOW_BYTES = 256 << 20


def _test_id(props: dict[str, Any], qc_name: str, case_id: str, devices: int, impl: str = "") -> str:
    """``add[size=1048576]``, with ``-async`` for a queue configuration other than single,
    ``-dev1`` when several devices are tested and ``-yule@1ef0762`` for a declared kernel set."""
    return (case_id + ("" if qc_name == "single" else f"-{qc_name}")
            + (f"-dev{props.get('index', 0)}" if devices > 1 else "") + (f"-{impl}" if impl else ""))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kbench_id" not in metafunc.fixturenames:
        return
    from kbench.bench.queues import parse_queue_configs

    mode = getattr(metafunc.module, "MODE", "validate")
    config = metafunc.config
    names = parse_queue_configs(config.getoption("--kbench-queue-config"))
    if names is None:
        names = ["single", "multi_queue", "multi_family", "async"] if mode == "validate" else ["single"]
    # the parameter is a short string (the test id): pytest-benchmark stores it as the param
    # text; the implementation, device, configuration and instance behind it stay in this registry
    registry = config.stash.setdefault(_CASES, {})
    params = []
    for impl in _implementations(config):
        devices = _devices(config, impl)
        planned = impl.instances(mode, config.getoption("--kbench-cases") or None)
        for props in devices:
            gpu = "gpu" in str(props.get("device_type", "")).lower()
            for qc in impl.configs(props):
                if qc.name not in names or qc.unsupported:
                    continue
                multi = qc.name in ("multi_queue", "multi_family")
                for inst in planned:
                    if multi and inst.case.layer != "runtime":
                        continue
                    key = _test_id(props, qc.name, inst.case_id, len(devices), impl.label)
                    registry[key] = SuiteCase(props, qc, inst, impl)
                    marks = ([pytest.mark.gpu] if gpu else []) + \
                            ([pytest.mark.slow] if mode == "bench" and (inst.bytes_moved or 0) >= SLOW_BYTES else [])
                    params.append(pytest.param(key, id=key, marks=marks))
    metafunc.parametrize("kbench_id", params)


class SuiteCase(NamedTuple):
    """What one generated test runs: a case instance of an implementation on a device in a queue
    configuration."""

    props: dict[str, Any]
    qc: Any
    inst: Any
    impl: Any


_CASES = pytest.StashKey[dict]()


@pytest.fixture
def kbench_case(request: pytest.FixtureRequest, kbench_id: str) -> SuiteCase:
    """(device properties, queue configuration, case instance, implementation) of the test's id."""
    return request.config.stash[_CASES][kbench_id]


class _Session:
    """Open targets (one per device and configuration) and results writers, kept for the session."""

    def __init__(self, config: pytest.Config):
        from kbench.bench import expectations

        self.config = config
        self.targets: dict[tuple[str, int, str], Any] = {}
        self.writers: dict[tuple[str, int], Any] = {}
        self.expectations = expectations.load(config.getoption("--kbench-expectations"))

    def target(self, case: SuiteCase) -> Any:
        key = (case.impl.name, int(case.props.get("index", 0)), case.qc.name)
        if key not in self.targets:
            # one open device at a time keeps memory low: close the others first
            for other in list(self.targets):
                self.targets.pop(other).close()
            self.targets[key] = case.impl.open(case.props, case.qc)
        return self.targets[key]

    def record(self, case: SuiteCase, rec: dict[str, Any]) -> dict[str, Any]:
        props = case.props
        from kbench.bench import expectations

        expectations.apply(rec, self.expectations, str(props.get("driver_name", "")), str(props.get("device_name", "")))
        out = self.config.getoption("--kbench-out")
        if out:
            from kbench.results import RunWriter, collect_provenance

            impl = case.impl
            key = (impl.name, int(props.get("index", 0)))
            if key not in self.writers:
                prov = collect_provenance(props if impl.describes_device else None, impl.backend, impl.name)
                prov.update(impl.header())
                self.writers[key] = RunWriter(Path(out), prov)
            rec = self.writers[key].write(rec)
        return rec

    def close(self) -> None:
        for t in self.targets.values():
            t.close()
        for w in self.writers.values():
            w.close()


@pytest.fixture(scope="session")
def kbench_session(request: pytest.FixtureRequest):
    s = _Session(request.config)
    yield s
    s.close()


def conclude(rec: dict[str, Any]) -> None:
    """Turn a result record into the pytest outcome: pass, skip (unsupported), xfail, fail."""
    status, reason = rec["status"], rec.get("reason", "")
    if rec.get("unexpected_pass"):
        warnings.warn(f"unexpected pass of {rec['case_id']} (expected {rec['expected']['status']}: "
                      f"{rec['expected']['reason']}); remove the expectation")
    if status == "unsupported":
        pytest.skip(f"unsupported: {reason}")
    if status == "xfail":
        pytest.xfail(reason)
    if status in ("fail", "error"):
        pytest.fail(f"{status}: {reason}", pytrace=False)
