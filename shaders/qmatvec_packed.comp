#version 450
// quantized_matmul y = W x on Q4_0 / Q8_0 / Q6_K / Q4_K weights repacked by qmatvec_pack.comp
// (16-byte aligned quants, fp16 scales in an array of their own; Q4_K: its sub-block scales and
// mins unpacked to bytes, see qmatvec_pack.comp) and x quantized by qmatvec_xq.comp (16 bits per
// element as two signed bytes, a float scale per block of 32).
//
// A workgroup is TEAMS = WG / LANES teams of LANES lanes; team t takes ROWS consecutive rows.
// Lane l of a team takes units l, l + LANES, ... of each of its rows: units of 32 weights (a
// Q4_0/Q8_0 block; an eighth of a Q6_K block) or, for Q4_K, of 64 weights (a quarter of a block:
// 2 uvec4 of quants holding sub-blocks 2u and 2u + 1 in their low and high nibbles; a unit of 32
// would load both words for one nibble of each), so the lanes of a subgroup read consecutive
// 16-byte words.  A unit covers UX = 1 (Q4_K: 2) of x's blocks of 32.
// UNROLL units per row are loaded before any is decoded: the loads of UNROLL * ROWS units are in
// flight together, which is what keeps HBM busy (the read floor probe's finding: a grid of short
// independent 16-byte loads reads at 0.7x copy; one load at a time per lane does not).
// Per unit and row: uvec4 loads of quants, a 16-bit load of the scale (Q4_K: a word of d and dmin,
// a word of its two sub-blocks' scales and mins), and 4-wide byte dot
// products against both byte halves of x (Q4_0: the unsigned nibbles, minus 8 times x's sum;
// Q6_K: the unsigned 6-bit q, minus 32 times x's sum, two 16-element sub-blocks with int8 scales;
// Q4_K: the unsigned nibbles of a 32-element sub-block, d * sc times their dot minus dmin * m
// times x's integer sum over the sub-block).
// Integer sums are exact (|sum| < 2^31); they are scaled by d * s_x (and the sub-block scale) in fp32.
// A team's rows are summed by subgroup shuffles (variant sg: LANES a power of two; teams wider
// than a subgroup add their subgroups' sums in shared memory), or by a shared-memory tree
// (variant tree, devices without subgroup arithmetic).

// Variant xwg: no qmatvec_xq dispatch; every workgroup quantizes x the same way into shared
// memory (x read from L2 once per workgroup: worth it where a workgroup has many rows): all of it
// first where it fits, else chunk by chunk (BLOCKS), a barrier before and after each chunk; a
// block of 32 by one lane (tree) or by the 4 lanes of a quad, a quarter each (sg: quantize_quarter).
// Variant xwg8 (X8): as xwg, but x quantized to 8 bits per element (one signed byte, q = round(x *
// 127 / max|x| of its block of 32), as ggml's q8_1 activations): one byte dot per weight word where
// the 16-bit x takes two, at the price of x's quantization error (NMSE about 3e-5 against float64
// for uniform x, where 16 bits give about 2e-10): the kernels' integer issue halves.
// Variant xlane (XQ_LANE): no qmatvec_xq dispatch and no x in shared memory; each lane quantizes the
// blocks of x its own units meet, in registers, to the bytes, scale and sums qmatvec_xq.comp gives
// them (lane_quantize): no team waits at a barrier for the others, at the price of every team
// quantizing x again.

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
// kbench: variant q4_0.xwg8.sg QT_Q4_0 XQ_WG X8 USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.xwg8.tree QT_Q4_0 XQ_WG X8 target=vulkan1.1
// kbench: variant q8_0.xwg8.sg QT_Q8_0 XQ_WG X8 USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.xwg8.tree QT_Q8_0 XQ_WG X8 target=vulkan1.1
// kbench: variant q6_k.xwg8.sg QT_Q6_K XQ_WG X8 USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.xwg8.tree QT_Q6_K XQ_WG X8 target=vulkan1.1
// kbench: variant q4_k.sg QT_Q4_K USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.tree QT_Q4_K target=vulkan1.1
// kbench: variant q4_k.xwg.sg QT_Q4_K XQ_WG USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.xwg.tree QT_Q4_K XQ_WG target=vulkan1.1
// kbench: variant q4_k.xwg8.sg QT_Q4_K XQ_WG X8 USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.xwg8.tree QT_Q4_K XQ_WG X8 target=vulkan1.1
// kbench: variant q4_0.xwg.stagger.sg QT_Q4_0 XQ_WG STAGGER USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.xwg.stagger.sg QT_Q8_0 XQ_WG STAGGER USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.xwg.stagger.sg QT_Q6_K XQ_WG STAGGER USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.xwg.stagger.sg QT_Q4_K XQ_WG STAGGER USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.xlane.sg QT_Q4_0 XQ_LANE USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.xlane.sg QT_Q8_0 XQ_LANE USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.xlane.sg QT_Q6_K XQ_LANE USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.xlane.sg QT_Q4_K XQ_LANE USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.xlane.tree QT_Q4_0 XQ_LANE target=vulkan1.1
// kbench: variant q8_0.xlane.tree QT_Q8_0 XQ_LANE target=vulkan1.1
// kbench: variant q6_k.xlane.tree QT_Q6_K XQ_LANE target=vulkan1.1
// kbench: variant q4_k.xlane.tree QT_Q4_K XQ_LANE target=vulkan1.1
// kbench: variant q4_0.last.sg QT_Q4_0 SPLIT_LAST USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.last.sg QT_Q8_0 SPLIT_LAST USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.last.sg QT_Q6_K SPLIT_LAST USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.last.sg QT_Q4_K SPLIT_LAST USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.xwg.last.sg QT_Q4_0 XQ_WG SPLIT_LAST USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.xwg.last.sg QT_Q8_0 XQ_WG SPLIT_LAST USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.xwg.last.sg QT_Q6_K XQ_WG SPLIT_LAST USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.xwg.last.sg QT_Q4_K XQ_WG SPLIT_LAST USE_SUBGROUP target=vulkan1.1

