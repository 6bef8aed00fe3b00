#version 450
// kbench peak "int8_dot": packed 4x8-bit signed integer dot products (SPV_KHR_integer_dot_product,
// needs shaderIntegerDotProduct), the instruction kbench's quantized_matmul *.dot.* kernels use.
// Eight independent accumulator chains per invocation; one sdot = 4 multiplies + 4 adds, so a
// step counts 8 x 8 = 64 integer operations (reported as GOP/s, like the FMA peaks' FLOPs).
// kbench: target vulkan1.1

#extension GL_EXT_spirv_intrinsics : require

spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot(uint a, uint b, spirv_literal int fmt);

layout(local_size_x_id = 0) in;

layout(std430, binding = 0) writeonly buffer Out { int o[]; };

layout(push_constant) uniform Push {
    uint iters;
} p;

void main() {
    uint gid = gl_GlobalInvocationID.x;
    uint a = 0x01020304u ^ gid, b = 0x7f81fe02u;
    int s0 = int(gid), s1 = s0 + 1, s2 = s0 + 2, s3 = s0 + 3, s4 = s0 + 4, s5 = s0 + 5, s6 = s0 + 6, s7 = s0 + 7;
    for (uint k = 0u; k < p.iters; ++k) {
        // the operands depend on the loop so that the compiler cannot hoist the products
        uint x = a + k;
        s0 += sdot(x, b, 0); s1 += sdot(x, b ^ 1u, 0); s2 += sdot(x, b ^ 2u, 0); s3 += sdot(x, b ^ 3u, 0);
        s4 += sdot(x, b ^ 4u, 0); s5 += sdot(x, b ^ 5u, 0); s6 += sdot(x, b ^ 6u, 0); s7 += sdot(x, b ^ 7u, 0);
    }
    o[gid] = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
}
