#version 450
// quantized_matmul y = W x on Q4_0 / Q8_0 / Q6_K weights repacked by qmatvec_pack.comp (16-byte
// aligned quants, fp16 scales in an array of their own) and x quantized by qmatvec_xq.comp
// (16 bits per element as two signed bytes, a float scale per block of 32).
//
// A workgroup is one team of WG lanes taking ROWS consecutive rows; lane l takes units of 32
// weights l, l + WG, ... of each row (a Q4_0/Q8_0 block; an eighth of a Q6_K block), so the
// lanes of a subgroup read consecutive 16-byte words.  Per unit and row: uvec4 loads of quants,
// a 16-bit load of the scale, and 4-wide signed byte dot products against both byte halves of
// x (Q4_0: the nibbles become n - 8 as signed bytes; Q6_K: the 6-bit q - 32, two 16-element
// sub-blocks with int8 scales).  Integer sums are exact (|sum| < 2^31); they are scaled by
// d * s_x (and Q6_K's sub-block scale) in fp32.
// Rows are summed by subgroupAdd and, across subgroups, in shared memory (variant sg), or by a
// shared-memory tree (variant tree, devices without subgroup arithmetic).

// Variant xwg: no qmatvec_xq dispatch; every workgroup quantizes all of x the same way into
// shared memory first (x read from L2 once per workgroup: worth it where a workgroup has many rows).

// kbench: variant q4_0.sg QT_Q4_0 USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.tree QT_Q4_0 target=vulkan1.1
// kbench: variant q8_0.sg QT_Q8_0 USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.tree QT_Q8_0 target=vulkan1.1
// kbench: variant q4_0.xwg.sg QT_Q4_0 XQ_WG USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.xwg.tree QT_Q4_0 XQ_WG target=vulkan1.1
// kbench: variant q8_0.xwg.sg QT_Q8_0 XQ_WG USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.xwg.tree QT_Q8_0 XQ_WG target=vulkan1.1
// kbench: variant q6_k.sg QT_Q6_K USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.tree QT_Q6_K target=vulkan1.1
// kbench: variant q6_k.xwg.sg QT_Q6_K XQ_WG USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.xwg.tree QT_Q6_K XQ_WG target=vulkan1.1

#if defined(USE_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#extension GL_EXT_spirv_intrinsics : require
// OpSDotKHR on 4 packed signed bytes (last operand: PackedVectorFormat4x8Bit = 0)
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot(uint a, uint b, spirv_literal int fmt);

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 4;  // rows per workgroup

#if defined(QT_Q4_0)
const uint QV = 1u, UNITS = 1u;  // uvec4 per block, units of 32 weights per block
#elif defined(QT_Q8_0)
const uint QV = 2u, UNITS = 1u;
#else
const uint QV = 13u, UNITS = 8u;
#endif

