"""Runs the hypothesis properties of hypothesis_properties.py (backend ops against NumPy, runtime
transfers against a byte model, mutated SPIR-V) in a subprocess: a segfault or a hang there fails
this test instead of ending the test session. KBENCH_PROPERTY_EXAMPLES raises the example count
(CI: 100 per property, about 10-20 s each on lavapipe)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import VALIDATION

ROOT = Path(__file__).resolve().parents[1]
#: a run that takes longer than this is a hang (CI runs it in well under a minute)
LIMIT_S = 600


@pytest.mark.parametrize("prop", ["backend_ops", "runtime_transfers", "mutated_spirv"])
def test_property_holds_without_crash_hang_or_validation_message(prop):
    pytest.importorskip("hypothesis", reason="hypothesis is in the test extra: pip install -e '.[test]'")
    env = dict(os.environ, KBENCH_VALIDATION="1" if VALIDATION else "0")
    env.setdefault("KBENCH_PROPERTY_EXAMPLES", "100")
    cmd = [sys.executable, "-m", "pytest", "tests/hypothesis_properties.py", "-q", "-x", "-p", "no:cacheprovider",
           "-k", prop]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{prop}: no result within {LIMIT_S} s (a hang?); output so far:\n{(exc.stdout or '')[-4000:]}")
    if proc.returncode < 0:
        pytest.fail(f"{prop}: the process was killed by signal {-proc.returncode} (a crash):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    assert proc.returncode == 0 and " passed" in proc.stdout, f"{prop}:\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}"
