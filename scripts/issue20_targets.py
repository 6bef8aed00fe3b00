"""Issue 20's targets as ratios from the runs of one device session, as the Markdown table of the
README's performance-round section: kbench beside torch (`kbench bench --peer torch`; batches of vectors
with `--full -k n_vecs=`), beside ggml
where both re-read one weight matrix (`kbench bench --full --peer ggml -k rotate_mib=0`; 8 vectors with
`-k rotate_mib=0,n_vecs=8`), and the
quantized kernels against the read floor of the same weight bytes (`kbench probe read_floor`).

    python scripts/issue20_targets.py results/nvidia-h200/20261205T13*.jsonl \\
        --read-floor results/nvidia-h200/probes/20261205T1300-read_floor.log

Later files override earlier ones case by case; each ratio is between records of one
implementation pair, so run a pair in one command (the peers' files are written beside kbench's).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from h200_targets import clock_note, spread  # noqa: E402 - the record formatting of issue 7's table

SHAPES = ((14336, 4096), (4096, 14336))
QDTYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")
#: read_floor's size labels, by the weight type whose bytes they read
FLOOR_LABEL = {"Q4_0": "Q4_0/Q4_K", "Q4_K": "Q4_0/Q4_K", "Q8_0": "Q8_0", "Q6_K": "Q6_K"}
TARGETS = {"quant_floor": 0.9, "tensor": 0.6, "fp32": 0.85}


def load(paths: list[str]) -> dict[str, dict[str, dict]]:
    """implementation ("kbench", "torch-cuda", "ggml") -> case id -> the last passing bench record."""
    out: dict[str, dict[str, dict]] = {}
    for path in sorted(paths):
        with open(path, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        run = next((r for r in records if r.get("kind") == "run"), {})
        if run.get("backend_options"):
            print(f"# {path}: skipped, kernel options {run['backend_options']}", file=sys.stderr)
            continue
        for r in records:
            if (r.get("kind") == "case" and r.get("mode") == "bench" and r.get("status") == "pass"
                    and r.get("queue_config", "single") == "single"):
                impl = str(r.get("implementation", "kbench")).split("@")[0].replace("ggml-vulkan", "ggml")
                out.setdefault(impl, {})[r["case_id"]] = r
    return out


def read_floor(path: str | None) -> dict[str, float]:
    """read_floor's '# floor LABEL: X us' lines: label -> us."""
    if not path:
        return {}
    text = open(path, encoding="utf-8").read()
    return {m[0]: float(m[1]) for m in re.findall(r"^# floor (\S+): ([\d.]+) us", text, re.M)}


def us(r: dict) -> float:
    return (r.get("gpu_ns") or r["host_ns"])["median"] / 1e3


def timed_weights(r: dict, rows: int, cols: int, n_vecs: int = 1) -> str:
    """The record's time and GB/s of weight bytes (its bytes less x and y, 4 bytes an element)."""
    weights = r["bytes"] - 4 * n_vecs * (rows + cols)
    return f"{spread(r)}, {weights / us(r) / 1e3:.0f} GB/s of weights"


def verdict(ratio: float, need: float) -> str:
    return f"{ratio:.2f}x ({'met' if ratio >= need else '**not met**'}, need {need}x)"


