#version 450
// Numerically stable softmax over one flat float32 vector, out = exp(x - max) / sum(exp(x - max)).
//
// Variants (the backend picks by size):
//   small:     one workgroup does the whole vector (one dispatch, for small sizes).
//   partial:   pass 1, workgroup g reduces elements [g*chunk, (g+1)*chunk) to an online
//              (max, sum of exp(x - max)) pair, stored at scratch[2 + 2g].
//   combine:   pass 2, one workgroup merges the n_parts pairs into scratch[0..1].
//   normalize: pass 3, out = exp(x - M) / S over a grid of many workgroups, one vec4 each.
// The output may alias the input: pass 3 reads each element before writing it, and the small
// variant writes only after every read of the vector has finished (barrier).
// Local sizes must be powers of two (tree reduction in shared memory).
//
// kbench: variant small SOFTMAX_SMALL
// kbench: variant partial SOFTMAX_PARTIAL
// kbench: variant combine SOFTMAX_COMBINE
// kbench: variant normalize SOFTMAX_NORMALIZE

layout(local_size_x_id = 0) in;

// -FLT_MAX rather than -inf as the empty maximum: merging two empty pairs then gives
// exp(0) * 0 instead of exp(-inf - -inf) = NaN.
const float EMPTY_MAX = -3.402823466e38;

layout(push_constant) uniform Push {
    uint size;     // elements in the vector
    uint chunk;    // elements per workgroup in pass 1
    uint n_parts;  // workgroups of pass 1
} pc;

#if defined(SOFTMAX_SMALL)
layout(std430, binding = 0) readonly buffer In { float x[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };
#elif defined(SOFTMAX_PARTIAL)
layout(std430, binding = 0) readonly buffer In { float x[]; };
layout(std430, binding = 1) writeonly buffer Scratch { float scratch[]; };
#elif defined(SOFTMAX_COMBINE)
layout(std430, binding = 0) buffer Scratch { float scratch[]; };
#else
layout(std430, binding = 0) readonly buffer In { vec4 x4[]; };
layout(std430, binding = 1) writeonly buffer Out { vec4 o4[]; };
layout(std430, binding = 2) readonly buffer Scratch { float scratch[]; };
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
    for (uint i = begin + lid; i < end; i += gl_WorkGroupSize.x) {
        push_value(m, s, x[i]);
    }
    reduce_workgroup(m, s);
    if (lid == 0u) {
        scratch[2u + 2u * group] = red_max[0];
        scratch[3u + 2u * group] = red_sum[0];
    }
#elif defined(SOFTMAX_COMBINE)
    float m = EMPTY_MAX;
    float s = 0.0;
    for (uint p = lid; p < pc.n_parts; p += gl_WorkGroupSize.x) {
        merge(m, s, scratch[2u + 2u * p], scratch[3u + 2u * p]);
    }
    reduce_workgroup(m, s);
    if (lid == 0u) {
        scratch[0] = red_max[0];
        scratch[1] = red_sum[0];
    }
#else
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint i = group * gl_WorkGroupSize.x + lid;
    uint first = i * 4u;
    if (first >= pc.size) {
        return;
    }
    float mx = scratch[0];
    float inv = 1.0 / scratch[1];
    if (first + 4u <= pc.size) {
        o4[i] = exp(x4[i] - mx) * inv;
    } else {
        for (uint c = 0u; first + c < pc.size; ++c) {
            o4[i][c] = exp(x4[i][c] - mx) * inv;
        }
    }
#endif
}
