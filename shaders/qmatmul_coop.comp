#version 450
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : require
#ifdef TIMELINE
#extension GL_ARB_shader_clock : require
#extension GL_EXT_shader_realtime_clock : require
#endif
#ifndef COOP_EMULATE
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
// kbench: requires glslang>=13
// kbench: variant q4_0.khr QT_Q4_0 target=vulkan1.3
// kbench: variant q4_0.emulated QT_Q4_0 COOP_EMULATE target=vulkan1.1
// kbench: variant q8_0.khr QT_Q8_0 target=vulkan1.3
// kbench: variant q8_0.emulated QT_Q8_0 COOP_EMULATE target=vulkan1.1
// kbench: variant q6_k.khr QT_Q6_K target=vulkan1.3
// kbench: variant q6_k.emulated QT_Q6_K COOP_EMULATE target=vulkan1.1
// kbench: variant q4_k.khr QT_Q4_K target=vulkan1.3
// kbench: variant q4_k.emulated QT_Q4_K COOP_EMULATE target=vulkan1.1
//
// quantized_matmul for a batch of NV vectors on cooperative matrices (VK_KHR_cooperative_matrix,
// 16x16x16 fp16 x fp16 -> fp32): Y = W X with W in the packed layout of qmatvec_pack.comp (Q4_0,
// Q8_0, Q6_K, Q4_K) and X prepared by qmatmul_coop_io.comp (variant x) as the B operand.
//
// Exact to fp32 rounding, not to fp16: every weight w = q * d (Q4_0: q - 8 of 4 bits, Q8_0: 8 bits,
// times an 11-bit fp16 scale: at most 19 significant bits) is written to shared memory as two fp16
// numbers, w_hi = fp16(w) and w_lo = w - w_hi (exact: at most 8 bits, and no finer than d's last
// bit, so an fp16 subnormal holds it).  B holds each vector as two fp16 columns the same way (x
// times a power of two per vector that puts max|x| in [2^14, 2^15): 22 of x's 24 bits).  The
// accumulators add (A_hi + A_lo) B in fp32 over the whole row, no per-block scaling: y_v =
// (C[:, v] + C[:, NV + v]) / scale_v.  What is lost against float64 is x's last 2 bits and fp32
// accumulation (NMSE about 1e-13 for uniform data), where fp16 weights or x would give about 1e-7.
// Q6_K's w = d * sc * (q - 32) has up to 24 bits: d * sc (a multiple of d's last bit) is split
// exactly into two halves per 16 weights, and w_lo = (q - 32) ds_lo + what (q - 32) ds_hi left,
// rounded once to fp16 (2^-22 of w).  Q4_K's w = d * sc * q - dmin * m: the matrices take q * d * sc
// (as Q6_K's), and the mins' part, dmin * m times the sum of x over the 32 weights' columns (S,
// from the io shader), is added up per (row, vector) in fp32 by the invocation that decodes the
// pair, and taken off in the epilogue.
//
// A workgroup of NSG subgroups takes BM = 16 NSG rows and one split of the row's blocks of 32
// (gl_WorkGroupID.y; pc.bps blocks each); subgroup s owns rows 16 s .. 16 s + 15 and NT 16x16
// accumulators (columns of B).  Per step of U blocks, the workgroup's invocations load the quants
// and scales of BM x U (row, block) pairs into registers (the next step's loads go out before the
// current step is multiplied), decode them into the A planes of a shared-memory stage (two stages,
// one barrier a step; STAGES 1: one stage, two barriers a step, room for longer steps; DEPTH 2: two
// register sets, so each step's loads go out two steps before it is decoded), and each subgroup
// multiplies its 16 rows: 2 U k-slices of 16, two coopMatMulAdd (hi, lo planes) per slice and column
// tile, B read from global memory (L1/L2), or with BSH from the stage, where the step's B rows were
// put beside A (each invocation loads and stores its share of them with the quants).  ACCS 2 or 4
// gives each tile's products that many accumulators (hi and lo planes apart; 4: even and odd
// k-slices apart too), added once at the end, so that a step's products are not one chain.
// A decoded row holds a block's 32 weights in decoding order (a permutation within the block that
// qmatmul_coop_io.comp's x variant applies to x too: its PERM).  With one split the workgroup
// writes y; with several, a partial sum per split at (split * NV + v) * n_rows + row, added by the
// io shader's sum variant.
//
// CUT_LOADS, CUT_DECODE and CUT_DOTS make the probe's ablated twins (kbench probe qmatvec --cut):
// no weight reads, no decoding, no matrix products; their results are not checked.  TIMELINE makes
// the timeline twin (--cut timeline, kbench/probes/timeline.py): the full kernel, whose results give
// way to a record per workgroup at y[4 w ..] (w = its linear index): the device clock's low word at
// its start and at the end of its steps, the subgroup clock's ticks in between, and its steps.
//
// The emulated variant (COOP_EMULATE) does the cooperative-matrix operations and the decoding in
// plain fp32 code with the same memory layout, so that the staging, edges, splits and epilogue are
// tested on devices without cooperative matrices (tests/test_qmatmul_coop.py).
//
// local_size_x = NSG * subgroup size.  Grid: (ceil(n_rows / BM), splits).

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NSG = 4;  // subgroups per workgroup, 16 rows each
layout(constant_id = 2) const uint U = 2;    // blocks of 32 per step
layout(constant_id = 3) const uint NT = 1;   // 16-column tiles of B: ceil(2 NV / 16)
layout(constant_id = 4) const uint NV = 8;   // vectors
layout(constant_id = 5) const uint BSH = 0;  // 1: each step's slice of B staged in shared memory beside A
layout(constant_id = 6) const uint STAGES = 2;  // 1: one stage, refilled after a second barrier (half the memory)
layout(constant_id = 7) const uint DEPTH = 1;   // steps whose loads are in flight at once (register sets): 1 or 2
layout(constant_id = 8) const uint ACCS = 1;    // accumulators per column tile: 1, 2 (hi and lo planes) or 4 (and even / odd k-slices)

