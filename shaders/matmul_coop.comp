#version 450
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : require
#ifndef COOP_EMULATE
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#ifdef ELEM_BF16
#extension GL_EXT_bfloat16 : require
#endif
#endif
// kbench: requires glslang>=13
// kbench: variant khr target=vulkan1.3
// kbench: variant emulated COOP_EMULATE target=vulkan1.1
// kbench: variant khr.bf16 ELEM_BF16 target=vulkan1.3 requires=glslang>=16
// kbench: variant emulated.bf16 COOP_EMULATE ELEM_BF16 target=vulkan1.1
//
// Reduced-precision matrix product on cooperative matrices (VK_KHR_cooperative_matrix):
// C[m,n] = A[m,k] @ B[k,n] with A and B float16 (or bfloat16: ELEM_BF16, GL_EXT_bfloat16) and
// C float32, all row-major, accumulated in float32 by 16x16x16 -> f32 matrix multiply-adds.
// Any m, n, k >= 1.  The staging below moves 16-bit patterns and is the same for both types.
//
// A workgroup of WG_M x WG_N subgroups computes a BM x BN block of C (BM = WG_M*SG_M*16,
// BN = WG_N*SG_N*16); each subgroup holds SG_M x SG_N 16x16 accumulators.  A and B are staged
// through shared memory in BK-deep slices as uvec4s (8 halves each; rows padded by one uvec4 so
// the matrix loads of 8 consecutive rows hit distinct banks), zero-padded at the matrix edges.
// STAGES = 2 double-buffers the slices (the next one is fetched into registers while the current
// one is multiplied; one barrier per slice); STAGES = 1 uses one buffer and two barriers.
// VEC = 1 (needs k % 8 == 0 and n % 8 == 0): global loads are whole uvec4s; VEC = 0 loads
// halves one at a time with bounds checks.  Accumulators that lie wholly inside C are stored
// straight to global memory (when n % 4 == 0, the 16-byte alignment a matrix store needs);
// the others go through shared memory and are written element by element with bounds checks.
// GROUP_M > 1 renumbers the workgroups so that GROUP_M block rows sweep the columns together.
//
// The `emulated` variant (COOP_EMULATE) replaces the three cooperative-matrix operations by
// plain per-invocation code with the same memory semantics (each invocation of a subgroup owns
// elements lane, lane + subgroup size, ... of every 16x16 accumulator); it runs anywhere, slowly,
// and exists so that everything else in this file (staging, edges, swizzle, epilogue) is tested
// on devices without cooperative matrices (tests/test_matmul_kernels.py).
//
// local_size_x must be WG_M * WG_N * subgroup size (the backend derives it: kernels.py
// KernelPolicy.matmul_f16).  Grid: (ceil(n/BN), ceil(m/BM)).

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint WG_M = 2;
layout(constant_id = 2) const uint WG_N = 4;
layout(constant_id = 3) const uint SG_M = 4;
layout(constant_id = 4) const uint SG_N = 2;
layout(constant_id = 5) const uint BK = 32;
layout(constant_id = 6) const uint VEC = 0;
layout(constant_id = 7) const uint STAGES = 2;
layout(constant_id = 8) const uint GROUP_M = 1;

layout(std430, binding = 0) readonly buffer MatA { uvec4 a4[]; };  // float16 pairs
layout(std430, binding = 1) readonly buffer MatB { uvec4 b4[]; };
layout(std430, binding = 2) writeonly buffer MatC { float c[]; };

layout(push_constant) uniform Push {
    uint m;
    uint n;
    uint k;
} pc;

const uint THREADS = gl_WorkGroupSize.x;
const uint BM = WG_M * SG_M * 16u;
const uint BN = WG_N * SG_N * 16u;
const uint NSG = WG_M * WG_N;
const uint ACH = BK / 8u;            // uvec4 chunks per A row of a slice
const uint BCH = BN / 8u;            // uvec4 chunks per B row of a slice
const uint AROW = ACH + 1u;          // padded row pitches (in uvec4)
const uint BROW = BCH + 1u;
const uint A_SLICE = BM * AROW;
const uint B_SLICE = BK * BROW;
const uint B_OFF = STAGES * A_SLICE;
const uint AB_WORDS = STAGES * (A_SLICE + B_SLICE);
const uint C_WORDS = NSG * 64u;      // a 16x16 float32 staging tile per subgroup
const uint SMEM = AB_WORDS > C_WORDS ? AB_WORDS : C_WORDS;
const uint A_LOAD = BM * ACH;
const uint B_LOAD = BK * BCH;
const uint LA = (A_LOAD + THREADS - 1u) / THREADS;
const uint LB = (B_LOAD + THREADS - 1u) / THREADS;

shared uvec4 smem[SMEM];

