"""Probe for the 1 GiB bandwidth cliff (issue 7): multiply bandwidth by memory type, size, access width."""
import numpy as np
import kbench.runtime as kp

SRC = """
#version 450
layout(local_size_x = 256) in;
layout(set=0, binding=0) readonly buffer A { T a[]; };
layout(set=0, binding=1) readonly buffer B { T b[]; };
layout(set=0, binding=2) writeonly buffer O { T o[]; };
layout(push_constant) uniform P { uint n; uint stride; } p;
void main() {
  uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.stride;
  if (i < p.n) o[i] = a[i] * b[i];
}
"""
with kp.Manager() as mgr:
    for width, glsl_t in ((4, "vec4"), (1, "float")):
        spv = kp.compile_source(SRC.replace(" T ", f" {glsl_t} "))
        for ttype in (kp.TensorTypes.storage, kp.TensorTypes.device_and_host):
            for mib in (64, 1024):
                n = mib * (1 << 20) // 4
                bufs = [mgr.buffer(n * 4, ttype) for _ in range(3)]
                nv = n // width
                groups = (nv + 255) // 256
                gx = min(groups, 65535); gy = (groups + gx - 1) // gx
                pc = np.array([(nv, gx * 256)], dtype=[("n", "<u4"), ("stride", "<u4")])
                algo = mgr.algorithm(bufs, spv, (gx, gy, 1), [], pc)
                seq = mgr.sequence(total_timestamps=21)
                for _ in range(20):
                    seq.record(kp.OpAlgoDispatch(algo))
                seq.eval(); seq.eval()
                t = np.diff(seq.get_timestamps())
                mt = bufs[0]._buffer.memory_type
                print(f"{glsl_t:5s} {ttype.name:15s} type{mt} {mib:5d} MiB: median {np.median(t)/1e3:8.1f} us {3*n*4/np.median(t):7.1f} GB/s", flush=True)
                seq.destroy(); algo.destroy(); [b.destroy() for b in bufs]
