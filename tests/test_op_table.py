"""The one table of ComputeBackend ops (kbench.backend.op_table) against the backends and cases."""

from __future__ import annotations

import inspect

import pytest

from kbench.backend import ComputeBackend, NumpyBackend
from kbench.backend.op_table import ALIASING_OPS, DEVICE_ONLY_OPS, OP_BUFFER_ACCESS, OPS, TRAIT_OPS, get_op
from kbench.cases import ALL_CASES


def test_every_op_of_the_table_is_a_method_of_the_backend_contract_with_its_buffer_arguments():
    for name, op in OPS.items():
        method = getattr(NumpyBackend, name, None)
        assert callable(method), f"op {name!r} of the table is not a NumpyBackend method"
        params = inspect.signature(method).parameters
        missing = [arg for arg in op.buffers if arg not in params]
        assert not missing, f"op {name!r}: table names buffer arguments {missing} that {name}() does not take"
        if not op.extension:
            assert callable(getattr(ComputeBackend, name, None)), f"trait op {name!r} is not on ComputeBackend"


def test_the_tables_derived_sets_agree_with_the_rows():
    assert len(TRAIT_OPS) == 19, f"the trait has 19 ops, the table lists {len(TRAIT_OPS)}: {TRAIT_OPS}"
    assert ALIASING_OPS <= set(OP_BUFFER_ACCESS)
    assert {"copy_to_device", "copy_from_device", "synchronize"}.isdisjoint(DEVICE_ONLY_OPS), \
        "host copies and waits cannot be replayed from a recording"
    with pytest.raises(ValueError, match="unknown ComputeBackend op 'conv2d'"):
        get_op("conv2d")


def test_every_backend_case_declares_ops_from_the_table():
    for case in ALL_CASES:
        if case.layer != "backend":
            continue
        unknown = [op for op in case.ops if op not in OPS]
        assert not unknown, f"case {case.name!r} declares ops {unknown} that are not in kbench.backend.op_table"
