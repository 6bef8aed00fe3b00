"""The registry of implementations (kbench.bench.implementations): the built-in entries, and a
further implementation added as one more entry runs through the runner and its worker."""

from __future__ import annotations

import json
import textwrap

import pytest

from kbench.bench import implementations
from kbench.bench.implementations import main_kinds, peer_kinds, resolve
from kbench.bench.runner import RunOptions, Runner


def test_the_built_in_implementations_name_their_records():
    names = {kind: (resolve(kind).name, resolve(kind).backend) for kind in ("vulkan", "numpy", "torch", "ggml")}
    assert names == {"vulkan": ("kbench", "vulkan"), "numpy": ("numpy", "numpy"),
                     "torch": ("torch-cuda", "torch-cuda"), "ggml": ("ggml-vulkan", "ggml-vulkan")}
    assert main_kinds() == ("vulkan", "numpy") and peer_kinds() == ("torch", "ggml")
    assert resolve("torch").peer and resolve("ggml").peer and not resolve("vulkan").peer
    with pytest.raises(ValueError, match="unknown implementation 'nope'; known: vulkan, numpy, torch, foreign, ggml"):
        resolve("nope")


STUB = '''
from kbench.bench.devices import configs_for, numpy_properties, open_target
from kbench.bench.implementations import Implementation


def implementation(tag="1ef0762"):
    return Implementation(
        kind="stub", name=f"stub@{tag}", backend="numpy", description="the NumPy backend under another name",
        devices=lambda: [numpy_properties()], configs=lambda props: configs_for("numpy", props),
        open=lambda props, config: open_target("numpy", props, config), peer=True, args={"tag": tag})
'''


def test_a_registered_implementation_runs_beside_the_main_one_and_names_its_records(tmp_path, monkeypatch):
    (tmp_path / "kbench_stub_impl.py").write_text(textwrap.dedent(STUB))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the worker subprocess imports it too
    monkeypatch.setitem(implementations._KINDS, "stub", "kbench_stub_impl:implementation")
    monkeypatch.setattr(implementations, "_PEERS", {*implementations._PEERS, "stub"})
    out = tmp_path / "results"
    result = Runner(RunOptions(mode="validate", backend="numpy", peer="stub", patterns=["add[size=1]"],
                               out_dir=out)).run()
    assert len(result.files) == 2, f"expected a run file for numpy and one for the stub, got {result.files}"
    by_impl: dict[str, list[dict]] = {}
    for path in result.files:
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        by_impl.setdefault(lines[0]["implementation"], []).extend(lines[1:])
    assert set(by_impl) == {"numpy", "stub@1ef0762"}
    stub = by_impl["stub@1ef0762"]
    assert stub and all(r["implementation"] == "stub@1ef0762" and r["status"] == "pass" for r in stub), \
        [(r["case_id"], r["status"], r["reason"]) for r in stub]