#if defined(USE_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#extension GL_EXT_spirv_intrinsics : require
#extension GL_EXT_control_flow_attributes : enable
#ifdef TIMELINE
#extension GL_ARB_shader_clock : require
#extension GL_EXT_shader_realtime_clock : require
#endif
// OpSDotKHR on 4 packed signed bytes (last operand: PackedVectorFormat4x8Bit = 0)
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot(uint a, uint b, spirv_literal int fmt);
// OpSUDotKHR: signed bytes (x) against unsigned bytes (the weights' unsigned quants)
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot(uint a, uint b, spirv_literal int fmt);

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 4;     // rows per team
layout(constant_id = 3) const uint LANES = 32;   // lanes per team (a power of two dividing WG)
layout(constant_id = 4) const uint UNROLL = 2;   // units per row loaded before decoding
layout(constant_id = 5) const bool PREFETCH = true;  // the first batch's loads before x is quantized
layout(constant_id = 6) const uint NX = 1;       // vectors x (y = W x for each; x_v at v * n_cols, y_v at v * n_rows)
// floats of the reduction's shared array: WG (variant tree: one per lane, reused per sum), ROWS *
// NX * WG / subgroup (variant sg with teams wider than a subgroup), 1 (sg otherwise: unused)
layout(constant_id = 7) const uint PART = 1;
// units of a row per split (0: the whole row).  Split z of the grid (gl_WorkGroupID.z) takes units
// z * SPLIT_UNITS .. of its rows and writes its sums at z * NX * n_rows + (as y) of the output, the
// splits' partial sums, which qmatmul_coop_io.comp's sum variant adds: long rows of few rows (4096 x
// 14336) otherwise launch fewer workgroups than the device has compute units.  Variants *.last.*:
// no second dispatch; the last split of a row group to finish adds the partial sums (split_finish).
layout(constant_id = 8) const uint SPLIT_UNITS = 0;
// BALANCE: the grid's workgroups share the matrix's blocks of ROWS rows evenly (workgroup w of G takes
// blocks w * B / G .. (w + 1) * B / G - 1, one per team; teams past them idle), where a grid of whole
// row groups leaves some compute units one workgroup and others two (224 groups of 64 rows on 132
// SMs): the policy launches a whole number of workgroups per compute unit, so each unit reads about
// the same bytes.  One pass, no splits.
layout(constant_id = 9) const bool BALANCE = false;
const uint TEAMS = gl_WorkGroupSize.x / LANES;

// QV: uvec4 of quants per block, UNITS: units per block, NQ: uvec4 per unit, UX: x blocks per unit
#if defined(QT_Q4_0)
const uint QV = 1u, UNITS = 1u, NQ = 1u, UX = 1u;
#elif defined(QT_Q8_0)
const uint QV = 2u, UNITS = 1u, NQ = 2u, UX = 1u;
#elif defined(QT_Q6_K)
const uint QV = 13u, UNITS = 8u, NQ = 2u, UX = 1u;  // a unit's low 4 bits (uvec4) and high 2 bits (2 words)
#else
const uint QV = 8u, UNITS = 4u, NQ = 2u, UX = 2u;  // Q4_K: the 32 quant bytes of two sub-blocks
#endif

layout(std430, binding = 0) readonly buffer Packed { uvec4 wq[]; };
#if defined(XQ_WG)
// x's blocks of 32 held in shared memory per vector: all n_cols / 32 of them where they fit beside
// the other vectors', else a chunk (a multiple of UX): the workgroup then runs over x chunk by
// chunk, quantizing each into shared memory before its teams take the chunk's units of their rows
layout(constant_id = 2) const uint BLOCKS = 128;
layout(std430, binding = 1) readonly buffer Input { vec4 x4[]; };
// block j of the chunk of vector v at v * BLOCKS + j
shared uvec4 sxl[2u * BLOCKS * NX];  // lo bytes (X8: the bytes), 8 words per block
#if !defined(X8)
shared uvec4 sxh[2u * BLOCKS * NX];  // hi bytes
#endif
shared float sxs[BLOCKS * NX];       // scales
shared ivec2 sxsum[BLOCKS * NX];     // sums of q over elements 0..15 and 16..31
#elif defined(XQ_LANE)
layout(std430, binding = 1) readonly buffer Input { vec4 x4[]; };
#else
layout(std430, binding = 1) readonly buffer XQ { uvec4 xq[]; };
#endif
#if defined(SPLIT_LAST)
// the splits' partial sums (read back by the last split: coherent), y, and each row group's count of
// splits done (zero between dispatches: the last split re-arms it)
layout(std430, binding = 2) coherent buffer Output { float y[]; };
layout(std430, binding = 3) writeonly buffer Final { float yf[]; };
layout(std430, binding = 4) coherent buffer Arrivals { uint arrived[]; };
shared bool s_last;
#else
layout(std430, binding = 2) writeonly buffer Output { float y[]; };
#endif

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;     // a multiple of 32
    uint row_bytes;  // of the GGUF rows (unused: the push layout of every qmatvec kernel)
} pc;

shared float part[PART];

// The weights stay unsigned (Q4_0 and Q4_K nibbles 0..15, Q6_K 6-bit q 0..63) in the dot products
// with x's signed bytes; their offsets (8, 32; Q4_K's dmin * m) come off once per 16 (Q4_K: 32)
// elements through the sum of x's q there: n - 8 per element would cost three more integer
// operations per word, and integer issue, not HBM, is what bounds these kernels on a GPU whose
// integer rate is half its fp32 rate.

