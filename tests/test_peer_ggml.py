"""The ggml-vulkan peer (kbench.bench.peer_ggml): reading test-backend-ops' output (a capture of
the real binary on lavapipe in tests/data), the test file that describes kbench's shapes to it,
and the runner path end to end with a stand-in program, without ggml itself."""

from __future__ import annotations

import json
import stat
import textwrap
from pathlib import Path

import pytest

from kbench.bench import peer_ggml as gg
from kbench.cases import get_case

DATA = Path(__file__).parent / "data"


def _inst(case: str, mode: str = "bench", sizes: str = "default", **match):
    for i in get_case(case).instances(mode, sizes):
        if all(i.params.get(k) == v for k, v in match.items()):
            return i
    raise AssertionError(f"no {case} instance with {match}")


def test_sql_output_of_the_real_binary_is_read_with_timings_and_kbench_case_ids():
    rows = gg.parse_sql((DATA / "ggml-perf-lavapipe.sql").read_text())
    assert [(r.op_name, r.name) for r in rows] == [
        ("ADD", "add[size=65537]"), ("MUL_MAT", "quantized_matmul[n_rows=64,n_cols=1024,dtype=Q4_0]")]
    add = rows[0]
    assert add.mode == "perf" and add.supported and add.n_runs == 8192
    assert add.time_us == pytest.approx(1462.002197) and add.build_commit == "d99724f2"


def test_sql_reader_skips_other_lines_and_unescapes_quotes():
    text = textwrap.dedent("""\
        CREATE TABLE IF NOT EXISTS test_backend_ops (x TEXT);
        ggml_vulkan: Found 1 Vulkan devices:
        INSERT INTO test_backend_ops (op_name, op_params, test_mode, supported, passed, error_message, time_us) VALUES ('MUL', 'name=it''s', 'test', '1', '0', 'NMSE = 1.0 > 5e-4', '0');
        INSERT INTO test_backend_ops (op_name) VALUES ('broken
        """)
    (row,) = gg.parse_sql(text)
    assert row.op_name == "MUL" and row.name == "it's" and row.supported and not row.passed
    assert "NMSE" in row.error