layout(std430, binding = 0) readonly buffer Packed { uvec4 wq[]; };
#if defined(XQ_WG)
layout(constant_id = 2) const uint BLOCKS = 128;  // n_cols / 32 (the shared arrays' size)
layout(std430, binding = 1) readonly buffer Input { vec4 x4[]; };
shared uvec4 sxl[2u * BLOCKS];  // lo bytes, 8 words per block
shared uvec4 sxh[2u * BLOCKS];  // hi bytes
shared float sxs[BLOCKS];       // scales
#else
layout(std430, binding = 1) readonly buffer XQ { uvec4 xq[]; };
#endif
layout(std430, binding = 2) writeonly buffer Output { float y[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;     // a multiple of 32
    uint row_bytes;  // of the GGUF rows (unused: the push layout of every qmatvec kernel)
} pc;

#if defined(USE_SUBGROUP)
shared float part[ROWS * gl_WorkGroupSize.x];  // per row, one slot per subgroup
#else
shared float part[gl_WorkGroupSize.x];
#endif

// the nibbles of a Q4_0 quant word as signed bytes n - 8: bytes 0..15 stay below 0x80, so
// setting each byte's top bit and subtracting 8 borrows nothing across bytes
uint nibbles_minus_8(uint w) {
    return (((w & 0x0F0F0F0Fu) | 0x80808080u) - 0x08080808u) ^ 0x80808080u;
}

// four Q6_K weights as signed bytes q - 32: q = low 4 bits from ql (nibble at shift ls), high 2
// bits from qh (at shift hs); bytes 0..63, so the same borrow-free subtraction works
uint q6_minus_32(uint ql, uint qh, uint ls, uint hs) {
    uint q = ((ql >> ls) & 0x0F0F0F0Fu) | (((qh >> hs) & 0x03030303u) << 4u);
    return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

int dot4(uvec4 q, uvec4 x) {
    return sdot(q.x, x.x, 0) + sdot(q.y, x.y, 0) + sdot(q.z, x.z, 0) + sdot(q.w, x.w, 0);
}

#if defined(XQ_WG)
const float QMAX = 32639.0;  // as qmatvec_xq.comp: q = 256 * hi + lo, |q| <= 32639

uint pack_bytes(ivec4 v) {
    uvec4 b = uvec4(v) & 0xFFu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}

// x's block b into shared memory, quantized exactly as qmatvec_xq.comp does it
void quantize_block(uint b) {
    vec4 v[8];
    float m = 0.0;
    bool finite = true;
    for (uint k = 0u; k < 8u; ++k) {
        v[k] = x4[8u * b + k];
        vec4 a = abs(v[k]);
        finite = finite && !any(isnan(v[k])) && !any(isinf(v[k]));
        m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
    }
    float inv = finite && m > 0.0 ? QMAX / m : 0.0;
    uint lo[8], hi[8];
    for (uint k = 0u; k < 8u; ++k) {
        ivec4 q = clamp(ivec4(roundEven(v[k] * inv)), ivec4(-32639), ivec4(32639));
        ivec4 l = ((q + 128) & 255) - 128;
        lo[k] = pack_bytes(l);
        hi[k] = pack_bytes((q - l) >> 8);
    }
    sxl[2u * b] = uvec4(lo[0], lo[1], lo[2], lo[3]);
    sxl[2u * b + 1u] = uvec4(lo[4], lo[5], lo[6], lo[7]);
    sxh[2u * b] = uvec4(hi[0], hi[1], hi[2], hi[3]);
    sxh[2u * b + 1u] = uvec4(hi[4], hi[5], hi[6], hi[7]);
    sxs[b] = finite ? m / QMAX : uintBitsToFloat(0x7FC00000u);
}
#endif

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint row0 = group * ROWS;
    if (row0 >= pc.n_rows) {
        return;  // whole workgroup: no barrier is skipped by part of it
    }
    uint nb = pc.n_cols >> 5u;
    uint rows = min(ROWS, pc.n_rows - row0);
#if defined(XQ_WG)
    for (uint b = lid; b < nb; b += gl_WorkGroupSize.x) {
        quantize_block(b);
    }
    barrier();
#endif
    uint nblk = nb / UNITS;  // weight blocks per row
    uint scale_base = pc.n_rows * nblk * QV;  // uvec4 index of the scales
    float acc[ROWS];
    for (uint r = 0u; r < ROWS; ++r) {
        acc[r] = 0.0;
    }
    for (uint b = lid; b < nb; b += gl_WorkGroupSize.x) {
#if defined(XQ_WG)
        uvec4 xl0 = sxl[2u * b], xl1 = sxl[2u * b + 1u];
        uvec4 xh0 = sxh[2u * b], xh1 = sxh[2u * b + 1u];
        float sx = sxs[b];
#else
        uvec4 xl0 = xq[2u * b], xl1 = xq[2u * b + 1u];
        uvec4 xh0 = xq[2u * nb + 2u * b], xh1 = xq[2u * nb + 2u * b + 1u];
        uint sxi = 16u * nb + b;  // x scale word
        float sx = uintBitsToFloat(xq[sxi >> 2u][sxi & 3u]);
#endif
        for (uint r = 0u; r < ROWS; ++r) {  // a constant trip count keeps acc[] in registers
            if (r >= rows) {
                break;
            }
            uint blk = (row0 + r) * nblk + b / UNITS;
            uint si = blk >> 1u;
            float d = unpackHalf2x16(wq[scale_base + (si >> 2u)][si & 3u] >> (16u * (blk & 1u))).x;
#if defined(QT_Q6_K)
            // unit b & 7 of the block: half h = bit 2 (elements 128h ..), group g = bits 0-1:
            // ql bytes 64h + 32 (g & 1) + l, nibble g >> 1, qh bytes 32h + l at bits 2g, scales
            // 8h + 2g (elements 0..15) and + 1 (16..31)
            uint g = b & 3u, h = (b >> 2u) & 1u, q0 = blk * QV;
            uvec4 l0 = wq[q0 + 4u * h + 2u * (g & 1u)], l1 = wq[q0 + 4u * h + 2u * (g & 1u) + 1u];
            uvec4 h0 = wq[q0 + 8u + 2u * h], h1 = wq[q0 + 8u + 2u * h + 1u];
            int scw = int(wq[q0 + 12u][2u * h + (g >> 1u)]);
            uint ls = 4u * (g >> 1u), hs = 2u * g;
            uvec4 qa = uvec4(q6_minus_32(l0.x, h0.x, ls, hs), q6_minus_32(l0.y, h0.y, ls, hs),
                             q6_minus_32(l0.z, h0.z, ls, hs), q6_minus_32(l0.w, h0.w, ls, hs));
            uvec4 qb = uvec4(q6_minus_32(l1.x, h1.x, ls, hs), q6_minus_32(l1.y, h1.y, ls, hs),
                             q6_minus_32(l1.z, h1.z, ls, hs), q6_minus_32(l1.w, h1.w, ls, hs));
            // each sum of 16 is below 2^24, so exact in fp32
            float ta = float(256 * dot4(qa, xh0) + dot4(qa, xl0));
            float tb = float(256 * dot4(qb, xh1) + dot4(qb, xl1));
            int sb = int(16u * (g & 1u));
            acc[r] += (ta * float(bitfieldExtract(scw, sb, 8)) + tb * float(bitfieldExtract(scw, sb + 8, 8))) * (d * sx);
#else
            int t;
#if defined(QT_Q4_0)
            uvec4 q = wq[blk];
            uvec4 lo = uvec4(nibbles_minus_8(q.x), nibbles_minus_8(q.y), nibbles_minus_8(q.z), nibbles_minus_8(q.w));
            uvec4 hi = uvec4(nibbles_minus_8(q.x >> 4u), nibbles_minus_8(q.y >> 4u), nibbles_minus_8(q.z >> 4u),
                             nibbles_minus_8(q.w >> 4u));
            // elements 0..15 are the low nibbles (x words 0..3), 16..31 the high ones (words 4..7)
            t = 256 * (sdot(lo.x, xh0.x, 0) + sdot(lo.y, xh0.y, 0) + sdot(lo.z, xh0.z, 0) + sdot(lo.w, xh0.w, 0)
                       + sdot(hi.x, xh1.x, 0) + sdot(hi.y, xh1.y, 0) + sdot(hi.z, xh1.z, 0) + sdot(hi.w, xh1.w, 0))
                + (sdot(lo.x, xl0.x, 0) + sdot(lo.y, xl0.y, 0) + sdot(lo.z, xl0.z, 0) + sdot(lo.w, xl0.w, 0)
                   + sdot(hi.x, xl1.x, 0) + sdot(hi.y, xl1.y, 0) + sdot(hi.z, xl1.z, 0) + sdot(hi.w, xl1.w, 0));
#else
            uvec4 q0 = wq[2u * blk], q1 = wq[2u * blk + 1u];
            t = 256 * (sdot(q0.x, xh0.x, 0) + sdot(q0.y, xh0.y, 0) + sdot(q0.z, xh0.z, 0) + sdot(q0.w, xh0.w, 0)
                       + sdot(q1.x, xh1.x, 0) + sdot(q1.y, xh1.y, 0) + sdot(q1.z, xh1.z, 0) + sdot(q1.w, xh1.w, 0))
                + (sdot(q0.x, xl0.x, 0) + sdot(q0.y, xl0.y, 0) + sdot(q0.z, xl0.z, 0) + sdot(q0.w, xl0.w, 0)
                   + sdot(q1.x, xl1.x, 0) + sdot(q1.y, xl1.y, 0) + sdot(q1.z, xl1.z, 0) + sdot(q1.w, xl1.w, 0));
#endif
            acc[r] += float(t) * (d * sx);
#endif
        }
    }
#if defined(USE_SUBGROUP)
    for (uint r = 0u; r < ROWS; ++r) {
        float s = subgroupAdd(acc[r]);
        if (subgroupElect()) {
            part[r * gl_NumSubgroups + gl_SubgroupID] = s;
        }
    }
    barrier();
    if (lid < rows) {
        float s = 0.0;
        for (uint g = 0u; g < gl_NumSubgroups; ++g) {
            s += part[lid * gl_NumSubgroups + g];
        }
        y[row0 + lid] = s;
    }
#else
    for (uint r = 0u; r < ROWS; ++r) {
        part[lid] = acc[r];
        barrier();
        for (uint h = gl_WorkGroupSize.x >> 1u; h > 0u; h >>= 1u) {  // WG is a power of two
            if (lid < h) {
                part[lid] += part[lid + h];
            }
            barrier();
        }
        if (lid == 0u && r < rows) {
            y[row0 + r] = part[0];
        }
        barrier();
    }
#endif
}
