"""Which cases a kernel set runs: kbench's own backend cases for the ComputeBackend ops it declares
(same sizes, inputs, references and tolerances, so its rows meet kbench's in one table), and one
case per custom op built from the declaration's ``[op.<name>]`` table.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kbench.cases.base import Arrays, Case, Params
from kbench.cases.buffers import BackendBuffers

from .declaration import CustomOp, Declaration


def _uniform(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, int(n)).astype(np.float32)


def custom_case(op: CustomOp) -> Case:
    """A Case for a custom op: float32 inputs uniform in [-1, 1], the declared float64 reference,
    guarded outputs, the declared tolerance, bytes and FLOPs."""

    def generate(p: Params, rng: np.random.Generator) -> Arrays:
        return {n: _uniform(rng, f.int_value(p)) for n, f in op.inputs.items()}

    def reference(inp: Arrays, p: Params) -> Arrays:
        env: dict[str, Any] = {n: np.asarray(a, np.float64) for n, a in inp.items()}
        env.update(p)
        out = {}
        for name, expr in op.reference.items():
            value = np.broadcast_to(np.asarray(expr(env), np.float64), (op.outputs[name].int_value(p),))
            out[name] = np.array(value)
        return out

    def setup(t: Any, inp: Arrays, p: Params) -> dict:
        bufs = BackendBuffers(t.backend)
        state: dict[str, Any] = {"bufs": bufs, "guarded": {}}
        for n in op.inputs:
            state[n] = bufs.upload(inp[n])
        for n, f in op.outputs.items():
            g = bufs.guarded(4 * f.int_value(p))
            state["guarded"][n] = g
            state[n] = g.handle
        return state

    def launch(t: Any, s: dict, p: Params) -> None:
        run = getattr(t.backend, "run_custom", None)
        if run is None:
            from kbench.cases.base import UnsupportedCase

            raise UnsupportedCase(f"{op.name} is a custom op of a declared kernel set; this backend has no kernel for it")
        run(op.name, {n: s[n] for n in op.buffers}, dict(p))

    def collect(t: Any, s: dict, p: Params) -> Arrays:
        t.backend.synchronize()
        bufs: BackendBuffers = s["bufs"]
        return {n: bufs.read_f32(g, n) for n, g in s["guarded"].items()}

    def teardown(_t: Any, s: Any) -> None:
        if isinstance(s, dict) and "bufs" in s:
            s["bufs"].free_all()

    def total_bytes(p: Params) -> int:
        return 4 * sum(f.int_value(p) for f in (*op.inputs.values(), *op.outputs.values()))

    return Case(
        name=op.name, layer="backend", description=op.description or f"custom op {op.name}",
        generate=generate, reference=reference, setup=setup, launch=launch, collect=collect, teardown=teardown,
        validate_sizes=op.validate, bench_sizes=op.bench, ops=(op.name,), tolerance=op.tolerance,
        bytes_moved=(lambda p: op.bytes.int_value(p)) if op.bytes is not None else total_bytes,
        flops=(lambda p: op.flops.int_value(p)) if op.flops is not None else (lambda p: 0),
        footprint=total_bytes,
        largest_buffer=lambda p: 4 * max(f.int_value(p) for f in (*op.inputs.values(), *op.outputs.values())),
        peak=op.peak,
    )


def cases_for(declaration: Declaration, declared_ops: frozenset[str], all_cases: tuple[Case, ...]) -> list[Case]:
    """The cases one kernel group runs: kbench's backend cases whose every op the group declares,
    then the group's custom ops."""
    picked = [c for c in all_cases if c.layer == "backend" and c.ops and set(c.ops) <= declared_ops]
    picked += [custom_case(op) for name, op in declaration.custom_ops.items() if name in declared_ops]
    return picked
