#version 450
// Quantized matrix-vector product: y[r] = sum_{c < n_cols} dequant(W)[r, c] * x[c].
//
// W is the raw GGUF block data, bound as uint words so that no 8/16-bit storage feature is
// needed: halves are decoded with unpackHalf2x16, bf16 and integer fields with shifts.  Row r
// starts at byte r * row_bytes.  Blocks are only 2-byte aligned in general (18, 22, 34, 210
// bytes), so multi-byte fields are assembled from the two words they straddle.
//
// A workgroup computes ROWS consecutive rows.  For block formats the row is cut into units:
// one 32-element block of Q4_0..Q8_0 (read as the few aligned words that hold it), or 64
// elements of a K block chosen so that every weight byte of the unit is read once (Q4_K/Q5_K:
// one 64-element group, whose two sub-blocks share the nibbles of the same 32 bytes; Q6_K: the
// two 32-element parts that share the same ql and qh bytes, 64 elements apart).  Invocations
// take units in turn, decode them in registers and multiply with the matching inputs, which
// are loaded once per unit and reused for all ROWS rows.  For F32, F16 and BF16 a unit is one
// element.  The per-invocation sums are then added across the
// workgroup: with subgroup arithmetic (variant *.subgroup) or by a tree in shared memory
// (variant *.shared, any device; local size must be a power of two).
//
// kbench: variant f32.subgroup QT_F32 USE_SUBGROUP target=vulkan1.1
// kbench: variant f32.shared QT_F32
// kbench: variant f16.subgroup QT_F16 USE_SUBGROUP target=vulkan1.1
// kbench: variant f16.shared QT_F16
// kbench: variant bf16.subgroup QT_BF16 USE_SUBGROUP target=vulkan1.1
// kbench: variant bf16.shared QT_BF16
// kbench: variant q4_0.subgroup QT_Q4_0 USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_0.shared QT_Q4_0
// kbench: variant q4_1.subgroup QT_Q4_1 USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_1.shared QT_Q4_1
// kbench: variant q5_0.subgroup QT_Q5_0 USE_SUBGROUP target=vulkan1.1
// kbench: variant q5_0.shared QT_Q5_0
// kbench: variant q5_1.subgroup QT_Q5_1 USE_SUBGROUP target=vulkan1.1
// kbench: variant q5_1.shared QT_Q5_1
// kbench: variant q8_0.subgroup QT_Q8_0 USE_SUBGROUP target=vulkan1.1
// kbench: variant q8_0.shared QT_Q8_0
// kbench: variant q4_k.subgroup QT_Q4_K USE_SUBGROUP target=vulkan1.1
// kbench: variant q4_k.shared QT_Q4_K
// kbench: variant q5_k.subgroup QT_Q5_K USE_SUBGROUP target=vulkan1.1
// kbench: variant q5_k.shared QT_Q5_K
// kbench: variant q6_k.subgroup QT_Q6_K USE_SUBGROUP target=vulkan1.1
// kbench: variant q6_k.shared QT_Q6_K

#if defined(USE_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 1;

#if defined(QT_F32) || defined(QT_F16) || defined(QT_BF16)
#define ELEMENT_UNITS 1
#elif defined(QT_Q4_K) || defined(QT_Q5_K) || defined(QT_Q6_K)
#define K_FORMAT 1
#endif

layout(std430, binding = 0) readonly buffer Weights { uint wq[]; };
#if defined(ELEMENT_UNITS)
layout(std430, binding = 1) readonly buffer Input { float x[]; };
#else
layout(std430, binding = 1) readonly buffer Input { vec4 x4[]; };
#endif
layout(std430, binding = 2) writeonly buffer Output { float y[]; };

layout(push_constant) uniform Push {
    uint n_rows;
    uint n_cols;
    uint row_bytes;
} pc;

// one slot per invocation and row (the subgroup variant uses one per subgroup and row)
shared float red[gl_WorkGroupSize.x * ROWS];

// ---- raw byte access -------------------------------------------------------------------------

uint load_u8(uint off) {
    return (wq[off >> 2] >> ((off & 3u) * 8u)) & 0xFFu;
}

