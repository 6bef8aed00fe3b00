#version 450
// Quantized matrix-vector product for GPUs, Q4_0 / Q8_0 / Q4_K / Q6_K:
// y[r] = sum_{c < n_cols} dequant(W)[r, c] * x[c].  Same bindings and push constants as
// qmatvec.comp; no 8/16-bit storage: W is read as uint words (uvec4 for Q4_K, whose 144-byte
// blocks are always 16-byte aligned), halves decoded with unpackHalf2x16.
//
// Work split.  A workgroup of WG invocations is cut into teams of LANES consecutive
// invocations (LANES a power of two dividing WG); team t of workgroup g computes the ROWS
// consecutive rows starting at (g * WG / LANES + t) * ROWS.  A row is cut into small units and
// the lanes of a team take units lane, lane + LANES, ...: consecutive lanes read consecutive
// bytes of the row (and of x), so a subgroup's loads are coalesced.  A unit's inputs are loaded
// once and used for all ROWS rows (x traffic / ROWS); the ROWS rows' weight loads are
// independent, so each lane has several loads in flight.
//   Q4_0: 4 quant bytes of one block (8 elements: 4k..4k+3 and 16+4k..16+4k+3)
//   Q8_0: 8 quant bytes of one block (8 elements)
//   Q4_K: one 16-byte quarter of a 64-element group (32 elements, two sub-block scales)
//   Q6_K: 8 l-positions of one 128-element half (32 elements: 8 of each of its 4 parts)
// Blocks of Q4_0, Q8_0 and Q6_K are only 2-byte aligned: a 2-aligned 4-byte field is put
// together from the words holding its first and last byte (never a word past the field).
//
// Decoding without integer-to-float conversions: (bits & mask) | 0x4B000000 is the float
// 2^23 + v * 2^p for a field v at bit p < 20 (p = 0, 4, 8, 12), so subtracting 2^23 (plus the
// format's offset times 2^p) gives v * 2^p exactly; fields at the same p share an accumulator
// and the 2^-p factors are applied once per unit.
//
// Reduction of the lanes' partial sums: with subgroup arithmetic (variant *.sg), when every
// subgroup is full, contiguous in gl_LocalInvocationID and inside one team (checked at run
// time, so the result is right on any device), by subgroupAdd (plus shared memory when a team
// spans several subgroups); otherwise (and in variant *.tree) by a tree in shared memory.
//
// Staged variants (*.staged.sg, *.staged.tree; rows of a multiple of 16 bytes only): the
// workgroup's TEAMS * ROWS rows are consumed in chunks of CHUNK_BLOCKS blocks per row.  Every
// invocation copies its share of the next chunk (16-byte loads of consecutive addresses, so
// the whole workgroup streams contiguous row segments) into registers while the teams decode
// the current chunk out of shared memory; then the registers go to shared memory.  A lane
// thus keeps STAGE_LOADS 16-byte loads in flight instead of a few narrow, 2-byte-aligned
// ones, which is what a matrix-vector product needs to approach DRAM bandwidth.  The decoding
// below is the same code: its byte offsets point into the chunk instead of the buffer.
//
// Integer-dot variants (*.dot.sg, *.dot.tree): binding 1 is not x but x quantized by
// qmatvec_xq.comp to 16 bits per element in blocks of 32 (q = round(x / s), |q| <= 32639,
// s = max|x| / 32639 per block), each q split into signed bytes q = 256 * hi + lo.  The weights'
// integer fields meet both halves in 4-wide integer dot products (SPV_KHR_integer_dot_product,
// declared through GL_EXT_spirv_intrinsics because this glslang has no GLSL built-ins for it),
// so a unit costs a few dot instructions instead of a float conversion and an fma per element.
// The per-block integer sums stay below 2^24 (Q8_0: 2^26, rounded once), so the only error
// beside fp32 rounding is the quantization of x: NMSE about 2e-10 for uniform x (1e-9 with
// heavy tails) against the float64 oracle, under the case tolerance of 1e-8.
// Lane variants (*.dotl.*): binding 1 is x itself; each lane quantizes the x elements of its
// own unit (8 elements, 16 for each half of a Q4_K unit) with their own scale, once for its
// ROWS rows: no second dispatch and no sharing, and a finer scale than the blocks of 32.
// (Quantizing x inside every workgroup instead, to save the second dispatch and its barrier,
// about 4 us per call on the H200, was 2-10x slower there: each workgroup of a few rows
// repeats the whole of x's quantization.  probes/20261203T1345-probe_qmatvec-dot-fused.log)
//
// kbench: variant q4_0.sg QT_Q4_0 USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.tree QT_Q4_0
// kbench: variant q8_0.sg QT_Q8_0 USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.tree QT_Q8_0
// kbench: variant q4_k.sg QT_Q4_K USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.tree QT_Q4_K
// kbench: variant q6_k.sg QT_Q6_K USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.tree QT_Q6_K
// kbench: variant q4_0.dot.sg QT_Q4_0 DOT USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.dot.tree QT_Q4_0 DOT target=vulkan1.1
// kbench: variant q8_0.dot.sg QT_Q8_0 DOT USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.dot.tree QT_Q8_0 DOT target=vulkan1.1
// kbench: variant q4_k.dot.sg QT_Q4_K DOT USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.dot.tree QT_Q4_K DOT target=vulkan1.1
// kbench: variant q6_k.dot.sg QT_Q6_K DOT USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.dot.tree QT_Q6_K DOT target=vulkan1.1
// kbench: variant q4_0.dotl.sg QT_Q4_0 DOT DOT_LANE USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.dotl.tree QT_Q4_0 DOT DOT_LANE target=vulkan1.1
// kbench: variant q8_0.dotl.sg QT_Q8_0 DOT DOT_LANE USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.dotl.tree QT_Q8_0 DOT DOT_LANE target=vulkan1.1
// kbench: variant q4_k.dotl.sg QT_Q4_K DOT DOT_LANE USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.dotl.tree QT_Q4_K DOT DOT_LANE target=vulkan1.1
// kbench: variant q6_k.dotl.sg QT_Q6_K DOT DOT_LANE USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.dotl.tree QT_Q6_K DOT DOT_LANE target=vulkan1.1
// kbench: variant q4_0.stream.raw.sg QT_Q4_0 RAW_ONLY STREAM_ONLY USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.staged.sg QT_Q4_0 STAGED USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.staged.tree QT_Q4_0 STAGED
// kbench: variant q4_0.raw.sg QT_Q4_0 RAW_ONLY USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.staged.raw.sg QT_Q4_0 STAGED RAW_ONLY USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.staged.sg QT_Q8_0 STAGED USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.staged.tree QT_Q8_0 STAGED
// kbench: variant q4_k.staged.sg QT_Q4_K STAGED USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.staged.tree QT_Q4_K STAGED
// kbench: variant q6_k.staged.sg QT_Q6_K STAGED USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.staged.tree QT_Q6_K STAGED