uvec4 pa[LA];
uvec4 pb[LB];

uint a_half(uint i) {
    return (a4[i >> 3][(i >> 1) & 3u] >> ((i & 1u) * 16u)) & 0xFFFFu;
}

uint b_half(uint i) {
    return (b4[i >> 3][(i >> 1) & 3u] >> ((i & 1u) * 16u)) & 0xFFFFu;
}

void fetch(uint row0, uint col0, uint k0, uint lid) {
    [[unroll]] for (uint i = 0u; i < LA; ++i) {
        uint e = lid + i * THREADS;
        uvec4 v = uvec4(0u);
        if (e < A_LOAD) {
            uint gr = row0 + e / ACH;
            uint gk = k0 + 8u * (e % ACH);
            if (VEC != 0u) {
                if (gr < pc.m && gk < pc.k) {
                    v = a4[(gr * pc.k + gk) >> 3];
                }
            } else if (gr < pc.m) {
                uint base = gr * pc.k + gk;
                [[unroll]] for (uint h = 0u; h < 8u; ++h) {
                    if (gk + h < pc.k) {
                        v[h >> 1] |= a_half(base + h) << ((h & 1u) * 16u);
                    }
                }
            }
        }
        pa[i] = v;
    }
    [[unroll]] for (uint i = 0u; i < LB; ++i) {
        uint e = lid + i * THREADS;
        uvec4 v = uvec4(0u);
        if (e < B_LOAD) {
            uint gp = k0 + e / BCH;
            uint gc = col0 + 8u * (e % BCH);
            if (VEC != 0u) {
                if (gp < pc.k && gc < pc.n) {
                    v = b4[(gp * pc.n + gc) >> 3];
                }
            } else if (gp < pc.k) {
                uint base = gp * pc.n + gc;
                [[unroll]] for (uint h = 0u; h < 8u; ++h) {
                    if (gc + h < pc.n) {
                        v[h >> 1] |= b_half(base + h) << ((h & 1u) * 16u);
                    }
                }
            }
        }
        pb[i] = v;
    }
}

void stash(uint stage, uint lid) {
    [[unroll]] for (uint i = 0u; i < LA; ++i) {
        uint e = lid + i * THREADS;
        if (e < A_LOAD) {
            smem[stage * A_SLICE + (e / ACH) * AROW + e % ACH] = pa[i];
        }
    }
    [[unroll]] for (uint i = 0u; i < LB; ++i) {
        uint e = lid + i * THREADS;
        if (e < B_LOAD) {
            smem[B_OFF + stage * B_SLICE + (e / BCH) * BROW + e % BCH] = pb[i];
        }
    }
}

#ifdef COOP_EMULATE
// a "fragment" is the uvec4 offset of its 16x16 half block in smem; an accumulator is this
// invocation's share of the 16x16 float block (subgroups of at least 8 invocations)
struct Acc { float v[32]; };
#define FragA uint
#define FragB uint

float smem_half(uint at, uint h) {
    uint word = smem[at + (h >> 3)][(h >> 1) & 3u];
#ifdef ELEM_BF16
    return uintBitsToFloat((h & 1u) != 0u ? word & 0xFFFF0000u : word << 16);
#else
    vec2 pair = unpackHalf2x16(word);
    return (h & 1u) != 0u ? pair.y : pair.x;
#endif
}

Acc acc_zero() {
    Acc z;
    for (uint j = 0u; j < 32u; ++j) {
        z.v[j] = 0.0;
    }
    return z;
}

Acc emu_muladd(uint fa, uint fb, Acc c) {
    uint lane = gl_SubgroupInvocationID;
    for (uint j = 0u; j * gl_SubgroupSize < 256u; ++j) {
        uint e = lane + j * gl_SubgroupSize;
        uint r = e >> 4;
        uint col = e & 15u;
        float sum = c.v[j];
        for (uint kk = 0u; kk < 16u; ++kk) {
            float x = smem_half(fa + r * AROW, kk);
            float y = smem_half(fb + kk * BROW, col);
            sum = fma(x, y, sum);
        }
        c.v[j] = sum;
    }
    return c;
}

void emu_store_global(Acc a, uint at, uint stride) {
    uint lane = gl_SubgroupInvocationID;
    for (uint j = 0u; j * gl_SubgroupSize < 256u; ++j) {
        uint e = lane + j * gl_SubgroupSize;
        c[at + (e >> 4) * stride + (e & 15u)] = a.v[j];
    }
}

