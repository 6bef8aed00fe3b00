"""Correctness suite: every case on every device and queue configuration against float64 NumPy.

Generated from kbench.cases (see conftest.py for the options); the same checks as
`kbench validate`.
"""

from __future__ import annotations

from conftest import conclude

from kbench.bench.execute import run_instance

MODE = "validate"


def test_case(kbench_case, kbench_session):
    inst = kbench_case.inst
    target = kbench_session.target(kbench_case)
    rec = run_instance(inst, target, MODE)
    conclude(kbench_session.record(kbench_case, rec))