def test_test_file_lines_describe_kbench_shapes_in_ggml_terms():
    qmm = _inst("quantized_matmul", sizes="full", n_rows=4096, n_cols=14336, dtype="Q4_K", rotate_mib=0)
    words = gg.test_line(qmm.case.name, qmm.params, qmm.case_id).split()
    # op, output type, output ne (m, n), no op params, two sources, then the name
    assert words[:7] == ["29", "0", "4096", "1", "1", "1", "0"]
    assert words[7] == "2" and words[8] == "12" and words[9:13] == ["14336", "4096", "1", "1"]
    assert words[13:15] == ["144", str(14336 // 256 * 144)], "Q4_K: block bytes and row bytes"
    assert words[-1] == qmm.case_id
    rms = _inst("rms_norm", size=16 << 20)
    assert gg.test_line(rms.case.name, rms.params, rms.case_id).split()[6:8] == ["1", "925353388"], "eps 1e-5 as bits"
    assert gg.test_line("rope", {"head_dim": 128}, "rope[x]") is None
    assert gg.test_line("quantized_matmul", {"n_rows": 1, "n_cols": 32, "dtype": "IQ2_XS"}, "q") is None
    assert gg.ggml_bytes("rms_norm", {"size": 10}, 120) == 80, "ggml's RMS_NORM has no weight to read"


def test_ggml_rows_go_to_the_instances_that_re_read_one_matrix_as_ggml_does():
    # ggml's perf mode repeats one weight matrix, which a 50 MB L2 may hold: no row for kbench's rotated instances
    cold = _inst("quantized_matmul", n_rows=14336, n_cols=4096, dtype="Q4_0", rotate_mib=256)
    assert gg.test_line(cold.case.name, cold.params, cold.case_id) is None, cold.case_id
    hot = _inst("quantized_matmul", sizes="full", n_rows=14336, n_cols=4096, dtype="Q4_0", rotate_mib=0)
    assert gg.test_line(hot.case.name, hot.params, hot.case_id).split()[-1] == hot.case_id
    default = {i.case_id for i in get_case("quantized_matmul").instances("bench")}
    assert hot.case_id not in default, "the re-read instances are for --full (the ggml comparison), not the main job"
    small = _inst("quantized_matmul", n_rows=1024, n_cols=4096, dtype="Q4_0")
    assert gg.test_line(small.case.name, small.params, small.case_id) is not None
    # 8 vectors re-reading one matrix: ggml's MUL_MAT with 8 columns of x (n = 8), src1 8 rows of k floats
    batch = _inst("quantized_matmul", sizes="full", n_rows=4096, n_cols=14336, dtype="Q6_K", rotate_mib=0, n_vecs=8)
    words = gg.test_line(batch.case.name, batch.params, batch.case_id).split()
    assert words[2:4] == ["4096", "8"], f"output ne of 4096 x 8 expected, got {words[2:4]}"
    src1 = words[-10:-1]  # type, ne0..3, nb0..3
    assert src1[:3] == ["0", "14336", "8"], f"an F32 src1 of 8 rows of 14336 expected, got {src1}"
    assert batch.case_id not in default


def test_matrix_products_map_to_mul_mat_with_their_first_operand_type():
    assert gg.test_line("matmul", {"m": 64, "n": 64, "k": 64}, "mm") is None, "ggml's F32 MUL_MAT is not fp32"
    for case, type_a in (("matmul_f16", "1"), ("matmul_bf16", "30")):
        words = gg.test_line(case, {"m": 4096, "n": 2048, "k": 1024}, f"{case}[x]").split()
        # MUL_MAT, f32 output of m x n; src0 type_a with k x m elements; src1 f32 with k x n
        assert words[:4] == ["29", "0", "4096", "2048"], (case, words)
        assert words[8:11] == [type_a, "1024", "4096"], (case, words[8:11])
        src1 = words[8 + 9:8 + 18]
        assert src1[:3] == ["0", "1024", "2048"] and src1[5:7] == ["4", "4096"], (case, src1)


def test_the_peer_names_the_shader_features_of_its_build(tmp_path):
    exe = tmp_path / "test-backend-ops"
    assert gg.build_info(exe) == {} and gg.peer_name("d99724f2b1", {}) == "ggml-vulkan@d99724f"
    (tmp_path / "build.json").write_text(json.dumps({
        "ggml_commit": "d99724f2b1", "glsl_extensions": ["GL_EXT_bfloat16", "GL_EXT_float_e2m1",
                                                         "GL_EXT_integer_dot_product", "GL_KHR_cooperative_matrix",
                                                         "GL_NV_cooperative_matrix2"]}))
    info = gg.build_info(exe)
    assert gg.peer_name("d99724f2b1", info) == "ggml-vulkan@d99724f+coopmat+coopmat2+intdot+bf16"
    (tmp_path / "build.json").write_text("[1, 2")
    with pytest.raises(gg.PeerUnavailable, match="build.json is not readable JSON"):
        gg.build_info(exe)


def test_a_missing_binary_is_named_and_the_peer_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.delenv(gg.BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(gg.PeerUnavailable, match="no test-backend-ops binary"):
        gg.find_binary(None)
    with pytest.raises(gg.PeerUnavailable, match="no test-backend-ops binary at"):
        gg.find_binary(tmp_path / "nope")
    ok, why = gg.implementation(str(tmp_path / "nope")).availability()
    assert not ok and "nope" in why


FAKE = """#!/usr/bin/env python3
# Stands in for test-backend-ops: answers perf over a test file with one row per line (time
# derived from the line's position) and test mode with a pass, a FAIL and an unsupported row.
import sys
args = sys.argv[1:]
cols = "test_time, build_commit, backend_name, op_name, op_params, test_mode, supported, passed, error_message, time_us, flops, bandwidth_gb_s, memory_kb, n_runs, device_description, backend_reg_name"
def row(op, params, mode, sup, ok, err, t):
    print(f"INSERT INTO test_backend_ops ({cols}) VALUES ('t', 'abcdef12', 'Vulkan0', '{op}', '{params}', '{mode}', '{sup}', '{ok}', '{err}', '{t}', '0', '0', '0', '100', '', '');")
if args[0] == "perf":
    lines = open(args[args.index("--test-file") + 1]).read().split()
    names = [w for w in open(args[args.index("--test-file") + 1]).read().splitlines()]
    for k, line in enumerate(names):
        name = line.split()[-1]
        row("X", "name=" + name + ",type=f32", "perf", 1, 1, "", 10.0 * (k + 1))
else:
    op = args[args.index("-o") + 1]
    tests = {"MUL_MAT": ("type_a=q4_0,type_b=f32,m=16,n=1,k=256", 1, 1, ""),
             "SOFT_MAX": ("type=f32,ne=[4,4,1,1]", 1, 0, "NMSE = 0.5 > 1e-7"),
             "ADD": ("type=f16,ne=[1,1,8,1]", 0, 0, "")}
    if op in tests:
        params, sup, ok, err = tests[op]
        row(op, params, "test", sup, ok, err, 0)
    if op == "SOFT_MAX" and "CRASH" in __import__("os").environ:
        sys.stdout.flush()
        sys.stderr.write("GGML_ASSERT(x) failed")
        __import__("os").abort()
"""


@pytest.fixture
def fake_binary(tmp_path: Path) -> Path:
    exe = tmp_path / "test-backend-ops"
    exe.write_text(FAKE)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _records(files):
    return [json.loads(line) for f in files for line in Path(f).read_text().splitlines()]


def test_runner_records_ggml_perf_rows_beside_kbench_cases(fake_binary, tmp_path):
    from kbench.bench.runner import RunOptions, Runner

    opts = RunOptions(mode="bench", backend="numpy", peer="ggml", ggml_bin=fake_binary, peaks=False,
                      patterns=["add[size=1048576]", "quantized_matmul[n_rows=1024,n_cols=4096,dtype=Q8_0]",
                                "rope"], out_dir=tmp_path / "out")
    runner = Runner(opts)
    peer_insts = runner.peers[0].instances("bench", opts.patterns)
    assert sorted(i.case_id for i in peer_insts) == ["add[size=1048576]",
                                                     "quantized_matmul[n_rows=1024,n_cols=4096,dtype=Q8_0]"]
    runner._run_peer(runner.peers[0])
    recs = _records(runner.files)
    header = next(r for r in recs if r["kind"] == "run")
    assert header["implementation"] == "ggml-vulkan@abcdef1" and header["backend"] == "ggml-vulkan"
    cases = {r["case_id"]: r for r in recs if r["kind"] == "case"}
    assert set(cases) == {i.case_id for i in peer_insts}
    add = cases["add[size=1048576]"]
    assert add["status"] == "pass" and add["timer"] == "host" and add["peer"] is True
    assert add["host_ns"]["median"] in (10_000.0, 20_000.0)
    assert add["gbps"] == pytest.approx(add["bytes"] / add["host_ns"]["median"])


def test_runner_records_ggml_test_mode_verdicts(fake_binary, tmp_path):
    from kbench.bench.runner import RunOptions, Runner

    runner = Runner(RunOptions(mode="validate", backend="numpy", peer="ggml", ggml_bin=fake_binary,
                               patterns=["add[size=3]"], out_dir=tmp_path / "out"))
    runner._run_peer(runner.peers[0])
    cases = [r for r in _records(runner.files) if r["kind"] == "case"]
    assert [(r["params"]["op"], r["status"]) for r in cases] == [
        ("MUL_MAT", "pass"), ("SOFT_MAX", "fail"), ("ADD", "unsupported")]
    assert "NMSE = 0.5" in cases[1]["reason"]
    assert runner.summary.new_failures and "ggml-vulkan" in runner.summary.new_failures[0]


def test_a_ggml_crash_midway_keeps_the_rows_before_it_and_is_an_error_of_its_own(fake_binary, tmp_path,
                                                                                   monkeypatch):
    from kbench.bench.runner import RunOptions, Runner

    monkeypatch.setenv("CRASH", "1")
    runner = Runner(RunOptions(mode="validate", backend="numpy", peer="ggml", ggml_bin=fake_binary,
                               patterns=["add[size=3]"], out_dir=tmp_path / "out"))
    runner._run_peer(runner.peers[0])
    cases = [r for r in _records(runner.files) if r["kind"] == "case"]
    assert [r["status"] for r in cases] == ["pass", "fail", "unsupported", "error"], cases
    assert cases[-1]["case_id"] == "ggml_run[run=validate_SOFT_MAX]" and "after 1 result(s)" in cases[-1]["reason"]
    assert "GGML_ASSERT" in cases[-1]["reason"], cases[-1]["reason"]


def test_runner_records_an_unavailable_ggml_peer_instead_of_dropping_it(tmp_path, monkeypatch):
    from kbench.bench.runner import RunOptions, Runner

    monkeypatch.delenv(gg.BIN_ENV, raising=False)
    runner = Runner(RunOptions(mode="bench", backend="numpy", peer="ggml", ggml_bin=tmp_path / "missing",
                               peaks=False, patterns=["add[size=1048576]"], out_dir=tmp_path / "out"))
    runner._run_peer(runner.peers[0])
    cases = [r for r in _records(runner.files) if r["kind"] == "case"]
    assert [(r["case_id"], r["status"]) for r in cases] == [("add[size=1048576]", "unsupported")]
    assert "unavailable" in cases[0]["reason"] and "missing" in cases[0]["reason"]
