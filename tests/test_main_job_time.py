"""The main job finishes fast and shows where its time goes (issue 20): `bench --quick` and
`--full` from the case declarations, the phase split every record carries, the end-of-run summary,
progress with done/total and the time left, and the clock test that ends a warm-up."""
from __future__ import annotations

import io
import json
import os
import re

import pytest

from kbench.bench.clocks import ClockReady
from kbench.bench.execute import size_reason
from kbench.cases import ALL_CASES, get_case, instances
from kbench.cases.base import pick_quick
from kbench.console import RichProgress, TextProgress, make_progress, time_summary
from kbench.results.records import PHASES, phase_fields
from kbench.results.schema import RecordError, validate_record

MiB = 1 << 20


def _sizes_per_case(insts) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for inst in insts:
        out.setdefault(inst.case.name, set()).add(inst.case.size_index(inst.params))
    return out


def _fits(props: dict, max_bytes: int | None):
    return lambda inst: not size_reason(inst, props, max_bytes)


GPU_PROPS = {"memory_bytes": 141 << 30, "max_storage_buffer_range": 4 << 30}
CPU_PROPS = {"memory_bytes": 8 << 30, "max_storage_buffer_range": 2 << 30}


@pytest.mark.parametrize("props,max_bytes", [(GPU_PROPS, None), (CPU_PROPS, 16 * MiB)], ids=["gpu", "cpu-16MiB"])
def test_quick_selects_exactly_one_size_per_headline_case(props, max_bytes):
    planned = instances("bench", sizes="quick")
    picked = pick_quick(planned, _fits(props, max_bytes))
    headline = {c.name for c in ALL_CASES if c.quick is not None}
    per_case = _sizes_per_case(picked)
    assert set(per_case) == headline, f"quick ran {sorted(per_case)}, the declarations mark {sorted(headline)}"
    many = {name: sorted(idx) for name, idx in per_case.items() if len(idx) != 1}
    assert not many, f"each headline case should run one size, got several: {many}"


def test_quick_headline_set_comes_from_the_declarations_and_covers_the_main_ops():
    picked = pick_quick(instances("bench", sizes="quick"), _fits(GPU_PROPS, None))
    ids = [i.case_id for i in picked]
    names = {i.case.name for i in picked}
    for op in ("add", "softmax", "rms_norm", "matmul", "matmul_f16", "quantized_matmul", "attention_fused",
               "copy_buffer", "copy_roundtrip"):
        assert op in names, f"{op} should be a headline case of --quick, got {ids}"
    dtypes = sorted(i.params["dtype"] for i in picked if i.case.name == "quantized_matmul")
    assert dtypes == sorted(("Q4_0", "Q8_0", "Q4_K", "Q6_K")), f"one quantized matmul per main dtype, got {dtypes}"
    assert "add[size=16777216]" in ids and "matmul[m=4096,n=4096,k=4096]" in ids, ids
    assert len(ids) <= 16, f"--quick should stay a short run, it plans {len(ids)} cases: {ids}"


def test_quick_falls_back_to_the_largest_size_that_fits_a_small_device():
    picked = pick_quick(instances("bench", sizes="quick"), _fits(CPU_PROPS, 16 * MiB))
    by_case = {i.case.name: i for i in picked}
    assert by_case["add"].params["size"] == 1 << 20, f"16M does not fit 16 MiB: expected 1M, got {by_case['add'].case_id}"
    assert by_case["matmul"].params["m"] == 1024, by_case["matmul"].case_id
    qmm = {(i.params["n_rows"], i.params["n_cols"]) for i in picked if i.case.name == "quantized_matmul"}
    assert qmm == {(1024, 4096)}, f"the model shape rotates 256 MiB: expected the small shape, got {qmm}"
    # nothing smaller declared: the headline size stays and its record says why it cannot run
    assert by_case["attention_fused"].params["seq_len"] == 8192


def test_every_quick_marker_names_one_of_its_bench_sizes():
    for case in ALL_CASES:
        if case.quick is not None:
            idx = case.quick_size_index()
            assert 0 <= idx < len(case.bench_sizes), f"{case.name}: quick names size {idx}"
            assert case.instances("bench", "quick"), f"{case.name}: quick marker selects no instance"


