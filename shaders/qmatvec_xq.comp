#version 450
// x for the integer-dot quantized_matmul kernels (qmatvec_fast.comp, *.dot.*): per block of 32
// elements s = max|x| / 32639 and q = round(x / s), |q| <= 32639, written as two signed bytes
// q = 256 * hi + lo with lo in [-128, 127] (so hi stays in [-127, 127]).  Output words, with
// B = n_cols / 32 blocks: lo bytes of elements 4j .. 4j+3 at word j, hi bytes at 8B + j,
// the scale of block b (float bits) at 16B + b.  An all-zero block gets s = 0 and q = 0.
// A block holding a NaN or an infinity gets s = NaN, so the rows it meets come out NaN rather
// than silently finite.  One invocation per 4 elements; the 8 invocations of a block share its
// maximum through shared memory (workgroup size a multiple of 8).

layout(local_size_x_id = 0) in;

layout(std430, binding = 0) readonly buffer Input { vec4 x4[]; };
layout(std430, binding = 1) writeonly buffer Output { uint xw[]; };

layout(push_constant) uniform Push {
    uint n_cols;  // a multiple of 32
} pc;

shared float amax[gl_WorkGroupSize.x];

const float QMAX = 32639.0;  // 127 * 256 + 127

uint pack_bytes(ivec4 v) {
    uvec4 b = uvec4(v) & 0xFFu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint i = group * gl_WorkGroupSize.x + lid;  // vec4 index = word index of the lo bytes
    uint n4 = pc.n_cols >> 2;
    vec4 v = i < n4 ? x4[i] : vec4(0.0);
    vec4 a = abs(v);
    bool bad = any(isnan(v)) || any(isinf(v));
    amax[lid] = bad ? uintBitsToFloat(0x7F800000u) : max(max(a.x, a.y), max(a.z, a.w));  // +inf marks it
    barrier();
    uint first = lid & ~7u;
    float m = 0.0;
    bool finite = true;
    for (uint j = 0u; j < 8u; ++j) {
        float e = amax[first + j];
        finite = finite && !isinf(e);
        m = max(m, e);
    }
    if (i >= n4) {
        return;  // after the only barrier
    }
    float inv = finite && m > 0.0 ? QMAX / m : 0.0;
    ivec4 q = clamp(ivec4(roundEven(v * inv)), ivec4(-32639), ivec4(32639));
    ivec4 lo = ((q + 128) & 255) - 128;
    ivec4 hi = (q - lo) >> 8;
    uint blocks = pc.n_cols >> 5;
    xw[i] = pack_bytes(lo);
    xw[8u * blocks + i] = pack_bytes(hi);
    if ((i & 7u) == 0u) {
        xw[16u * blocks + (i >> 3)] = finite ? floatBitsToUint(m / QMAX) : 0x7FC00000u;
    }
}
