#version 450
// RMS normalization with weight: out_i = x_i * w_i / sqrt(mean(x^2) + eps).
//
// The sum of squares is kept as (m, s) with sum = m^2 * s, m the largest |x| seen: each x is
// scaled by 1/m before squaring, as a careful reference does, so inputs up to float32's range
// (x ~ 3e19, whose square overflows float32) give the right scale instead of 0.
//
// Variants (the backend picks by size):
//   small:     one workgroup does the whole vector (one dispatch).
//   partial:   pass 1, workgroup g sums x^2 over [g*chunk, (g+1)*chunk) (chunk a multiple of
//              4: vec4 loads) into parts[2g], parts[2g+1] (m, s); the last workgroup to finish
//              (an atomic counter) merges them, stores the scale and resets the counter.
//   normalize: pass 2, out = x * w * scale over many workgroups, one vec4 per invocation.
// Scratch layout: counter, pad, scale, pad, then (m, s) per part; the counter is zero when the
// buffer is created and after every partial pass.
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
shared float red_m[gl_WorkGroupSize.x];
shared float red_s[gl_WorkGroupSize.x];

// (m, s) with sum of squares = m^2 * s: add the squares of v (m >= 0; s = 0 while m = 0).
void add_squares(inout float m, inout float s, vec4 v) {
    float a = max(max(abs(v.x), abs(v.y)), max(abs(v.z), abs(v.w)));
    if (a > m) {
        float r = m / a;
        s *= r * r;
        m = a;
    }
    if (m > 0.0) {
        vec4 u = v * (1.0 / m);
        s += dot(u, u);
    }
}

// (m1, s1) + (m2, s2) into (m1, s1).
void merge(inout float m1, inout float s1, float m2, float s2) {
    if (m2 > m1) {
        float r = m1 / m2;
        s1 = s2 + s1 * r * r;
        m1 = m2;
    } else if (m2 > 0.0) {
        float r = m2 / m1;
        s1 += s2 * r * r;
    }
}

// Tree reduction of (m, s); the total is in red_m[0], red_s[0] for every invocation afterwards.
void reduce_workgroup(float m, float s) {
    uint lid = gl_LocalInvocationID.x;
    red_m[lid] = m;
    red_s[lid] = s;
    barrier();
    for (uint stride = gl_WorkGroupSize.x / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            float m1 = red_m[lid], s1 = red_s[lid];
            merge(m1, s1, red_m[lid + stride], red_s[lid + stride]);
            red_m[lid] = m1;
            red_s[lid] = s1;
        }
        barrier();
    }
}

// 1 / sqrt(mean(x^2) + eps) from sum = m^2 * s over `size` elements, without forming m^2 * s
// where it would overflow (there eps is negligible: the scale is 1 / rms).
float norm_scale(float m, float s, uint size) {
    float rms = m * sqrt(s / float(size));
    if (rms < 1.0e19) {
        return inversesqrt(rms * rms + pc.eps);
    }
    return 1.0 / rms;
}
#endif

void main() {
    uint lid = gl_LocalInvocationID.x;
#if defined(RMS_SMALL)
    float m = 0.0, s = 0.0;
    for (uint i = lid; i < pc.size; i += gl_WorkGroupSize.x) {
        add_squares(m, s, vec4(x[i], 0.0, 0.0, 0.0));
    }
    reduce_workgroup(m, s);
    float scale = norm_scale(red_m[0], red_s[0], pc.size);
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
    float m = 0.0, s = 0.0;
    for (uint e = begin + 4u * lid; e < end; e += 4u * gl_WorkGroupSize.x) {
        vec4 v = x4[e >> 2];
        if (e + 4u > end) {
            for (uint c = end - e; c < 4u; ++c) {
                v[c] = 0.0;  // past the end (the next part's elements, or padding)
            }
        }
        add_squares(m, s, v);
    }
    reduce_workgroup(m, s);
    if (lid == 0u) {
        parts[2u * group] = red_m[0];
        parts[2u * group + 1u] = red_s[0];
        memoryBarrierBuffer();  // the sum is visible before the counter says so
        is_last = atomicAdd(counter, 1u) == pc.n_parts - 1u;
    }
    barrier();
    if (!is_last) {
        return;
    }
    memoryBarrierBuffer();
    m = 0.0;
    s = 0.0;
    for (uint p = lid; p < pc.n_parts; p += gl_WorkGroupSize.x) {
        merge(m, s, parts[2u * p], parts[2u * p + 1u]);
    }
    reduce_workgroup(m, s);
    if (lid == 0u) {
        total[0] = norm_scale(red_m[0], red_s[0], pc.size);
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