void emu_store_shared(Acc a, uint at) {
    uint lane = gl_SubgroupInvocationID;
    for (uint j = 0u; j * gl_SubgroupSize < 256u; ++j) {
        uint e = lane + j * gl_SubgroupSize;
        smem[at + (e >> 2)][e & 3u] = floatBitsToUint(a.v[j]);
    }
}
#define ACC_T Acc
#define ACC_ZERO acc_zero()
#define LOAD_A(f, at, stride) f = (at)
#define LOAD_B(f, at, stride) f = (at)
#define MULADD(x, y, z) emu_muladd(x, y, z)
#define STORE_GLOBAL(a, at, stride) emu_store_global(a, at, stride)
#define STORE_SHARED(a, at) emu_store_shared(a, at)
#else
#define ACC_T coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#ifdef ELEM_BF16
#define ELEM bfloat16_t
#else
#define ELEM float16_t
#endif
#define FragA coopmat<ELEM, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FragB coopmat<ELEM, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define ACC_ZERO ACC_T(0.0)
#define LOAD_A(f, at, stride) coopMatLoad(f, smem, at, stride, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_B(f, at, stride) coopMatLoad(f, smem, at, stride, gl_CooperativeMatrixLayoutRowMajor)
#define MULADD(x, y, z) coopMatMulAdd(x, y, z)
#define STORE_GLOBAL(a, at, stride) coopMatStore(a, c, at, stride, gl_CooperativeMatrixLayoutRowMajor)
#define STORE_SHARED(a, at) coopMatStore(a, smem, at, 4u, gl_CooperativeMatrixLayoutRowMajor)
#endif

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID;
    uint sgm = sg / WG_N;
    uint sgn = sg % WG_N;

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

    ACC_T acc[SG_M * SG_N];
    [[unroll]] for (uint i = 0u; i < SG_M * SG_N; ++i) {
        acc[i] = ACC_ZERO;
    }
    FragA fa[SG_M];
    FragB fb[SG_N];

    uint slices = (pc.k + BK - 1u) / BK;
    fetch(row0, col0, 0u, lid);
    stash(0u, lid);
    barrier();

    for (uint s = 0u; s < slices; ++s) {
        uint stage = (STAGES == 2u) ? (s & 1u) : 0u;
        bool more = s + 1u < slices;
        if (more) {
            fetch(row0, col0, (s + 1u) * BK, lid);
        }
        uint abase = stage * A_SLICE + sgm * SG_M * 16u * AROW;
        uint bbase = B_OFF + stage * B_SLICE + sgn * SG_N * 2u;
        [[unroll]] for (uint kk = 0u; kk < BK / 16u; ++kk) {
            [[unroll]] for (uint i = 0u; i < SG_M; ++i) {
                LOAD_A(fa[i], abase + i * 16u * AROW + kk * 2u, AROW);
            }
            [[unroll]] for (uint j = 0u; j < SG_N; ++j) {
                LOAD_B(fb[j], bbase + kk * 16u * BROW + j * 2u, BROW);
            }
            [[unroll]] for (uint i = 0u; i < SG_M; ++i) {
                [[unroll]] for (uint j = 0u; j < SG_N; ++j) {
                    acc[i * SG_N + j] = MULADD(fa[i], fb[j], acc[i * SG_N + j]);
                }
            }
        }
        if (STAGES == 2u) {
            if (more) {
                stash(stage ^ 1u, lid);
            }
            barrier();
        } else {
            barrier();
            if (more) {
                stash(0u, lid);
            }
            barrier();
        }
    }
    // every subgroup has finished with the slices (the loop ends on a barrier): smem is free

    bool direct_ok = (pc.n & 3u) == 0u;
    uint lane = gl_SubgroupInvocationID;
    uint stage_at = sg * 64u;
    [[unroll]] for (uint i = 0u; i < SG_M; ++i) {
        [[unroll]] for (uint j = 0u; j < SG_N; ++j) {
            uint gr0 = row0 + (sgm * SG_M + i) * 16u;
            uint gc0 = col0 + (sgn * SG_N + j) * 16u;
            if (gr0 >= pc.m || gc0 >= pc.n) {
                continue;
            }
            if (direct_ok && gr0 + 16u <= pc.m && gc0 + 16u <= pc.n) {
                STORE_GLOBAL(acc[i * SG_N + j], gr0 * pc.n + gc0, pc.n);
            } else {
                STORE_SHARED(acc[i * SG_N + j], stage_at);
                subgroupMemoryBarrierShared();
                subgroupBarrier();
                for (uint e = lane; e < 256u; e += gl_SubgroupSize) {
                    uint r = e >> 4;
                    uint cc = e & 15u;
                    if (gr0 + r < pc.m && gc0 + cc < pc.n) {
                        c[(gr0 + r) * pc.n + gc0 + cc] = uintBitsToFloat(smem[stage_at + (e >> 2)][e & 3u]);
                    }
                }
                subgroupMemoryBarrierShared();
                subgroupBarrier();
            }
        }
    }
}