def test_the_default_set_leaves_the_full_only_sizes_to_full():
    default = {i.case_id for i in instances("bench")}
    full = {i.case_id for i in instances("bench", sizes="full")}
    assert default < full, "--full should add instances to the default set"
    for cid in ("add[size=268435456]", "copy_buffer[size=1073741824]", "copy_roundtrip[size=536870912]",
                "quantized_matmul[n_rows=14336,n_cols=4096,rotate_mib=256,dtype=Q5_1]",
                "kp_sync[size=16777216,dtype=int8]", "kp_copy[size=1048576,dtype=float16]"):
        assert cid in full and cid not in default, f"{cid} should run with --full only"
    for cid in ("add[size=16777216]", "quantized_matmul[n_rows=14336,n_cols=4096,rotate_mib=256,dtype=Q4_K]",
                "quantized_matmul[n_rows=1024,n_cols=4096,dtype=Q5_1]", "kp_sync[size=16777216,dtype=float32]",
                "matmul[m=8192,n=8192,k=8192]"):
        assert cid in default, f"{cid} should stay in the default set"


def test_an_unknown_size_set_is_refused():
    with pytest.raises(ValueError, match="sizes must be one of"):
        get_case("add").instances("bench", "huge")
    from kbench.bench.runner import RunOptions

    with pytest.raises(ValueError, match="sizes must be one of"):
        RunOptions(mode="bench", sizes="huge")


def test_kbench_cases_lists_the_quick_and_full_sets(capsys):
    from kbench.cli import main

    sets = {}
    for flag in ("--quick", None, "--full"):
        assert main(["cases", "--mode", "bench"] + ([flag] if flag else [])) == 0
        sets[flag] = capsys.readouterr().out.split()
    assert len(sets["--quick"]) < len(sets[None]) < len(sets["--full"]), {k: len(v) for k, v in sets.items()}
    assert "add[size=16777216]" in sets["--quick"] and "add[size=1048576]" not in sets["--quick"], sets["--quick"]
    assert main(["cases", "--quick"]) == 2, "--quick lists bench instances: validate mode should be refused"


def test_a_pattern_of_full_only_sizes_says_to_add_full(capsys):
    from kbench.cli import main

    rc = main(["bench", "-k", "add[size=268435456]", "--out", "/nonexistent-kbench-out"])
    err = capsys.readouterr().err
    assert rc == 2 and "add --full" in err, f"expected a usage error naming --full, got {rc}: {err}"


# ------------------------------------------------------------------ phases in the record

def test_phase_fields_keep_the_declared_order_and_refuse_unknown_phases():
    got = phase_fields(2.5, {"check": 0.25, "setup": 1.0})
    assert got == {"wall_s": 2.5, "phases_s": {"setup": 1.0, "check": 0.25}}, got
    assert list(got["phases_s"]) == [p for p in PHASES if p in got["phases_s"]]
    with pytest.raises(ValueError, match="unknown phase"):
        phase_fields(1.0, {"nap": 0.5})


def test_the_schema_takes_phases_and_refuses_a_negative_one(tmp_path):
    from kbench.results import RunWriter, collect_provenance
    from kbench.results.records import case_record

    props = {"device_name": "GPU A", "vendor_name": "Vendor", "vendor_id": 1, "device_id": 2,
             "driver_name": "drv", "driver_version": "1.0", "api_version": "1.3.0", "device_type": "discrete_gpu"}
    with RunWriter(tmp_path, collect_provenance(props, "vulkan")) as writer:
        rec = case_record("add", {"size": 1}, mode="validate", status="pass", queue_config="single",
                          queues=[[0, 0]], **phase_fields(1.0, {"setup": 0.5}))
        written = writer.write(rec)
        assert written["phases_s"] == {"setup": 0.5} and written["wall_s"] == 1.0, written
        with pytest.raises(RecordError, match="phases_s.setup"):
            validate_record({**written, "phases_s": {"setup": -0.1}})


def _bench_record_on_numpy():
    from kbench.bench.devices import enumerate_devices, open_target
    from kbench.bench.execute import run_instance
    from kbench.bench.queues import QueueConfig
    from kbench.bench.timing import TimingPolicy

    props = enumerate_devices("numpy")[0]
    target = open_target("numpy", props, QueueConfig("single", (0,), ((0, 0, 0),)))
    try:
        inst = next(i for i in get_case("add").instances("bench") if i.params["size"] == 1 << 20)
        policy = TimingPolicy(min_sample_s=0.001, samples=3, max_repeats=4, settle_max_s=0.0)
        return run_instance(inst, target, "bench", policy=policy)
    finally:
        target.close()


