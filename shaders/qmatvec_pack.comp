#version 450
// Repack GGUF Q4_0 / Q8_0 / Q6_K / Q4_K weights into the 16-byte-aligned layout of qmatvec_packed.comp.
//
// GGUF blocks are 18 (Q4_0), 34 (Q8_0) or 210 (Q6_K) bytes, each with one fp16 scale (first in
// Q4_0/Q8_0, last in Q6_K), so most blocks start 2 bytes past a 4-byte boundary and no wide load
// fits them.  The packed layout keeps the same bytes, split in two arrays in one buffer:
//   quants: the block minus its fp16 scale, QV uvec4 (QV = 1, 2, 13), block i at uvec4 i * QV,
//           the bytes in GGUF order (Q4_0 byte j: element j in the low nibble, j + 16 in the
//           high), except Q6_K's, regrouped by unit of 32 elements (below);
//   scales: the fp16 scale of block i in half (i & 1) of word i / 2, words from uvec4 n * QV
//           on (n blocks in all, row-major, as in GGUF).
// One invocation per pair of blocks, so each scale word has one writer.
//
// Q6_K's 13 uvec4 a block: uvec4 u < 8 holds the low 4 bits of unit u's elements (elements 32 u ..
// 32 u + 31 of the block) as Q4_0 holds its quants: byte j = element j | element j + 16 << 4; uvec4
// 8 + u / 2, words 2 (u & 1) and 2 (u & 1) + 1, hold their high 2 bits: byte j (0..7) = elements j, j
// + 8, j + 16, j + 24 at bits 0, 2, 4, 6; uvec4 12 the 16 int8 sub-block scales as in GGUF.  So a
// unit's own 24 bytes are all its kernel loads (GGUF's order spreads them over 64, which held 16
// registers a unit and row in qmatvec_packed.comp).
//
// Q4_K (144-byte blocks: d, dmin, scales[12], qs[128]; 144 is a multiple of 16, so its blocks
// are word aligned already) gets a layout of its own, three arrays in one buffer, so that the
// matvec kernel does no 6-bit unpacking and a lane's quant loads are one 32-byte run:
//   quants:   8 uvec4 per block, block i at uvec4 8 i: qs[128] as in GGUF (byte 32 g + l: element
//             64 g + l of sub-block 2 g in its low nibble, element 64 g + 32 + l of sub-block
//             2 g + 1 in its high nibble);
//   scales:   one uvec4 per block, block i at uvec4 8 n + i: word u (the 64 elements of qs bytes
//             32 u .. 32 u + 31) = sc[2u] | sc[2u+1] << 8 | m[2u] << 16 | m[2u+1] << 24, the
//             6-bit sub-block scales and mins as bytes;
//   d, dmin:  one word per block, block i's at word i from uvec4 9 n on: d in the low half, dmin
//             in the high half (GGUF's first word of the block, as it is).
// 148 bytes per block: GGUF's 144, its 12 bytes of 6-bit scales and mins grown to 16.

// kbench: variant q4_0 QT_Q4_0
// kbench: variant q8_0 QT_Q8_0
// kbench: variant q6_k QT_Q6_K
// kbench: variant q4_k QT_Q4_K

layout(local_size_x_id = 0) in;

#if defined(QT_Q4_0)
const uint BLOCK_BYTES = 18u, QV = 1u, QUANTS_AT = 2u, SCALE_AT = 0u;
#elif defined(QT_Q8_0)
const uint BLOCK_BYTES = 34u, QV = 2u, QUANTS_AT = 2u, SCALE_AT = 0u;
#elif defined(QT_Q6_K)
const uint BLOCK_BYTES = 210u, QV = 13u, QUANTS_AT = 0u, SCALE_AT = 208u;
#else
const uint BLOCK_BYTES = 144u, QV = 8u, QUANTS_AT = 16u, SCALE_AT = 0u;
#endif

layout(std430, binding = 0) readonly buffer Source { uint src[]; };
layout(std430, binding = 1) writeonly buffer Packed { uvec4 dst[]; };

layout(push_constant) uniform Push {
    uint n_blocks;  // blocks in the matrix (n_rows * n_cols / 32; K formats: / 256)
} pc;

// the 16 bits at byte offset o (o even)
uint half_at(uint o) {
    return (src[o >> 2u] >> ((o & 2u) * 8u)) & 0xFFFFu;
}

// the 32 bits at byte offset o (o even)
uint word_at(uint o) {
    return half_at(o) | (half_at(o + 2u) << 16u);
}

uint copy_block(uint block) {
    uint base = block * BLOCK_BYTES;
    for (uint v = 0u; v < QV; ++v) {
        uint o = base + QUANTS_AT + 16u * v;
        dst[block * QV + v] = uvec4(word_at(o), word_at(o + 4u), word_at(o + 8u), word_at(o + 12u));
    }
    return half_at(base + SCALE_AT);
}

