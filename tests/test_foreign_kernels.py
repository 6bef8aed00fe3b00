"""Declared third-party kernels (kbench.foreign): the declaration parser and its refusals, the
checks against the reflected shader, and kernels run through kbench's cases on lavapipe: a
declaration of kbench's own shader agrees with kbench bit for bit, a Q4_0 decoder written for
this test with the nibbles interleaved is reported FAIL, a grid that misses the output is
refused before any GPU work. No third-party tree is needed: every shader here is the test's own.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kbench.foreign import DeclarationError, FormulaError, declaration_path, parse, shipped_sets
from kbench.foreign import formula as fx

REPO = Path(__file__).resolve().parents[1]
PIN = "0" * 40

HEADER = f"""
[source]
name = "mine"
repository = "https://example.invalid/mine"
commit = "{PIN}"
license = "MIT"
"""

ADD_KERNEL = """
[[kernel]]
name = "add"
op = "add"
glsl = "elementwise.comp"
defines = { OP_ADD = "1" }
bindings = [
  { binding = 0, arg = "a", type = "vec4" },
  { binding = 1, arg = "b", type = "vec4" },
  { binding = 2, arg = "output", type = "vec4" },
]
push_constants = [{ name = "size", type = "uint32", value = "size" }]
spec_constants = [{ id = 0, type = "uint32", value = 64 }]
local_size = [64]
grid = ["ceil_div(ceil_div(size, 4), 64)"]
covers = "ceil_div(size, 4)"
"""


def _decl(body: str, header: str = HEADER):
    return parse(header + body, "mine.toml")


def _refused(body: str, *fragments: str, header: str = HEADER) -> str:
    with pytest.raises(DeclarationError) as info:
        _decl(body, header)
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"expected {f!r} in the refusal, got: {msg}"
    return msg


# --------------------------------------------------------------------------- formulas

def test_formula_evaluates_arithmetic_and_whitelisted_functions():
    f = fx.parse("ceil_div(size, 256) * 2 + max(1, n)")
    assert f({"size": 257, "n": 3}) == 7
    assert fx.parse("f32_bits(1.0)")({}) == 0x3F800000


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "size.__class__", "[x for x in y]",
                                  "lambda: 1", "open('f')", "'text'"])
def test_formula_refuses_code_that_is_not_arithmetic(text):
    with pytest.raises(FormulaError):
        fx.parse(text)


def test_formula_refuses_unknown_names_and_fractional_counts():
    with pytest.raises(FormulaError, match="unknown name"):
        fx.parse("size + bogus", allowed_names={"size"})
    with pytest.raises(FormulaError, match="not a whole number"):
        fx.parse("size / 3").int_value({"size": 4})
    with pytest.raises(FormulaError, match="does not have"):
        fx.parse("size")({})


# --------------------------------------------------------------------------- declaration refusals

def test_a_valid_declaration_parses_with_its_kernels_and_groups():
    d = _decl(ADD_KERNEL)
    assert [k.name for k in d.kernels] == ["add"]
    assert d.groups() == ("",)
    assert d.implementation("", "abcdef0123456789") == "mine@abcdef0"
    assert d.implementation("fast", "abcdef0123456789") == "mine/fast@abcdef0"


def test_unknown_op_is_refused_with_file_line_and_key():
    body = ADD_KERNEL.replace('op = "add"', 'op = "addd"')
    msg = _refused(body, "mine.toml:", "kernel 'add': op", "unknown op 'addd'")
    line = int(msg.split(":")[1])
    assert (HEADER + body).splitlines()[line - 1].strip() == 'op = "addd"', msg


@pytest.mark.parametrize("body, fragment", [
    (ADD_KERNEL.replace('arg = "b"', 'arg = "c"'), "arg 'c' is not a buffer argument of add"),
    (ADD_KERNEL.replace('arg = "b"', 'arg = "a"'), "bound twice"),
    (ADD_KERNEL.replace('{ binding = 1, arg = "b", type = "vec4" },', ''), "b are bound to no binding"),
    (ADD_KERNEL.replace('glsl = "elementwise.comp"', 'glsl = "e.comp"\nspirv = "e.spv"'), "exactly one of glsl"),
    (ADD_KERNEL.replace('glsl = "elementwise.comp"', 'glsl = "../outside.comp"'), "inside the source tree"),
    (ADD_KERNEL.replace('"ceil_div(ceil_div(size, 4), 64)"', '"size.bit_length()"'), "unknown function 'size.bit_length'"),
    (ADD_KERNEL.replace('"ceil_div(ceil_div(size, 4), 64)"', '"n_rows"'), "unknown name(s) n_rows"),
    (ADD_KERNEL.replace('type = "uint32", value = "size"', 'type = "uint64", value = "size"'), "type must be one of"),
    (ADD_KERNEL.replace('name = "add"\nop', 'name = "add"\ndtypes = ["Q4_0"]\nop'), "only quantized_matmul"),
    (ADD_KERNEL + ADD_KERNEL, "declared twice"),
    (ADD_KERNEL + ADD_KERNEL.replace('name = "add"', 'name = "add2"'), "already implemented by kernel 'add'"),
    (ADD_KERNEL.replace('type = "vec4" },\n  { binding = 1', 'type = "vec4", layout = "gguf" },\n  { binding = 1'),
     "layout must be \"gguf\" for quantized_matmul's weights"),
    (ADD_KERNEL.replace("grid =", "gird ="), "unknown key"),
])
def test_bad_kernel_declarations_are_refused_with_the_reason(body, fragment):
    _refused(body, "mine.toml:", fragment)


def test_source_pin_and_custom_op_refusals():
    _refused(ADD_KERNEL, "full 40-hex-digit commit", header=HEADER.replace(PIN, "abc123"))
    _refused(ADD_KERNEL, "a [source] table is required", header="")
    custom = """
