#version 450
// Repack GGUF Q4_0 / Q8_0 weights into the 16-byte-aligned layout of qmatvec_packed.comp.
//
// GGUF blocks are 18 (Q4_0) or 34 (Q8_0) bytes: an fp16 scale, then the quants, so a block's
// quants start 2 bytes past a 4-byte boundary half of the time and no wide load fits them.
// The packed layout keeps the same bytes, split in two arrays in one buffer:
//   quants: QV uvec4 per block (QV = 1 for Q4_0, 2 for Q8_0), block i at uvec4 i * QV, the
//           bytes in GGUF order (Q4_0 byte j: element j in the low nibble, j + 16 in the high);
//   scales: the fp16 scale of block i in half (i & 1) of word i / 2, words from uvec4 n * QV
//           on (n blocks in all, row-major, as in GGUF).
// One invocation per pair of blocks, so each scale word has one writer.

// kbench: variant q4_0 QT_Q4_0
// kbench: variant q8_0 QT_Q8_0

layout(local_size_x_id = 0) in;

#if defined(QT_Q4_0)
const uint BLOCK_BYTES = 18u, QV = 1u;
#else
const uint BLOCK_BYTES = 34u, QV = 2u;
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
        uint o = base + 2u + 16u * v;
        dst[block * QV + v] = uvec4(word_at(o), word_at(o + 4u), word_at(o + 8u), word_at(o + 12u));
    }
    return half_at(base);
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