def test_a_bench_record_carries_its_phases_and_they_sum_to_at_most_its_wall_time():
    rec = _bench_record_on_numpy()
    assert rec["status"] == "pass", rec.get("reason")
    phases = rec["phases_s"]
    for name in ("inputs", "setup", "run", "reference", "check", "warmup", "host_samples", "teardown"):
        assert name in phases, f"phase {name!r} missing from {phases}"
    assert set(phases) <= set(PHASES), f"phases outside PHASES: {set(phases) - set(PHASES)}"
    assert rec["wall_s"] > 0 and all(v >= 0 for v in phases.values()), rec
    assert sum(phases.values()) <= rec["wall_s"] + 1e-3, f"phases {phases} sum past wall_s {rec['wall_s']}"


def test_an_unsupported_case_still_says_how_long_it_took():
    from test_cases import numpy_target

    from kbench.bench.execute import run_instance

    inst = next(i for i in get_case("add").instances("bench", "full") if i.params["size"] == 256 << 20)
    rec = run_instance(inst, numpy_target(max_storage_buffer_range=128 << 20))
    assert rec["status"] == "unsupported" and rec["wall_s"] >= 0 and rec["phases_s"] == {}, rec


# ------------------------------------------------------------------ end-of-run summary

def _timed(cid, wall, **phases):
    return {"kind": "case", "case_id": cid, "mode": "bench", "status": "pass", "implementation": "kbench",
            "queue_config": "single", "wall_s": wall, "phases_s": phases}


def test_time_summary_names_the_phases_largest_first_and_the_slowest_cases():
    recs = [_timed("add[size=1]", 1.0, setup=0.2, gpu_timing=0.7),
            _timed("matmul[m=8192]", 10.0, reference=6.0, setup=3.0, gpu_timing=0.5),
            {"kind": "peak", "peak": "peak.copy_bandwidth", "wall_s": 0.5}]
    text = time_summary(recs, run_wall_s=20.0, top=2)
    assert "3 result(s)" in text and "of 20 s" in text, text
    by_phase = text.splitlines()[1]
    assert by_phase.index("reference 6.0 s") < by_phase.index("setup 3.2 s") < by_phase.index("gpu_timing 1.2 s"), by_phase
    assert "other" in by_phase, f"0.8 s of the cases' time is in no phase: expected 'other', got {by_phase}"
    assert "peaks 0.5 s" in by_phase, f"the peak's measurement should count as 'peaks': {by_phase}"
    slow = text.split("slowest:")[1].splitlines()
    assert "matmul[m=8192]" in slow[1] and "reference 6.00" in slow[1], slow
    assert "add[size=1]" in slow[2] and len(slow) == 3, f"top=2 should list two cases, got {slow}"


def test_time_summary_names_each_part_of_the_run_with_its_device_open_time():
    text = time_summary([_timed("add[size=1]", 1.0, setup=0.5)], run_wall_s=9.0,
                        sections=[{"label": "GPU A [single]", "wall_s": 5.0, "open_s": 1.5},
                                  {"label": "torch-cuda", "wall_s": 3.0, "open_s": 0.0}])
    line = next(ln for ln in text.splitlines() if "by part:" in ln)
    assert "GPU A [single] 5.0 s (open 1.5 s)" in line and "torch-cuda 3.0 s" in line, line


def test_the_runner_reports_each_part_with_its_open_time(tmp_path):
    from kbench.bench.runner import RunOptions, Runner

    opts = RunOptions(mode="validate", backend="numpy", patterns=["add[size=3]"], out_dir=tmp_path)
    result = Runner(opts).run()
    assert len(result.sections) == 1, result.sections
    sec = result.sections[0]
    assert "[single]" in sec["label"] and 0 < sec["open_s"] <= sec["wall_s"], sec


def test_time_summary_is_empty_without_timed_records():
    assert time_summary([{"kind": "case", "case_id": "x"}]) == ""


# ------------------------------------------------------------------ progress

def test_log_progress_prints_one_line_per_case_with_done_total_and_time_left():
    now = [0.0]
    out = io.StringIO()
    p = TextProgress(stream=out, every_case=True, clock=lambda: now[0])
    p.begin(3, "GPU A [single]")
    for k, cid in enumerate(("add[size=1]", "add[size=2]", "add[size=3]")):
        now[0] += 10.0
        p.start(cid)
        p.advance({"kind": "case", "case_id": cid, "mode": "validate", "status": "pass"})
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("  [")]
    assert len(lines) == 3, f"expected a line per case, got:\n{out.getvalue()}"
    assert lines[0].startswith("  [1/3] pass") and "add[size=1]" in lines[0] and "(20 s left)" in lines[0], lines[0]
    assert "(10 s left)" in lines[1], lines[1]
    assert "left" not in lines[2], f"nothing is left after the last case: {lines[2]}"


