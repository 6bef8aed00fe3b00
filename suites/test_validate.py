"""Correctness suite: every case on every device and queue configuration against float64 NumPy.

Generated from kbench.cases (see conftest.py for the options); the same checks as
`kbench validate`.
"""

from __future__ import annotations

from conftest import conclude

from kbench.bench.execute import run_instance

MODE = "validate"


def test_case(kbench_case, kbench_session):
    props, qc, inst = kbench_case
    target = kbench_session.target(props, qc)
    rec = run_instance(inst, target, MODE)
    conclude(kbench_session.record(props, rec))
