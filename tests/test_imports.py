"""Every kbench module imports on this interpreter (run on the oldest declared Python too:
`nox -s tests-3.10`), so a 3.11-only import or syntax fails here rather than at a user's."""
from __future__ import annotations

import importlib
import pkgutil

import pytest

import kbench

# kbench.__main__ runs the command line when imported
MODULES = sorted(m.name for m in pkgutil.walk_packages(kbench.__path__, "kbench.") if m.name != "kbench.__main__")


def test_the_walk_finds_the_packages():
    assert {"kbench.cli", "kbench.runtime", "kbench.report", "kbench.bench.expectations"} <= set(MODULES), MODULES


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)