[op.twice]
inputs = { x = "size" }
outputs = { out = "size" }
reference = { y = "2 * x" }
validate = [{ size = 4 }]
"""
    _refused(custom + ADD_KERNEL, "one expression per output")
    _refused(custom.replace("[op.twice]", "[op.softmax]") + ADD_KERNEL, "is a ComputeBackend op")
    _refused(custom.replace('{ y = "2 * x" }', '{ out = "numpy.exp(x)" }') + ADD_KERNEL, "unknown function")


def test_shipped_yule_declaration_parses_and_is_found_by_name():
    assert "yule" in shipped_sets()
    from kbench.foreign import load

    d = load(declaration_path("yule"))
    assert d.source.commit == "1ef07620ab30bb7fc9409cf8d293bc6f76beae9e"
    assert {"add", "rms_norm", "softmax", "rope", "attn_score", "attn_value", "quantized_matmul",
            "silu_mul"} <= {k.op for k in d.kernels}
    assert d.groups() == ("", "fast", "coalesced")
    with pytest.raises(DeclarationError, match="neither a declaration file nor a shipped set"):
        declaration_path("no-such-set")


# --------------------------------------------------------------------------- checks against the shader

@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A source tree (no git metadata) holding kbench's elementwise shader and the test's own."""
    shutil.copy(REPO / "shaders" / "elementwise.comp", tmp_path / "elementwise.comp")
    (tmp_path / "q4_0.comp").write_text(Q4_0_GLSL)
    (tmp_path / "spin.comp").write_text(SPIN_GLSL)
    return tmp_path


def _load(tmp_path: Path, body: str, header: str = HEADER):
    from kbench.foreign.kernelset import load_kernel_set

    path = tmp_path / "mine.toml"
    path.write_text(header + body)
    return load_kernel_set(path, tmp_path)


@pytest.mark.parametrize("body, fragment", [
    (ADD_KERNEL.replace('  { binding = 2, arg = "output", type = "vec4" },\n', ''), "binding"),
    (ADD_KERNEL.replace('push_constants = [{ name = "size", type = "uint32", value = "size" }]',
                        'push_constants = [{ name = "size", type = "uint32", value = "size" }, '
                        '{ name = "pad", type = "uint32", value = 0 }]'), "push_constants add up to 8 bytes"),
    (ADD_KERNEL.replace('type = "uint32", value = "size"', 'type = "float32", value = "size"'),
     "push constant 'size' is declared float32"),
    (ADD_KERNEL.replace("{ id = 0,", "{ id = 3,"), "specialization constant id 3 is not in the shader"),
    (ADD_KERNEL.replace('glsl = "elementwise.comp"', 'glsl = "missing.comp"'), "does not exist"),
])
def test_declarations_that_disagree_with_the_shader_are_refused_before_gpu_work(tree, body, fragment):
    with pytest.raises(DeclarationError) as info:
        _load(tree, body)
    assert fragment in str(info.value) and "mine.toml:" in str(info.value), str(info.value)