// 16-bit field at an even byte offset.
uint load_u16(uint off) {
    return (wq[off >> 2] >> ((off & 2u) * 8u)) & 0xFFFFu;
}

// 32-bit field at any byte offset.
uint load_u32(uint off) {
    uint word = off >> 2;
    uint shift = (off & 3u) * 8u;
    uint lo = wq[word];
    if (shift == 0u) {
        return lo;
    }
    return (lo >> shift) | (wq[word + 1u] << (32u - shift));
}

float load_half(uint off) {
    return unpackHalf2x16(load_u16(off)).x;
}

float half_lo(uint w) {
    return unpackHalf2x16(w).x;
}

float half_hi(uint w) {
    return unpackHalf2x16(w).y;
}

// Byte b (0..3) of a word, as an unsigned value.
uint byte_of(uint w, uint b) {
    return (w >> (8u * b)) & 0xFFu;
}

#if !defined(ELEMENT_UNITS)

#if defined(K_FORMAT)
const uint UNIT_ELEMS = 64u;
const uint UNITS_PER_BLOCK = 4u;
#else
const uint UNIT_ELEMS = 32u;
const uint UNITS_PER_BLOCK = 1u;
#endif

#if defined(QT_Q4_0)
const uint BLOCK_BYTES = 18u;
#elif defined(QT_Q4_1)
const uint BLOCK_BYTES = 20u;
#elif defined(QT_Q5_0)
const uint BLOCK_BYTES = 22u;
#elif defined(QT_Q5_1)
const uint BLOCK_BYTES = 24u;
#elif defined(QT_Q8_0)
const uint BLOCK_BYTES = 34u;
#elif defined(QT_Q4_K)
const uint BLOCK_BYTES = 144u;
#elif defined(QT_Q5_K)
const uint BLOCK_BYTES = 176u;
#elif defined(QT_Q6_K)
const uint BLOCK_BYTES = 210u;
#endif

// Element offsets (within the block) of the two 32-element halves of unit `sub`.
uint unit_first(uint sub) {
#if defined(QT_Q6_K)
    return 128u * (sub >> 1) + 32u * (sub & 1u);
#else
    return UNIT_ELEMS * sub;
#endif
}

uint unit_second(uint sub) {
#if defined(QT_Q6_K)
    return unit_first(sub) + 64u;
#else
    return UNIT_ELEMS * sub + 32u;
#endif
}

#if !defined(K_FORMAT)
// The block's bytes as aligned words: bw[i] holds block bytes 4i..4i+3.  Blocks are 2-byte
// aligned, so the words are put together from the (at most BW + 1) words the block touches;
// the last of those is read only when the block really reaches into it.
const uint BW = (BLOCK_BYTES + 3u) / 4u;
uint bw[BW + 1u];

void load_block(uint off) {
    uint base = off >> 2;
    uint shift = (off & 3u) * 8u;
    uint last = (off + BLOCK_BYTES - 1u) >> 2;
    uint raw[BW + 1u];
    for (uint i = 0u; i < BW + 1u; ++i) {
        raw[i] = (base + i <= last) ? wq[base + i] : 0u;
    }
    for (uint i = 0u; i < BW; ++i) {
        bw[i] = shift == 0u ? raw[i] : (raw[i] >> shift) | (raw[i + 1u] << (32u - shift));
    }
    bw[BW] = 0u;
}

// 32 bits of the block starting at byte 2 + 4k (the quants after a leading half).
uint after_half(uint k) {
    return (bw[k] >> 16) | (bw[k + 1u] << 16);
}
#endif

#if defined(QT_Q4_K) || defined(QT_Q5_K)
// 6-bit scale and min of sub-block j from the 12 packed bytes at `off` (4-byte aligned).
void scale_min_k4(uint off, uint j, out float sc, out float mn) {
    if (j < 4u) {
        sc = float(load_u8(off + j) & 63u);
        mn = float(load_u8(off + j + 4u) & 63u);
    } else {
        uint packed = load_u8(off + j + 4u);
        sc = float((packed & 0xFu) | ((load_u8(off + j - 4u) >> 6) << 4));
        mn = float((packed >> 4) | ((load_u8(off + j) >> 6) << 4));
    }
}
#endif