// a pair's quants: QV uvec4 (Q6_K: the unit's low 4 bits, then a uvec4 of its 2 words of high bits,
// qmatvec_pack.comp's unit layout)
#if defined(QT_Q4_0)
const uint QV = 1u;
#else
const uint QV = 2u;
#endif
#if defined(QT_Q4_K)
const uint NMIN = NV;  // per pair: the mins' part of each vector
#else
const uint NMIN = 1u;
#endif

layout(std430, binding = 0) readonly buffer Packed { uvec4 wq[]; };
layout(std430, binding = 1) readonly buffer XB { uvec4 xb[]; };  // B columns, then 1 / scale per vector
layout(std430, binding = 2) writeonly buffer Output { float y[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint bps;  // blocks of 32 per split (a multiple of U)
    uint kp8;  // B's column pitch in uvec4 (8 halves)
} pc;

const uint WG = gl_WorkGroupSize.x;
const uint BM = 16u * NSG;
const uint APITCH = 4u * U + 1u;             // uvec4 per A row of a step (one of padding)
const uint PLANE = BM * APITCH;
const uint BPITCH = APITCH;                  // uvec4 per B column of a step (BSH): as long as an A row
const uint BPLANE = BSH * NT * 16u * BPITCH;  // a step's B columns (BSH)
const uint STAGE = 2u * PLANE + BPLANE;      // hi and lo planes, then B
const uint BL = BSH * (NT * 16u * 4u * U + WG - 1u) / WG;  // B uvec4 per invocation a step
const uint PAIRS = BM * U;                   // (row, block) pairs per step
const uint PL = (PAIRS + WG - 1u) / WG;      // pairs per invocation
const uint C_WORDS = NSG * NT * 64u;         // a 16x16 float tile per subgroup and column tile
const uint MIN_WORDS = NMIN > 1u ? (PAIRS * NMIN + 3u) / 4u : 0u;  // Q4_K: the pairs' mins, after the C tiles
const uint SMEM = STAGES * STAGE > C_WORDS + MIN_WORDS ? STAGES * STAGE : C_WORDS + MIN_WORDS;

shared uvec4 smem[SMEM];

// a register set per step in flight (DEPTH); set k's pair j at k * PL + j
const uint BLS = BL > 0u ? BL : 1u;
uvec4 pq[DEPTH * PL * QV];
uvec4 pbx[DEPTH * BLS];  // BSH: the step's slice of B
uint pd[DEPTH * PL];  // the fp16 scale d; Q6_K: | its unit's two int8 sub-block scales << 16
#if defined(QT_Q4_K)
uint pg[DEPTH * PL];  // sc | m << 8 | nibble << 16
uint pb[DEPTH * PL];  // the pair's unit in its row
float pmin[PL * NV];  // the mins' part: sum over the pair's units of dmin * m * S
#endif

// the scale d of GGUF block `blk` (n_blocks in the matrix, QB uvec4 of quants each)
uint scale_bits(uint blk, uint n_blocks, uint qb) {
#ifdef CUT_LOADS
    return 0x3C00u;  // 1.0
#else
    return (wq[n_blocks * qb + (blk >> 3u)][(blk >> 1u) & 3u] >> (16u * (blk & 1u))) & 0xFFFFu;
#endif
}

#ifdef CUT_LOADS
// probe twin (kbench probe qmatvec --cut loads): quants and scales made from the pair's place, no reads
#define WQ(i) uvec4(0x9E3779B9u * ((i) + 1u), 0x85EBCA6Bu ^ (i), 0xC2B2AE35u + (i), (i) * 0x27D4EB2Fu)
#else
#define WQ(i) wq[i]
#endif

// blocks of 32 (Q6_K: units of 32, an eighth of a block of 256) blk0 .. of rows row0 ..; with BSH,
// also B's rows 32 blk0 .. 32 (blk0 + U) of every column (zeros past n_cols: the io shader's padding)
void fetch(uint set, uint row0, uint blk0, uint blk_end, uint nb, uint lid) {
    [[unroll]] for (uint j = 0u; j < BL; ++j) {
        uint e = lid + j * WG;
        uint col = e / (4u * U);
        pbx[set * BLS + j] = e < NT * 16u * 4u * U ? xb[col * pc.kp8 + 4u * blk0 + e % (4u * U)] : uvec4(0u);
    }
    [[unroll]] for (uint j = 0u; j < PL; ++j) {
        uint p = lid + j * WG;
        uint k = set * PL + j;
        uint r = p / U;
        uint b = blk0 + p % U;
        bool ok = p < PAIRS && row0 + r < pc.n_rows && b < blk_end;
        uint g = ok ? (row0 + r) * nb + b : 0u;  // unit of the matrix
#if defined(QT_Q6_K)
        // unit u of block g / 8: low bits at uvec4 u, high bits in words 2 (u & 1), + 1 of uvec4 8 + u / 2,
        // scales 2 u and 2 u + 1 in half u & 1 of word u / 2 of uvec4 12
        uint blk = g >> 3u;
        uint u = g & 7u;
        uint q0 = 13u * blk;
        uint c = 2u * (u & 1u);
        pq[k * QV] = ok ? WQ(q0 + u) : uvec4(0u);
        pq[k * QV + 1u] = ok ? uvec4(WQ(q0 + 8u + (u >> 1u))[c], WQ(q0 + 8u + (u >> 1u))[c + 1u], 0u, 0u) : uvec4(0u);
        uint sc = ok ? WQ(q0 + 12u)[u >> 1u] : 0u;
        pd[k] = ok ? scale_bits(blk, pc.n_rows * (nb >> 3u), 13u) | (((sc >> (16u * (u & 1u))) & 0xFFFFu) << 16u) : 0u;
#elif defined(QT_Q4_K)
        // sub-block u of block g / 8: quants 2 (u >> 1), + 1 (nibble u & 1), scale and min bytes, d | dmin
        uint blk = g >> 3u;
        uint u = g & 7u;
        uint n_blocks = pc.n_rows * (nb >> 3u);
        [[unroll]] for (uint i = 0u; i < 2u; ++i) {
            pq[k * QV + i] = ok ? WQ(8u * blk + 2u * (u >> 1u) + i) : uvec4(0u);
        }
        uint sm = ok ? WQ(8u * n_blocks + blk)[u >> 1u] >> (8u * (u & 1u)) : 0u;
        pd[k] = ok ? WQ(9u * n_blocks + (blk >> 2u))[blk & 3u] : 0u;
        pg[k] = (sm & 0xFFu) | (((sm >> 16u) & 0xFFu) << 8u) | ((u & 1u) << 16u);
        pb[k] = ok ? b : 0xFFFFFFFFu;
#else
        [[unroll]] for (uint i = 0u; i < QV; ++i) {
            pq[k * QV + i] = ok ? WQ(g * QV + i) : uvec4(0u);
        }
        pd[k] = ok ? scale_bits(g, pc.n_rows * nb, QV) : 0u;
#endif
    }
}

#ifdef COOP_EMULATE
// fp16 bit patterns of w_hi (w truncated to 11 bits; 0 below 2^-14) and w_lo = w - w_hi, both with
// w's sign: exact where w has at most 22 significant bits and none below 2^-24
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

// a pair of weights (q0, q1) times d into the hi and lo planes' words
uvec2 planes2(int q0, int q1, float d) {
    uvec2 a = split16(float(q0) * d);
    uvec2 b = split16(float(q1) * d);
    return uvec2(a.x | (b.x << 16u), a.y | (b.y << 16u));
}

// Q6_K: (q0 - off, q1 - off) times ds
uvec2 planes2k(uint q0, uint q1, int off, float ds) {
    return planes2(int(q0) - off, int(q1) - off, ds);
}
#else
// d * sc split exactly into fp16 halves by fp16 arithmetic alone: hi = d * sc rounded, lo = what the
// rounding left.  (A split through fp32 <-> fp16 conversions lost lo on a GPU: drivers may fold or
// flush such round trips; README, performance round 6.)
void split_scale(float16_t d, float16_t sc, out f16vec2 ds_hi, out f16vec2 ds_lo) {
    precise float16_t hi = d * sc;
    precise float16_t lo = fma(d, sc, -hi);
    ds_hi = f16vec2(hi);
    ds_lo = f16vec2(lo);
}

// Q6_K: as planes2h with d * sc split exactly into (ds_hi, ds_lo); w_lo rounded once
uvec2 planes2k(uint biased, float16_t bias, f16vec2 ds_hi, f16vec2 ds_lo) {
    f16vec2 q = unpackFloat2x16(biased | 0x64006400u) - f16vec2(bias);
    precise f16vec2 hi = q * ds_hi;
    precise f16vec2 lo = fma(q, ds_lo, fma(q, ds_hi, -hi));
    return uvec2(packFloat2x16(hi), packFloat2x16(lo));
}

// the same with fp16 arithmetic: w_hi = q * d rounded, w_lo = fma(q, d, -w_hi) exact; q from its
// biased bits (0x6400 | n is 1024 + n as fp16)
uvec2 planes2h(uint biased, float16_t bias, f16vec2 d) {
    f16vec2 q = unpackFloat2x16(biased | 0x64006400u) - f16vec2(bias);
    precise f16vec2 hi = q * d;  // precise: no fusing or folding of the pair, so lo is what hi left
    precise f16vec2 lo = fma(q, d, -hi);
    return uvec2(packFloat2x16(hi), packFloat2x16(lo));
}
#endif

// decode the registers' pair k (pair j of its set) into row r, block u of A's planes at stage base `at`
void stash_pair(uint k, uint j, uint at, uint r, uint u) {
    uint hi_at = at + r * APITCH + 4u * u;
    uint lo_at = hi_at + PLANE;
    uint w[4u * QV];
    [[unroll]] for (uint i = 0u; i < QV; ++i) {
        w[4u * i] = pq[k * QV + i].x;
        w[4u * i + 1u] = pq[k * QV + i].y;
        w[4u * i + 2u] = pq[k * QV + i].z;
        w[4u * i + 3u] = pq[k * QV + i].w;
    }
    uint hw[16];
    uint lw[16];
#ifdef CUT_DECODE
    // probe twin (--cut decode): the raw quant words into both planes, no decoding
    [[unroll]] for (uint i = 0u; i < 16u; ++i) {
        hw[i] = w[i % (4u * QV)] ^ pd[k];
        lw[i] = w[(i + 1u) % (4u * QV)];
    }
#else
#ifdef COOP_EMULATE
    float d = unpackHalf2x16(pd[k]).x;
#elif !defined(QT_Q6_K) && !defined(QT_Q4_K)
    f16vec2 d = f16vec2(unpackFloat2x16(pd[k]).x);
#endif
#if defined(QT_Q4_K)
    // word i (bytes 4i..4i+3: elements 4i..4i+3 in the nibble at 4 (u & 1)); slots as Q8_0's
    vec2 dd = unpackHalf2x16(pd[k]);
#ifdef COOP_EMULATE
    float dsf = dd.x * float(pg[k] & 0xFFu);
#else
    f16vec2 ds_hi, ds_lo;
    split_scale(unpackFloat2x16(pd[k]).x, float16_t(pg[k] & 0xFFu), ds_hi, ds_lo);
#endif
    uint ls = 4u * (pg[k] >> 16u);
    [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        uint q4 = (w[i] >> ls) & 0x0F0F0F0Fu;
        [[unroll]] for (uint t = 0u; t < 2u; ++t) {
            uint n = (q4 >> (8u * t)) & 0x00FF00FFu;
#ifdef COOP_EMULATE
            uvec2 hl = planes2k(n & 0xFFu, n >> 16u, 0, dsf);
#else
            uvec2 hl = planes2k(n, float16_t(1024.0), ds_hi, ds_lo);
#endif
            hw[2u * i + t] = hl.x;
            lw[2u * i + t] = hl.y;
        }
    }
    if (pb[k] != 0xFFFFFFFFu) {  // the mins' part: dmin * m * S[v][unit]
        float dm = dd.y * float((pg[k] >> 8u) & 0xFFu);
        uint sums = 4u * (2u * NT * 8u * pc.kp8 + 4u * NT);  // float index of S
        [[unroll]] for (uint v = 0u; v < NV; ++v) {
            uint f = sums + v * (pc.kp8 >> 2u) + pb[k];
            pmin[j * NV + v] = fma(dm, uintBitsToFloat(xb[f >> 2u][f & 3u]), pmin[j * NV + v]);
        }
    }
#elif defined(QT_Q6_K)
    // word i (elements 4i..4i+3): low bits in nibble i >> 2 of word i & 3, high bits at 2 (i >> 1) of
    // word 4 + (i & 1) (qmatvec_pack.comp's unit layout); slots as Q8_0's; elements 0..15 take the
    // first sub-block scale, 16..31 the second
    [[unroll]] for (uint half_ = 0u; half_ < 2u; ++half_) {
#ifdef COOP_EMULATE
        float ds = unpackHalf2x16(pd[k]).x * float(bitfieldExtract(int(pd[k]), 16 + 8 * int(half_), 8));
#else
        f16vec2 ds_hi, ds_lo;
        split_scale(unpackFloat2x16(pd[k]).x, float16_t(bitfieldExtract(int(pd[k]), 16 + 8 * int(half_), 8)),
                    ds_hi, ds_lo);
#endif
        [[unroll]] for (uint i = 4u * half_; i < 4u * half_ + 4u; ++i) {
            uint q6 = ((w[i & 3u] >> (4u * (i >> 2u))) & 0x0F0F0F0Fu)
                    | (((w[4u + (i & 1u)] >> (2u * (i >> 1u))) & 0x03030303u) << 4u);
            [[unroll]] for (uint t = 0u; t < 2u; ++t) {
                uint n = (q6 >> (8u * t)) & 0x00FF00FFu;
#ifdef COOP_EMULATE
                uvec2 hl = planes2k(n & 0xFFu, n >> 16u, 32, ds);
#else
                uvec2 hl = planes2k(n, float16_t(1056.0), ds_hi, ds_lo);
#endif
                hw[2u * i + t] = hl.x;
                lw[2u * i + t] = hl.y;
            }
        }
    }
#elif defined(QT_Q4_0)
    // word i (bytes 4i..4i+3: elements 4i..4i+3 low nibbles, 16+4i.. high): slots 8i..8i+7 hold
    // elements 4i, 4i+2, 4i+1, 4i+3, 16+4i, 16+4i+2, 16+4i+1, 16+4i+3
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        [[unroll]] for (uint t = 0u; t < 4u; ++t) {
            uint n = (w[i] >> (8u * (t & 1u) + 4u * (t >> 1u))) & 0x000F000Fu;
#ifdef COOP_EMULATE
            uvec2 hl = planes2(int(n & 0xFFu) - 8, int(n >> 16u) - 8, d);
#else
            uvec2 hl = planes2h(n, float16_t(1032.0), d);
#endif
            hw[4u * i + t] = hl.x;
            lw[4u * i + t] = hl.y;
        }
    }
#else
    // word i (elements 4i..4i+3 as signed bytes): slots 4i..4i+3 hold 4i, 4i+2, 4i+1, 4i+3
    [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        [[unroll]] for (uint t = 0u; t < 2u; ++t) {
            uint n = ((w[i] ^ 0x80808080u) >> (8u * t)) & 0x00FF00FFu;
#ifdef COOP_EMULATE
            uvec2 hl = planes2(int(n & 0xFFu) - 128, int(n >> 16u) - 128, d);
#else
            uvec2 hl = planes2h(n, float16_t(1152.0), d);
#endif
            hw[2u * i + t] = hl.x;
            lw[2u * i + t] = hl.y;
        }
    }
#endif
#endif  // CUT_DECODE
    [[unroll]] for (uint i = 0u; i < 4u; ++i) {
        smem[hi_at + i] = uvec4(hw[4u * i], hw[4u * i + 1u], hw[4u * i + 2u], hw[4u * i + 3u]);
        smem[lo_at + i] = uvec4(lw[4u * i], lw[4u * i + 1u], lw[4u * i + 2u], lw[4u * i + 3u]);
    }
}