#if defined(QT_Q6_K)
// Q6_K block i into the unit layout above; returns its fp16 scale d.  GGUF: element 128 h + 32 g +
// l (half h, group g < 4, l < 32) has its low 4 bits in nibble g >> 1 of ql[64 h + 32 (g & 1) + l]
// and its high 2 bits at bit 2 g of qh[32 h + l].
uint pack_q6_k(uint block) {
    uint base = block * BLOCK_BYTES;
    for (uint u = 0u; u < 8u; ++u) {
        uint h = u >> 2u, g = u & 3u;
        uint ql = base + 64u * h + 32u * (g & 1u), qh = base + 128u + 32u * h;
        uvec4 lo;
        uvec2 hi = uvec2(0u);
        for (uint w = 0u; w < 4u; ++w) {  // bytes 4 w .. 4 w + 3: elements 4 w .., and 16 + 4 w .. above them
            uint a = (word_at(ql + 4u * w) >> (4u * (g >> 1u))) & 0x0F0F0F0Fu;
            uint b = (word_at(ql + 16u + 4u * w) >> (4u * (g >> 1u))) & 0x0F0F0F0Fu;
            lo[w] = a | (b << 4u);
        }
        for (uint w = 0u; w < 8u; ++w) {  // qh bytes 4 w ..: elements l = 4 w .. 4 w + 3 of the unit
            uint f = (word_at(qh + 4u * w) >> (2u * g)) & 0x03030303u;
            hi[w & 1u] |= f << (2u * (w >> 1u));  // byte l & 7, bits 2 (l >> 3)
        }
        dst[block * QV + u] = lo;
        uint q = block * QV + 8u + (u >> 1u);
        dst[q][2u * (u & 1u)] = hi.x;
        dst[q][2u * (u & 1u) + 1u] = hi.y;
    }
    uint sc = base + 192u;
    dst[block * QV + 12u] = uvec4(word_at(sc), word_at(sc + 4u), word_at(sc + 8u), word_at(sc + 12u));
    return half_at(base + SCALE_AT);
}
#endif

#if defined(QT_Q4_K)
// Q4_K block i: its quants, its eight 6-bit scales and mins as bytes, its d / dmin word
void pack_q4_k(uint block) {
    uint w = block * (BLOCK_BYTES / 4u);  // word aligned: 36 words a block
    copy_block(block);
    // scales[12] as words s0 (bytes 0..3), s1 (4..7), s2 (8..11); byte lane j of each word:
    //   sc[j] = s0 & 63, m[j] = s1 & 63,
    //   sc[j + 4] = (s2 & 15) | (s0 >> 6) << 4, m[j + 4] = (s2 >> 4) | (s1 >> 6) << 4
    uint s0 = src[w + 1u], s1 = src[w + 2u], s2 = src[w + 3u];
    uint sc_lo = s0 & 0x3F3F3F3Fu, m_lo = s1 & 0x3F3F3F3Fu;
    uint sc_hi = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2u) & 0x30303030u);
    uint m_hi = ((s2 >> 4u) & 0x0F0F0F0Fu) | ((s1 >> 2u) & 0x30303030u);
    // word u: bytes sc[2u], sc[2u + 1], m[2u], m[2u + 1], i.e. bytes 2 (u & 1) and 2 (u & 1) + 1
    // of sc_lo / m_lo (u < 2) or sc_hi / m_hi
    dst[pc.n_blocks * QV + block] = uvec4(
        (sc_lo & 0xFFFFu) | (m_lo << 16u), (sc_lo >> 16u) | (m_lo & 0xFFFF0000u),
        (sc_hi & 0xFFFFu) | (m_hi << 16u), (sc_hi >> 16u) | (m_hi & 0xFFFF0000u));
    dst[pc.n_blocks * (QV + 1u) + (block >> 2u)][block & 3u] = src[w];  // d | dmin << 16
}
#endif

void main() {
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint pair = group * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    uint first = 2u * pair;
    if (first >= pc.n_blocks) {
        return;
    }
#if defined(QT_Q4_K)
    pack_q4_k(first);  // every block has words of its own: the pair only keeps the other formats' grid
    if (first + 1u < pc.n_blocks) {
        pack_q4_k(first + 1u);
    }
#elif defined(QT_Q6_K)
    uint scales = pack_q6_k(first);
    if (first + 1u < pc.n_blocks) {
        scales |= pack_q6_k(first + 1u) << 16u;
    }
    dst[pc.n_blocks * QV + (pair >> 2u)][pair & 3u] = scales;
#else
    uint scales = copy_block(first);
    if (first + 1u < pc.n_blocks) {
        scales |= copy_block(first + 1u) << 16u;
    }
    dst[pc.n_blocks * QV + (pair >> 2u)][pair & 3u] = scales;
#endif
}
