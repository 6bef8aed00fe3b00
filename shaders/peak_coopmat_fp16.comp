#version 450
// kbench peak "coopmat_fp16": cooperative-matrix (tensor-core) throughput, float16 A and B with
// float32 accumulation (VK_KHR_cooperative_matrix), the path of matmul_f16. Each subgroup keeps
// four independent M x N accumulators and multiplies register-resident M x K and K x N tiles
// into them `iters` times: 4 * 2 * M * N * K FLOPs per subgroup and step. M, N, K come from the
// device's cooperative-matrix properties (spec constants 1-3).
// kbench: target vulkan1.3
// kbench: requires glslang>=13

#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint M = 16;
layout(constant_id = 2) const uint N = 16;
layout(constant_id = 3) const uint K = 16;

layout(std430, binding = 0) buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint iters;
} p;

void main() {
    uint sg = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    coopmat<float16_t, gl_ScopeSubgroup, M, K, gl_MatrixUseA> a = coopmat<float16_t, gl_ScopeSubgroup, M, K, gl_MatrixUseA>(float16_t(1.0 / 64.0));
    coopmat<float16_t, gl_ScopeSubgroup, K, N, gl_MatrixUseB> b = coopmat<float16_t, gl_ScopeSubgroup, K, N, gl_MatrixUseB>(float16_t(1.0 / 128.0));
    coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator> c0 = coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator>(0.0);
    coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator> c1 = coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator>(1.0);
    coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator> c2 = coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator>(2.0);
    coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator> c3 = coopmat<float, gl_ScopeSubgroup, M, N, gl_MatrixUseAccumulator>(3.0);
    for (uint k = 0u; k < p.iters; ++k) {
        c0 = coopMatMulAdd(a, b, c0);
        c1 = coopMatMulAdd(a, b, c1);
        c2 = coopMatMulAdd(a, b, c2);
        c3 = coopMatMulAdd(a, b, c3);
    }
    for (uint i = 0u; i < c0.length(); ++i) {
        c0[i] = (c0[i] + c1[i]) + (c2[i] + c3[i]);
    }
    coopMatStore(c0, o, sg * M * N, N, gl_CooperativeMatrixLayoutRowMajor);
}