void stash(uint set, uint stage, uint lid) {
    [[unroll]] for (uint j = 0u; j < BL; ++j) {
        uint e = lid + j * WG;
        if (e < NT * 16u * 4u * U) {
            smem[stage * STAGE + 2u * PLANE + (e / (4u * U)) * BPITCH + e % (4u * U)] = pbx[set * BLS + j];
        }
    }
    [[unroll]] for (uint j = 0u; j < PL; ++j) {
        uint p = lid + j * WG;
        if (p < PAIRS) {
            stash_pair(set * PL + j, j, stage * STAGE, p / U, p % U);
        }
    }
}

#ifdef COOP_EMULATE
// an accumulator: this invocation's elements lane, lane + subgroup size, ... of the 16x16 tile
struct Acc { float v[32]; };
#define FragA uint
#define FragB uint

float smem_half(uint at, uint h) {
    vec2 pair = unpackHalf2x16(smem[at + (h >> 3u)][(h >> 1u) & 3u]);
    return (h & 1u) != 0u ? pair.y : pair.x;
}

float xb_half(uint at, uint h) {
    vec2 pair = unpackHalf2x16(xb[at + (h >> 3u)][(h >> 1u) & 3u]);
    return (h & 1u) != 0u ? pair.y : pair.x;
}

