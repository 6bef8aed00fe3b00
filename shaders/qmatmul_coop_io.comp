#version 450
#extension GL_EXT_control_flow_attributes : enable
// kbench: variant x X_PREP
// kbench: variant sum SPLIT_SUM
//
// The two small dispatches around qmatmul_coop.comp.
//
// Variant x: X (NV vectors of n_cols floats, back to back) as qmatmul_coop's B operand, column
// major with a pitch of 8 kp8 halves: column v holds w_hi and column NV + v w_lo of x_v * scale_v
// (the fp16 pair that sums to it: w_hi = its top 11 bits, w_lo the next 11), scale_v the power of
// two that puts max|x_v| in [2^14, 2^15) (1 where x_v is all zeros or not finite), so that neither
// half overflows and w_lo stays clear of fp16's subnormals.  Rows are slots: within each block of
// 32, the order in which qmatmul_coop decodes a block's weights (PERM 1: Q4_0's, PERM 0: Q8_0's).
// Rows from n_cols to 8 kp8 are zeros.  1 / scale_v is written at float 4 scales_at + v; with SUMS,
// the sum of x_v (unscaled) over each unit of 32 columns at float 4 sums_at + v * kp8 / 4 + unit.
// Workgroup (g, v) computes max|x_v| over all of x_v (14336 floats: 57 KB from L2 per workgroup),
// then writes 8 rows per invocation.  Grid: (ceil(kp8 / WG), NV).
//
// Variant sum: y[i] = sum over s < splits of part[s * n + i] (qmatmul_coop's per-split partial sums).

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint PERM = 1;
layout(constant_id = 2) const uint SUMS = 0;  // 1: also S[v][unit], the sum of x_v over each unit of 32 (Q4_K's mins)

#if defined(X_PREP)
layout(std430, binding = 0) readonly buffer Input { vec4 x4[]; };
layout(std430, binding = 1) writeonly buffer XB { uvec4 xb[]; };

layout(push_constant) uniform Push {
    uint n_cols;     // a multiple of 32
    uint kp8;        // column pitch in uvec4
    uint nv;         // vectors
    uint scales_at;  // uvec4 index of the 1 / scale words
    uint sums_at;    // uvec4 index of S (SUMS): S[v][u] at float 4 sums_at + v * kp8 / 4 + u
} pc;

shared float red[gl_WorkGroupSize.x];

// as qmatmul_coop.comp's split16: fp16 bits of the top 11 bits of w and of the next 11
uvec2 split16(float w) {
    uint sgn = (floatBitsToUint(w) >> 16u) & 0x8000u;
    float a = abs(w);
    float h = 0.0;
    uint hb = 0u;
    if (a >= 6.103515625e-05) {
        uint au = floatBitsToUint(a) & 0xFFFFE000u;
        h = uintBitsToFloat(au);
        hb = (au >> 13u) - (112u << 10u);
    }
    float l = a - h;
    uint lb = l >= 6.103515625e-05 ? ((floatBitsToUint(l) & 0xFFFFE000u) >> 13u) - (112u << 10u)
                                   : uint(l * 16777216.0);
    return uvec2(hb | sgn, lb | sgn);
}

// the element of a block of 32 that slot t holds
uint slot_elem(uint t) {
    const uint mid[4] = uint[4](0u, 2u, 1u, 3u);  // each word's decoding order
    if (PERM == 1u) {
        return ((t & 7u) >= 4u ? 16u : 0u) + 4u * (t >> 3u) + mid[t & 3u];
    }
    return 4u * (t >> 2u) + mid[t & 3u];
}

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint v = gl_WorkGroupID.y;
    uint n4 = pc.n_cols >> 2u;
    float m = 0.0;
    for (uint e = lid; e < n4; e += gl_WorkGroupSize.x) {
        vec4 a = abs(x4[v * n4 + e]);
        m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
    }
    red[lid] = m;
    barrier();
    for (uint h = gl_WorkGroupSize.x >> 1u; h > 0u; h >>= 1u) {
        if (lid < h) {
            red[lid] = max(red[lid], red[lid + h]);
        }
        barrier();
    }
    m = red[0];
    float scale = 1.0;
    if (m > 0.0 && !isinf(m) && !isnan(m)) {
        int e;
        frexp(m, e);
        scale = ldexp(1.0, clamp(15 - e, -126, 126));
    }
    if (gl_WorkGroupID.x == 0u && lid == 0u) {
        xb[pc.scales_at + (v >> 2u)][v & 3u] = floatBitsToUint(1.0 / scale);
    }
    uint g = gl_GlobalInvocationID.x;
    if (g >= pc.kp8) {
        return;
    }
    uint base = 8u * g;  // first slot
    uint blk = base >> 5u;
    uvec4 hi = uvec4(0u);
    uvec4 lo = uvec4(0u);
    if (base < pc.n_cols) {
        [[unroll]] for (uint i = 0u; i < 8u; ++i) {
            uint c = 32u * blk + slot_elem((base & 31u) + i);
            float w = x4[v * n4 + (c >> 2u)][c & 3u] * scale;
            uvec2 hl = split16(w);
            hi[i >> 1u] |= hl.x << (16u * (i & 1u));
            lo[i >> 1u] |= hl.y << (16u * (i & 1u));
        }
    }
    if (SUMS == 1u && (base & 31u) == 0u) {
        float sum = 0.0;
        if (base < pc.n_cols) {
            [[unroll]] for (uint i = 0u; i < 8u; ++i) {
                vec4 a = x4[v * n4 + (base >> 2u) + i];
                sum += (a.x + a.y) + (a.z + a.w);
            }
        }
        uint f = 4u * pc.sums_at + v * (pc.kp8 >> 2u) + blk;
        xb[f >> 2u][f & 3u] = floatBitsToUint(sum);
    }
    xb[v * pc.kp8 + g] = hi;
    xb[(pc.nv + v) * pc.kp8 + g] = lo;
}
#else
layout(std430, binding = 0) readonly buffer Parts { float part[]; };
layout(std430, binding = 1) writeonly buffer Output { float y[]; };

layout(push_constant) uniform Push {
    uint n;
    uint splits;
} pc;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i >= pc.n) {
        return;
    }
    float s = 0.0;
    for (uint k = 0u; k < pc.splits; ++k) {
        s += part[k * pc.n + i];
    }
    y[i] = s;
}
#endif