#if defined(USE_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#if defined(DOT)
#extension GL_EXT_spirv_intrinsics : require
// OpSDotKHR / OpSUDotKHR on 4 packed bytes (last operand: PackedVectorFormat4x8Bit = 0);
// sudot's first operand is signed, its second unsigned
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot(uint a, uint b, spirv_literal int fmt);
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int sudot(uint a, uint b, spirv_literal int fmt);
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint LANES = 32;  // invocations per team (power of two, divides WG)
layout(constant_id = 2) const uint ROWS = 4;    // rows per team

#if defined(QT_Q4_0)
const uint BLOCK_BYTES = 18u, BLOCK_ELEMS = 32u;
#elif defined(QT_Q8_0)
const uint BLOCK_BYTES = 34u, BLOCK_ELEMS = 32u;
#elif defined(QT_Q4_K)
const uint BLOCK_BYTES = 144u, BLOCK_ELEMS = 256u;
#else
const uint BLOCK_BYTES = 210u, BLOCK_ELEMS = 256u;
#endif

#if defined(STAGED)
layout(constant_id = 3) const uint CHUNK_BLOCKS = 8;  // blocks per row and chunk (CHUNK_BLOCKS * BLOCK_BYTES % 16 == 0)
const uint CHUNK16 = CHUNK_BLOCKS * BLOCK_BYTES / 16u;             // uvec4s per row and chunk
const uint TILE16 = gl_WorkGroupSize.x / LANES * ROWS * CHUNK16;  // uvec4s per chunk
const uint STAGE_LOADS = (TILE16 + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;
layout(std430, binding = 0) readonly buffer Weights4 { uvec4 wg4[]; };
shared uvec4 st4[TILE16];
#define WQ(i) st4[(i) >> 2][(i) & 3u]
#define WQ4(i) st4[i]
#else
layout(std430, binding = 0) readonly buffer Weights { uint wq[]; };
#define WQ(i) wq[i]
#if defined(QT_Q4_K)
layout(std430, binding = 0) readonly buffer Weights4 { uvec4 wq4[]; };
#define WQ4(i) wq4[i]
#endif
#if defined(STREAM_ONLY)
layout(std430, binding = 0) readonly buffer WeightsS { uvec4 ws4[]; };
#endif
#endif
#if defined(DOT) && !defined(DOT_LANE)
// quantized x (qmatvec_xq.comp): lo bytes at word 0, hi bytes at word XHI = 8 * blocks of 32,
// the block scales (float bits) at word XSC = 16 * blocks
layout(std430, binding = 1) readonly buffer InputQ { uint xw[]; };
layout(std430, binding = 1) readonly buffer InputQ4 { uvec4 xw4[]; };
#define XLO(i) xw[i]
#define XHIW(i) xw[XHI + (i)]
#define XLO4(i) xw4[i]
#define XHI4(i) xw4[(XHI >> 2) + (i)]
#define XSCALE(b) uintBitsToFloat(xw[XSC + (b)])
#else
layout(std430, binding = 1) readonly buffer Input { vec4 x4[]; };
#endif
layout(std430, binding = 2) writeonly buffer Output { float y[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint row_bytes;
} pc;

shared float red[gl_WorkGroupSize.x * ROWS];
#if defined(USE_SUBGROUP)
shared uint sg_bad[gl_WorkGroupSize.x];
#endif

const uint MAGIC = 0x4B000000u;
const float TWO23 = 8388608.0;

// 2^23 + (bits as an integer); bits must be below 2^23
float mag(uint bits) {
    return uintBitsToFloat(bits | MAGIC);
}

// the 4 bytes at a 2-aligned byte offset
uint load4(uint p) {
    uint lo = WQ(p >> 2);
    uint hi = WQ((p + 2u) >> 2);
    return (p & 2u) != 0u ? (lo >> 16) | (hi << 16) : lo;
}

// the 8 bytes at a 2-aligned byte offset
uvec2 load8(uint p) {
    uint w = p >> 2;
    uint a = WQ(w);
    uint b = WQ(w + 1u);
    uint c = WQ((p + 6u) >> 2);
    return (p & 2u) != 0u ? uvec2((a >> 16) | (b << 16), (b >> 16) | (c << 16)) : uvec2(a, b);
}

// the half float at a 2-aligned byte offset
float load_half(uint p) {
    return unpackHalf2x16(WQ(p >> 2) >> ((p & 2u) * 8u)).x;
}

#if defined(QT_Q4_0) || defined(QT_Q8_0)
const uint UNIT_SHIFT = 3u;   // 8 elements per unit
#else
const uint UNIT_SHIFT = 5u;   // 32 elements per unit
#endif

// per-invocation state of main(): the ROWS rows' partial sums and the byte offsets that the
// decoding adds a block's offset to (buffer offsets, or in a staged chunk modulo 2^32)
float acc[ROWS];
uint rowoff[ROWS];
#if defined(DOT)
uint XHI, XSC;  // word offsets of x's high bytes and scales (set by main from n_cols)
const uint ONES = 0x01010101u;
#endif
#if defined(DOT_LANE)
const float QMAX = 32639.0;  // 127 * 256 + 127, as in qmatvec_xq.comp

uint pack_bytes(ivec4 v) {
    uvec4 b = uvec4(v) & 0xFFu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}

float amax4(vec4 v) {
    vec4 a = abs(v);
    return max(max(a.x, a.y), max(a.z, a.w));
}

bool finite4(vec4 v) {
    return !any(isnan(v)) && !any(isinf(v));
}

// 1 / scale for elements of maximum m (0 for an all-zero or non-finite group)
float qinv(float m, bool finite) {
    return finite && m > 0.0 ? QMAX / m : 0.0;
}

// the scale (NaN for a group holding a NaN or an infinity, so its rows come out NaN)
float qscale(float m, bool finite) {
    return finite ? m * (1.0 / QMAX) : uintBitsToFloat(0x7FC00000u);
}

// (lo, hi) byte words of 4 elements: q = round(v * inv) = 256 * hi + lo
uvec2 qsplit(vec4 v, float inv) {
    ivec4 q = clamp(ivec4(roundEven(v * inv)), ivec4(-32639), ivec4(32639));
    ivec4 lo = ((q + 128) & 255) - 128;
    return uvec2(pack_bytes(lo), pack_bytes((q - lo) >> 8));
}
#endif

// adds unit u of every row (u counts units from the start of the row) to acc
void accumulate(uint u) {
#if defined(RAW_ONLY)
    // probe only (scripts/probe_qmatvec.py "raw:" specs): Q4_0's loads without its decoding, a
    // wrong result whose time is what the memory side of the kernel costs
    uint b = u >> 2;
    uint k = u & 3u;
    vec4 xa = x4[8u * b + k];
    for (uint r = 0u; r < ROWS; ++r) {
        uint blk = rowoff[r] + 18u * b;
        acc[r] = fma(uintBitsToFloat((load4(blk + 2u + 4u * k) ^ WQ(blk >> 2)) & 0x3F7FFFFFu), xa.x, acc[r]);
    }
#elif defined(DOT) && defined(QT_Q4_0)
    uint b = u >> 2;
    uint k = u & 3u;
#if defined(DOT_LANE)
    vec4 xa = x4[8u * b + k], xb = x4[8u * b + 4u + k];
    bool fin = finite4(xa) && finite4(xb);
    float m = max(amax4(xa), amax4(xb));
    float inv = qinv(m, fin), sx = qscale(m, fin);
    uvec2 qa = qsplit(xa, inv), qb = qsplit(xb, inv);
    uint l0 = qa.x, h0 = qa.y, l1 = qb.x, h1 = qb.y;
#else
    uint l0 = XLO(8u * b + k), l1 = XLO(8u * b + 4u + k);              // elements 4k.., 16+4k..
    uint h0 = XHIW(8u * b + k), h1 = XHIW(8u * b + 4u + k);
    float sx = XSCALE(b);
#endif
    // nibble v is the weight + 8: sum (v - 8) q = sum v q - 8 sum q
    int qsum = 256 * (sdot(h0, ONES, 0) + sdot(h1, ONES, 0)) + sdot(l0, ONES, 0) + sdot(l1, ONES, 0);
    for (uint r = 0u; r < ROWS; ++r) {
        uint blk = rowoff[r] + 18u * b;
        uint q = load4(blk + 2u + 4u * k);
        float d = load_half(blk);
        uint lo = q & 0x0F0F0F0Fu;
        uint hi = (q >> 4) & 0x0F0F0F0Fu;
        int t = 256 * (sudot(h0, lo, 0) + sudot(h1, hi, 0)) + (sudot(l0, lo, 0) + sudot(l1, hi, 0)) - 8 * qsum;
        acc[r] = fma(d * sx, float(t), acc[r]);
    }

#elif defined(DOT) && defined(QT_Q8_0)
    uint b = u >> 2;
    uint k = u & 3u;
    uint wl = 8u * b + 2u * k;  // elements 8k .. 8k+7
#if defined(DOT_LANE)
    vec4 xa = x4[wl], xb = x4[wl + 1u];
    bool fin = finite4(xa) && finite4(xb);
    float m = max(amax4(xa), amax4(xb));
    float inv = qinv(m, fin), sx = qscale(m, fin);
    uvec2 qa = qsplit(xa, inv), qb = qsplit(xb, inv);
    uint l0 = qa.x, h0 = qa.y, l1 = qb.x, h1 = qb.y;
#else
    uint l0 = XLO(wl), l1 = XLO(wl + 1u);
    uint h0 = XHIW(wl), h1 = XHIW(wl + 1u);
    float sx = XSCALE(b);
#endif
    for (uint r = 0u; r < ROWS; ++r) {
        uint blk = rowoff[r] + 34u * b;
        uvec2 q = load8(blk + 2u + 8u * k);
        float d = load_half(blk);
        int t = 256 * (sdot(h0, q.x, 0) + sdot(h1, q.y, 0)) + (sdot(l0, q.x, 0) + sdot(l1, q.y, 0));
        acc[r] = fma(d * sx, float(t), acc[r]);
    }

#elif defined(DOT) && defined(QT_Q4_K)
    // unit i of block b as in the float variant: low nibbles = 16 elements of sub-block 2g,
    // high nibbles = 16 of sub-block 2g+1; x words are numbered like x's vec4s
    uint b = u >> 3;
    uint i = u & 7u;
    uint g = i >> 1;
    uint xbase = 64u * b + 16u * g + 4u * (i & 1u);
#if defined(DOT_LANE)
    uvec4 L0, L1, H0, H1;
    float sx0, sx1;
    {
        vec4 xl[4], xh[4];
        bool f0 = true, f1 = true;
        float m0 = 0.0, m1 = 0.0;
        for (uint w = 0u; w < 4u; ++w) {
            xl[w] = x4[xbase + w];
            xh[w] = x4[xbase + 8u + w];
            f0 = f0 && finite4(xl[w]);
            f1 = f1 && finite4(xh[w]);
            m0 = max(m0, amax4(xl[w]));
            m1 = max(m1, amax4(xh[w]));
        }
        float inv0 = qinv(m0, f0), inv1 = qinv(m1, f1);
        sx0 = qscale(m0, f0);
        sx1 = qscale(m1, f1);
        for (uint w = 0u; w < 4u; ++w) {
            uvec2 a = qsplit(xl[w], inv0), c = qsplit(xh[w], inv1);
            L0[w] = a.x;
            H0[w] = a.y;
            L1[w] = c.x;
            H1[w] = c.y;
        }
    }
#else
    uvec4 L0 = XLO4(xbase >> 2), L1 = XLO4((xbase + 8u) >> 2);
    uvec4 H0 = XHI4(xbase >> 2), H1 = XHI4((xbase + 8u) >> 2);
    float sx0 = XSCALE(8u * b + 2u * g);
    float sx1 = XSCALE(8u * b + 2u * g + 1u);
#endif
    int s0 = 0, s1 = 0;
    for (uint w = 0u; w < 4u; ++w) {
        s0 += 256 * sdot(H0[w], ONES, 0) + sdot(L0[w], ONES, 0);
        s1 += 256 * sdot(H1[w], ONES, 0) + sdot(L1[w], ONES, 0);
    }
    float xsum0 = sx0 * float(s0), xsum1 = sx1 * float(s1);  // sums of (quantized) x
    uint sh = 16u * (g & 1u);
    bool upper = g >= 2u;
    for (uint r = 0u; r < ROWS; ++r) {
        uint blk4 = (rowoff[r] + 144u * b) >> 4;
        uvec4 hd = WQ4(blk4);
        uvec4 q = WQ4(blk4 + 1u + i);
        uint sa = hd.y >> sh;
        uint sb = hd.z >> sh;
        uint sc = hd.w >> sh;
        uint sc0 = upper ? (sc & 0xFu) | ((sa >> 2) & 0x30u) : sa & 63u;
        uint mn0 = upper ? ((sc >> 4) & 0xFu) | ((sb >> 2) & 0x30u) : sb & 63u;
        uint sc1 = upper ? ((sc >> 8) & 0xFu) | ((sa >> 10) & 0x30u) : (sa >> 8) & 63u;
        uint mn1 = upper ? ((sc >> 12) & 0xFu) | ((sb >> 10) & 0x30u) : (sb >> 8) & 63u;
        int hi0 = 0, lo0 = 0, hi1 = 0, lo1 = 0;
        for (uint w = 0u; w < 4u; ++w) {
            uint n0 = q[w] & 0x0F0F0F0Fu;
            uint n1 = (q[w] >> 4) & 0x0F0F0F0Fu;
            hi0 += sudot(H0[w], n0, 0);
            lo0 += sudot(L0[w], n0, 0);
            hi1 += sudot(H1[w], n1, 0);
            lo1 += sudot(L1[w], n1, 0);
        }
        vec2 dm = unpackHalf2x16(hd.x);
        float fs0 = mag(sc0) - TWO23, fs1 = mag(sc1) - TWO23;
        float fm0 = mag(mn0) - TWO23, fm1 = mag(mn1) - TWO23;
        float dot0 = sx0 * float(256 * hi0 + lo0), dot1 = sx1 * float(256 * hi1 + lo1);
        acc[r] += dm.x * fma(fs0, dot0, fs1 * dot1) - dm.y * fma(fm0, xsum0, fm1 * xsum1);
    }

#elif defined(DOT) && defined(QT_Q6_K)
    // unit (b, n, t) as in the float variant; part k's 8 elements lie in x block 8b + 4n + k
    uint b = u >> 3;
    uint n = (u >> 2) & 1u;
    uint t = u & 3u;
    uint xbase = 64u * b + 32u * n + 2u * t;
    uint xl[8], xh[8];  // [2k + w]: part k, elements l = 8t + 4w ..
    float sxk[4];
    int qs[4];
    for (uint kk = 0u; kk < 4u; ++kk) {
#if defined(DOT_LANE)
        vec4 xa = x4[xbase + 8u * kk], xb = x4[xbase + 8u * kk + 1u];
        bool fin = finite4(xa) && finite4(xb);
        float m = max(amax4(xa), amax4(xb));
        float inv = qinv(m, fin);
        sxk[kk] = qscale(m, fin);
        uvec2 qa = qsplit(xa, inv), qb = qsplit(xb, inv);
        xl[2u * kk] = qa.x;
        xh[2u * kk] = qa.y;
        xl[2u * kk + 1u] = qb.x;
        xh[2u * kk + 1u] = qb.y;
#else
        for (uint w = 0u; w < 2u; ++w) {
            xl[2u * kk + w] = XLO(xbase + 8u * kk + w);
            xh[2u * kk + w] = XHIW(xbase + 8u * kk + w);
        }
        sxk[kk] = XSCALE(8u * b + 4u * n + kk);
#endif
        qs[kk] = 256 * (sdot(xh[2u * kk], ONES, 0) + sdot(xh[2u * kk + 1u], ONES, 0))
               + (sdot(xl[2u * kk], ONES, 0) + sdot(xl[2u * kk + 1u], ONES, 0));
    }
    const float CS = TWO23 + 128.0;
    uint ssh = 8u * (t >> 1);
    for (uint r = 0u; r < ROWS; ++r) {
        uint blk = rowoff[r] + 210u * b;
        uvec2 qa = load8(blk + 64u * n + 8u * t);
        uvec2 qb = load8(blk + 64u * n + 32u + 8u * t);
        uvec2 qh = load8(blk + 128u + 32u * n + 8u * t);
        uvec2 sw = (load8(blk + 192u + 8u * n) >> ssh) ^ uvec2(0x00800080u);
        float d = load_half(blk + 208u);
        int hi[4] = int[4](0, 0, 0, 0);
        int lo[4] = int[4](0, 0, 0, 0);
        for (uint w = 0u; w < 2u; ++w) {
            uint A = qa[w], B = qb[w], H = qh[w];
            uint v[4];  // the 6-bit values v = weight + 32 of part k, l = 8t + 4w ..
            v[0] = (A & 0x0F0F0F0Fu) | ((H << 4) & 0x30303030u);
            v[1] = (B & 0x0F0F0F0Fu) | ((H << 2) & 0x30303030u);
            v[2] = ((A >> 4) & 0x0F0F0F0Fu) | (H & 0x30303030u);
            v[3] = ((B >> 4) & 0x0F0F0F0Fu) | ((H >> 2) & 0x30303030u);
            for (uint kk = 0u; kk < 4u; ++kk) {
                hi[kk] += sudot(xh[2u * kk + w], v[kk], 0);
                lo[kk] += sudot(xl[2u * kk + w], v[kk], 0);
            }
        }
        float f[4];
        for (uint kk = 0u; kk < 4u; ++kk) {
            f[kk] = sxk[kk] * float(256 * hi[kk] + lo[kk] - 32 * qs[kk]);
        }
        float s0 = mag(sw.x & 0xFFu) - CS;
        float s1 = mag((sw.x >> 16) & 0xFFu) - CS;
        float s2 = mag(sw.y & 0xFFu) - CS;
        float s3 = mag((sw.y >> 16) & 0xFFu) - CS;
        float part = fma(s3, f[3], fma(s2, f[2], fma(s1, f[1], s0 * f[0])));
        acc[r] = fma(d, part, acc[r]);
    }

#elif defined(QT_Q4_0)
    uint b = u >> 2;
    uint k = u & 3u;
    vec4 xa = x4[8u * b + k];        // elements 4k .. 4k+3 (low nibbles)
    vec4 xb = x4[8u * b + 4u + k];   // elements 16+4k .. 16+4k+3 (high nibbles)
    const float C0 = TWO23 + 8.0, C4 = TWO23 + 128.0, C8 = TWO23 + 2048.0, C12 = TWO23 + 32768.0;
    for (uint r = 0u; r < ROWS; ++r) {
        uint blk = rowoff[r] + 18u * b;
        uint q = load4(blk + 2u + 4u * k);
        float d = load_half(blk);
        uint qs = q >> 16;
        float a0 = (mag(q & 0xFu) - C0) * xa.x;
        float a8 = (mag(q & 0xF00u) - C8) * xa.y;
        float a4 = (mag(q & 0xF0u) - C4) * xb.x;
        float a12 = (mag(q & 0xF000u) - C12) * xb.y;
        a0 = fma(mag(qs & 0xFu) - C0, xa.z, a0);
        a8 = fma(mag(qs & 0xF00u) - C8, xa.w, a8);
        a4 = fma(mag(qs & 0xF0u) - C4, xb.z, a4);
        a12 = fma(mag(qs & 0xF000u) - C12, xb.w, a12);
        float s = fma(a12, 1.0 / 4096.0, fma(a8, 1.0 / 256.0, fma(a4, 1.0 / 16.0, a0)));
        acc[r] = fma(d, s, acc[r]);
    }

#elif defined(QT_Q8_0)
    uint b = u >> 2;
    uint k = u & 3u;
    vec4 xa = x4[8u * b + 2u * k];       // elements 8k .. 8k+3
    vec4 xb = x4[8u * b + 2u * k + 1u];  // elements 8k+4 .. 8k+7
    const float C0 = TWO23 + 128.0, C8 = TWO23 + 32768.0;
    for (uint r = 0u; r < ROWS; ++r) {
        uint blk = rowoff[r] + 34u * b;
        uvec2 q = load8(blk + 2u + 8u * k) ^ uvec2(0x80808080u);  // int8 -> int8 + 128
        float d = load_half(blk);
        uint h0 = q.x >> 16;
        uint h1 = q.y >> 16;
        float a0 = (mag(q.x & 0xFFu) - C0) * xa.x;
        float a8 = (mag(q.x & 0xFF00u) - C8) * xa.y;
        a0 = fma(mag(h0 & 0xFFu) - C0, xa.z, a0);
        a8 = fma(mag(h0 & 0xFF00u) - C8, xa.w, a8);
        a0 = fma(mag(q.y & 0xFFu) - C0, xb.x, a0);
        a8 = fma(mag(q.y & 0xFF00u) - C8, xb.y, a8);
        a0 = fma(mag(h1 & 0xFFu) - C0, xb.z, a0);
        a8 = fma(mag(h1 & 0xFF00u) - C8, xb.w, a8);
        acc[r] = fma(d, fma(a8, 1.0 / 256.0, a0), acc[r]);
    }

#elif defined(QT_Q4_K)
    // unit i of block b: qs bytes 16i .. 16i+15 = group g = i/2, l = 16h .. 16h+15
    uint b = u >> 3;
    uint i = u & 7u;
    uint g = i >> 1;
    uint xbase = 64u * b + 16u * g + 4u * (i & 1u);
    vec4 xl[4];
    vec4 xh[4];
    for (uint w = 0u; w < 4u; ++w) {
        xl[w] = x4[xbase + w];       // elements 64g + 16h + 4w .. (sub-block 2g)
        xh[w] = x4[xbase + 8u + w];  // elements 64g + 32 + 16h + 4w .. (sub-block 2g+1)
    }
    vec4 xs4 = (xl[0] + xl[1]) + (xl[2] + xl[3]);
    vec4 xh4 = (xh[0] + xh[1]) + (xh[2] + xh[3]);
    float xsum_lo = (xs4.x + xs4.y) + (xs4.z + xs4.w);
    float xsum_hi = (xh4.x + xh4.y) + (xh4.z + xh4.w);
    uint sh = 16u * (g & 1u);  // byte (2g) & 3 of the scale words
    bool upper = g >= 2u;
    for (uint r = 0u; r < ROWS; ++r) {
        uint blk4 = (rowoff[r] + 144u * b) >> 4;
        uvec4 hd = WQ4(blk4);
        uvec4 q = WQ4(blk4 + 1u + i);
        uint sa = hd.y >> sh;  // scales[j], scales[j+1]     (j = 2g & 3)
        uint sb = hd.z >> sh;  // scales[j+4], scales[j+5]
        uint sc = hd.w >> sh;  // scales[j+8], scales[j+9]
        uint sc0 = upper ? (sc & 0xFu) | ((sa >> 2) & 0x30u) : sa & 63u;
        uint mn0 = upper ? ((sc >> 4) & 0xFu) | ((sb >> 2) & 0x30u) : sb & 63u;
        uint sc1 = upper ? ((sc >> 8) & 0xFu) | ((sa >> 10) & 0x30u) : (sa >> 8) & 63u;
        uint mn1 = upper ? ((sc >> 12) & 0xFu) | ((sb >> 10) & 0x30u) : (sb >> 8) & 63u;
        float l0 = 0.0, l8 = 0.0, h4 = 0.0, h12 = 0.0;
        for (uint w = 0u; w < 4u; ++w) {
            uint v = q[w];
            uint vs = v >> 16;
            l0 = fma(mag(v & 0xFu) - TWO23, xl[w].x, l0);
            l8 = fma(mag(v & 0xF00u) - TWO23, xl[w].y, l8);
            h4 = fma(mag(v & 0xF0u) - TWO23, xh[w].x, h4);
            h12 = fma(mag(v & 0xF000u) - TWO23, xh[w].y, h12);
            l0 = fma(mag(vs & 0xFu) - TWO23, xl[w].z, l0);
            l8 = fma(mag(vs & 0xF00u) - TWO23, xl[w].w, l8);
            h4 = fma(mag(vs & 0xF0u) - TWO23, xh[w].z, h4);
            h12 = fma(mag(vs & 0xF000u) - TWO23, xh[w].w, h12);
        }
        vec2 dm = unpackHalf2x16(hd.x);
        float dot_lo = fma(l8, 1.0 / 256.0, l0);
        float dot_hi = fma(h12, 1.0 / 4096.0, h4 * (1.0 / 16.0));
        float fs0 = mag(sc0) - TWO23, fs1 = mag(sc1) - TWO23;
        float fm0 = mag(mn0) - TWO23, fm1 = mag(mn1) - TWO23;
        float part = dm.x * fma(fs0, dot_lo, fs1 * dot_hi) - dm.y * fma(fm0, xsum_lo, fm1 * xsum_hi);
        acc[r] += part;
    }

#elif defined(QT_Q6_K)
    // unit (b, n, t): l = 8t .. 8t+7 of half n; part k holds elements 128n + 32k + l
    uint b = u >> 3;
    uint n = (u >> 2) & 1u;
    uint t = u & 3u;
    uint xbase = 64u * b + 32u * n + 2u * t;
    vec4 xv[8];  // xv[2k + w]: part k, elements l = 8t + 4w ..
    for (uint kk = 0u; kk < 4u; ++kk) {
        xv[2u * kk] = x4[xbase + 8u * kk];
        xv[2u * kk + 1u] = x4[xbase + 8u * kk + 1u];
    }
    const float C0 = TWO23 + 32.0, C8 = TWO23 + 8192.0, CS = TWO23 + 128.0;
    uint ssh = 8u * (t >> 1);  // scale index is = l / 16 = t / 2
    for (uint r = 0u; r < ROWS; ++r) {
        uint blk = rowoff[r] + 210u * b;
        uvec2 qa = load8(blk + 64u * n + 8u * t);        // ql[l]
        uvec2 qb = load8(blk + 64u * n + 32u + 8u * t);  // ql[l + 32]
        uvec2 qh = load8(blk + 128u + 32u * n + 8u * t);
        uvec2 sw = (load8(blk + 192u + 8u * n) >> ssh) ^ uvec2(0x00800080u);
        float d = load_half(blk + 208u);
        float p0[4] = float[4](0.0, 0.0, 0.0, 0.0);
        float p8[4] = float[4](0.0, 0.0, 0.0, 0.0);
        for (uint w = 0u; w < 2u; ++w) {
            uint A = qa[w], B = qb[w], H = qh[w];
            uint v[4];
            v[0] = (A & 0x0F0F0F0Fu) | ((H << 4) & 0x30303030u);
            v[1] = (B & 0x0F0F0F0Fu) | ((H << 2) & 0x30303030u);
            v[2] = ((A >> 4) & 0x0F0F0F0Fu) | (H & 0x30303030u);
            v[3] = ((B >> 4) & 0x0F0F0F0Fu) | ((H >> 2) & 0x30303030u);
            for (uint kk = 0u; kk < 4u; ++kk) {
                uint e = v[kk];
                uint es = e >> 16;
                vec4 xx = xv[2u * kk + w];
                p0[kk] = fma(mag(e & 0x3Fu) - C0, xx.x, p0[kk]);
                p8[kk] = fma(mag(e & 0x3F00u) - C8, xx.y, p8[kk]);
                p0[kk] = fma(mag(es & 0x3Fu) - C0, xx.z, p0[kk]);
                p8[kk] = fma(mag(es & 0x3F00u) - C8, xx.w, p8[kk]);
            }
        }
        // int8 scales sc[is + 2k]: bytes 0 and 2 of sw.x (k = 0, 1) and of sw.y (k = 2, 3)
        float s0 = mag(sw.x & 0xFFu) - CS;
        float s1 = mag((sw.x >> 16) & 0xFFu) - CS;
        float s2 = mag(sw.y & 0xFFu) - CS;
        float s3 = mag((sw.y >> 16) & 0xFFu) - CS;
        float part = s0 * fma(p8[0], 1.0 / 256.0, p0[0]);
        part = fma(s1, fma(p8[1], 1.0 / 256.0, p0[1]), part);
        part = fma(s2, fma(p8[2], 1.0 / 256.0, p0[2]), part);
        part = fma(s3, fma(p8[3], 1.0 / 256.0, p0[3]), part);
        acc[r] = fma(d, part, acc[r]);
    }
#endif
}

void main() {
    const uint TEAMS = gl_WorkGroupSize.x / LANES;
    uint lid = gl_LocalInvocationID.x;
    uint team = lid / LANES;
    uint lane = lid % LANES;
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint row0 = (group * TEAMS + team) * ROWS;
    for (uint r = 0u; r < ROWS; ++r) {
        acc[r] = 0.0;
    }
#if defined(DOT)
    XHI = 8u * (pc.n_cols >> 5);
    XSC = 16u * (pc.n_cols >> 5);
#endif

#if defined(STAGED)
    // every invocation stages (and reaches every barrier), whether or not its rows exist
    uint wg_row0 = group * TEAMS * ROWS;
    uint chunks = pc.n_cols / (CHUNK_BLOCKS * BLOCK_ELEMS);  // the policy makes it exact
    uint chunk_units = (CHUNK_BLOCKS * BLOCK_ELEMS) >> UNIT_SHIFT;
    uint row16 = pc.row_bytes >> 4;
    // uvec4 index of tile slot e of chunk 0 (rows past the end repeat the last row)
    uint src[STAGE_LOADS];
    uvec4 reg[STAGE_LOADS];
    for (uint s = 0u; s < STAGE_LOADS; ++s) {
        uint e = min(lid + s * gl_WorkGroupSize.x, TILE16 - 1u);
        uint row = min(wg_row0 + e / CHUNK16, pc.n_rows - 1u);
        src[s] = row * row16 + e % CHUNK16;
        reg[s] = wg4[src[s]];
    }
    for (uint c = 0u; c < chunks; ++c) {
        for (uint s = 0u; s < STAGE_LOADS; ++s) {
            uint e = lid + s * gl_WorkGroupSize.x;
            if (e < TILE16) {
                st4[e] = reg[s];
            }
        }
        barrier();
        if (c + 1u < chunks) {  // the next chunk's loads are in flight while this one is decoded
            for (uint s = 0u; s < STAGE_LOADS; ++s) {
                reg[s] = wg4[src[s] + (c + 1u) * CHUNK16];
            }
        }
        uint first = c * chunk_units;
        for (uint r = 0u; r < ROWS; ++r) {
            // + the block's offset in the row = its offset in the tile (uint arithmetic wraps)
            rowoff[r] = (team * ROWS + r) * (CHUNK16 * 16u) - c * (CHUNK_BLOCKS * BLOCK_BYTES);
        }
        for (uint u = first + lane; u < first + chunk_units; u += LANES) {
            accumulate(u);
        }
        barrier();
    }
#else
    for (uint r = 0u; r < ROWS; ++r) {
        // rows past the end repeat the last row (loads stay in bounds; results are dropped)
        rowoff[r] = min(row0 + r, pc.n_rows - 1u) * pc.row_bytes;
    }
    if (row0 < pc.n_rows) {
#if defined(STREAM_ONLY)
        // probe only: the rows' bytes as consecutive 16-byte loads across the team, no decoding
        // (rows of a multiple of 16 bytes): the read floor of this grid
        uint row16 = pc.row_bytes >> 4;
        for (uint i = lane; i < row16; i += LANES) {
            for (uint r = 0u; r < ROWS; ++r) {
                uvec4 w = ws4[(rowoff[r] >> 4) + i];
                acc[r] += uintBitsToFloat(((w.x ^ w.y) ^ (w.z ^ w.w)) & 0x3F7FFFFFu);
            }
        }
#else
        uint units = pc.n_cols >> UNIT_SHIFT;
        for (uint u = lane; u < units; u += LANES) {
            accumulate(u);
        }
#endif
    }
#endif

    // ---- reduction over the team's lanes (every invocation gets here: barriers stay uniform)
#if defined(USE_SUBGROUP)
    {
        uint S = gl_SubgroupSize;
        uint members = subgroupAdd(1u);  // outside any condition: every invocation takes part
        bool ok = (LANES % S) == 0u && lid == gl_SubgroupID * S + gl_SubgroupInvocationID && members == S;
        uint bad = subgroupMax(ok ? 0u : 1u);
        if (subgroupElect()) {
            sg_bad[gl_SubgroupID] = bad;
        }
        barrier();
        uint any_bad = 0u;
        for (uint s = 0u; s < gl_NumSubgroups; ++s) {
            any_bad |= sg_bad[s];
        }
        if (any_bad == 0u) {  // uniform: every invocation read the same flags
            uint nsub = LANES / S;
            if (nsub == 1u) {
                for (uint r = 0u; r < ROWS; ++r) {
                    float s = subgroupAdd(acc[r]);
                    if (lane == 0u && row0 + r < pc.n_rows) {
                        y[row0 + r] = s;
                    }
                }
            } else {
                uint sub = lane / S;
                for (uint r = 0u; r < ROWS; ++r) {
                    float s = subgroupAdd(acc[r]);
                    if (subgroupElect()) {
                        red[(team * ROWS + r) * nsub + sub] = s;
                    }
                }
                barrier();
                if (lane < ROWS && row0 + lane < pc.n_rows) {
                    float s = 0.0;
                    for (uint j = 0u; j < nsub; ++j) {
                        s += red[(team * ROWS + lane) * nsub + j];
                    }
                    y[row0 + lane] = s;
                }
            }
            return;
        }
    }
#endif
    for (uint r = 0u; r < ROWS; ++r) {
        red[(team * ROWS + r) * LANES + lane] = acc[r];
    }
    barrier();
    for (uint stride = LANES / 2u; stride > 0u; stride >>= 1u) {
        if (lane < stride) {
            for (uint r = 0u; r < ROWS; ++r) {
                uint base = (team * ROWS + r) * LANES + lane;
                red[base] += red[base + stride];
            }
        }
        barrier();
    }
    if (lane < ROWS && row0 + lane < pc.n_rows) {
        y[row0 + lane] = red[(team * ROWS + lane) * LANES];
    }
}
