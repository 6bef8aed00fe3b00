"""`kbench probe NAME`: the probes are a documented command of the package, not scripts."""

from __future__ import annotations

import pytest

from kbench.cli import main
from kbench.probes import PROBES


def _has_int_dot() -> bool:
    import kbench.runtime as kp

    devices = kp.list_devices()
    return bool(devices) and bool(devices[0].get("features", {}).get("integer_dot_product"))


def test_probe_help_lists_every_probe(capsys):
    assert main(["probe", "--help"]) == 0
    out = capsys.readouterr().out
    missing = [name for name in PROBES if name not in out]
    assert not missing, f"kbench probe --help does not list {missing}:\n{out}"


def test_an_unknown_probe_is_a_usage_error(capsys):
    assert main(["probe", "bandwidth"]) == 2
    assert "probes:" in capsys.readouterr().err


def test_the_read_floor_probe_runs_on_this_device(capsys):
    assert main(["probe", "read_floor", "--small"]) == 0
    assert "# floor small:" in capsys.readouterr().out


def test_the_matmul_probe_ranks_every_fp32_variant_on_this_device(capsys, tmp_path):
    import json

    from kbench.probes.matmul import SMALL_FP32_VARIANTS, fp32_name

    assert main(["probe", "matmul", "--small", "--fp32-only", "--no-torch", "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    ranking = out[out.index("fp32 ranking 256x256x256"):]
    missing = [fp32_name(*v) for v in SMALL_FP32_VARIANTS[1:] if fp32_name(*v) not in ranking]
    assert not missing, f"variants missing from the ranking: {missing}\n{out}"
    rows = json.loads((tmp_path / "r.json").read_text())
    bad = [(r["variant"], r["m"], r["nmse"], r["note"]) for r in rows if not r["nmse"] < 1e-10]
    assert rows and not bad, f"fp32 variants without an exact result (NMSE >= 1e-10 or not run): {bad}"


def test_the_qmatvec_probe_times_batches_of_vectors_exactly(capsys):
    assert main(["probe", "qmatvec", "--small", "--vecs", "2", "3", "--dtypes", "Q4_0", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("Q4_0")]
    assert len(rows) == 4, f"a row per shape and batch size expected:\n{out}"
    bad = [r for r in rows if not float(r[-2]) < 1e-8]  # NMSE of the worst vector
    assert not bad, f"batches off against float64: {bad}"


def test_the_qmatvec_probe_puts_eight_bit_x_beside_the_automatic_kernel_on_batches(capsys):
    if not _has_int_dot():
        pytest.skip("the device has no shaderIntegerDotProduct (the packed kernel needs it)")
    assert main(["probe", "qmatvec", "--small", "--vecs", "2", "--x-bits", "16", "8", "--dtypes", "Q4_0",
                 "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("Q4_0")]
    x8 = [r for r in rows if ".xwg8." in r[3]]
    assert len(rows) == 4 and len(x8) == 2, f"a 16-bit and an 8-bit row per shape expected:\n{out}"
    # 8-bit x: its own error, well above the 16-bit kernels' and within the probe's limit
    assert all(1e-7 < float(r[-2]) < 1e-4 for r in x8), f"8-bit x rows off: {x8}"


def test_the_qmatvec_probe_times_ablated_twins_and_restores_the_real_kernel_after_them(capsys):
    if not _has_int_dot():
        pytest.skip("the device has no shaderIntegerDotProduct (the packed kernel needs it)")
    assert main(["probe", "qmatvec", "--small", "--dtypes", "Q4_0", "--repeats", "1", "--variants", "packedw",
                 "cut:x+dots:packedw", "cut:loads:packedw", "packedw:8:2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("Q4_0") and " us " not in line]
    cut = [r for r in rows if r[2].startswith("cut:")]
    real = [r for r in rows if not r[2].startswith("cut:")]
    assert len(cut) == 4 and all("(cut)" in r for r in cut), f"an unchecked row per shape and cut expected:\n{out}"
    # the rows after the cut ones ran the shipped kernel again: exact against float64
    assert len(real) == 4 and all(float(r[7]) < 1e-8 for r in real), f"real kernels off after the cut ones:\n{out}"


def test_load_only_twins_are_unchecked_and_the_kernels_after_them_run_and_check_again(capsys):
    """raw:<spec> hands out the load-only twin of a fast kernel with the same plan; the variants after it
    (the GGUF and packed kernels) must get the policy's own kernels back, exact against float64."""
    if not _has_int_dot():
        pytest.skip("the device has no shaderIntegerDotProduct (the packed kernel needs it)")
    assert main(["probe", "qmatvec", "--small", "--dtypes", "Q4_0", "--repeats", "1", "--variants",
                 "raw:fast:8:2:4", "fast:8:2:4", "packed"]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out, f"no variant may fail after a load-only twin:\n{out}"
    rows = [line.split() for line in out.splitlines() if line.startswith("Q4_0") and " us " not in line]
    raw = [r for r in rows if r[2].startswith("raw:")]
    real = [r for r in rows if not r[2].startswith("raw:")]
    assert len(raw) == 2 and all("(cut)" in r and "WRONG" not in r for r in raw), \
        f"an unchecked load-only row per shape expected:\n{out}"
    assert len(real) == 4 and all(float(r[7]) < 1e-8 for r in real), f"the kernels after the twin off:\n{out}"
    best = out[out.index("# best correct variant"):]
    assert "raw:" not in best, f"a load-only twin ranked as a correct variant:\n{best}"


def test_a_cut_twin_is_the_shipped_packed_kernel_compiled_with_its_cut_defines():
    if not _has_int_dot():
        pytest.skip("the device has no shaderIntegerDotProduct (the packed kernel needs it)")
    from kbench.backend import VulkanBackend
    from kbench.probes.qmatvec import cut_kernel, restore_kernel
    from kbench.quant import DType

    be = VulkanBackend()
    try:
        be._policy.configure_qmatvec({"layout": "packed", "xq": "workgroup"})
        shipped = be._policy.qmatvec(DType.Q4_0, 512, 96)
        twins = []
        for cut in (("dots",), ("loads",), ("x",), ("xfirst",), ("quads",), ("halving",)):
            twins.append(cut_kernel(be, shipped, cut))
            assert be._policy.qmatvec(DType.Q4_0, 512, 96) is twins[-1], "the policy does not hand out the twin"
        restore_kernel(be)
        assert be._policy.qmatvec(DType.Q4_0, 512, 96) == shipped, "restore_kernel left a twin in place"
        codes = {t.spirv() for t in twins} | {shipped.spirv()}
        assert len(codes) == 7, "a cut twin compiled to the shipped SPIR-V or to another twin's: the defines did nothing"
        assert len({t.spv for t in twins} | {shipped.spv}) == 7, "twins share a pipeline-cache key"
    finally:
        be.close()


def _skip_unless_packed_timeline() -> None:
    """Skips where the packed kernel (integer dot products) or its timeline twin (device clocks) cannot run."""
    if not _has_int_dot():
        pytest.skip("the device has no shaderIntegerDotProduct (the packed kernel needs it)")
    from kbench.probes import timeline
    from kbench.runtime import Manager

    mgr = Manager()
    why = timeline.unsupported(mgr.get_device_properties()["features"])
    mgr.destroy()
    if why:
        pytest.skip(why)


def test_the_packed_kernels_timeline_twin_says_each_workgroups_residency_and_steps(capsys):
    """kbench probe qmatvec cut:timeline:<packed spec>: the whole kernel runs, its workgroups' records
    replace y, and the summary line counts every workgroup of the grid with its batches."""
    _skip_unless_packed_timeline()
    assert main(["probe", "qmatvec", "--small", "--dtypes", "Q4_0", "--repeats", "1", "--variants",
                 "cut:timeline:packedw:8:2:4", "cut:timeline:packedw:8:2:1"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.lstrip().startswith("timeline:")]
    # packedw:8:2:4 (4 teams of 8 lanes, 2 rows each) on the small shapes: 96 and 32 rows in 8-row workgroups
    assert len(lines) == 2, f"a timeline line per shape expected:\n{out}"
    for line, groups in zip(lines, (12, 4)):
        assert f"{groups} workgroups over" in line, f"{groups} workgroups expected in {line!r}\n{out}"
    # one team of 2 rows a workgroup: 48 workgroups' records would not fit 96 floats of y
    assert "skipped: 48 workgroups' records (4 words each) do not fit y's 96 floats" in out, out


def test_the_qmatvec_probe_applies_knobs_to_batches_and_refuses_bad_ones(capsys):
    if not _has_int_dot():
        pytest.skip("the device has no shaderIntegerDotProduct (the packed kernel needs it)")
    assert main(["probe", "qmatvec", "--small", "--vecs", "2", "--dtypes", "Q4_0", "--repeats", "1", "--stats",
                 "--knobs", "layout=packed", "rows=1", "lanes=8"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("Q4_0")]
    assert len(rows) == 2 and all(".xwg." in r[3] for r in rows), f"the packed kernel per shape expected:\n{out}"
    assert all(r[-1] == "-" for r in rows), f"lavapipe reports no registers: a '-' column expected:\n{out}"
    assert all(float(r[-3]) < 1e-8 for r in rows), f"batches off against float64:\n{out}"
    assert main(["probe", "qmatvec", "--small", "--vecs", "2", "--dtypes", "Q4_0", "--repeats", "1",
                 "--knobs", "unroll=2"]) == 0
    out = capsys.readouterr().out
    assert "FAILED: " in out and "unroll is a choice of layout='packed'" in out, f"the policy's refusal expected:\n{out}"
    assert main(["probe", "qmatvec", "--small", "--vecs", "2", "--knobs", "rows"]) == 2
    cap = capsys.readouterr()
    assert "bad knob 'rows'" in cap.err and "# device" not in cap.out, f"a usage error before any GPU work expected: {cap}"


def test_cuts_that_keep_the_product_are_checked_against_float64(capsys):
    if not _has_int_dot():
        pytest.skip("the device has no shaderIntegerDotProduct (the packed kernel needs it)")
    assert main(["probe", "qmatvec", "--small", "--dtypes", "Q6_K", "--repeats", "1", "--variants",
                 "cut:quads:packedw", "cut:quads+xfirst:packedw"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("Q6_K") and " us " not in line]
    assert len(rows) == 4 and all("(cut)" not in r and float(r[7]) < 1e-8 for r in rows), \
        f"x by a lane per block, or loaded after the weights: an exact product per row expected:\n{out}"


def test_the_qmatvec_probe_times_ablated_twins_of_a_batch_and_checks_only_the_exact_ones(capsys):
    if not _has_int_dot():
        pytest.skip("the device has no shaderIntegerDotProduct (the packed kernel needs it)")
    assert main(["probe", "qmatvec", "--small", "--vecs", "2", "--dtypes", "Q4_0", "--repeats", "1",
                 "--knobs", "layout=packed", "lanes=8", "--cut", "x+dots", "quads", "halving"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("Q4_0")]
    assert [r[3] for r in rows] == ["qmatvec_packed.q4_0.xwg.sg", "cut:dots+x", "cut:quads", "cut:halving"] * 2, \
        f"the shipped kernel and its three twins per shape expected:\n{out}"
    exact = [r for r in rows if r[3] in ("cut:quads", "cut:halving")]
    assert all(r[-1] == "replay" and float(r[-2]) < 1e-8 for r in exact), \
        f"cut:quads and cut:halving exact and checked expected:\n{out}"
    assert all(r[-1] == "(cut)" for r in rows if r[3] == "cut:dots+x"), f"cut:x+dots marked unchecked expected:\n{out}"
    assert main(["probe", "qmatvec", "--small", "--vecs", "2", "--cut", "y"]) == 2
    cap = capsys.readouterr()
    assert "bad cut 'y'" in cap.err and "# device" not in cap.out, f"a usage error before any GPU work expected: {cap}"


def test_the_stats_column_reads_registers_local_and_shared_memory_and_lists_new_names_once(capsys):
    """--stats on NVIDIA: "Register Count" and the memory sizes, whose upper word carries a flag (0x10 on
    driver 580): 64 registers, 368 bytes of local and 7168 of shared memory read as 64+L368+S7168."""
    from types import SimpleNamespace

    from kbench.probes import qmatvec
    from kbench.runtime.executables import PipelineExecutable

    flag = 0x10 << 32
    exe = PipelineExecutable(name="compute", description="", subgroup_size=32, statistics={
        "Register Count": 64, "Local Memory Size": flag | 368, "Shared Memory Size": flag | 7168},
        descriptions={"Register Count": "registers per thread"})
    be = SimpleNamespace(manager=SimpleNamespace(pipeline_statistics=lambda code, spec: [exe]))
    kernel = SimpleNamespace(spirv=lambda: b"", spec=(1,))
    qmatvec._LISTED_STATISTICS.clear()
    assert qmatvec.register_column(be, kernel) == "64+L368+S7168"
    assert qmatvec.register_column(be, kernel) == "64+L368+S7168"
    out = capsys.readouterr().out
    assert out.count("# the driver's statistics: ") == 1, f"the names listed once expected:\n{out}"
    assert "Register Count = 64 (registers per thread)" in out, out


def test_the_timeline_twin_of_a_split_kernel_records_every_split_of_every_row_group(capsys):
    """--knobs splits=2 --cut timeline: the records land in the splits' partial sums, one per workgroup
    of the grid's z too, and the product of the shipped kernel stays exact."""
    _skip_unless_packed_timeline()
    assert main(["probe", "qmatvec", "--small", "--vecs", "1", "--dtypes", "Q4_0", "--repeats", "1", "--knobs",
                 "layout=packed", "splits=2", "lanes=8", "teams=2", "--cut", "timeline"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("Q4_0") and "cut:" not in line]
    assert len(rows) == 2 and all("s2" in r for r in rows), f"the split kernel (s2) per shape expected:\n{out}"
    assert all(float(r[-2]) < 1e-8 for r in rows), f"split products off against float64:\n{out}"
    lines = [line for line in out.splitlines() if line.lstrip().startswith("timeline:")]
    # 8 rows a workgroup (2 teams of 4 short rows): 96 rows 12 row groups, 32 rows 4; two splits each
    assert len(lines) == 2, f"a timeline line per shape expected:\n{out}"
    for line, groups in zip(lines, (24, 8)):
        assert f"{groups} workgroups over" in line, f"{groups} workgroups expected in {line!r}\n{out}"


def test_a_twin_built_by_another_glslang_than_the_shipped_kernel_says_so(capsys, monkeypatch):
    # the driver's code depends on the SPIR-V it gets (docs/shaders.md): a twin from another compiler
    # than the shipped kernel's is not a like-for-like ablation, and the probe's log must say which
    if not _has_int_dot():
        pytest.skip("the device has no shaderIntegerDotProduct (the packed kernel needs it)")
    from kbench.backend import VulkanBackend
    from kbench.probes.qmatvec import cut_kernel
    from kbench.quant import DType
    from kbench.shaders import build

    real = build.load_manifest()
    be = VulkanBackend()
    try:
        be._policy.configure_qmatvec({"layout": "packed", "xq": "workgroup"})
        shipped = be._policy.qmatvec(DType.Q4_0, 512, 96)
        built = ".".join(map(str, build.pick_compiler(
            next(o for o in build.declared_outputs() if o.name == shipped.spv), build.find_compilers()).version))
        for shipped_by, noted in ((built, False), ("99.0.0", True)):
            manifest = {**real, "outputs": {**real["outputs"], shipped.spv: {**real["outputs"][shipped.spv],
                                                                             "glslang": shipped_by}}}
            monkeypatch.setattr(build, "load_manifest", lambda *a, m=manifest: m)
            cut_kernel(be, shipped, ("dots",))
            out = capsys.readouterr().out
            assert ("compiled by glslang" in out) == noted, \
                f"shipped by {shipped_by}, twin by {built}: expected a note {noted}, got {out!r}"
            if noted:
                assert f"glslang {built}, the shipped kernel by 99.0.0" in out, out
    finally:
        be.close()