// Q6_K's 6-bit q of elements 4 i .. 4 i + 3 of a unit (i < 8) as bytes: the low 4 bits from its
// low-bits word i & 3 (nibble i >> 2), the high 2 from its high-bits word i & 1 (bits 2 (i >> 1) of
// each byte) (qmatvec_pack.comp's unit layout)
uint q6_bytes(uint ql, uint qh, uint i) {
    return ((ql >> (4u * (i >> 2u))) & 0x0F0F0F0Fu) | (((qh >> (2u * (i >> 1u))) & 0x03030303u) << 4u);
}

int dot4(uvec4 q, uvec4 x) {
    return sdot(q.x, x.x, 0) + sdot(q.y, x.y, 0) + sdot(q.z, x.z, 0) + sdot(q.w, x.w, 0);
}

// x's signed bytes x against unsigned weight bytes w
int udot4(uvec4 x, uvec4 w) {
    return sudot(x.x, w.x, 0) + sudot(x.y, w.y, 0) + sudot(x.z, w.z, 0) + sudot(x.w, w.w, 0);
}

// sum of x's q over 16 elements (4 lo words, 4 hi words; X8: the 4 words of bytes in xl)
int xsum16(uvec4 xl, uvec4 xh) {
#if defined(X8)
    return dot4(xl, uvec4(0x01010101u));
#else
    return 256 * dot4(xh, uvec4(0x01010101u)) + dot4(xl, uvec4(0x01010101u));
#endif
}

#if defined(XQ_WG) || defined(XQ_LANE)
#if defined(X8)
const int QLIM = 127;     // one signed byte
#else
const int QLIM = 32639;   // as qmatvec_xq.comp: q = 256 * hi + lo, |q| <= 32639
#endif
const float QMAX = float(QLIM);

uint pack_bytes(ivec4 v) {
    uvec4 b = uvec4(v) & 0xFFu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}

#if defined(XQ_LANE)
// x's block src (among all vectors' blocks) quantized by this lane alone: its lo and hi byte words
// (elements 0..15, then 16..31), scale and sums of q per half, as qmatvec_xq.comp makes them.  Every
// team quantizes x again, so q is rounded by adding 1.5 * 2^23 to the product (already rounded to
// fp32, as roundEven sees it; precise: no fused multiply-add) and taking the low bits, where
// roundEven and a conversion to int would take the quarter-rate conversion unit.  The same q under
// round-to-nearest-even arithmetic, the default of the devices kbench has met.
const float ROUNDER = 12582912.0;  // 1.5 * 2^23: |t| < 2^22 lands where a unit is the last bit
void lane_quantize(uint src, out uvec4 xl0, out uvec4 xl1, out uvec4 xh0, out uvec4 xh1, out float sx,
                   out ivec2 xs) {
    float m = 0.0;
    bool finite = true;
    [[unroll]] for (uint k = 0u; k < 8u; ++k) {
        vec4 a = abs(x4[8u * src + k]);
        finite = finite && !any(isnan(a)) && !any(isinf(a));
        m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
    }
    float inv = finite && m > 0.0 ? QMAX / m : 0.0;
    uvec4 lw[2], hw[2];
    [[unroll]] for (uint k = 0u; k < 8u; ++k) {  // x read again (L1), not held: 32 registers fewer
        precise vec4 t = x4[8u * src + k] * inv;
        precise vec4 r = t + ROUNDER;
        ivec4 q = clamp(floatBitsToInt(r) - 0x4B400000, ivec4(-QLIM), ivec4(QLIM));
        ivec4 l = ((q + 128) & 255) - 128;
        lw[k >> 2u][k & 3u] = pack_bytes(l);
        hw[k >> 2u][k & 3u] = pack_bytes((q - l) >> 8);
    }
    xl0 = lw[0];
    xl1 = lw[1];
    xh0 = hw[0];
    xh1 = hw[1];
    sx = finite ? m / QMAX : uintBitsToFloat(0x7FC00000u);
    xs = ivec2(xsum16(xl0, xh0), xsum16(xl1, xh1));
}
#else
// x's block src (among all vectors' blocks) into shared slot b, quantized exactly as qmatvec_xq.comp does it
void quantize_block(uint src, uint b) {
    vec4 v[8];
    float m = 0.0;
    bool finite = true;
    for (uint k = 0u; k < 8u; ++k) {
        v[k] = x4[8u * src + k];
        vec4 a = abs(v[k]);
        finite = finite && !any(isnan(v[k])) && !any(isinf(v[k]));
        m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
    }
    float inv = finite && m > 0.0 ? QMAX / m : 0.0;
    uint lo[8], hi[8];
    for (uint k = 0u; k < 8u; ++k) {
        ivec4 q = clamp(ivec4(roundEven(v[k] * inv)), ivec4(-QLIM), ivec4(QLIM));
        ivec4 l = ((q + 128) & 255) - 128;
        lo[k] = pack_bytes(l);
        hi[k] = pack_bytes((q - l) >> 8);
    }
    uvec4 l0 = uvec4(lo[0], lo[1], lo[2], lo[3]), l1 = uvec4(lo[4], lo[5], lo[6], lo[7]);
    uvec4 h0 = uvec4(hi[0], hi[1], hi[2], hi[3]), h1 = uvec4(hi[4], hi[5], hi[6], hi[7]);
    sxl[2u * b] = l0;
    sxl[2u * b + 1u] = l1;
#if !defined(X8)
    sxh[2u * b] = h0;
    sxh[2u * b + 1u] = h1;
#endif
    sxs[b] = finite ? m / QMAX : uintBitsToFloat(0x7FC00000u);
    sxsum[b] = ivec2(xsum16(l0, h0), xsum16(l1, h1));
}