def test_a_written_buffer_the_shader_declares_readonly_is_refused(tree):
    body = (ADD_KERNEL.replace('{ binding = 0, arg = "a"', '{ binding = 0, arg = "output"')
            .replace('{ binding = 2, arg = "output"', '{ binding = 2, arg = "a"'))
    with pytest.raises(DeclarationError, match="written by add, but the shader declares it readonly"):
        _load(tree, body)


def test_source_tree_at_another_commit_than_the_pin_is_refused(tree):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "-c", "user.email=t@t", "-c", "user.name=t", "add", "."], check=True)
    subprocess.run(["git", "-C", str(tree), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x"],
                   check=True)
    with pytest.raises(DeclarationError, match="is pinned to"):
        _load(tree, ADD_KERNEL)
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    ks = _load(tree, ADD_KERNEL, HEADER.replace(PIN, head))
    assert ks.source.verified and ks.implementation() == f"mine@{head[:7]}"


# --------------------------------------------------------------------------- on the device

Q4_0_GLSL = """#version 450
// Test's own Q4_0 matrix-vector product, one invocation per row. SWAPPED pairs the nibbles of a
// byte with neighbouring columns (an interleaved reading), which is not GGUF's layout.
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer W { uint w[]; };
layout(binding = 1) readonly buffer X { float x[]; };
layout(binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform P { uint n_rows; uint n_cols; uint row_bytes; };
uint byte_at(uint i) { return (w[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }
void main() {
    uint r = gl_GlobalInvocationID.x;
    if (r >= n_rows) return;
    float acc = 0.0;
    for (uint b = 0u; b < n_cols / 32u; b++) {
        uint base = r * row_bytes + b * 18u;
        float d = unpackHalf2x16(byte_at(base) | (byte_at(base + 1u) << 8)).x;
        for (uint j = 0u; j < 16u; j++) {
            uint q = byte_at(base + 2u + j);
            float lo = float(int(q & 15u) - 8), hi = float(int(q >> 4) - 8);
#ifdef SWAPPED
            acc += d * (lo * x[b * 32u + 2u * j] + hi * x[b * 32u + 2u * j + 1u]);
#else
            acc += d * (lo * x[b * 32u + j] + hi * x[b * 32u + j + 16u]);
#endif
        }
    }
    y[r] = acc;
}
"""

SPIN_GLSL = """#version 450
// A kernel that runs for hours: lavapipe ends any shader loop after 65535 iterations, so the
// test's declaration launches 67M workgroups of such loops instead of one endless loop.
layout(local_size_x = 1) in;
layout(binding = 0) readonly buffer A { float a[]; };
layout(binding = 1) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { uint size; };
void main() { float s = 0.0; for (uint i = 0u; i < 60000u; i++) { s += a[i % 3u]; } if (s == 12345.0) { o[0] = s; } }
"""

def _q4_0_kernel(name: str, group: str = "", extra: str = "", grid: str = '["ceil_div(n_rows, local_size_x)"]',
                 covers: str = 'covers = "n_rows"') -> str:
    """A declaration of the test's Q4_0 shader (``extra``: e.g. its SWAPPED define)."""
    return f"""
[[kernel]]
name = "{name}"
group = "{group}"
op = "quantized_matmul"
dtypes = ["Q4_0"]
glsl = "q4_0.comp"
{extra}
bindings = [
  {{ binding = 0, arg = "weights", type = "uint32", layout = "gguf" }},
  {{ binding = 1, arg = "input", type = "float32" }},
  {{ binding = 2, arg = "output", type = "float32" }},
]
push_constants = [
  {{ name = "n_rows", type = "uint32", value = "n_rows" }},
  {{ name = "n_cols", type = "uint32", value = "n_cols" }},
  {{ name = "row_bytes", type = "uint32", value = "row_bytes" }},
]
grid = {grid}
{covers}
"""


Q4_0_KERNELS = (_q4_0_kernel("q4_0") + _q4_0_kernel("q4_0_swapped", "swapped", 'defines = { SWAPPED = "1" }')
                + _q4_0_kernel("q4_0_short_grid", "short", grid="[1]", covers='covers_workgroups = "n_rows"'))


def _target(backend):
    import kbench.runtime as kp
    from kbench.bench.targets import Lane, Target

    return Target("vulkan", 0, backend.device_properties, "single",
                  [Lane(backend=backend, kp=kp, manager=backend.manager)])


def _run(backend, case_name: str, mode: str = "validate", **match):
    from kbench.bench.execute import run_instance
    from kbench.cases import get_case

    t = _target(backend)
    out = []
    for inst in get_case(case_name).instances(mode):
        if all(inst.params.get(k) == v for k, v in match.items()):
            out.append(run_instance(inst, t, mode, seed=7))
    assert out, f"no {case_name} instance matched {match}"
    return out


def _backend(ks, group=""):
    from conftest import VALIDATION

    from kbench.foreign.backend import ForeignBackend

    return ForeignBackend(ks, group, validation=VALIDATION)


def test_declared_kbench_shader_matches_kbench_own_results_bit_for_bit(tree):
    from conftest import VALIDATION

    from kbench.backend import VulkanBackend
    from kbench.cases import get_case

    ks = _load(tree, ADD_KERNEL)
    foreign = _backend(ks)
    own = VulkanBackend(validation=VALIDATION)
    try:
        recs = _run(foreign, "add")
        assert all(r["status"] == "pass" for r in recs), [(r["case_id"], r["status"], r["reason"]) for r in recs]
        inst = next(i for i in get_case("add").instances("validate") if i.params["size"] == 4097)
        results = []
        inputs = inst.case.generate(inst.params, np.random.default_rng(3))
        for be in (foreign, own):
            lane = _target(be).lanes[0]
            state = inst.case.setup(lane, inputs, inst.params)
            try:
                inst.case.launch(lane, state, inst.params)
                results.append(inst.case.collect(lane, state, inst.params)["out"])
            finally:
                inst.case.teardown(lane, state)
        assert np.array_equal(results[0], results[1]), "the same shader gave different bytes under two names"
        assert foreign.implementation == f"mine@{PIN[:7]}"
    finally:
        foreign.close()
        own.close()


def test_a_q4_0_decoder_with_interleaved_nibbles_is_reported_as_fail(tree):
    ks = _load(tree, Q4_0_KERNELS)
    right, wrong = _backend(ks, ""), _backend(ks, "swapped")
    try:
        good = _run(right, "quantized_matmul", dtype="Q4_0")
        bad = _run(wrong, "quantized_matmul", dtype="Q4_0")
        other = _run(right, "quantized_matmul", dtype="Q8_0")
    finally:
        right.close()
        wrong.close()
    assert all(r["status"] == "pass" for r in good), [(r["case_id"], r["reason"]) for r in good]
    # the batch instance too: a batch runs the declared kernel once per vector, never kbench's own
    assert any("n_vecs=3" in r["case_id"] for r in bad), [r["case_id"] for r in bad]
    assert all(r["status"] == "fail" and "NMSE" in r["reason"] for r in bad), \
        [(r["case_id"], r["status"], r["reason"]) for r in bad]
    assert all(r["status"] == "unsupported" and "no kernel for Q8_0" in r["reason"] for r in other), \
        [(r["case_id"], r["status"], r["reason"]) for r in other]


def test_a_grid_that_misses_the_output_is_an_error_before_any_dispatch(tree):
    ks = _load(tree, Q4_0_KERNELS)
    be = _backend(ks, "short")
    try:
        recs = _run(be, "quantized_matmul", dtype="Q4_0", n_rows=17)
        assert be.cache_stats()["cached_algorithms"] == 0, "a refused call still built a pipeline"
    finally:
        be.close()
    # one vector, and a batch of 3 (the declared kernel once per vector): both refused
    assert len(recs) == 2, [r["case_id"] for r in recs]
    for rec in recs:
        assert rec["status"] == "error" and "launches 1 workgroups, but the output needs 17" in rec["reason"], \
            (rec["case_id"], rec["reason"])


def test_custom_op_with_its_own_reference_passes_and_a_wrong_reference_fails(tree):
    from kbench.bench.execute import run_instance
    from kbench.foreign.cases import cases_for

    custom = """
[op.sum3]
inputs = { a = "size", b = "size" }
outputs = { out = "size" }
reference = { out = "a + b" }
validate = [{ size = 5 }, { size = 4097 }]
tolerance = 1e-7
bytes = "12 * size"
""" + ADD_KERNEL.replace('name = "add"\nop = "add"', 'name = "sum3"\nop = "sum3"').replace(
        'arg = "output"', 'arg = "out"')
    for ref, want in (("a + b", "pass"), ("a - b", "fail")):
        ks = _load(tree, custom.replace('reference = { out = "a + b" }', f'reference = {{ out = "{ref}" }}'))
        be = _backend(ks)
        try:
            (case,) = cases_for(ks.declaration, be.declared_ops(), ())
            t = _target(be)
            recs = [run_instance(i, t, "validate", seed=1) for i in case.instances("validate")]
        finally:
            be.close()
        assert [r["status"] for r in recs] == [want, want], [(r["case_id"], r["status"], r["reason"]) for r in recs]


SPIN_KERNEL = """
[[kernel]]
name = "spin"
op = "silu"
glsl = "spin.comp"
bindings = [
  { binding = 0, arg = "input", type = "float32" },
  { binding = 1, arg = "output", type = "float32" },
]
push_constants = [{ name = "size", type = "uint32", value = "size" }]
grid = [65535, 1024]
"""


def test_runner_isolates_a_hanging_foreign_kernel_and_records_the_implementation(tree, tmp_path):
    import json

    from kbench.bench.runner import RunOptions, Runner

    decl = tmp_path / "mine.toml"
    decl.write_text(HEADER + ADD_KERNEL + SPIN_KERNEL)
    out = tmp_path / "runs"
    runner = Runner(RunOptions(mode="validate", kernels=decl, source=tree, patterns=["silu[size=3]", "add[size=3]"],
                               queue_configs=["single"], timeout=8, out_dir=out))
    result = runner.run()
    recs = [json.loads(line) for f in result.files for line in f.read_text().splitlines()]
    header = next(r for r in recs if r["kind"] == "run")
    assert header["implementation"] == f"mine@{PIN[:7]}" and header["foreign"]["pinned_commit"] == PIN
    by_id = {r["case_id"]: r for r in recs if r["kind"] == "case"}
    assert by_id["silu[size=3]"]["status"] == "error" and "timed out" in by_id["silu[size=3]"]["reason"]
    assert by_id["add[size=3]"]["status"] == "pass", by_id["add[size=3]"]
    assert all(r["implementation"] == f"mine@{PIN[:7]}" for r in by_id.values())


def test_cli_refuses_a_bad_declaration_before_opening_a_device(tree, tmp_path, capsys):
    from kbench.cli import main

    decl = tmp_path / "bad.toml"
    decl.write_text(HEADER + ADD_KERNEL.replace('op = "add"', 'op = "nope"'))
    rc = main(["validate", "--kernels", str(decl), "--source", str(tree), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.toml:" in err and "unknown op 'nope'" in err, (rc, err)
    assert not (tmp_path / "o").exists(), "a refused declaration still wrote results"


def test_the_suites_take_a_declaration_and_report_each_group_as_its_own_tests(tree, tmp_path):
    import subprocess
    import sys

    decl = tmp_path / "mine.toml"
    decl.write_text(HEADER + Q4_0_KERNELS)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/test_validate.py", "-q", "-rA", "-p", "no:cacheprovider",
         "--kbench-kernels", str(decl), "--kbench-source", str(tree), "--kbench-queue-config", "single",
         "--kbench-cases", "quantized_matmul[n_rows=3,n_cols=512,dtype=Q4_0]", "--kbench-out", str(tmp_path / "runs")],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    out = proc.stdout
    tid = "quantized_matmul[n_rows=3,n_cols=512,dtype=Q4_0]"
    assert f"PASSED suites/test_validate.py::test_case[{tid}-mine@{PIN[:7]}]" in out, out[-3000:]
    assert f"FAILED suites/test_validate.py::test_case[{tid}-mine/swapped@{PIN[:7]}]" in out, out[-3000:]
    assert f"FAILED suites/test_validate.py::test_case[{tid}-mine/short@{PIN[:7]}]" in out, out[-3000:]
    assert proc.returncode == 1, out[-2000:]
    assert len(list((tmp_path / "runs").glob("*.jsonl"))) == 3, "one results file per implementation"


def test_kbench_kernels_checks_a_declaration_and_lists_it_without_running_it(tree, tmp_path, capsys):
    from kbench.cli import main

    decl = tmp_path / "mine.toml"
    decl.write_text(HEADER + ADD_KERNEL + Q4_0_KERNELS)
    assert main(["kernels", str(decl), "--source", str(tree)]) == 0
    out = capsys.readouterr().out
    assert "4 kernel(s) checked against their shaders" in out and "q4_0_swapped" in out, out
    assert f"mine/swapped@{PIN[:7]}: 5 validate case(s)" in out, out
    decl.write_text(HEADER + ADD_KERNEL.replace('value = "size" }]', 'value = "size" }, { name = "x", type = "uint32", value = 1 }]'))
    assert main(["kernels", str(decl), "--source", str(tree)]) == 2
    err = capsys.readouterr().err
    assert "push_constants add up to 8 bytes" in err, err
