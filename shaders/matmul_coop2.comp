#version 450
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#ifdef ELEM_BF16
#extension GL_EXT_bfloat16 : require
#define ELEM bfloat16_t
#else
#define ELEM float16_t
#endif
// kbench: requires glslang>=16
// kbench: variant f16 target=vulkan1.3
// kbench: variant bf16 ELEM_BF16 target=vulkan1.3
// kbench: variant f16.bt B_T target=vulkan1.3
// kbench: variant bf16.bt ELEM_BF16 B_T target=vulkan1.3
//
// Reduced-precision matrix product on workgroup-scope cooperative matrices
// (VK_NV_cooperative_matrix2): C[m,n] = A[m,k] @ B[k,n] with A and B float16 (variant f16) or
// bfloat16 (variant bf16), C float32, all row-major, accumulated in float32.  Any m, n, k >= 1.
//
// Each workgroup computes one BM x BN block of C as a single workgroup-scope accumulator; the
// driver splits it over the workgroup's subgroups and stages the operands itself.  A and B are
// read in BK-deep slices through tensor layouts (coopMatLoadTensorNV): CLAMP = 1 makes elements
// outside the matrices read as zero (any m, n, k); CLAMP = 0 leaves them undefined and is only
// for m % BM == n % BN == k % BK == 0.  The tensor-layout store writes only elements inside C.
// GROUP_M > 1 renumbers the workgroups so that GROUP_M block rows sweep the columns together.
// VEC = 1 (k % 8 == 0 and n % 8 == 0) tells the compiler that rows start on 16-byte boundaries
// (the row pitches are set with their low bits masked off), so that it can load whole vectors;
// UNROLL > 1 unrolls the slice loop UNROLL times (the driver can then overlap one slice's loads
// with another's multiply), with a plain loop for the slices left over.
// Variants *.bt take B transposed: binding 1 holds B^T, n rows of k (both operands then run along
// k, the order ggml's coopmat2 matmul reads them in), loaded as BK x BN slices through a
// transposing tensor view; the backend transposes B first (shaders/transpose16.comp).
//
// local_size_x must be one of the workgroup sizes the device lists for this type combination
// and these granularities (vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV;
// the backend checks: kernels.py KernelPolicy.matmul_f16).  Grid: (ceil(n/BN), ceil(m/BM)).

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 128;
layout(constant_id = 2) const uint BN = 128;
layout(constant_id = 3) const uint BK = 32;
layout(constant_id = 4) const uint GROUP_M = 1;
layout(constant_id = 5) const uint CLAMP = gl_CooperativeMatrixClampModeConstantNV;
layout(constant_id = 6) const uint UNROLL = 1;
layout(constant_id = 7) const uint VEC = 0;

layout(std430, binding = 0) readonly buffer MatA { ELEM a[]; };
layout(std430, binding = 1) readonly buffer MatB { ELEM b[]; };
layout(std430, binding = 2) writeonly buffer MatC { float c[]; };

layout(push_constant) uniform Push {
    uint m;
    uint n;
    uint k;
} pc;

void main() {
    uint bx = gl_WorkGroupID.x;
    uint by = gl_WorkGroupID.y;
    if (GROUP_M > 1u) {
        uint gx = gl_NumWorkGroups.x;
        uint gy = gl_NumWorkGroups.y;
        uint id = by * gx + bx;
        uint per_group = GROUP_M * gx;
        uint first = (id / per_group) * GROUP_M;
        uint rows = min(gy - first, GROUP_M);
        uint inner = id % per_group;
        by = first + inner % rows;
        bx = inner / rows;
    }
    uint row0 = by * BM;
    uint col0 = bx * BN;

    tensorLayoutNV<2, CLAMP> ta = createTensorLayoutNV(2, CLAMP);
    tensorLayoutNV<2, CLAMP> tb = createTensorLayoutNV(2, CLAMP);
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> tc =
        createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    ta = setTensorLayoutDimensionNV(ta, pc.m, pc.k);
#ifdef B_T
    tb = setTensorLayoutDimensionNV(tb, pc.n, pc.k);
    tensorViewNV<2, false, 1, 0> bview = createTensorViewNV(2, false, 1, 0);
#define LOAD_B(k0) coopMatLoadTensorNV(mb, b, 0u, sliceTensorLayoutNV(tb, col0, BN, k0, BK), bview)
#else
    tb = setTensorLayoutDimensionNV(tb, pc.k, pc.n);
#define LOAD_B(k0) coopMatLoadTensorNV(mb, b, 0u, sliceTensorLayoutNV(tb, k0, BK, col0, BN))
#endif
    tc = setTensorLayoutDimensionNV(tc, pc.m, pc.n);
    if (VEC != 0u) {
        ta = setTensorLayoutStrideNV(ta, pc.k & ~7u, 1u);
#ifdef B_T
        tb = setTensorLayoutStrideNV(tb, pc.k & ~7u, 1u);
#else
        tb = setTensorLayoutStrideNV(tb, pc.n & ~7u, 1u);
#endif
        tc = setTensorLayoutStrideNV(tc, pc.n & ~7u, 1u);
    }

    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    coopmat<ELEM, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> ma;
    coopmat<ELEM, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> mb;

    uint k0 = 0u;
    if (UNROLL > 1u) {
        for (; k0 + UNROLL * BK <= pc.k; ) {
            [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
                coopMatLoadTensorNV(ma, a, 0u, sliceTensorLayoutNV(ta, row0, BM, k0, BK));
                LOAD_B(k0);
                acc = coopMatMulAdd(ma, mb, acc);
                k0 += BK;
            }
        }
    }
    for (; k0 < pc.k; k0 += BK) {
        coopMatLoadTensorNV(ma, a, 0u, sliceTensorLayoutNV(ta, row0, BM, k0, BK));
        LOAD_B(k0);
        acc = coopMatMulAdd(ma, mb, acc);
    }
    coopMatStoreTensorNV(acc, c, 0u, sliceTensorLayoutNV(tc, row0, BM, col0, BN));
}