#if defined(USE_SUBGROUP)
// Quarter qq (its vec4s 2 qq and 2 qq + 1: v0, v1) of x's block into shared slot b, by the 4 lanes
// of an aligned quad of the subgroup together (its max and finiteness shared by shuffles): the same
// bytes, scale and sums as quantize_block, a quarter of the loads and arithmetic per lane, so x's
// quantization (the largest cost of the xwg kernels in the ablation, docs/kernel-choices.md) is
// spread over 4 times as many lanes.
void quantize_quarter(vec4 v0, vec4 v1, uint b, uint qq) {
    vec4 a = max(abs(v0), abs(v1));
    float m = max(max(a.x, a.y), max(a.z, a.w));
    uint bad = any(isnan(v0)) || any(isinf(v0)) || any(isnan(v1)) || any(isinf(v1)) ? 1u : 0u;
    m = max(m, subgroupShuffleXor(m, 1u));
    m = max(m, subgroupShuffleXor(m, 2u));
    bad |= subgroupShuffleXor(bad, 1u);
    bad |= subgroupShuffleXor(bad, 2u);
    bool finite = bad == 0u;
    float inv = finite && m > 0.0 ? QMAX / m : 0.0;
    ivec4 q0 = clamp(ivec4(roundEven(v0 * inv)), ivec4(-QLIM), ivec4(QLIM));
    ivec4 q1 = clamp(ivec4(roundEven(v1 * inv)), ivec4(-QLIM), ivec4(QLIM));
    ivec4 l0 = ((q0 + 128) & 255) - 128, l1 = ((q1 + 128) & 255) - 128;
    uvec2 lo = uvec2(pack_bytes(l0), pack_bytes(l1));
    uvec2 hi = uvec2(pack_bytes((q0 - l0) >> 8), pack_bytes((q1 - l1) >> 8));  // unused (X8)
    uint w = 2u * b + (qq >> 1u);  // the uvec4 of words 2 qq, 2 qq + 1; its half qq & 1
    if ((qq & 1u) == 0u) {
        sxl[w].xy = lo;
#if !defined(X8)
        sxh[w].xy = hi;
#endif
    } else {
        sxl[w].zw = lo;
#if !defined(X8)
        sxh[w].zw = hi;
#endif
    }
    ivec4 t = q0 + q1;
    int sum = t.x + t.y + t.z + t.w;
    sum += subgroupShuffleXor(sum, 1u);  // elements 0..15 (qq 0, 1) or 16..31 (qq 2, 3)
    if (qq == 0u) {
        sxs[b] = finite ? m / QMAX : uintBitsToFloat(0x7FC00000u);
        sxsum[b].x = sum;
    } else if (qq == 2u) {
        sxsum[b].y = sum;
    }
}

// quarter i of a chunk of cb blocks per vector: its vector, block in the chunk and quarter
uvec3 quarter_of(uint i, uint cb) {
    uint v = i / (4u * cb);
    return uvec3(v, i / 4u - v * cb, i & 3u);
}
#endif
#endif  // XQ_LANE
#endif

// the loads of one unit of a row: NQ quant words, Q6_K's sub-block scale word (Q4_K: its two
// sub-blocks' scales and mins), the block scale (Q4_K: d and dmin)
#define N_BLOCKS (pc.n_rows * (pc.n_cols >> 5u) / (UNITS * UX))  // weight blocks in the matrix
#define SCALE_BASE (N_BLOCKS * QV)  // uvec4 index of the scales (Q4_K: of the scale and min bytes)
#if defined(QT_Q4_K)
#define DT vec2   // d, dmin
#else
#define DT float  // d
#endif

void fetch(uint blk, uint b, out uvec4 q[NQ], out uint extra, out DT d) {
#if defined(CUT_LOADS)
    [[unroll]] for (uint i = 0u; i < NQ; ++i) {
        q[i] = uvec4(blk * 0x9E3779B9u + i, b * 0x85EBCA6Bu, blk ^ b, blk + i);
    }
    extra = blk ^ 0x5A5A5A5Au;
    d = DT(float(b & 7u) * 0.125);
    return;
#endif
#if defined(QT_Q4_K)
    // unit b & 3 of the block: quants 2 (b & 3), + 1, its scale/min word, the block's d | dmin word
    uint u = b & 3u;
    q[0] = wq[blk * QV + 2u * u];
    q[1] = wq[blk * QV + 2u * u + 1u];
    extra = wq[SCALE_BASE + blk][u];
    d = unpackHalf2x16(wq[SCALE_BASE + N_BLOCKS + (blk >> 2u)][blk & 3u]);
#else
    uint si = blk >> 1u;
    d = unpackHalf2x16(wq[SCALE_BASE + (si >> 2u)][si & 3u] >> (16u * (blk & 1u))).x;
#if defined(QT_Q6_K)
    // unit u = b & 7 of the block (qmatvec_pack.comp's unit layout): its low bits at uvec4 u, its high
    // bits in words 2 (u & 1) and 2 (u & 1) + 1 of uvec4 8 + u / 2, its scales 2u (elements 0..15) and
    // 2u + 1 (16..31): half (u & 1) of word u / 2
    uint u = b & 7u, q0 = blk * QV;
    q[0] = wq[q0 + u];
    uint qh = q0 + 8u + (u >> 1u), c = 2u * (u & 1u);
    q[1] = uvec4(wq[qh][c], wq[qh][c + 1u], 0u, 0u);
    extra = wq[q0 + 12u][u >> 1u];
#else
    [[unroll]] for (uint i = 0u; i < NQ; ++i) {
        q[i] = wq[blk * QV + i];
    }
    extra = 0u;
#endif
#endif
}