def test_progress_without_a_terminal_is_a_line_per_case_also_in_validate(monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())
    p = make_progress(quiet=False, verbose=False, every_case=False)
    assert isinstance(p, TextProgress) and p.every_case, "a log should get a line per finished case"


def test_the_live_bar_shows_the_running_case_done_total_and_time_left():
    from rich.console import Console
    from rich.progress import MofNCompleteColumn, TimeRemainingColumn

    console = Console(file=io.StringIO(), force_terminal=False, width=200)
    p = RichProgress(every_case=True, console=console)
    try:
        kinds = {type(c) for c in p.bar.columns}
        assert {MofNCompleteColumn, TimeRemainingColumn} <= kinds, f"bar columns: {kinds}"
        p.begin(2, "GPU A [single]")
        p.start("softmax[size=3]")
        task = p.bar.tasks[0]
        from rich.markup import escape

        # shown as text, not markup: the brackets are escaped for rich
        assert task.fields["last"] == escape("running softmax[size=3]"), task.fields
        assert task.total == 2 and task.completed == 0
    finally:
        p.end()


def test_the_runner_tells_progress_which_case_starts(tmp_path):
    from kbench.bench.runner import RunOptions, Runner

    seen: list[tuple[str, str]] = []

    class Spy:
        def begin(self, total, label):
            seen.append(("begin", label))

        def start(self, case_id):
            seen.append(("start", case_id))

        def advance(self, record):
            seen.append(("advance", record.get("case_id")))

        def note(self, text):
            pass

        def end(self):
            pass

    opts = RunOptions(mode="validate", backend="numpy", patterns=["add[size=3]"], out_dir=tmp_path)
    Runner(opts, Spy()).run()
    starts = [cid for kind, cid in seen if kind == "start"]
    assert starts == ["add[size=3]"], seen
    assert seen.index(("start", "add[size=3]")) < seen.index(("advance", "add[size=3]")), seen


# ------------------------------------------------------------------ clocks

class _Clock:
    def __init__(self, readings):
        self.readings, self.t = list(readings), 0.0

    def read(self):
        self.t += 0.1
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def now(self):
        return self.t


def test_a_boosted_clock_is_ready_at_once():
    c = _Clock([1980.0])
    assert ClockReady(c.read, 1980.0, now=c.now)() is True


def test_a_power_limited_plateau_is_ready_after_its_hold():
    c = _Clock([1470.0])  # fp16 tensor-core matmul on the H200: 0.74 of 1980 MHz, for as long as it runs
    ready = ClockReady(c.read, 1980.0, now=c.now)
    got = [ready() for _ in range(6)]
    assert got[0] is False and got[-1] is True, f"a held 1470 MHz should count as settled after 0.25 s, got {got}"


def test_a_low_clock_is_never_taken_for_a_plateau():
    c = _Clock([345.0])  # idle clock: from here the climb holds each step for seconds
    ready = ClockReady(c.read, 1980.0, now=c.now)
    assert not any(ready() for _ in range(50)), "345 MHz of 1980 held for 5 s is still a climb, not a plateau"


def test_a_rising_clock_restarts_the_hold():
    c = _Clock([1300.0, 1300.0, 1500.0, 1500.0, 1500.0, 1500.0])
    ready = ClockReady(c.read, 1980.0, now=c.now)
    got = [ready() for _ in range(6)]
    assert got[:5] == [False] * 5 and got[5] is True, got


# ------------------------------------------------------------------ end to end on lavapipe

def _quick_bench_on_the_cpu_driver(tmp_path, capsys, *args: str):
    """`kbench bench --quick ARGS` with short samples into tmp_path: its captured output and records."""
    from conftest import NO_DEVICE

    from kbench.cli import main

    if NO_DEVICE is not None:
        pytest.skip(NO_DEVICE)
    rc = main(["bench", "--quick", *args, "--out", str(tmp_path), "--samples", "2", "--min-sample-ms", "1"])
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    return out, [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]


def test_bench_quick_on_the_cpu_driver_runs_one_size_per_case_and_prints_where_the_time_went(tmp_path, capsys):
    out, recs = _quick_bench_on_the_cpu_driver(tmp_path, capsys, "--no-peaks", "-k", "add", "-k", "copy_buffer")
    cases = sorted(r["case_id"] for r in recs if r.get("kind") == "case")
    assert cases == ["add[size=1048576]", "copy_buffer[size=4194304]"], f"expected one size per case, got {cases}"
    for r in recs:
        if r.get("kind") == "case":
            validate_record(r)
            assert sum(r["phases_s"].values()) <= r["wall_s"] + 1e-3, r
            assert "gpu_timing" in r["phases_s"], f"a lavapipe bench case is GPU-timed: {r['phases_s']}"
    assert "where the time went: 2 result(s)" in out.out and "slowest:" in out.out, out.out
    assert "[1/2]" in out.err and "[2/2]" in out.err, f"expected a progress line per case:\n{out.err}"