Acc acc_zero() {
    Acc z;
    for (uint j = 0u; j < 32u; ++j) {
        z.v[j] = 0.0;
    }
    return z;
}

// A: 16 rows of APITCH uvec4 from smem at fa; B: 16 columns of pc.kp8 uvec4 from xb at fb (BSH:
// of BPITCH uvec4 from smem)
Acc emu_muladd(uint fa, uint fb, Acc c) {
    uint lane = gl_SubgroupInvocationID;
    for (uint j = 0u; j * gl_SubgroupSize < 256u; ++j) {
        uint e = lane + j * gl_SubgroupSize;
        uint r = e >> 4u;
        uint col = e & 15u;
        float sum = c.v[j];
        for (uint kk = 0u; kk < 16u; ++kk) {
            float b = BSH == 1u ? smem_half(fb + col * BPITCH, kk) : xb_half(fb + col * pc.kp8, kk);
            sum = fma(smem_half(fa + r * APITCH, kk), b, sum);
        }
        c.v[j] = sum;
    }
    return c;
}

Acc emu_add(Acc a, Acc b) {
    for (uint j = 0u; j < 32u; ++j) {
        a.v[j] += b.v[j];
    }
    return a;
}

void emu_store_shared(Acc a, uint at) {
    uint lane = gl_SubgroupInvocationID;
    for (uint j = 0u; j * gl_SubgroupSize < 256u; ++j) {
        uint e = lane + j * gl_SubgroupSize;
        smem[at + (e >> 2u)][e & 3u] = floatBitsToUint(a.v[j]);
    }
}
#define ACC_T Acc
#define ACC_ZERO acc_zero()
#define LOAD_A(f, at) f = (at)
#define LOAD_B(f, at) f = (at)
#define LOAD_B_SH(f, at) f = (at)
#define MULADD(x, y, z) emu_muladd(x, y, z)
#define ACC_ADD(x, y) emu_add(x, y)
#define STORE_SHARED(a, at) emu_store_shared(a, at)
#else
#define ACC_T coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define FragA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FragB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define ACC_ZERO ACC_T(0.0)
#define LOAD_A(f, at) coopMatLoad(f, smem, at, APITCH, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_B(f, at) coopMatLoad(f, xb, at, pc.kp8, gl_CooperativeMatrixLayoutColumnMajor)
#define LOAD_B_SH(f, at) coopMatLoad(f, smem, at, BPITCH, gl_CooperativeMatrixLayoutColumnMajor)
#define MULADD(x, y, z) coopMatMulAdd(x, y, z)
#define ACC_ADD(x, y) ((x) + (y))
#define STORE_SHARED(a, at) coopMatStore(a, smem, at, 4u, gl_CooperativeMatrixLayoutRowMajor)
#endif