// blk: byte offset of the block; sub: unit index inside the block; xs: the unit's inputs
// (xs[0..31] at unit_first(sub), xs[32..63] at unit_second(sub) for the K formats).
float unit_dot(uint blk, uint sub, float xs[UNIT_ELEMS]) {
#if defined(QT_Q4_0) || defined(QT_Q4_1) || defined(QT_Q5_0) || defined(QT_Q5_1) || defined(QT_Q8_0)
    load_block(blk);
#endif
#if defined(QT_Q4_0)
    float acc = 0.0;
    for (uint k = 0u; k < 4u; ++k) {
        uint w = after_half(k);
        for (uint b = 0u; b < 4u; ++b) {
            uint byte = byte_of(w, b);
            acc = fma(float(byte & 0xFu) - 8.0, xs[4u * k + b], acc);
            acc = fma(float(byte >> 4) - 8.0, xs[4u * k + b + 16u], acc);
        }
    }
    return half_lo(bw[0]) * acc;

#elif defined(QT_Q4_1)
    float acc = 0.0;
    float xsum = 0.0;
    for (uint k = 0u; k < 4u; ++k) {
        uint w = bw[1u + k];
        for (uint b = 0u; b < 4u; ++b) {
            uint byte = byte_of(w, b);
            acc = fma(float(byte & 0xFu), xs[4u * k + b], acc);
            acc = fma(float(byte >> 4), xs[4u * k + b + 16u], acc);
            xsum += xs[4u * k + b] + xs[4u * k + b + 16u];
        }
    }
    return half_lo(bw[0]) * acc + half_hi(bw[0]) * xsum;

#elif defined(QT_Q5_0)
    uint qh = after_half(0u);
    float acc = 0.0;
    for (uint k = 0u; k < 4u; ++k) {
        uint w = after_half(k + 1u);
        for (uint b = 0u; b < 4u; ++b) {
            uint byte = byte_of(w, b);
            uint j = 4u * k + b;
            uint lo = (byte & 0xFu) | (((qh >> j) & 1u) << 4);
            uint hi = (byte >> 4) | (((qh >> (j + 16u)) & 1u) << 4);
            acc = fma(float(lo) - 16.0, xs[j], acc);
            acc = fma(float(hi) - 16.0, xs[j + 16u], acc);
        }
    }
    return half_lo(bw[0]) * acc;

#elif defined(QT_Q5_1)
    uint qh = bw[1];
    float acc = 0.0;
    float xsum = 0.0;
    for (uint k = 0u; k < 4u; ++k) {
        uint w = bw[2u + k];
        for (uint b = 0u; b < 4u; ++b) {
            uint byte = byte_of(w, b);
            uint j = 4u * k + b;
            uint lo = (byte & 0xFu) | (((qh >> j) & 1u) << 4);
            uint hi = (byte >> 4) | (((qh >> (j + 16u)) & 1u) << 4);
            acc = fma(float(lo), xs[j], acc);
            acc = fma(float(hi), xs[j + 16u], acc);
            xsum += xs[j] + xs[j + 16u];
        }
    }
    return half_lo(bw[0]) * acc + half_hi(bw[0]) * xsum;

#elif defined(QT_Q8_0)
    float acc = 0.0;
    for (uint k = 0u; k < 8u; ++k) {
        int w = int(after_half(k));
        for (uint b = 0u; b < 4u; ++b) {
            acc = fma(float(bitfieldExtract(w, int(8u * b), 8)), xs[4u * k + b], acc);
        }
    }
    return half_lo(bw[0]) * acc;

#elif defined(QT_Q4_K) || defined(QT_Q5_K)
    // unit = 64-element group g: sub-block 2g from the low nibbles, 2g+1 from the high ones
    uint g = sub;
    float sc0, mn0, sc1, mn1;
    scale_min_k4(blk + 4u, 2u * g, sc0, mn0);
    scale_min_k4(blk + 4u, 2u * g + 1u, sc1, mn1);
#if defined(QT_Q4_K)
    uint qs_word = (blk + 16u + 32u * g) >> 2;
#else
    uint qh_word = (blk + 16u) >> 2;
    uint qs_word = (blk + 48u + 32u * g) >> 2;
#endif
    float acc0 = 0.0, acc1 = 0.0, xsum0 = 0.0, xsum1 = 0.0;
    for (uint k = 0u; k < 8u; ++k) {
        uint w = wq[qs_word + k];
#if defined(QT_Q5_K)
        uint h = wq[qh_word + k];
#endif
        for (uint b = 0u; b < 4u; ++b) {
            uint j = 4u * k + b;
            uint byte = byte_of(w, b);
            uint q0 = byte & 0xFu;
            uint q1 = byte >> 4;
#if defined(QT_Q5_K)
            uint hb = byte_of(h, b);
            q0 |= ((hb >> (2u * g)) & 1u) << 4;
            q1 |= ((hb >> (2u * g + 1u)) & 1u) << 4;
#endif
            acc0 = fma(float(q0), xs[j], acc0);
            acc1 = fma(float(q1), xs[j + 32u], acc1);
            xsum0 += xs[j];
            xsum1 += xs[j + 32u];
        }
    }
    uint dd = wq[blk >> 2];
    return half_lo(dd) * (sc0 * acc0 + sc1 * acc1) - half_hi(dd) * (mn0 * xsum0 + mn1 * xsum1);

#elif defined(QT_Q6_K)
    // unit = parts p and p+2 of half n: the low and high nibbles of the same 32 ql bytes, and
    // bit pairs (2p, 2p+1) and (2p+4, 2p+5) of the same 32 qh bytes
    uint n = sub >> 1;
    uint p = sub & 1u;
    uint ql_off = blk + 64u * n + 32u * p;
    uint qh_off = blk + 128u + 32u * n;
    uint qh_shift = 2u * p;
    float a00 = 0.0, a01 = 0.0, a10 = 0.0, a11 = 0.0;  // a<part><l >= 16>
    for (uint k = 0u; k < 8u; ++k) {
        uint wl = load_u32(ql_off + 4u * k);
        uint wh = load_u32(qh_off + 4u * k);
        for (uint b = 0u; b < 4u; ++b) {
            uint j = 4u * k + b;
            uint lb = byte_of(wl, b);
            uint hb = byte_of(wh, b) >> qh_shift;
            float q0 = float((lb & 0xFu) | ((hb & 3u) << 4)) - 32.0;
            float q1 = float((lb >> 4) | (((hb >> 4) & 3u) << 4)) - 32.0;
            if (j < 16u) {
                a00 = fma(q0, xs[j], a00);
                a10 = fma(q1, xs[j + 32u], a10);
            } else {
                a01 = fma(q0, xs[j], a01);
                a11 = fma(q1, xs[j + 32u], a11);
            }
        }
    }
    uint sc_off = blk + 192u + 8u * n + 2u * p;
    float s00 = float(bitfieldExtract(int(load_u8(sc_off)), 0, 8));
    float s01 = float(bitfieldExtract(int(load_u8(sc_off + 1u)), 0, 8));
    float s10 = float(bitfieldExtract(int(load_u8(sc_off + 4u)), 0, 8));
    float s11 = float(bitfieldExtract(int(load_u8(sc_off + 5u)), 0, 8));
    return load_half(blk + 208u) * (s00 * a00 + s01 * a01 + s10 * a10 + s11 * a11);
#endif
}
#endif  // !ELEMENT_UNITS

