"""The read floor of quantized_matmul on this device: how fast can any kernel read the weight
bytes of one call, with a barrier after every call (issue 7's 0.7x-copy target)?

A flat read-only kernel (16-byte loads, UNROLL independent loads in flight per invocation, a
grid-stride loop over GRID workgroups of WG invocations) reads buffers of the sizes of the
four formats' 14336x4096 weights.  Copies rotate through > 4x the 50 MB L2, so every call reads
HBM.  Each call may write one word of a shared output (only if its xor of the data equals a
pushed value that never occurs), which the sequence's hazard tracking turns into a barrier
between calls, the way consecutive quantized_matmul calls into one output are separated.
Also timed: the same reads without barriers (each call its own output), an empty dispatch
with a barrier (the fixed cost per call), and a 256 MiB copy (the copy bandwidth the target is
a fraction of).  GPU timestamps; the GPU is kept busy for --warm-s first.

    kbench probe read_floor            # the H200 run (about 20 s)
    kbench probe read_floor --small    # lavapipe smoke run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


import kbench.runtime as kp

READ = """
#version 450
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint UNROLL = 4;
layout(std430, binding = 0) readonly buffer W { uvec4 w[]; };
layout(std430, binding = 1) buffer O { uint o[]; };
layout(push_constant) uniform P { uint n16; uint magic; } p;
void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uint i = gl_GlobalInvocationID.x;
    uvec4 acc = uvec4(0);
    for (; i + (UNROLL - 1u) * stride < p.n16; i += UNROLL * stride) {
        uvec4 v[UNROLL];
        for (uint k = 0u; k < UNROLL; ++k) v[k] = w[i + k * stride];
        for (uint k = 0u; k < UNROLL; ++k) acc ^= v[k];
    }
    for (; i < p.n16; i += stride) acc ^= w[i];
    uint s = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (s == p.magic) o[0] = s;
}
"""

COPY = """
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer S { uvec4 s[]; };
layout(std430, binding = 1) writeonly buffer D { uvec4 d[]; };
layout(push_constant) uniform P { uint n16; } p;
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < p.n16; i += stride) d[i] = s[i];
}
"""

# weight bytes of one 14336x4096 matrix in each format (elements / block elems * block bytes)
SIZES = {"Q4_0/Q4_K": 58720256 // 32 * 18, "Q6_K": 58720256 // 256 * 210, "Q8_0": 58720256 // 32 * 34}
L2 = 50 << 20
PUSH2 = np.dtype([("n16", "<u4"), ("magic", "<u4")])
PUSH1 = np.dtype([("n16", "<u4")])


def timed(mgr, algos, loops, repeats):
    """Median ns per dispatch over `repeats` submissions of `loops` passes over `algos`."""
    n = loops * len(algos)
    seq = mgr.sequence(total_timestamps=n + 1)
    for _ in range(loops):
        for a in algos:
            seq.record(kp.OpAlgoDispatch(a))
    seq.eval()  # first touches, pipeline warm
    out = []
    for _ in range(repeats):
        seq.eval()
        ts = seq.get_timestamps()
        out.append((ts[-1] - ts[0]) / n)
    seq.destroy()
    return statistics.median(out), min(out), max(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--warm-s", type=float, default=None)
    ap.add_argument("--sms", type=int, default=132, help="multiprocessors (grids are multiples)")
    args = ap.parse_args(argv)
    small = args.small
    sizes = {"small": 3 << 20} if small else SIZES
    warm_s = (0.0 if small else 3.0) if args.warm_s is None else args.warm_s
    loops, repeats = (2, 3) if small else (8, 7)
    grids = [("full", None)] + [(f"{k}/SM", k * args.sms) for k in ((4, 16) if small else (2, 4, 8, 16, 32))]
    shapes = [(256, 4), (128, 8)] if small else [(256, 1), (256, 2), (256, 4), (256, 8), (512, 4), (128, 8), (1024, 2)]
    read_spv, copy_spv = kp.compile_source(READ), kp.compile_source(COPY)
    t_start = time.perf_counter()
    with kp.Manager() as mgr:
        props = mgr.get_device_properties()
        print(f"# device: {props['device_name']}")
        copy_mib = 16 if small else 256
        n16 = (copy_mib << 20) // 16
        src, dst = mgr.buffer(copy_mib << 20), mgr.buffer(copy_mib << 20)
        copy = mgr.algorithm([src, dst], copy_spv, (min(65535, n16 // 256), 1, 1), [],
                             np.array([(n16,)], PUSH1))
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < warm_s:
            timed(mgr, [copy], 20, 1)
        med, lo, hi = timed(mgr, [copy], 10, repeats)
        copy_tbs = 2 * (copy_mib << 20) / med * 1e-3
        print(f"# copy {copy_mib} MiB: {med / 1e3:.1f} us ({lo / 1e3:.1f}-{hi / 1e3:.1f}), {copy_tbs:.3f} TB/s "
              f"(read + written); warmed {warm_s:.0f} s")
        out = mgr.buffer(4096)
        outs = [mgr.buffer(4096) for _ in range(8)]
        empty = mgr.algorithm([src, out], read_spv, (1, 1, 1), np.array([256, 1], np.uint32), np.array([(0, 1)], PUSH2))
        med, lo, hi = timed(mgr, [empty] * 4, 16, repeats)
        print(f"# empty dispatch + barrier: {med / 1e3:.2f} us ({lo / 1e3:.2f}-{hi / 1e3:.2f})")
        print(f"{'weights':10} {'MiB':>6} {'grid':>6} {'WG':>5} {'unroll':>6} {'us':>8} {'min':>8} {'max':>8} "
              f"{'TB/s':>6} {'x copy':>6} {'no-barrier us':>13}")
        for label, nbytes in sizes.items():
            nbytes -= nbytes % 16
            copies = 2 if small else max(4, -(-(4 * L2 + 1) // nbytes))
            ws = [mgr.buffer(nbytes) for _ in range(copies)]
            fill = np.random.default_rng(1).integers(0, 2**32, nbytes // 4, dtype=np.uint32)
            t = mgr.tensor_t(fill)  # random data: no compression of repeated values
            with mgr.sequence() as seq:
                seq.eval(kp.OpTensorSyncDevice([t]))
                for w in ws:
                    seq.eval(kp.OpTensorCopyRegion(t, w, 0, 0, nbytes))
            t.destroy()
            best = None
            for wg, unroll in shapes:
                for gname, grid in grids:
                    g = grid or -(-(nbytes // 16) // (wg * unroll))
                    g = min(g, 65535)
                    push = np.array([(nbytes // 16, 0xDEADBEEF)], PUSH2)
                    algos = [mgr.algorithm([w, out], read_spv, (g, 1, 1), np.array([wg, unroll], np.uint32), push) for w in ws]
                    free = [mgr.algorithm([w, outs[i % 8]], read_spv, (g, 1, 1), np.array([wg, unroll], np.uint32), push)
                            for i, w in enumerate(ws)]
                    t0 = time.perf_counter()
                    while time.perf_counter() - t0 < (0.2 if not small else 0):
                        timed(mgr, [copy], 10, 1)  # keep the clock up between variants
                    med, lo, hi = timed(mgr, algos, loops, repeats)
                    nob = timed(mgr, free, loops, repeats)[0]
                    tbs = nbytes / med * 1e-3
                    print(f"{label:10} {nbytes / 2**20:6.1f} {gname:>6} {wg:5d} {unroll:6d} {med / 1e3:8.2f} "
                          f"{lo / 1e3:8.2f} {hi / 1e3:8.2f} {tbs:6.3f} {tbs / copy_tbs:6.2f} {nob / 1e3:13.2f}", flush=True)
                    if best is None or med < best[0]:
                        best = (med, gname, wg, unroll, nob)
                    for a in algos + free:
                        a.destroy()
            med, gname, wg, unroll, nob = best
            tbs = nbytes / med * 1e-3
            print(f"# floor {label}: {med / 1e3:.2f} us = {tbs:.3f} TB/s = {tbs / copy_tbs:.2f}x copy "
                  f"(grid {gname}, WG {wg}, unroll {unroll}); without barriers {nbytes / nob * 1e-3 / copy_tbs:.2f}x; "
                  f"0.7x copy needs {nbytes / (0.7 * copy_tbs) * 1e-6:.2f} us", flush=True)
            for w in ws:
                w.destroy()
    print(f"# total {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