# ------------------------------------------------------------------ host arrays kept for the peer

def test_a_slow_array_set_is_made_once_per_run_and_read_back_bit_for_bit(tmp_path, monkeypatch):
    import numpy as np

    from kbench.bench import host_cache

    monkeypatch.setenv(host_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(host_cache, "MIN_SECONDS", 0.0)
    made = []

    def make():
        made.append(1)
        return {"w": np.arange(12, dtype=np.uint8).reshape(3, 4), "x": np.linspace(0, 1, 5)}

    stem = host_cache.key("qmm[n=1]", 0, 0, "inputs")
    first = host_cache.cached(stem, make)
    again = host_cache.cached(stem, make)
    assert len(made) == 1, f"the set should be made once, made {len(made)} times"
    for name in first:
        assert again[name].dtype == first[name].dtype and np.array_equal(again[name], first[name]), name
        assert again[name].shape == first[name].shape
    other = host_cache.cached(host_cache.key("qmm[n=1]", 1, 0, "inputs"), make)  # another seed: made again
    assert len(made) == 2 and np.array_equal(other["w"], first["w"])


def test_fast_sets_and_runs_without_a_cache_directory_make_the_arrays_every_time(tmp_path, monkeypatch):
    import numpy as np

    from kbench.bench import host_cache

    made = []

    def make():
        made.append(1)
        return {"x": np.zeros(3)}

    monkeypatch.delenv(host_cache.CACHE_ENV, raising=False)
    host_cache.cached("a", make), host_cache.cached("a", make)
    monkeypatch.setenv(host_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(host_cache, "MIN_SECONDS", 60.0)
    host_cache.cached("b", make), host_cache.cached("b", make)
    assert len(made) == 4 and not list(tmp_path.iterdir()), "nothing should be kept"


def test_the_second_implementation_of_an_instance_reuses_inputs_and_reference(tmp_path, monkeypatch):
    import dataclasses

    from test_cases import numpy_target

    from kbench.bench import host_cache
    from kbench.bench.execute import run_instance
    from kbench.cases import Instance

    monkeypatch.setenv(host_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(host_cache, "MIN_SECONDS", 0.0)
    calls = {"generate": 0, "reference": 0}
    add = get_case("add")

    def generate(p, rng):
        calls["generate"] += 1
        return add.generate(p, rng)

    def reference(inp, p):
        calls["reference"] += 1
        return add.reference(inp, p)

    case = dataclasses.replace(add, generate=generate, reference=reference)
    inst = Instance(case, {"size": 1000})
    recs = [run_instance(inst, numpy_target(), "validate", seed=3) for _ in range(2)]
    assert [r["status"] for r in recs] == ["pass", "pass"], [r.get("reason") for r in recs]
    assert calls == {"generate": 1, "reference": 1}, f"the second run should read both sets back: {calls}"
    assert recs[0]["metric"] == recs[1]["metric"], "the same inputs should give the same error"


def test_a_killed_runs_cache_directory_is_removed_by_the_next_run(tmp_path, monkeypatch):
    import tempfile

    from kbench.bench import host_cache

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / f"{host_cache.PREFIX}999999999-abcd"  # no such pid
    live = tmp_path / f"{host_cache.PREFIX}{os.getpid()}-abcd"
    for d in (dead, live):
        (d / "set").mkdir(parents=True)
    fresh = host_cache.new_directory()
    assert not dead.exists(), "the killed run's arrays should be gone"
    assert live.exists(), "a running kbench's directory must stay"
    assert not fresh.exists() and fresh.parent == tmp_path, "the new directory is made only when something is kept"


def test_bench_summary_counts_the_device_peaks_its_progress_counted_beside_the_results(tmp_path, capsys):
    out, recs = _quick_bench_on_the_cpu_driver(tmp_path, capsys, "-k", "add")
    peaks = sum(1 for r in recs if r.get("kind") == "peak")
    results = sum(1 for r in recs if r.get("kind") == "case")
    total = re.search(r"\[\d+/(\d+)\]", out.err)
    assert peaks and total and int(total.group(1)) == peaks + results, f"{peaks} peaks, {results} results:\n{out.err}"
    line = next((ln for ln in out.out.splitlines() if ln.startswith("kbench bench: ")), "")
    assert f"{results} result(s) (and {peaks} device peak(s) measured)" in line, f"expected both counts, got {line!r}"