// ---- main ------------------------------------------------------------------------------------

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint row0 = group * ROWS;

    float acc[ROWS];
    for (uint r = 0u; r < ROWS; ++r) {
        acc[r] = 0.0;
    }

    if (row0 < pc.n_rows) {
        uint rows_here = min(ROWS, pc.n_rows - row0);
#if defined(QT_F16) || defined(QT_BF16)
        if ((pc.n_cols & 1u) == 0u) {
            // even rows are word aligned: two halves per word, one word per invocation step
            uint n_words = pc.n_cols >> 1;
            for (uint c2 = lid; c2 < n_words; c2 += gl_WorkGroupSize.x) {
                vec2 xv = vec2(x[2u * c2], x[2u * c2 + 1u]);
                for (uint r = 0u; r < rows_here; ++r) {
                    uint w = wq[(((row0 + r) * pc.row_bytes) >> 2) + c2];
#if defined(QT_F16)
                    vec2 wv = unpackHalf2x16(w);
#else
                    vec2 wv = vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xFFFF0000u));
#endif
                    acc[r] = fma(wv.x, xv.x, fma(wv.y, xv.y, acc[r]));
                }
            }
        } else
#endif
#if defined(ELEMENT_UNITS)
        for (uint c = lid; c < pc.n_cols; c += gl_WorkGroupSize.x) {
            float xv = x[c];
            for (uint r = 0u; r < rows_here; ++r) {
                uint row_off = (row0 + r) * pc.row_bytes;
#if defined(QT_F32)
                float wv = uintBitsToFloat(wq[(row_off >> 2) + c]);
#elif defined(QT_F16)
                float wv = load_half(row_off + 2u * c);
#else
                float wv = uintBitsToFloat(load_u16(row_off + 2u * c) << 16);
#endif
                acc[r] = fma(wv, xv, acc[r]);
            }
        }