// One unit decoded once for all vectors: its weights as bytes (elements 0..15 in wa, 16..31 in
// wb; unsigned quants except Q8_0's signed ones) and the scale of each half.
#if defined(QT_Q8_0)
const int OFFSET = 0;  // signed weights: nothing to take off
int wdot4(uvec4 x, uvec4 w) {
    return dot4(w, x);
}
#else
#if defined(QT_Q4_0)
const int OFFSET = 8;
#elif defined(QT_Q6_K)
const int OFFSET = 32;
#endif  // (Q4_K's offset, dmin * m, is a float: unit_dot takes it off)
int wdot4(uvec4 x, uvec4 w) {
    return udot4(x, w);
}
#endif

// x block s (< UX) of the unit.  Q4_K: its sub-block 2 (b & 3) + s, the low (s = 0) or high
// (s = 1) nibbles, both halves with the scale d * sc, so scale = (d * sc, dmin * m): the second
// is the min term's coefficient (see unit_dot).
void decode(uvec4 q[NQ], uint extra, DT d, uint b, uint s, out uvec4 wa, out uvec4 wb, out vec2 scale) {
#if defined(QT_Q4_K)
    wa = (q[0] >> (4u * s)) & 0x0F0F0F0Fu;
    wb = (q[1] >> (4u * s)) & 0x0F0F0F0Fu;
    scale = d * vec2((extra >> (8u * s)) & 0xFFu, (extra >> (16u + 8u * s)) & 0xFFu);
#elif defined(QT_Q6_K)
    [[unroll]] for (uint k = 0u; k < 4u; ++k) {
        wa[k] = q6_bytes(q[0][k], q[1][k & 1u], k);
        wb[k] = q6_bytes(q[0][k], q[1][k & 1u], k + 4u);
    }
    int sb = int(16u * (b & 1u));
    int scw = int(extra);
    scale = d * vec2(float(bitfieldExtract(scw, sb, 8)), float(bitfieldExtract(scw, sb + 8, 8)));
#elif defined(QT_Q4_0)
    // elements 0..15 are the low nibbles, 16..31 the high ones
    wa = q[0] & 0x0F0F0F0Fu;
    wb = (q[0] >> 4u) & 0x0F0F0F0Fu;
    scale = vec2(d);
#else
    wa = q[0];
    wb = q[1];
    scale = vec2(d);
#endif
}

// a decoded unit (Q4_K: sub-block) against one vector's block: x's two byte halves (xl, xh: words
// of elements 0..15 then 16..31), its scale sx and sums of q xs.  Each half's integer sum is below
// 2^27 (exact in fp32 below 2^24: Q4_0, Q6_K; Q8_0's rounds at 2^-24 relative).
float unit_dot(uvec4 wa, uvec4 wb, vec2 scale, uvec4 xl0, uvec4 xl1, uvec4 xh0, uvec4 xh1, float sx, ivec2 xs) {
#if defined(QT_Q4_K)
    // one sub-block, one scale: |t| <= 32 * 15 * 32639 = 15,666,720 < 2^24 (|256 hi| and |lo|
    // parts likewise), and |xs.x + xs.y| <= 32 * 32639 < 2^24: both exact in int32 and in fp32
#if defined(X8)
    int t = wdot4(xl0, wa) + wdot4(xl1, wb);
#else
    int t = 256 * (wdot4(xh0, wa) + wdot4(xh1, wb)) + wdot4(xl0, wa) + wdot4(xl1, wb);
#endif
    return (float(t) * scale.x - float(xs.x + xs.y) * scale.y) * sx;
#else
#if defined(X8)
    float ta = float(wdot4(xl0, wa) - OFFSET * xs.x);
    float tb = float(wdot4(xl1, wb) - OFFSET * xs.y);
#else
    float ta = float(256 * wdot4(xh0, wa) + wdot4(xl0, wa) - OFFSET * xs.x);
    float tb = float(256 * wdot4(xh1, wb) + wdot4(xl1, wb) - OFFSET * xs.y);
#endif
    return (ta * scale.x + tb * scale.y) * sx;
#endif
}

// One batch: UNROLL units of each of a team's ROWS rows, all loaded before any is decoded.  A
// workgroup's first batch is loaded before it quantizes x, so HBM is busy while x is prepared.
// (Loading the next batch while decoding the current one, two batches in registers, was slower
// on the H200: register pressure.  So was loading each unit's next words as soon as its current ones
// were decoded, one batch in registers, on the H100: the driver hoisted those loads and took more
// registers, 77 for Q4_0's short rows where 64 hold two workgroups an SM; docs/kernel-choices.md.)
uvec4 q_next[UNROLL * ROWS][NQ];
uint extra_next[UNROLL * ROWS];
DT d_next[UNROLL * ROWS];

