#version 450
// RMS normalization with weight: out_i = x_i * w_i / sqrt(mean(x^2) + eps).
//
// Variants (the backend picks by size):
//   small:     one workgroup does the whole vector (one dispatch).
//   partial:   pass 1, workgroup g sums x^2 over [g*chunk, (g+1)*chunk) (chunk a multiple of
//              4: vec4 loads) into parts[g]; the last workgroup to finish (an atomic counter)
//              adds the sums, stores the scale 1/sqrt(sum/size + eps) and resets the counter.
//   normalize: pass 2, out = x * w * scale over many workgroups, one vec4 per invocation.
// Scratch layout: counter, pad, scale, pad, then the sums; the counter is zero when the buffer
// is created and after every partial pass.
// The output may alias x or w (elementwise).  Local sizes must be powers of two.
//
// kbench: variant small RMS_SMALL
// kbench: variant partial RMS_PARTIAL
// kbench: variant normalize RMS_NORMALIZE

layout(local_size_x_id = 0) in;

layout(push_constant) uniform Push {
    uint size;     // elements in the vector
    uint chunk;    // elements per workgroup in pass 1 (a multiple of 4)
    uint n_parts;  // workgroups of pass 1
    float eps;
} pc;

#if defined(RMS_SMALL)
layout(std430, binding = 0) readonly buffer In { float x[]; };
layout(std430, binding = 1) readonly buffer Weight { float w[]; };
layout(std430, binding = 2) writeonly buffer Out { float o[]; };
#elif defined(RMS_PARTIAL)
layout(std430, binding = 0) readonly buffer In { vec4 x4[]; };
layout(std430, binding = 1) coherent buffer Scratch { uint counter; uint pad; float total[2]; float parts[]; };
shared bool is_last;
#else
layout(std430, binding = 0) readonly buffer In { vec4 x4[]; };
layout(std430, binding = 1) readonly buffer Weight { vec4 w4[]; };
layout(std430, binding = 2) writeonly buffer Out { vec4 o4[]; };
layout(std430, binding = 3) readonly buffer Scratch { uint counter; uint pad; float total[2]; float parts[]; };
#endif

#if !defined(RMS_NORMALIZE)
shared float red[gl_WorkGroupSize.x];

// Tree reduction; the total is in red[0] for every invocation afterwards.
void reduce_workgroup(float v) {
    uint lid = gl_LocalInvocationID.x;
    red[lid] = v;
    barrier();
    for (uint stride = gl_WorkGroupSize.x / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            red[lid] += red[lid + stride];
        }
        barrier();
    }
}
#endif

void main() {
    uint lid = gl_LocalInvocationID.x;
#if defined(RMS_SMALL)
    float s = 0.0;
    for (uint i = lid; i < pc.size; i += gl_WorkGroupSize.x) {
        float v = x[i];
        s += v * v;
    }
    reduce_workgroup(s);
    float scale = 1.0 / sqrt(red[0] / float(pc.size) + pc.eps);
    for (uint i = lid; i < pc.size; i += gl_WorkGroupSize.x) {
        o[i] = x[i] * scale * w[i];
    }
#elif defined(RMS_PARTIAL)
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (group >= pc.n_parts) {
        return;  // whole workgroup leaves together: the barriers below stay uniform
    }
    uint begin = group * pc.chunk;
    uint end = min(begin + pc.chunk, pc.size);
    float s = 0.0;
    for (uint e = begin + 4u * lid; e < end; e += 4u * gl_WorkGroupSize.x) {
        vec4 v = x4[e >> 2];
        if (e + 4u <= end) {
            s += dot(v, v);
        } else {
            for (uint c = 0u; e + c < end; ++c) {
                s += v[c] * v[c];
            }
        }
    }
    reduce_workgroup(s);
    if (lid == 0u) {
        parts[group] = red[0];
        memoryBarrierBuffer();  // the sum is visible before the counter says so
        is_last = atomicAdd(counter, 1u) == pc.n_parts - 1u;
    }
    barrier();
    if (!is_last) {
        return;
    }
    memoryBarrierBuffer();
    s = 0.0;
    for (uint p = lid; p < pc.n_parts; p += gl_WorkGroupSize.x) {
        s += parts[p];
    }
    reduce_workgroup(s);
    if (lid == 0u) {
        total[0] = 1.0 / sqrt(red[0] / float(pc.size) + pc.eps);
        counter = 0u;
    }
#else
    // Groups walk the vector from its end: pass 1 read it front to back, so its tail is the
    // part still in the L2 cache (a 64 MiB vector fits most of a 50-60 MB L2).
    uint groups = gl_NumWorkGroups.x * gl_NumWorkGroups.y;
    uint group = groups - 1u - (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x);
    uint i = group * gl_WorkGroupSize.x + lid;
    uint first = i * 4u;
    if (first >= pc.size) {
        return;
    }
    float scale = total[0];
    if (first + 4u <= pc.size) {
        o4[i] = x4[i] * scale * w4[i];
    } else {
        for (uint c = 0u; first + c < pc.size; ++c) {
            o4[i][c] = x4[i][c] * scale * w4[i][c];
        }
    }
#endif
}
