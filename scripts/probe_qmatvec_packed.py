#!/usr/bin/env python3
"""Prototype for issue 7's quantized_matmul gap: does a repacked weight layout get near the read floor?

GGUF Q4_0 / Q8_0 blocks (18 / 34 bytes) are only 2-byte aligned, so kbench's kernels load narrow
words (the same loads without any decoding already take 15.1 us for a 33 MB Q4_0 matrix on the
H200, against an 11.1 us floor for reading those bytes; probes/20261203T1818-read_floor.log).
This probe repacks the blocks on the host into 16-byte-aligned quants (one uvec4 per Q4_0
block, two per Q8_0 block) with the fp16 scales in an array of their own: the same bytes, so
weight bytes per second compare directly.  One dispatch per call:

  1. the workgroup quantizes x into shared memory: per block of 32, s = max|x| / 32639 and
     q = round(x / s) split into two signed bytes (q = 256 * hi + lo), as qmatvec_xq.comp does,
     plus each block's sum of q (Q4_0 stores q + 8: the sum takes the 8 back out);
  2. each subgroup of 32 takes ROWS rows; lane l takes blocks l, l + 32, ...; per block and row
     one 16-byte load (Q4_0) and 4-wide integer dot products against both byte halves of x;
  3. subgroupAdd per row.

Checked against float64 (NMSE), timed with GPU timestamps over copies rotating through > 4x
the L2, one barrier per call (all calls write one output), beside the current kernel through
VulkanBackend on the same weights.  Not wired into the backend: a measured prototype.

    python3 scripts/probe_qmatvec_packed.py           # the H200 run (about 30 s)
    python3 scripts/probe_qmatvec_packed.py --small   # correctness on lavapipe
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import kbench.runtime as kp  # noqa: E402
from kbench.backend import VulkanBackend  # noqa: E402
from kbench.quant import DType  # noqa: E402
from probe_qmatvec import L2_BYTES, make_weights, nmse  # noqa: E402
from probe_read_floor import timed  # noqa: E402

SHADER = """
#version 450
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot(uint a, uint b, spirv_literal int fmt);
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot(uint a, uint b, spirv_literal int fmt);

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 2;       // rows per subgroup
layout(constant_id = 2) const uint MAX_COLS = 4096;  // shared x capacity (elements)

layout(std430, binding = 0) readonly buffer Quants { uvec4 wq[]; };
layout(std430, binding = 1) readonly buffer Scales { uint ws[]; };   // fp16 pairs, block-major
layout(std430, binding = 2) readonly buffer Input { vec4 x4[]; };
layout(std430, binding = 3) writeonly buffer Output { float y[]; };
layout(push_constant) uniform Push { uint n_rows; uint n_cols; } pc;

shared uint xlo[MAX_COLS / 4];
shared uint xhi[MAX_COLS / 4];
shared float xsc[MAX_COLS / 32];
shared int xsum[MAX_COLS / 32];

const float QMAX = 32639.0;

uint pack_bytes(ivec4 v) {
    uvec4 b = uvec4(v) & 0xFFu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}