def quantized_rows(runs: dict, floor: dict[str, float]) -> list[str]:
    kb, pt, gg = runs.get("kbench", {}), runs.get("torch-cuda", {}), runs.get("ggml", {})
    rows = []
    for rows_, cols in SHAPES:
        for d in QDTYPES:
            cold = f"quantized_matmul[n_rows={rows_},n_cols={cols},rotate_mib=256,dtype={d}]"
            hot = f"quantized_matmul[n_rows={rows_},n_cols={cols},rotate_mib=0,dtype={d}]"
            r = kb.get(cold)
            cells = [f"{d} {rows_}x{cols}"]
            if r is None:
                cells += ["not run", "", "", ""]
            else:
                cells.append(timed_weights(r, rows_, cols))
                f_us = floor.get(FLOOR_LABEL[d])
                cells.append(verdict(f_us / us(r), TARGETS["quant_floor"]) + f" of the floor {f_us:.2f} us"
                             if f_us else "floor not measured")
                p = pt.get(cold)
                cells.append(f"torch {spread(p)} ({us(p) / us(r):.2f}x)" if p else "")
                cells.append(clock_note(r))
            h, g = kb.get(hot), gg.get(hot)
            cells.append(f"kbench {spread(h)} / ggml {spread(g)}: {'met' if us(h) <= us(g) else '**not met**'} "
                         f"({us(g) / us(h):.2f}x)" if h and g else "not run")
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def batch_rows(runs: dict) -> list[str]:
    """Batches of 2, 4, 8 vectors (`kbench bench --full --peer torch -k n_vecs=`): kbench against the torch
    peer, rotating 256 MiB of weight copies; then 8 vectors re-reading one matrix (`-k rotate_mib=0,n_vecs=8`),
    against torch and ggml (`--peer ggml`)."""
    kb, pt, gg = runs.get("kbench", {}), runs.get("torch-cuda", {}), runs.get("ggml", {})
    rows = []
    for rotate, counts in ((256, (2, 4, 8)), (0, (8,))):
        for d in QDTYPES:
            for rows_, cols in SHAPES:
                for nv in counts:
                    cid = f"quantized_matmul[n_rows={rows_},n_cols={cols},rotate_mib={rotate},n_vecs={nv},dtype={d}]"
                    r = kb.get(cid)
                    if r is None:
                        continue
                    cells = [f"{d} {rows_}x{cols} x{nv}" + ("" if rotate else " re-read"), timed_weights(r, rows_, cols, nv)]
                    p, g = pt.get(cid), gg.get(cid)
                    cells.append(f"torch {spread(p)}: {'beaten' if us(r) < us(p) else '**not beaten**'} "
                                 f"({us(p) / us(r):.2f}x)" if p else "no torch record")
                    cells.append(f"ggml {spread(g)} ({us(g) / us(r):.2f}x)" if g else "")
                    cells.append(clock_note(r))
                    rows.append("| " + " | ".join(cells) + " |")
    return rows


def matmul_rows(runs: dict) -> list[str]:
    kb, pt, gg = runs.get("kbench", {}), runs.get("torch-cuda", {}), runs.get("ggml", {})
    rows = []
    for case, need in (("matmul_f16", TARGETS["tensor"]), ("matmul_bf16", TARGETS["tensor"]), ("matmul", TARGETS["fp32"])):
        for s in (4096, 8192):
            cid = f"{case}[m={s},n={s},k={s}]"
            r = kb.get(cid)
            if r is None:
                continue
            tf = r["gflops"] / 1e3
            nmse = (r.get("metric") or {}).get("nmse")
            cells = [f"{case} {s}^3", f"{tf:.1f} TFLOP/s, {spread(r)}" + (f", NMSE {nmse:.1e}" if nmse is not None else "")]
            p = pt.get(cid)
            cells.append(f"torch {p['gflops'] / 1e3:.1f} TFLOP/s: " + verdict(r["gflops"] / p["gflops"], need) if p else "no torch record")
            g = gg.get(cid)
            cells.append(f"ggml {g['gflops'] / 1e3:.1f} TFLOP/s ({r['gflops'] / g['gflops']:.2f}x)" if g else "")
            cells.append(clock_note(r))
            rows.append("| " + " | ".join(cells) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="result files (*.jsonl) of one device session")
    ap.add_argument("--read-floor", metavar="LOG", help="the log of `kbench probe read_floor` in the same session")
    args = ap.parse_args(argv)
    runs, floor = load(args.runs), read_floor(args.read_floor)
    if not runs.get("kbench"):
        ap.error("no passing kbench bench records in the files given")
    print("| quantized_matmul (automatic kernel) | kbench, rotating 256 MiB of copies | against the read floor | "
          "torch peer (fp32 mv of the dequantized weights) | clock | re-reading one matrix: kbench / ggml |")
    print("|---|---|---|---|---|---|")
    print("\n".join(quantized_rows(runs, floor)))
    print()
    batches = batch_rows(runs)
    if batches:
        print("| quantized_matmul, a batch of vectors | kbench (rotating 256 MiB of copies; re-read: one matrix) | torch "
              "peer (fp32 mm of the dequantized weights) | ggml (re-read) | clock |")
        print("|---|---|---|---|---|")
        print("\n".join(batches))
        print()
    print("| matrix product | kbench | torch | ggml | clock |")
    print("|---|---|---|---|---|")
    print("\n".join(matmul_rows(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