#else
        uint n_units = pc.n_cols / UNIT_ELEMS;
        for (uint u = lid; u < n_units; u += gl_WorkGroupSize.x) {
            uint blk_index = u / UNITS_PER_BLOCK;
            uint sub = u % UNITS_PER_BLOCK;
            uint e0 = (blk_index * UNITS_PER_BLOCK * UNIT_ELEMS + unit_first(sub)) >> 2;
            float xs[UNIT_ELEMS];
            for (uint v = 0u; v < 8u; ++v) {
                vec4 xv = x4[e0 + v];
                xs[4u * v] = xv.x;
                xs[4u * v + 1u] = xv.y;
                xs[4u * v + 2u] = xv.z;
                xs[4u * v + 3u] = xv.w;
            }
#if defined(K_FORMAT)
            uint e1 = (blk_index * UNITS_PER_BLOCK * UNIT_ELEMS + unit_second(sub)) >> 2;
            for (uint v = 0u; v < 8u; ++v) {
                vec4 xv = x4[e1 + v];
                xs[32u + 4u * v] = xv.x;
                xs[32u + 4u * v + 1u] = xv.y;
                xs[32u + 4u * v + 2u] = xv.z;
                xs[32u + 4u * v + 3u] = xv.w;
            }
#endif
            uint blk_in_row = blk_index * BLOCK_BYTES;
            for (uint r = 0u; r < rows_here; ++r) {
                acc[r] += unit_dot((row0 + r) * pc.row_bytes + blk_in_row, sub, xs);
            }
        }
#endif
    }

    // Workgroup reduction of acc[r] (all invocations reach it: barriers stay uniform).
#if defined(USE_SUBGROUP)
    for (uint r = 0u; r < ROWS; ++r) {
        float s = subgroupAdd(acc[r]);
        if (subgroupElect()) {
            red[gl_SubgroupID * ROWS + r] = s;
        }
    }
    barrier();
    if (lid < ROWS && row0 + lid < pc.n_rows) {
        float s = 0.0;
        for (uint g = 0u; g < gl_NumSubgroups; ++g) {
            s += red[g * ROWS + lid];
        }
        y[row0 + lid] = s;
    }
#else
    for (uint r = 0u; r < ROWS; ++r) {
        red[r * gl_WorkGroupSize.x + lid] = acc[r];
    }
    barrier();
    for (uint stride = gl_WorkGroupSize.x / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            for (uint r = 0u; r < ROWS; ++r) {
                red[r * gl_WorkGroupSize.x + lid] += red[r * gl_WorkGroupSize.x + lid + stride];
            }
        }
        barrier();
    }
    if (lid < ROWS && row0 + lid < pc.n_rows) {
        y[row0 + lid] = red[lid * gl_WorkGroupSize.x];
    }
#endif
}
