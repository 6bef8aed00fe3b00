#version 450
// Numerically stable softmax over one flat float32 vector, out = exp(x - max) / sum(exp(x - max)).
//
// Variants (the backend picks by size):
//   small:     one workgroup does the whole vector (one dispatch, for small sizes).
//   partial:   pass 1, workgroup g reduces elements [g*chunk, (g+1)*chunk) (chunk a multiple
//              of 4: vec4 loads) to an online (max, sum of exp(x - max)) pair in parts[2g..];
//              the last workgroup to finish (an atomic counter) merges all pairs into total[]
//              and resets the counter, so no separate combine dispatch is needed.
//   normalize: pass 2, out = exp(x - M) / S over a grid of many workgroups, one vec4 each.
// Scratch layout: counter, pad, total[2] = (M, S), then the pairs; the counter is zero when the
// buffer is created and after every partial pass.
// The output may alias the input: pass 2 reads each element before writing it, and the small
// variant writes only after every read of the vector has finished (barrier).
// Local sizes must be powers of two (tree reduction in shared memory).
//
// kbench: variant small SOFTMAX_SMALL
// kbench: variant partial SOFTMAX_PARTIAL
// kbench: variant normalize SOFTMAX_NORMALIZE

layout(local_size_x_id = 0) in;

// -FLT_MAX rather than -inf as the empty maximum: merging two empty pairs then gives
// exp(0) * 0 instead of exp(-inf - -inf) = NaN.
const float EMPTY_MAX = -3.402823466e38;

layout(push_constant) uniform Push {
    uint size;     // elements in the vector
    uint chunk;    // elements per workgroup in pass 1 (a multiple of 4)
    uint n_parts;  // workgroups of pass 1
} pc;

#if defined(SOFTMAX_SMALL)
layout(std430, binding = 0) readonly buffer In { float x[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };
#elif defined(SOFTMAX_PARTIAL)
layout(std430, binding = 0) readonly buffer In { vec4 x4[]; };
layout(std430, binding = 1) coherent buffer Scratch { uint counter; uint pad; float total[2]; float parts[]; };
shared bool is_last;
#else
layout(std430, binding = 0) readonly buffer In { vec4 x4[]; };
layout(std430, binding = 1) writeonly buffer Out { vec4 o4[]; };
layout(std430, binding = 2) readonly buffer Scratch { uint counter; uint pad; float total[2]; float parts[]; };
#endif

#if !defined(SOFTMAX_NORMALIZE)
shared float red_max[gl_WorkGroupSize.x];
shared float red_sum[gl_WorkGroupSize.x];

// Merge the pair (m2, s2) into (m, s).
void merge(inout float m, inout float s, float m2, float s2) {
    float mx = max(m, m2);
    s = s * exp(m - mx) + s2 * exp(m2 - mx);
    m = mx;
}

// Online update with one element.
void push_value(inout float m, inout float s, float v) {
    if (v > m) {
        s = s * exp(m - v) + 1.0;
        m = v;
    } else {
        s += exp(v - m);
    }
}

// Tree reduction of every invocation's pair; the result is in red_*[0] for all invocations.
void reduce_workgroup(float m, float s) {
    uint lid = gl_LocalInvocationID.x;
    red_max[lid] = m;
    red_sum[lid] = s;
    barrier();
    for (uint stride = gl_WorkGroupSize.x / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            float mm = red_max[lid];
            float ss = red_sum[lid];
            merge(mm, ss, red_max[lid + stride], red_sum[lid + stride]);
            red_max[lid] = mm;
            red_sum[lid] = ss;
        }
        barrier();
    }
}
#endif

void main() {
    uint lid = gl_LocalInvocationID.x;
#if defined(SOFTMAX_SMALL)
    float m = EMPTY_MAX;
    float s = 0.0;
    for (uint i = lid; i < pc.size; i += gl_WorkGroupSize.x) {
        push_value(m, s, x[i]);
    }
    reduce_workgroup(m, s);
    float mx = red_max[0];
    float inv = 1.0 / red_sum[0];
    for (uint i = lid; i < pc.size; i += gl_WorkGroupSize.x) {
        o[i] = exp(x[i] - mx) * inv;
    }
#elif defined(SOFTMAX_PARTIAL)
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (group >= pc.n_parts) {
        return;  // whole workgroup leaves together: the barriers below stay uniform
    }
    uint begin = group * pc.chunk;
    uint end = min(begin + pc.chunk, pc.size);
    float m = EMPTY_MAX;
    float s = 0.0;
    for (uint e = begin + 4u * lid; e < end; e += 4u * gl_WorkGroupSize.x) {
        vec4 v = x4[e >> 2];
        if (e + 4u <= end) {
            float vm = max(max(v.x, v.y), max(v.z, v.w));
            if (vm > m) {
                s *= exp(m - vm);
                m = vm;
            }
            vec4 ev = exp(v - m);
            s += (ev.x + ev.y) + (ev.z + ev.w);
        } else {
            for (uint c = 0u; e + c < end; ++c) {
                push_value(m, s, v[c]);
            }
        }
    }
    reduce_workgroup(m, s);
    if (lid == 0u) {
        parts[2u * group] = red_max[0];
        parts[2u * group + 1u] = red_sum[0];
        memoryBarrierBuffer();  // the pair is visible before the counter says so
        is_last = atomicAdd(counter, 1u) == pc.n_parts - 1u;
    }
    barrier();
    if (!is_last) {
        return;
    }
    memoryBarrierBuffer();
    m = EMPTY_MAX;
    s = 0.0;
    for (uint p = lid; p < pc.n_parts; p += gl_WorkGroupSize.x) {
        merge(m, s, parts[2u * p], parts[2u * p + 1u]);
    }
    reduce_workgroup(m, s);
    if (lid == 0u) {
        total[0] = red_max[0];
        total[1] = red_sum[0];
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
    float mx = total[0];
    float inv = 1.0 / total[1];
    if (first + 4u <= pc.size) {
        o4[i] = exp(x4[i] - mx) * inv;
    } else {
        for (uint c = 0u; first + c < pc.size; ++c) {
            o4[i][c] = exp(x4[i][c] - mx) * inv;
        }
    }
#endif
}
