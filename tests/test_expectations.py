"""Expected failures keyed by driver and case: xfail, new failures, unexpected passes."""

from __future__ import annotations

import pytest

from kbench.bench import expectations as ex

FILE = """
[[expected]]
driver = "llvmpipe*"
case = "rope[*pos=32767*]"
status = "fail"
reason = "float32 angles at long positions"

[[expected]]
driver = "SwiftShader"
device = "*"
case = "kp_mul"
queue_config = "async"
reason = "known hang"
"""


def record(case_id: str, status: str, queue_config: str = "single", reason: str = "why") -> dict:
    return {"case_id": case_id, "status": status, "reason": "" if status == "pass" else reason,
            "queue_config": queue_config}


@pytest.fixture
def entries():
    return ex.parse(FILE, "test.toml")


def test_expected_failure_becomes_xfail_and_keeps_why(entries):
    rec = ex.apply(record("rope[head_dim=128,pos=32767]", "fail", reason="NMSE 3e-6"), entries,
                   "llvmpipe", "llvmpipe (LLVM 15)")
    assert rec["status"] == "xfail"
    assert rec["expected"]["status"] == "fail" and rec["expected"]["source"] == "test.toml#1"
    assert "float32 angles" in rec["reason"] and "NMSE 3e-6" in rec["reason"]


def test_driver_and_case_must_both_match(entries):
    other_driver = ex.apply(record("rope[head_dim=128,pos=32767]", "fail"), entries, "NVIDIA", "H200")
    assert other_driver["status"] == "fail"
    other_case = ex.apply(record("rope[head_dim=128,pos=700]", "fail"), entries, "llvmpipe", "x")
    assert other_case["status"] == "fail"


def test_status_kind_matters(entries):
    # entry 1 expects "fail": an error is still a new failure
    rec = ex.apply(record("rope[head_dim=128,pos=32767]", "error"), entries, "llvmpipe", "x")
    assert rec["status"] == "error"
    # entry 2 has status "any" (fail or error), matches the case name and only the async config
    hit = ex.apply(record("kp_mul[size=1,dtype=int8]", "error", "async"), entries, "swiftshader", "SwiftShader Device")
    assert hit["status"] == "xfail"
    miss = ex.apply(record("kp_mul[size=1,dtype=int8]", "error", "single"), entries, "swiftshader", "x")
    assert miss["status"] == "error"


def test_pass_against_an_expectation_is_an_unexpected_pass(entries):
    rec = ex.apply(record("rope[head_dim=128,pos=32767]", "pass"), entries, "llvmpipe", "x")
    assert rec["status"] == "pass" and rec["unexpected_pass"] is True
    s = ex.Summary()
    s.add(rec)
    assert s.ok and len(s.unexpected_passes) == 1


def test_summary_fails_only_on_new_failures():
    s = ex.Summary()
    for status in ("pass", "xfail", "unsupported"):
        s.add(record("a", status))
    assert s.ok and s.total == 3
    s.add(record("b[size=1]", "fail", reason="NMSE 1"))
    assert not s.ok and "b[size=1]: fail: NMSE 1" in s.new_failures[0]
    assert s.counts["fail"] == 1 and s.counts["xfail"] == 1


@pytest.mark.parametrize("text, message", [
    ('[[expected]]\ncase = "x"\n', "'reason' is required"),
    ('[[expected]]\nreason = "r"\n', "'case' is required"),
    ('[[expected]]\ncase = "x"\nreason = "r"\nstatus = "pass"\n', "'status' must be one of"),
    ('[[expected]]\ncase = "x"\nreason = "r"\ndrvier = "y"\n', "unknown key(s) ['drvier']"),
    ('[[expected]\n', "not valid TOML"),
    ('expected = 3\n', "array of tables"),
    ('[other]\n', "unknown top-level key"),
])
def test_malformed_files_are_rejected_with_the_problem(text, message):
    with pytest.raises(ex.ExpectationsError, match=None) as info:
        ex.parse(text, "bad.toml")
    assert message in str(info.value) and "bad.toml" in str(info.value)


def test_shipped_expectations_parse_and_files_load(tmp_path):
    shipped = ex.load([], default=True)
    assert all(e.reason for e in shipped)
    f = tmp_path / "mine.toml"
    f.write_text(FILE)
    assert len(ex.load([f], default=False)) == 2
    with pytest.raises(ex.ExpectationsError, match="does not exist"):
        ex.load([tmp_path / "missing.toml"], default=False)