// the accumulator of column tile t taking plane p's products of k-slice kk: ACCS independent chains
// per tile, so that consecutive products need not wait for each other
#define ACC_AT(t, p, kk) ((t) * ACCS + (ACCS > 1u ? (p) : 0u) + (ACCS == 4u ? 2u * ((kk) & 1u) : 0u))

// step S of a workgroup's split: multiply the stage (MULTIPLY), with step S + DEPTH's loads into register
// set FSET going out first and step S + 1's set SSET decoded into the next stage after; barriers are
// in uniform control flow (S and steps are the workgroup's)
#ifndef CUT_DOTS
#define MULTIPLY(STAGE_, S) { \
    uint abase = (STAGE_) * STAGE + sg * 16u * APITCH; \
    uint bbase = (STAGE_) * STAGE + 2u * PLANE; \
    uint k0 = 32u * (blk0 + (S) * U); \
    [[unroll]] for (uint kk = 0u; kk < 2u * U; ++kk) { \
        LOAD_A(fh, abase + 2u * kk); \
        LOAD_A(fl, abase + PLANE + 2u * kk); \
        [[unroll]] for (uint t = 0u; t < NT; ++t) { \
            if (BSH == 1u) { \
                LOAD_B_SH(fb, bbase + 16u * t * BPITCH + 2u * kk); \
            } else { \
                LOAD_B(fb, 16u * t * pc.kp8 + ((k0 + 16u * kk) >> 3u)); \
            } \
            acc[ACC_AT(t, 0u, kk)] = MULADD(fh, fb, acc[ACC_AT(t, 0u, kk)]); \
            acc[ACC_AT(t, 1u, kk)] = MULADD(fl, fb, acc[ACC_AT(t, 1u, kk)]); \
        } \
    } }
