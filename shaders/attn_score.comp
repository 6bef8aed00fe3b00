#version 450
// Attention scores for one query head:
//   scores[t] = sum_{d < head_dim} q[head_off + d] * kc[t*kv_stride + kv_off + d] * scale,
// scale = 1/sqrt(head_dim), for t < seq_len.
// Each key row is handled by ROW_THREADS neighbouring invocations (coalesced reads of the row)
// whose partial dot products are added by a tree in shared memory; a workgroup covers
// local_size_x / ROW_THREADS rows, and the grid covers seq_len (spread over y if needed).
// ROW_THREADS and local_size_x must be powers of two, ROW_THREADS <= local_size_x.

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROW_THREADS = 32;

layout(std430, binding = 0) readonly buffer Query { float q[]; };
layout(std430, binding = 1) readonly buffer KeyCache { float kc[]; };
layout(std430, binding = 2) writeonly buffer Scores { float scores[]; };

layout(push_constant) uniform Push {
    uint head_dim;
    uint seq_len;
    uint head_off;
    uint kv_off;
    uint kv_stride;
    float scale;
} pc;

shared float partial[gl_WorkGroupSize.x];

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint rows_per_group = gl_WorkGroupSize.x / ROW_THREADS;
    uint t = group * rows_per_group + lid / ROW_THREADS;
    uint lane = lid % ROW_THREADS;

    float acc = 0.0;
    if (t < pc.seq_len) {
        uint base = t * pc.kv_stride + pc.kv_off;
        for (uint d = lane; d < pc.head_dim; d += ROW_THREADS) {
            acc = fma(q[pc.head_off + d], kc[base + d], acc);
        }
    }
    partial[lid] = acc;
    barrier();
    for (uint stride = ROW_THREADS / 2u; stride > 0u; stride >>= 1u) {
        if (lane < stride) {
            partial[lid] += partial[lid + stride];
        }
        barrier();
    }
    if (lane == 0u && t < pc.seq_len) {
        scores[t] = partial[lid] * pc.scale;
    }
}
