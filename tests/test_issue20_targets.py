"""scripts/issue20_targets.py: the README's round-3 table is computed from one session's records,
each ratio between the right pair (kbench's rotated figure against the read floor and torch,
kbench's re-read figure against ggml's)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("issue20_targets", ROOT / "scripts" / "issue20_targets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rec(cid: str, impl: str, median_ns: float, **extra) -> dict:
    stats = {"median": median_ns, "min": median_ns * 0.99, "max": median_ns * 1.02, "n": 7}
    timer = "host_ns" if impl.startswith("ggml") else "gpu_ns"
    return {"kind": "case", "mode": "bench", "status": "pass", "case_id": cid, "implementation": impl,
            timer: stats, "bytes": 33103872 + 4 * (14336 + 4096), **extra}


def test_quantized_rows_pair_rotated_with_floor_and_torch_and_re_read_with_ggml(tmp_path, capsys):
    cold = "quantized_matmul[n_rows=14336,n_cols=4096,rotate_mib=256,dtype=Q4_0]"
    hot = "quantized_matmul[n_rows=14336,n_cols=4096,rotate_mib=0,dtype=Q4_0]"
    kb = tmp_path / "a.jsonl"
    kb.write_text("\n".join(json.dumps(r) for r in (
        {"kind": "run"}, _rec(cold, "kbench", 20000.0), _rec(hot, "kbench", 10000.0))))
    pt = tmp_path / "a-torch-cuda.jsonl"
    pt.write_text(json.dumps(_rec(cold, "torch-cuda", 40000.0)))
    gg = tmp_path / "b-ggml.jsonl"
    gg.write_text(json.dumps(_rec(hot, "ggml-vulkan@d99724f+coopmat2", 12500.0)))
    floor = tmp_path / "read_floor.log"
    floor.write_text("# floor Q4_0/Q4_K: 18.00 us = 1.8 TB/s = 0.72x copy (grid full)\n")
    assert _script().main([str(kb), str(pt), str(gg), "--read-floor", str(floor)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| Q4_0 14336x4096"))
    assert "0.90x (met, need 0.9x) of the floor 18.00 us" in row, row
    assert "torch 40.0 us" in row and "(2.00x)" in row, row
    assert "kbench 10.0 us" in row and "ggml 12.5 us" in row and "met (1.25x)" in row, row


def test_a_run_with_kernel_options_is_not_taken_for_the_defaults(tmp_path, capsys):
    f = tmp_path / "x.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in (
        {"kind": "run", "backend_options": {"qmatvec": {"rows": 2}}},
        _rec("quantized_matmul[n_rows=14336,n_cols=4096,rotate_mib=256,dtype=Q4_0]", "kbench", 1.0))))
    mod = _script()
    assert mod.load([str(f)]) == {}
    assert "skipped, kernel options" in capsys.readouterr().err


def _batch_row(tmp_path, capsys, cid: str, head: str, ns: dict[str, float]) -> str:
    """The table row starting with ``head`` from one batch case's records: implementation -> median ns
    (each in a file of its own, the bytes those of 8 vectors)."""
    files = []
    for i, (impl, median) in enumerate(ns.items()):
        f = tmp_path / f"{i}-{impl}.jsonl"
        f.write_text(json.dumps(_rec(cid, impl, median, bytes=33103872 + 4 * 8 * (14336 + 4096))))
        files.append(str(f))
    assert _script().main(files) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith(head))


def test_batches_of_vectors_are_paired_with_the_torch_peer_and_count_only_weight_bytes(tmp_path, capsys):
    cid = "quantized_matmul[n_rows=14336,n_cols=4096,rotate_mib=256,n_vecs=8,dtype=Q4_0]"
    row = _batch_row(tmp_path, capsys, cid, "| Q4_0 14336x4096 x8", {"kbench": 66208.0, "torch-cuda": 50000.0})
    assert "66.2 us" in row and "500 GB/s of weights" in row, row
    assert "torch 50.0 us [49.5-51.0]: **not beaten** (0.76x)" in row, row


def test_eight_vectors_re_reading_one_matrix_are_paired_with_torch_and_ggml(tmp_path, capsys):
    cid = "quantized_matmul[n_rows=4096,n_cols=14336,rotate_mib=0,n_vecs=8,dtype=Q4_K]"
    row = _batch_row(tmp_path, capsys, cid, "| Q4_K 4096x14336 x8 re-read",
                     {"kbench": 60000.0, "torch-cuda": 48000.0, "ggml-vulkan@d99724f+coopmat2": 90000.0})
    assert "torch 48.0 us [47.5-49.0]: **not beaten** (0.80x)" in row, row
    assert "ggml 90.0 us [89.1-91.8] (1.50x)" in row, row
