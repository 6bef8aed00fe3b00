#version 450
// Repack GGUF Q4_0 / Q8_0 / Q6_K weights into the 16-byte-aligned layout of qmatvec_packed.comp.
//
// GGUF blocks are 18 (Q4_0), 34 (Q8_0) or 210 (Q6_K) bytes, each with one fp16 scale (first in
// Q4_0/Q8_0, last in Q6_K), so most blocks start 2 bytes past a 4-byte boundary and no wide load
// fits them.  The packed layout keeps the same bytes, split in two arrays in one buffer:
//   quants: the block minus its fp16 scale, QV uvec4 (QV = 1, 2, 13), block i at uvec4 i * QV,
//           the bytes in GGUF order (Q4_0 byte j: element j in the low nibble, j + 16 in the
//           high; Q6_K: ql[128], qh[64], scales[16]);
//   scales: the fp16 scale of block i in half (i & 1) of word i / 2, words from uvec4 n * QV
//           on (n blocks in all, row-major, as in GGUF).
// One invocation per pair of blocks, so each scale word has one writer.

// kbench: variant q4_0 QT_Q4_0
// kbench: variant q8_0 QT_Q8_0
// kbench: variant q6_k QT_Q6_K

layout(local_size_x_id = 0) in;

#if defined(QT_Q4_0)
const uint BLOCK_BYTES = 18u, QV = 1u, QUANTS_AT = 2u, SCALE_AT = 0u;
#elif defined(QT_Q8_0)
const uint BLOCK_BYTES = 34u, QV = 2u, QUANTS_AT = 2u, SCALE_AT = 0u;
#else
const uint BLOCK_BYTES = 210u, QV = 13u, QUANTS_AT = 0u, SCALE_AT = 208u;
#endif

layout(std430, binding = 0) readonly buffer Source { uint src[]; };
layout(std430, binding = 1) writeonly buffer Packed { uvec4 dst[]; };

layout(push_constant) uniform Push {
    uint n_blocks;  // blocks in the matrix (n_rows * n_cols / 32)
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

void main() {
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint pair = group * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    uint first = 2u * pair;
    if (first >= pc.n_blocks) {
        return;
    }
    uint scales = copy_block(first);
    if (first + 1u < pc.n_blocks) {
        scales |= copy_block(first + 1u) << 16u;
    }
    dst[pc.n_blocks * QV + (pair >> 2u)][pair & 3u] = scales;
}