void main() {
    uint nb = pc.n_cols >> 5;
    // 1. x into shared memory, one invocation per block of 32
    for (uint b = gl_LocalInvocationID.x; b < nb; b += gl_WorkGroupSize.x) {
        vec4 v[8];
        float m = 0.0;
        for (uint k = 0u; k < 8u; ++k) {
            v[k] = x4[b * 8u + k];
            vec4 a = abs(v[k]);
            m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
        }
        float inv = m > 0.0 ? QMAX / m : 0.0;
        int sum = 0;
        for (uint k = 0u; k < 8u; ++k) {
            ivec4 q = clamp(ivec4(roundEven(v[k] * inv)), ivec4(-32639), ivec4(32639));
            ivec4 lo = ((q + 128) & 255) - 128;
            ivec4 hi = (q - lo) >> 8;
            xlo[b * 8u + k] = pack_bytes(lo);
            xhi[b * 8u + k] = pack_bytes(hi);
            sum += q.x + q.y + q.z + q.w;
        }
        xsc[b] = m / QMAX;
        xsum[b] = sum;
    }
    barrier();
    // 2. ROWS rows per subgroup
    uint sg = gl_SubgroupID + gl_NumSubgroups * gl_WorkGroupID.x;
    uint row0 = sg * ROWS;
    uint lane = gl_SubgroupInvocationID;
    float acc[ROWS];
    for (uint j = 0u; j < ROWS; ++j) acc[j] = 0.0;
    for (uint b = lane; b < nb; b += gl_SubgroupSize) {
        for (uint j = 0u; j < ROWS; ++j) {
            uint row = min(row0 + j, pc.n_rows - 1u);
            uint g = row * nb + b;
            float d = unpackHalf2x16(ws[g >> 1] >> ((g & 1u) * 16u)).x;
#if defined(QT_Q4_0)
            uvec4 w = wq[g];
            int h = 0, l = 0;
            for (uint k = 0u; k < 4u; ++k) {
                uint lo4 = w[k] & 0x0F0F0F0Fu;          // elements 4k .. 4k+3
                uint hi4 = (w[k] >> 4) & 0x0F0F0F0Fu;   // elements 16+4k .. 16+4k+3
                h += sudot(xhi[b * 8u + k], lo4, 0) + sudot(xhi[b * 8u + 4u + k], hi4, 0);
                l += sudot(xlo[b * 8u + k], lo4, 0) + sudot(xlo[b * 8u + 4u + k], hi4, 0);
            }
            acc[j] += d * xsc[b] * float(256 * h + l - 8 * xsum[b]);
#else
            uvec4 w0 = wq[2u * g], w1 = wq[2u * g + 1u];
            int h = 0, l = 0;
            for (uint k = 0u; k < 4u; ++k) {
                h += sdot(xhi[b * 8u + k], w0[k], 0) + sdot(xhi[b * 8u + 4u + k], w1[k], 0);
                l += sdot(xlo[b * 8u + k], w0[k], 0) + sdot(xlo[b * 8u + 4u + k], w1[k], 0);
            }
            acc[j] += d * xsc[b] * float(256 * h + l);
#endif
        }
    }
    for (uint j = 0u; j < ROWS; ++j) {
        float s = subgroupAdd(acc[j]);
        if (lane == 0u && row0 + j < pc.n_rows) y[row0 + j] = s;
    }
}
"""

PUSH = np.dtype([("n_rows", "<u4"), ("n_cols", "<u4")])


def repack(raw: bytes, dtype: DType, n_rows: int, n_cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(quants, scales): the blocks' quant bytes back to back (16 or 32 per block) and their
    fp16 scales as uint16, both block-major."""
    bb = 18 if dtype == DType.Q4_0 else 34
    blocks = np.frombuffer(raw, np.uint8).reshape(n_rows * (n_cols // 32), bb)
    return np.ascontiguousarray(blocks[:, 2:]).reshape(-1), np.ascontiguousarray(blocks[:, :2]).reshape(-1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="small shapes: correctness on lavapipe")
    ap.add_argument("--copy-tbs", type=float, default=4.16, help="measured copy bandwidth, TB/s")
    args = ap.parse_args(argv)
    small = args.small
    shapes = [(96, 512), (33, 1024)] if small else [(14336, 4096), (4096, 14336)]
    variants = [(64, 1), (128, 2)] if small else [(128, 1), (128, 2), (256, 1), (256, 2), (256, 4), (512, 2)]
    loops, repeats = (1, 3) if small else (3, 7)
    rng = np.random.default_rng(7)
    t_start = time.perf_counter()
    be = VulkanBackend(batch_ops=256)
    mgr = kp.Manager()
    try:
        print(f"# device: {mgr.get_device_properties()['device_name']}; x copy against {args.copy_tbs} TB/s")
        if not small:  # the clock up before anything is timed
            src, dst = be.allocate(256 << 20), be.allocate(256 << 20)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 3.0:
                for _ in range(20):
                    be.copy_buffer(src, dst, 256 << 20)
                be.synchronize()
            be.free(src), be.free(dst)
        print(f"{'dtype':5} {'shape':>11} {'kernel':18} {'us':>8} {'TB/s':>6} {'x copy':>6} {'NMSE':>9}")
        for dtype in (DType.Q4_0, DType.Q8_0):
            for n_rows, n_cols in shapes:
                raw, ref_base = make_weights(dtype, n_rows, n_cols, rng)
                x = rng.uniform(-1, 1, n_cols).astype(np.float32)
                ref = np.tile(ref_base @ x.astype(np.float64), -(-n_rows // len(ref_base)))[:n_rows]
                nbytes = len(raw)
                copies = 2 if small else max(4, -(-(4 * L2_BYTES + 1) // nbytes))

                # the current kernel, through the backend, on the same rotation
                hws = []
                for _ in range(copies):
                    h = be.allocate(nbytes)
                    be.copy_to_device(raw, h)
                    hws.append(h)
                hx, hy = be.allocate(4 * n_cols), be.allocate(4 * n_rows)
                be.copy_to_device(x.tobytes(), hx)

                def issue():
                    for _ in range(loops):
                        for h in hws:
                            be.quantized_matmul(h, hx, hy, n_rows, n_cols, dtype)
                issue()
                ns = statistics.median(be.measure_gpu_ns(issue) / (loops * copies) for _ in range(repeats))
                yb = np.empty(n_rows, np.float32)
                be.copy_from_device(hy, yb)
                tbs = nbytes / ns * 1e-3
                print(f"{dtype.name:5} {n_rows:>5}x{n_cols:<5} {'current (auto)':18} {ns / 1e3:8.2f} {tbs:6.3f} "
                      f"{tbs / args.copy_tbs:6.2f} {nmse(yb.astype(np.float64), ref):9.2e}", flush=True)
                for h in hws + [hx, hy]:
                    be.free(h)
                be.synchronize()

                spv = kp.compile_source(SHADER, {f"QT_{dtype.name}": 1}, target_env="vulkan1.1")
                quants, scales = repack(raw, dtype, n_rows, n_cols)
                tq = [mgr.tensor_t(quants.view(np.uint32), kp.TensorTypes.device) for _ in range(copies)]
                ts_ = [mgr.tensor_t(scales.view(np.uint32), kp.TensorTypes.device) for _ in range(copies)]
                tx = mgr.tensor_t(x, kp.TensorTypes.device)
                ty = mgr.tensor_t(np.zeros(n_rows, np.float32), kp.TensorTypes.device)
                with mgr.sequence() as seq:
                    seq.eval(kp.OpTensorSyncDevice(tq + ts_ + [tx, ty]))
                for wg, rows in variants:
                    per_group = wg // 32 * rows
                    groups = -(-n_rows // per_group)
                    spec = np.array([wg, rows, n_cols], np.uint32)
                    push = np.array([(n_rows, n_cols)], PUSH)
                    algos = [mgr.algorithm([q, s, tx, ty], spv, (groups, 1, 1), spec, push) for q, s in zip(tq, ts_)]
                    try:
                        ns = timed(mgr, algos, loops, repeats)[0]
                        with mgr.sequence() as seq:
                            seq.eval(kp.OpTensorSyncLocal([ty]))
                        err = nmse(ty.data().astype(np.float64), ref)
                    finally:
                        for a in algos:
                            a.destroy()
                    tbs = nbytes / ns * 1e-3
                    flag = "" if err <= 1e-8 else "  <-- WRONG"
                    print(f"{dtype.name:5} {n_rows:>5}x{n_cols:<5} {f'packed wg{wg} rows{rows}':18} {ns / 1e3:8.2f} "
                          f"{tbs:6.3f} {tbs / args.copy_tbs:6.2f} {err:9.2e}{flag}", flush=True)
                for t in tq + ts_ + [tx, ty]:
                    t.destroy()
    finally:
        mgr.destroy()
        be.close()
    print(f"# total {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
