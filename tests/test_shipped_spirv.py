"""The shipped SPIR-V under kbench/spv agrees with shaders/*.comp and is loadable."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kbench.backend import kernels
from kbench.quant import DType
from kbench.shaders import build as bs

REPO = Path(__file__).resolve().parent.parent

#: sources whose shipped SPIR-V is what performance rounds 5-11 measured on the H100/H200, and the
#: glslang that built it: the driver's code depends on the SPIR-V it gets (docs/shaders.md), so a
#: rebuild by another compiler is an unmeasured kernel
MEASURED_GLSLANG = {"shaders/qmatvec_packed.comp": "16.5.0", "shaders/qmatvec_pack.comp": "16.5.0",
                    "shaders/qmatmul_coop.comp": "16.5.0", "shaders/qmatmul_coop_io.comp": "16.5.0",
                    "shaders/matmul_coop2.comp": "16.5.0"}


def test_manifest_matches_every_declared_output():
    outputs = bs.declared_outputs()
    assert outputs, "no shader outputs declared in shaders/"
    problems = bs.check(outputs)
    assert problems == [], "shipped SPIR-V is stale; run python -m kbench.shaders:\n" + "\n".join(problems)


def test_every_shipped_file_is_spirv_and_listed():
    manifest = bs.load_manifest()["outputs"]
    shipped = sorted(p.name for p in bs.SPV_DIR.glob("*.spv"))
    assert shipped == sorted(manifest), (
        f"files in kbench/spv {shipped} differ from the manifest's {sorted(manifest)}"
    )
    for name in shipped:
        data = (bs.SPV_DIR / name).read_bytes()
        assert len(data) >= 20 and len(data) % 4 == 0, f"{name}: {len(data)} bytes is not a SPIR-V module"
        magic = int.from_bytes(data[:4], "little")
        assert magic == bs.SPIRV_MAGIC, f"{name}: magic 0x{magic:08x}, expected 0x{bs.SPIRV_MAGIC:08x}"


def test_every_spirv_in_the_package_is_built_from_shaders_into_kbench_spv():
    elsewhere = sorted(str(p.relative_to(REPO)) for p in (REPO / "kbench").rglob("*.spv") if p.parent != bs.SPV_DIR)
    assert elsewhere == [], f"SPIR-V outside kbench/spv (not built by python -m kbench.shaders): {elsewhere}"


def test_check_mode_exits_zero_when_up_to_date():
    res = subprocess.run([sys.executable, "-m", "kbench.shaders", "--check"], capture_output=True, text=True)
    assert res.returncode == 0, f"--check failed:\n{res.stdout}{res.stderr}"


def test_check_reports_an_edited_source_as_stale(tmp_path):
    shaders = tmp_path / "shaders"
    shutil.copytree(REPO / "shaders", shaders)
    spv = tmp_path / "spv"
    shutil.copytree(bs.SPV_DIR, spv)
    src = shaders / "rope.comp"
    src.write_text(src.read_text() + "\n// edited\n")
    problems = bs.check(bs.declared_outputs(shaders), spv)
    assert problems == ["rope.spv: stale (shaders/rope.comp or its defines changed since the build)"], problems


def test_check_reports_missing_and_undeclared_outputs(tmp_path):
    shaders = tmp_path / "shaders"
    shutil.copytree(REPO / "shaders", shaders)
    spv = tmp_path / "spv"
    shutil.copytree(bs.SPV_DIR, spv)
    (spv / "matmul.spv").unlink()
    (shaders / "rope.comp").unlink()
    problems = bs.check(bs.declared_outputs(shaders), spv)
    assert "matmul.spv: file missing" in problems, problems
    assert "rope.spv: in the manifest but no source declares it any more" in problems, problems


def test_variant_directives_are_parsed(tmp_path):
    src = tmp_path / "demo.comp"
    src.write_text(
        "#version 450\n"
        "// kbench: target vulkan1.1\n"
        "// kbench: requires glslang>=13\n"
        "// kbench: variant a X=1 Y\n"
        "// kbench: variant b.c Z target=vulkan1.2\n"
        "void main() {}\n"
    )
    outs = {o.name: o for o in bs.parse_source(src)}
    assert sorted(outs) == ["demo.a.spv", "demo.b.c.spv"]
    assert outs["demo.a.spv"].defines == ("X=1", "Y") and outs["demo.a.spv"].target == "vulkan1.1"
    assert outs["demo.b.c.spv"].target == "vulkan1.2"
    assert outs["demo.a.spv"].min_glslang == (13, 0)


@pytest.mark.parametrize("line", ["// kbench: varient x A", "// kbench: target opengl", "// kbench: variant X"])
def test_bad_directives_are_rejected(tmp_path, line):
    src = tmp_path / "bad.comp"
    src.write_text(f"#version 450\n{line}\nvoid main() {{}}\n")
    with pytest.raises(ValueError, match="bad.comp:2"):
        bs.parse_source(src)


def test_kernel_table_names_only_shipped_spirv():
    manifest = bs.load_manifest()["outputs"]
    props = {
        "device_name": "table check", "device_type": "discrete_gpu", "api_version": "1.3.0",
        "max_work_group_invocations": 1024, "max_work_group_size": (1024, 1024, 64),
        "max_work_group_count": (65535, 65535, 65535), "max_shared_memory": 49152, "subgroup_size": 32,
        "features": {"subgroup_basic": True, "subgroup_arithmetic": True},
    }
    names = set()
    for subgroups in (True, False):
        pol = kernels.KernelPolicy(props, use_subgroups=subgroups)
        names |= {pol.elementwise(op).spv for op in ("add", "mul", "silu")}
        names |= {pol.copy(16).spv, pol.copy(4).spv}
        names |= {pol.reduction(op, st).spv for op in ("softmax", "rms_norm")
                  for st in ("small", "partial", "normalize")}
        names |= {pol.matmul().spv, pol.rope().spv, pol.attn_score(128).spv,
                  pol.attn_value(128, 4096).kernel.spv, pol.attn_combine().spv}
        names |= {pol.qmatvec(dt, 4096).spv for dt in kernels.QMATVEC_DTYPES}
    missing = sorted(n for n in names if n not in manifest)
    assert missing == [], f"kernel table refers to SPIR-V that is not shipped: {missing}"
    assert set(kernels.QMATVEC_DTYPES) >= {DType.F32, DType.F16, DType.BF16, DType.Q4_0, DType.Q4_1,
                                           DType.Q5_0, DType.Q5_1, DType.Q8_0, DType.Q4_K, DType.Q5_K,
                                           DType.Q6_K}


def _compilers():
    try:
        return bs.find_compilers()
    except Exception:  # pragma: no cover - probing must never break collection
        return []


@pytest.mark.skipif(not _compilers(), reason="no glslangValidator installed: recompiling is not possible here")
def test_sources_recompile_and_match_shipped_bytes(tmp_path):
    compilers = _compilers()
    manifest = bs.load_manifest()["outputs"]
    compared = 0
    for out in bs.declared_outputs():
        usable = [c for c in compilers if c.version[:2] >= out.min_glslang]
        if not usable:
            continue
        comp = usable[0]
        dest = tmp_path / out.name
        bs.compile_output(out, comp, dest)
        # identical bytes are expected from the same glslang version that built the shipped file
        if manifest[out.name]["glslang"] == ".".join(map(str, comp.version)):
            assert dest.read_bytes() == (bs.SPV_DIR / out.name).read_bytes(), (
                f"{out.name}: recompiling {out.source_rel()} gives different SPIR-V than shipped"
            )
            compared += 1
    assert compared > 0, "no output could be compared with a matching glslang version"


def test_measured_kernels_stay_built_by_the_glslang_they_were_measured_with():
    wrong = {name: entry["glslang"] for name, entry in bs.load_manifest()["outputs"].items()
             if entry["source"] in MEASURED_GLSLANG and entry["glslang"] != MEASURED_GLSLANG[entry["source"]]}
    assert not wrong, (f"rebuilt by another glslang than the measured one: {wrong}; rebuild them with "
                       f"KBENCH_GLSLANG set to glslang {sorted(set(MEASURED_GLSLANG.values()))} "
                       f"(docs/shaders.md), or measure the new build and update MEASURED_GLSLANG")