#else  // probe twin (--cut dots): no matrix loads or products; a read of the stage keeps its stores live
#define MULTIPLY(STAGE_, S) { \
    uint abase = (STAGE_) * STAGE + sg * 16u * APITCH; \
    uint bbase = (STAGE_) * STAGE + 2u * PLANE; \
    sink += smem[abase + lid % (16u * APITCH)].x + (BSH == 1u ? smem[bbase + lid % max(BPLANE, 1u)].y : 0u); }
#endif
#define STEP(S, FSET, SSET) { \
    uint stage_ = STAGES == 2u ? (S) & 1u : 0u; \
    if ((S) + DEPTH < steps) { \
        fetch(FSET, row0, blk0 + ((S) + DEPTH) * U, blk_end, nb, lid); \
    } \
    MULTIPLY(stage_, S) \
    if ((S) + 1u < steps) { \
        if (STAGES == 1u) { \
            barrier(); \
        } \
        stash(SSET, STAGES == 2u ? stage_ ^ 1u : 0u, lid); \
    } \
    barrier(); }

void main() {
#ifdef TIMELINE
    uvec2 t_start = clockRealtime2x32EXT();
    uvec2 c_start = clock2x32ARB();
#endif
    uint lid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint row0 = gl_WorkGroupID.x * BM;
    uint nb = pc.n_cols >> 5u;
    uint blk0 = gl_WorkGroupID.y * pc.bps;
    uint blk_end = min(nb, blk0 + pc.bps);
    uint steps = blk_end > blk0 ? (blk_end - blk0 + U - 1u) / U : 0u;

    ACC_T acc[NT * ACCS];
    [[unroll]] for (uint t = 0u; t < NT * ACCS; ++t) {
        acc[t] = ACC_ZERO;
    }
#if defined(QT_Q4_K)
    [[unroll]] for (uint i = 0u; i < PL * NV; ++i) {
        pmin[i] = 0.0;
    }
#endif
    FragA fh;
    FragA fl;
    FragB fb;
#ifdef CUT_DOTS
    uint sink = 0u;
#endif

    if (steps > 0u) {
        fetch(0u, row0, blk0, blk_end, nb, lid);
        stash(0u, 0u, lid);
    }
    if (DEPTH == 2u && steps > 1u) {
        fetch(1u % DEPTH, row0, blk0 + U, blk_end, nb, lid);
    }
    barrier();
    // step s: set s % DEPTH is free (its step went into the stage), so it takes step s + DEPTH's loads
    // before the stage is multiplied; then step s + 1's set goes into the next stage.  Unrolled by
    // DEPTH so that every register set is named by a constant.
    for (uint s = 0u; s < steps; s += DEPTH) {
        STEP(s, 0u, 1u % DEPTH)
        if (DEPTH == 2u && s + 1u < steps) {
            STEP(s + 1u, 1u % DEPTH, 0u)
        }
    }
#ifdef TIMELINE
    if (lid == 0u) {
        uvec2 t_end = clockRealtime2x32EXT();
        uvec2 c_end = clock2x32ARB();
        uint w = 4u * (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x);
        y[w] = uintBitsToFloat(t_start.x);
        y[w + 1u] = uintBitsToFloat(t_end.x);
        y[w + 2u] = uintBitsToFloat(c_end.x - c_start.x);
        y[w + 3u] = uintBitsToFloat(steps);
    }
#endif
    // the loop ends on a barrier: smem is free for the accumulators
    uint at = sg * NT * 64u;
    [[unroll]] for (uint t = 0u; t < NT; ++t) {
        [[unroll]] for (uint a = 1u; a < ACCS; ++a) {
            acc[t * ACCS] = ACC_ADD(acc[t * ACCS], acc[t * ACCS + a]);
        }
        STORE_SHARED(acc[t * ACCS], at + 64u * t);
    }
#if defined(QT_Q4_K)
    // each pair's mins' parts after the C tiles (pair p of row p / U), for the rows' epilogue
    [[unroll]] for (uint j = 0u; j < PL; ++j) {
        uint p = lid + j * WG;
        if (p < PAIRS) {
            [[unroll]] for (uint v = 0u; v < NV; ++v) {
                uint f = 4u * C_WORDS + p * NV + v;
                smem[f >> 2u][f & 3u] = floatBitsToUint(pmin[j * NV + v]);
            }
        }
    }
    barrier();
#else
    subgroupMemoryBarrierShared();
    subgroupBarrier();
#endif
    uint scales = 2u * NT * 8u * pc.kp8;  // uvec4 index of 1 / scale per vector
    uint lane = gl_SubgroupInvocationID;
    uint out0 = gl_WorkGroupID.y * NV * pc.n_rows;
    for (uint e = lane; e < 16u * NV; e += gl_SubgroupSize) {
        uint r = e & 15u;
        uint v = e >> 4u;
        uint row = row0 + 16u * sg + r;
        if (row < pc.n_rows) {
            uint ch = v;
            uint cl = NV + v;
            float c_hi = uintBitsToFloat(smem[at + 64u * (ch >> 4u) + 4u * r + ((ch & 15u) >> 2u)][ch & 3u]);
            float c_lo = uintBitsToFloat(smem[at + 64u * (cl >> 4u) + 4u * r + ((cl & 15u) >> 2u)][cl & 3u]);
            float inv = uintBitsToFloat(xb[scales + (v >> 2u)][v & 3u]);
            float yv = (c_hi + c_lo) * inv;
#if defined(QT_Q4_K)
            for (uint u = 0u; u < U; ++u) {
                uint f = 4u * C_WORDS + ((16u * sg + r) * U + u) * NV + v;
                yv -= uintBitsToFloat(smem[f >> 2u][f & 3u]);
            }
#endif
#ifdef CUT_DOTS
            yv += sink == 0x7FFFFFFFu ? 1.0 : 0.0;
#endif
#ifdef TIMELINE
            if (floatBitsToUint(yv) == 0x7F7FFFFEu) {  // (never) keeps the products live, records intact
                y[out0 + v * pc.n_rows + row] = yv;
            }
#else
            y[out0 + v * pc.n_rows + row] = yv;
#endif
        }
    }
}
