#version 450
// Attention output for one query head:
//   out[out_off + d] = sum_{t < seq_len} w[t] * vc[t*kv_stride + kv_off + d], d < head_dim.
//
// Variants:
//   partial: workgroup (x, y) covers columns [x*local_size_x, ...) and the key chunk
//            [y*chunk, (y+1)*chunk); its local_size_y rows of invocations split the chunk and
//            add their sums through shared memory.  The sum for (chunk y, column d) is written
//            to dst[dst_off + y*dst_chunk_stride + d]: with one chunk that is the output
//            itself (dst_off = out_off, stride 0), otherwise a scratch buffer (stride head_dim).
//   combine: out[out_off + d] = sum over n_chunks of scratch[c*head_dim + d].
// local_size_y must be a power of two.
//
// kbench: variant partial ATTN_PARTIAL
// kbench: variant combine ATTN_COMBINE

#if defined(ATTN_PARTIAL)
layout(local_size_x_id = 0, local_size_y_id = 1) in;

layout(std430, binding = 0) readonly buffer Weights { float w[]; };
layout(std430, binding = 1) readonly buffer ValueCache { float vc[]; };
layout(std430, binding = 2) writeonly buffer Dst { float dst[]; };

layout(push_constant) uniform Push {
    uint head_dim;
    uint seq_len;
    uint kv_off;
    uint kv_stride;
    uint chunk;
    uint dst_off;
    uint dst_chunk_stride;
} pc;

shared float partial[gl_WorkGroupSize.x * gl_WorkGroupSize.y];

void main() {
    uint lx = gl_LocalInvocationID.x;
    uint ly = gl_LocalInvocationID.y;
    uint d = gl_WorkGroupID.x * gl_WorkGroupSize.x + lx;
    uint c = gl_WorkGroupID.y;
    uint begin = c * pc.chunk;
    uint end = min(begin + pc.chunk, pc.seq_len);

    float acc = 0.0;
    if (d < pc.head_dim) {
        for (uint t = begin + ly; t < end; t += gl_WorkGroupSize.y) {
            acc = fma(w[t], vc[t * pc.kv_stride + pc.kv_off + d], acc);
        }
    }
    uint slot = ly * gl_WorkGroupSize.x + lx;
    partial[slot] = acc;
    barrier();
    for (uint stride = gl_WorkGroupSize.y / 2u; stride > 0u; stride >>= 1u) {
        if (ly < stride) {
            partial[slot] += partial[slot + stride * gl_WorkGroupSize.x];
        }
        barrier();
    }
    if (ly == 0u && d < pc.head_dim) {
        dst[pc.dst_off + c * pc.dst_chunk_stride + d] = partial[lx];
    }
}
#else
layout(local_size_x_id = 0) in;

layout(std430, binding = 0) readonly buffer Scratch { float scratch[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint head_dim;
    uint n_chunks;
    uint out_off;
} pc;

void main() {
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint d = group * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (d >= pc.head_dim) {
        return;
    }
    float s = 0.0;
    for (uint c = 0u; c < pc.n_chunks; ++c) {
        s += scratch[c * pc.head_dim + d];
    }
    o[pc.out_off + d] = s;
}
#endif