// nu: units per row; units from bend on (the row's or the x chunk's end) are not loaded
void load_batch(uint row0, uint b0, uint nu, uint bend) {
    uint nblk = nu / UNITS;  // weight blocks per row
    [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {  // constant trip counts: unrolled
        uint b = min(b0 + u * LANES, bend - 1u);  // a unit past the end reloads the last one, unused
        [[unroll]] for (uint r = 0u; r < ROWS; ++r) {
            uint row = min(row0 + r, pc.n_rows - 1u);
            fetch(row * nblk + b / UNITS, b, q_next[u * ROWS + r], extra_next[u * ROWS + r], d_next[u * ROWS + r]);
        }
    }
}

#ifdef TIMELINE
// the timeline twin (kbench/probes/timeline.py): sums are computed but not written (a never-true test
// keeps them live), so that y holds each workgroup's record
#define Y_OUT(i, v) if (floatBitsToUint(v) == 0x7F7FFFFEu) { y[(i) + y_at] = (v); }
#else
#define Y_OUT(i, v) y[(i) + y_at] = (v)
#endif
uint y_at = 0u;  // this split's partial sums in the output (0 without splits)

const uint K = ROWS * NX;  // a team's sums: row r, vector v at r * NX + v
// K rounded up to a power of two: the halving reduction's slots (those from K on stay 0)
const uint K1 = K - 1u;
const uint KP = (K1 | (K1 >> 1u) | (K1 >> 2u) | (K1 >> 4u) | (K1 >> 8u) | (K1 >> 16u)) + 1u;
float acc[KP];

// units c0 .. c1 - 1 of rows row0 .. row0 + ROWS - 1 (rows past the matrix load its last row,
// unused) into acc; nu units per row; `loaded`: the first batch is in q_next already
void team_units(uint tl, uint row0, uint nu, uint c0, uint c1, bool loaded) {
    uint nb = nu * UX;  // x's blocks per vector
    const uint STEP = LANES * UNROLL;
    for (uint b0 = c0 + tl; b0 < c1; b0 += STEP) {
        if (!loaded || b0 != c0 + tl) {
            load_batch(row0, b0, nu, c1);
        }
        [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
            uint b = b0 + u * LANES;
            if (b >= c1) {
                break;
            }
#if defined(CUT_DOTS)
            [[unroll]] for (uint r = 0u; r < ROWS; ++r) {
                uint k = u * ROWS + r;
                uvec4 h = uvec4(extra_next[k]);
                [[unroll]] for (uint i = 0u; i < NQ; ++i) {
                    h ^= q_next[k][i];
                }
                acc[r * NX] += float((h.x ^ h.y ^ h.z ^ h.w) & 0xFFFFu) + vec2(d_next[k]).x;
            }
            continue;
#endif
            // row r, x block s of the unit at r * UX + s (flat: arrays [ROWS][UX], a row's [UX] passed
            // to decode as an out array, lost their [1] entries on lavapipe, seen with ROWS = 2)
            uvec4 wa[ROWS * UX], wb[ROWS * UX];
            vec2 scale[ROWS * UX];
            [[unroll]] for (uint r = 0u; r < ROWS; ++r) {
                uint k = u * ROWS + r;
                [[unroll]] for (uint s = 0u; s < UX; ++s) {
                    decode(q_next[k], extra_next[k], d_next[k], b, s, wa[r * UX + s], wb[r * UX + s], scale[r * UX + s]);
                }
            }
            [[unroll]] for (uint v = 0u; v < NX; ++v) {
                [[unroll]] for (uint s = 0u; s < UX; ++s) {
#if defined(XQ_WG)
                    uint gb = v * BLOCKS + (b - c0) * UX + s;  // x block b * UX + s of vector v in the held chunk
                    uvec4 xl0 = sxl[2u * gb], xl1 = sxl[2u * gb + 1u];
#if defined(X8)
                    uvec4 xh0 = uvec4(0u), xh1 = uvec4(0u);  // unused
#else
                    uvec4 xh0 = sxh[2u * gb], xh1 = sxh[2u * gb + 1u];
#endif
                    float sx = sxs[gb];
                    ivec2 xs = sxsum[gb];
#elif defined(XQ_LANE)
                    uvec4 xl0, xl1, xh0, xh1;
                    float sx;
                    ivec2 xs;
                    lane_quantize(v * nb + b * UX + s, xl0, xl1, xh0, xh1, sx, xs);
#else
                    uint gb = v * nb + b * UX + s;  // x block b * UX + s of vector v among all vectors' blocks
                    uint all = NX * nb;  // qmatvec_xq quantized every vector as one long x
                    uvec4 xl0 = xq[2u * gb], xl1 = xq[2u * gb + 1u];
                    uvec4 xh0 = xq[2u * all + 2u * gb], xh1 = xq[2u * all + 2u * gb + 1u];
                    uint sxi = 16u * all + gb;  // x scale word
                    float sx = uintBitsToFloat(xq[sxi >> 2u][sxi & 3u]);
#if defined(QT_Q8_0)
                    ivec2 xs = ivec2(0);  // signed weights: no offset to take off
#else
                    ivec2 xs = ivec2(xsum16(xl0, xh0), xsum16(xl1, xh1));
#endif
#endif
                    [[unroll]] for (uint r = 0u; r < ROWS; ++r) {
                        uint i = r * UX + s;
                        acc[r * NX + v] += unit_dot(wa[i], wb[i], scale[i], xl0, xl1, xh0, xh1, sx, xs);
                    }
                }
            }
        }
    }
}

// the team's sums of rows row0 .. (those inside the matrix) summed over its lanes and written;
// every lane of the workgroup takes part (barriers)
void team_write(uint team, uint tl, uint lid, uint row0) {
    uint rows = row0 < pc.n_rows ? min(ROWS, pc.n_rows - row0) : 0u;
#if defined(USE_SUBGROUP)
#if defined(CUT_HALVING)
    const bool HALVING = false;  // ablation: a butterfly of every sum, as before the halving
#else
    const bool HALVING = true;
#endif
    if (HALVING && LANES <= gl_SubgroupSize) {
        // Halving: at distance m = 1, 2, 4, .. each lane keeps half of its c sums (the upper half
        // where bit m of its lane is set), adds its partner's copy of that half and sends the other,
        // c / 2 shuffles a step, until one sum per lane or the team's width is reached; then a
        // butterfly over the remaining distances.  K - 1 shuffles where a butterfly of every sum
        // took K log2(LANES) (160 for 8 vectors of 4 rows): the reduction was most of a short-row
        // batch's time on the H100 (docs/kernel-choices.md).
        // Every index into acc is a constant once the loops are unrolled (their trip counts follow
        // from spec constants): an index known only at run time put acc in local memory (--stats).
        const uint M_END = LANES < KP ? LANES : KP;  // the halving's end: one sum a lane, or the team's width
        const uint C_END = KP / M_END;               // sums a lane holds then
        uint base = 0u;
        [[unroll]] for (uint m = 1u, c = KP; m < M_END; m <<= 1u, c >>= 1u) {
            uint h = c >> 1u;
            bool upper = (tl & m) != 0u;
            [[unroll]] for (uint j = 0u; j < h; ++j) {
                float keep = upper ? acc[j + h] : acc[j], send = upper ? acc[j] : acc[j + h];
                acc[j] = keep + subgroupShuffleXor(send, m);
            }
            base += upper ? h : 0u;
        }
        [[unroll]] for (uint mm = M_END; mm < LANES; mm <<= 1u) {
            acc[0] += subgroupShuffleXor(acc[0], mm);  // (C_END = 1 here: one sum per lane)
        }
        // lane tl holds sums base .. base + C_END - 1; where the butterfly left copies, lanes with the
        // bits from M_END on clear write them
        if (tl < M_END) {
            [[unroll]] for (uint j = 0u; j < C_END; ++j) {
                uint kk = base + j;
                if (kk < K && kk / NX < rows) {
                    Y_OUT((kk % NX) * pc.n_rows + row0 + kk / NX, acc[j]);
                }
            }
        }
    } else {
        // butterfly within min(LANES, subgroup): every lane of it ends with the sums
        uint width = min(LANES, gl_SubgroupSize);
        [[unroll]] for (uint k = 0u; k < K; ++k) {
            for (uint m = 1u; m < width; m <<= 1u) {
                acc[k] += subgroupShuffleXor(acc[k], m);
            }
        }
        if (LANES <= gl_SubgroupSize) {
            // lane l of the team writes sums l, l + LANES, ... (more sums than lanes: many vectors)
            for (uint k0 = 0u; k0 < K; k0 += LANES) {
                uint kk = k0 + tl;
                if (kk < K && kk / NX < rows) {
                    float s = 0.0;
                    [[unroll]] for (uint k = 0u; k < K; ++k) {
                        s = k == kk ? acc[k] : s;
                    }
                    Y_OUT((kk % NX) * pc.n_rows + row0 + kk / NX, s);
                }
            }
        } else {
            uint per_team = LANES / gl_SubgroupSize;  // subgroups of a team (whole: LANES and WG are multiples)
            uint sg_in_team = tl / gl_SubgroupSize;
            if (gl_SubgroupInvocationID == 0u) {
                [[unroll]] for (uint k = 0u; k < K; ++k) {
                    part[(team * K + k) * per_team + sg_in_team] = acc[k];
                }
            }
            barrier();
            for (uint kk = tl; kk < K; kk += LANES) {
                if (kk / NX < rows) {
                    float s = 0.0;
                    for (uint g = 0u; g < per_team; ++g) {
                        s += part[(team * K + kk) * per_team + g];
                    }
                    Y_OUT((kk % NX) * pc.n_rows + row0 + kk / NX, s);
                }
            }
            barrier();  // part is written again by the workgroup's next row group
        }
    }
#else
    [[unroll]] for (uint k = 0u; k < K; ++k) {
        part[lid] = acc[k];
        barrier();
        for (uint h = LANES >> 1u; h > 0u; h >>= 1u) {  // LANES is a power of two: halves within the team
            if (tl < h) {
                part[lid] += part[lid + h];
            }
            barrier();
        }
        if (tl == 0u && k / NX < rows) {
            Y_OUT((k % NX) * pc.n_rows + row0 + k / NX, part[lid]);
        }
        barrier();
    }
#endif
}

#if defined(SPLIT_LAST)
// After split z of row group g has written its partial sums: the last of the group's splits to get
// here adds them up, in split order as qmatmul_coop_io.comp's sum variant does (the same bits), into
// y, and sets the group's count back to zero.  Each split's writes are made visible device-wide
// (memoryBarrierBuffer) before its count is raised; the last reads them through a coherent binding.
void split_finish(uint g, uint lid, uint group_rows) {
    memoryBarrierBuffer();
    barrier();
    if (lid == 0u) {
        s_last = atomicAdd(arrived[g], 1u) == gl_NumWorkGroups.z - 1u;
    }
    barrier();
    if (s_last) {  // the same for the whole workgroup
        memoryBarrierBuffer();
        uint row0 = g * group_rows;
        uint n = min(group_rows, pc.n_rows - row0);
        uint stride = NX * pc.n_rows;
        for (uint i = lid; i < NX * n; i += gl_WorkGroupSize.x) {
            uint v = i / n;
            uint at = v * pc.n_rows + row0 + (i - v * n);
            float sum = 0.0;
            for (uint z = 0u; z < gl_NumWorkGroups.z; ++z) {
                sum += y[z * stride + at];
            }
            yf[at] = sum;
        }
        if (lid == 0u) {
            arrived[g] = 0u;
        }
    }
}
#endif

// Workgroups take row groups (TEAMS * ROWS rows) group, group + n_groups, ...: one each where
// the grid covers the matrix; several where the policy launches about as many workgroups as
// the device holds at once (whole waves, and x quantized once per workgroup where it fits whole).
void main() {
#ifdef TIMELINE
    uvec2 t_start = clockRealtime2x32EXT();
    uvec2 c_start = clock2x32ARB();
    uint steps = 0u;
#endif
    uint lid = gl_LocalInvocationID.x;
    uint team = lid / LANES, tl = lid % LANES;
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint n_groups = gl_NumWorkGroups.x * gl_NumWorkGroups.y;
    uint group_rows = TEAMS * ROWS;
    // BALANCE: this workgroup's blocks of ROWS rows blk0 .. blk1 - 1 (the policy keeps B * G < 2^32)
    uint n_blk = (pc.n_rows + ROWS - 1u) / ROWS;
    uint blk0 = group * n_blk / n_groups, blk1 = (group + 1u) * n_blk / n_groups;
    if (BALANCE ? blk0 >= blk1 : group * group_rows >= pc.n_rows) {
        return;  // whole workgroup: no barrier is skipped by part of it
    }
    // a team with no block of rows (BALANCE): past the matrix, so it loads and writes nothing
    uint team_row0 = BALANCE ? (blk0 + team < blk1 ? (blk0 + team) * ROWS : pc.n_rows) : group * group_rows + team * ROWS;
    uint nb = pc.n_cols >> 5u;  // x's blocks of 32
    uint nu = nb / UX;           // units per row
    // this split's units u0 .. u1 - 1 of each row (every split has some: the policy launches no empty one)
    uint u0 = SPLIT_UNITS > 0u ? gl_WorkGroupID.z * SPLIT_UNITS : 0u;
    uint u1 = SPLIT_UNITS > 0u ? min(u0 + SPLIT_UNITS, nu) : nu;
    y_at = gl_WorkGroupID.z * NX * pc.n_rows;
#if defined(XQ_WG)
    uint cu = BLOCKS / UX;       // units per chunk of x
#else
    uint cu = u1 - u0;
#endif
#if defined(XQ_WG) && defined(USE_SUBGROUP)
    // quads of the subgroup quantize x (quantize_quarter) where the subgroup holds whole quads;
    // lid's quad is its subgroup's quad (1-D workgroups are laid out in subgroups by index)
#if defined(CUT_QUADS)
    bool quads = false;  // ablation: a lane per block of x, as the tree variant
#else
    bool quads = gl_SubgroupSize >= 4u;
#endif
    // the first chunk's first quarter of this lane loaded before the first batch of weights,
    // so that x is not queued behind the weight loads
    uint cb0 = min(cu, u1 - u0) * UX;
    vec4 pre0 = vec4(0.0), pre1 = vec4(0.0);
#if defined(CUT_X_FIRST)
    const bool X_FIRST = false;  // ablation: x loaded after the weights' first batch
#else
    const bool X_FIRST = PREFETCH;
#endif
    if (quads && X_FIRST && lid < 4u * NX * cb0) {
        uvec3 f = quarter_of(lid, cb0);  // of the chunk at unit 0
        uint src = 8u * (f.x * nb + u0 * UX + f.y) + 2u * f.z;
        pre0 = x4[src];
        pre1 = x4[src + 1u];
    }
#endif
#if defined(STAGGER)
    // Variants *.stagger.*: only the even teams load their first batch before x is quantized, the odd
    // ones after it, so that a workgroup's teams step out of phase: in round 12's timelines they
    // stepped together, their loads in bursts with the multiplies between them.  Variants of their
    // own, so the others' SPIR-V stays as measured.
    bool early = PREFETCH && (team & 1u) == 0u;
#define FIRST_EARLY early
#else
#define FIRST_EARLY PREFETCH
#endif
    if (FIRST_EARLY && team_row0 < pc.n_rows) {
        load_batch(team_row0, u0 + tl, nu, min(u0 + cu, u1));
    }
    uint held = 0xFFFFFFFFu;  // the first unit of the chunk of x in shared memory
    // uniform over the workgroup; BALANCE: one pass
    for (uint g = group; BALANCE ? g == group : g * group_rows < pc.n_rows; g += n_groups) {
        uint row0 = g == group ? team_row0 : g * group_rows + team * ROWS;
        bool idle = row0 >= pc.n_rows;  // the team's units: none
        [[unroll]] for (uint k = 0u; k < KP; ++k) {
            acc[k] = 0.0;
        }
        for (uint c0 = u0; c0 < u1; c0 += cu) {
            uint c1 = min(c0 + cu, u1);
#if defined(XQ_WG)
            if (c0 != held) {
                if (held != 0xFFFFFFFFu) {
                    barrier();  // every team is done with the chunk held now
                }
                uint cb = (c1 - c0) * UX;  // the chunk's blocks per vector
#if !defined(CUT_X)
#if defined(USE_SUBGROUP)
                if (quads) {
                    // 4 * NX * cb quarters and a workgroup of whole subgroups: a quad is active or idle whole
                    for (uint i = lid; i < 4u * NX * cb; i += gl_WorkGroupSize.x) {
                        uvec3 f = quarter_of(i, cb);
                        uint src = 8u * (f.x * nb + c0 * UX + f.y) + 2u * f.z;
                        bool first = X_FIRST && i == lid && held == 0xFFFFFFFFu;
                        vec4 v0 = first ? pre0 : x4[src], v1 = first ? pre1 : x4[src + 1u];
                        quantize_quarter(v0, v1, f.x * BLOCKS + f.y, f.z);
                    }
                } else
#endif
                for (uint i = lid; i < NX * cb; i += gl_WorkGroupSize.x) {
                    uint v = i / cb, j = i - v * cb;
                    quantize_block(v * nb + c0 * UX + j, v * BLOCKS + j);
                }
#endif
                barrier();
                held = c0;
            }
#endif
            team_units(tl, row0, nu, c0, idle ? c0 : c1, FIRST_EARLY && g == group && c0 == u0);
#ifdef TIMELINE
            steps += (c1 - c0 + LANES * UNROLL - 1u) / (LANES * UNROLL);  // a team's batches
#endif
        }
        team_write(team, tl, lid, row0);
#if defined(SPLIT_LAST)
        split_finish(g, lid, group_rows);
#endif
    }
#ifdef TIMELINE
    if (lid == 0u) {
        uvec2 t_end = clockRealtime2x32EXT();
        uvec2 c_end = clock2x32ARB();
        uint w = 4u * (gl_WorkGroupID.z * n_groups + group);  // split z's records after split z - 1's
        y[w] = uintBitsToFloat(t_start.x);
        y[w + 1u] = uintBitsToFloat(t_end.x);
        y[w + 2u] = uintBitsToFloat(c_end.x - c_start.x);
        y[w + 3u] = uintBitsToFloat(steps);
    }
#endif
}
