#version 450
#extension GL_EXT_shader_16bit_storage : require
//
// Transpose of a row-major matrix of 16-bit elements (fp16, bf16 or any 16-bit pattern):
// dst[c * rows + r] = src[r * cols + c] for r < rows, c < cols.  matmul_f16's coopmat2 path with
// B transposed (KernelPolicy.matmul_f16_cm2_b) runs it first, so that both of the product's
// operands are read along k.
//
// Each workgroup moves one 32 x 32 tile through shared memory, so that both its reads and its
// writes run along rows; the tile's rows are padded to 33 words so that reading a column of it
// touches 32 different banks.  Elements are held as 32-bit words between the 16-bit load and
// store (no 16-bit arithmetic: the device needs only storageBuffer16BitAccess).
// Grid: (ceil(cols / 32), ceil(rows / 32)).

layout(local_size_x = 32, local_size_y = 8) in;

layout(std430, binding = 0) readonly buffer Src { uint16_t src[]; };
layout(std430, binding = 1) writeonly buffer Dst { uint16_t dst[]; };

layout(push_constant) uniform Push {
    uint rows;
    uint cols;
} pc;

shared uint tile[32][33];

void main() {
    uint r0 = gl_WorkGroupID.y * 32u;
    uint c0 = gl_WorkGroupID.x * 32u;
    uint tx = gl_LocalInvocationID.x;
    for (uint j = gl_LocalInvocationID.y; j < 32u; j += 8u) {
        uint r = r0 + j;
        uint c = c0 + tx;
        if (r < pc.rows && c < pc.cols) {
            tile[j][tx] = uint(src[r * pc.cols + c]);
        }
    }
    barrier();
    for (uint j = gl_LocalInvocationID.y; j < 32u; j += 8u) {
        uint c = c0 + j;
        uint r = r0 + tx;
        if (c < pc.cols && r < pc.rows) {
            dst[c * pc.rows + r] = uint16_t(tile[tx][j]);
        }
    }
}
