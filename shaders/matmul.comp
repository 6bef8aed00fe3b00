#version 450
#extension GL_EXT_control_flow_attributes : enable
// fp32 matrix product C[m,n] = A[m,k] @ B[k,n], all row-major, any m, n, k >= 1 (SGEMM).
//
// Each workgroup computes a BM x BN block of C; each invocation a TM x TN sub-tile held in
// registers, as TM/4 x TN/4 groups of 4x4 (rows ty*4.. of each BM/(TM/4)-row band, columns
// tx*4.. of each BN/(TN/4)-column band), so that every shared-memory read of the inner loop is
// a vec4 and neighbouring invocations write neighbouring vec4s of C.
//
// A and B are staged through shared memory in BK-deep slices, A transposed (k-major, rows
// padded by 4 floats so the transposing stores hit distinct banks), B as is.  With STAGES = 2
// the slices are double-buffered: the next slice is fetched into registers while the current
// one is multiplied, then stored into the other buffer (one barrier per slice); STAGES = 1
// uses one buffer and two barriers (for devices with little shared memory).  SPLIT = 1 (with
// STAGES = 2) staggers the fetch: A's next slice at the start, stored half way through the slice,
// then B's (stored at the end), so only one of the two is held in registers at a time.
//
// VEC4 = 1 (needs n % 4 == 0 and k % 4 == 0): global loads and stores of C are whole vec4s.
// VEC4 = 2 (needs m % BM == 0, n % BN == 0 and k % BK == 0 besides): the same without bounds checks.
// VEC4 = 0: the general path, element-wise loads/stores with bounds checks (any m, n, k).
// Edges are zero-padded in either case, so no size needs to be a multiple of a tile.
// GROUP_M > 1 renumbers the workgroups so that GROUP_M block rows sweep the columns together
// (the A and B panels they share stay in L2).
// WARP_N > 0 lays each run of 32 invocations out as a (32/WARP_N) x WARP_N patch of the
// (BM/TM) x (BN/TN) invocation grid, so that one subgroup's shared-memory reads of a k-step touch
// 32/WARP_N vec4s of A and WARP_N of B (WARP_N = 0: row-major, BN/TN invocations per row).  Only the
// order of the invocations changes, so any subgroup size computes the same result.
//
// local_size_x must equal (BM/TM) * (BN/TN); TM, TN, BK are multiples of 4; with WARP_N > 0,
// WARP_N divides both 32 and BN/TN, and 32/WARP_N divides BM/TM.  The backend derives all of
// them (kbench/backend/kernels.py KernelPolicy.matmul).  Grid: (ceil(n/BN), ceil(m/BM)).

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 128;
layout(constant_id = 2) const uint BN = 128;
layout(constant_id = 3) const uint BK = 16;
layout(constant_id = 4) const uint TM = 8;
layout(constant_id = 5) const uint TN = 8;
layout(constant_id = 6) const uint VEC4 = 0;
layout(constant_id = 7) const uint STAGES = 2;
layout(constant_id = 8) const uint GROUP_M = 1;
layout(constant_id = 9) const uint WARP_N = 0;
layout(constant_id = 10) const uint SPLIT = 0;

// vec4 views of the buffers; the general path reads and writes single components
layout(std430, binding = 0) restrict readonly buffer MatA { vec4 a4[]; };
layout(std430, binding = 1) restrict readonly buffer MatB { vec4 b4[]; };
layout(std430, binding = 2) restrict writeonly buffer MatC { vec4 c4[]; };

layout(push_constant) uniform Push {
    uint m;
    uint n;
    uint k;
} pc;

const uint THREADS = (BM / TM) * (BN / TN);
const uint TX = BN / TN;          // invocations along n
const uint AROW = BM + 4u;        // floats per k-row of the transposed A slice (padded)
const uint AROW4 = AROW / 4u;
const uint BROW4 = BN / 4u;
const uint A_SLICE4 = BK * AROW4;  // vec4s of one A buffer
const uint B_SLICE4 = BK * BROW4;
const uint A_LOAD4 = BM * BK / 4u;  // vec4s of A fetched per slice
const uint B_LOAD4 = BK * BN / 4u;
const uint LA = (A_LOAD4 + THREADS - 1u) / THREADS;  // per invocation
const uint LB = (B_LOAD4 + THREADS - 1u) / THREADS;
const uint KQ = BK / 4u;           // vec4s along k of one A row slice
const bool SPLIT_ON = SPLIT != 0u && STAGES == 2u;

shared vec4 sA[STAGES * A_SLICE4];  // sA[s*A_SLICE4 + p*AROW4 + r/4][r%4] = A[row0 + r, k0 + p]
shared vec4 sB[STAGES * B_SLICE4];  // sB[s*B_SLICE4 + p*BROW4 + j/4][j%4] = B[k0 + p, col0 + j]

vec4 pa[LA];
vec4 pb[LB];

// fetch the A slice starting at k0 into pa (zero outside the matrix)
void fetch_a(uint row0, uint k0, uint lid) {
    [[unroll]] for (uint i = 0u; i < LA; ++i) {
        uint e = lid + i * THREADS;
        vec4 v = vec4(0.0);
        if (e < A_LOAD4) {
            uint r = e / KQ;
            uint gr = row0 + r;
            uint gk = k0 + 4u * (e % KQ);
            if (VEC4 == 2u) {
                v = a4[(gr * pc.k + gk) >> 2];
            } else if (VEC4 != 0u) {
                if (gr < pc.m && gk < pc.k) {
                    v = a4[(gr * pc.k + gk) >> 2];
                }
            } else if (gr < pc.m) {
                uint base = gr * pc.k + gk;
                [[unroll]] for (uint c = 0u; c < 4u; ++c) {
                    if (gk + c < pc.k) {
                        v[c] = a4[(base + c) >> 2][(base + c) & 3u];
                    }
                }
            }
        }
        pa[i] = v;
    }
}

// fetch the B slice starting at k0 into pb (zero outside the matrix)
void fetch_b(uint col0, uint k0, uint lid) {
    [[unroll]] for (uint i = 0u; i < LB; ++i) {
        uint e = lid + i * THREADS;
        vec4 v = vec4(0.0);
        if (e < B_LOAD4) {
            uint gp = k0 + e / BROW4;
            uint gc = col0 + 4u * (e % BROW4);
            if (VEC4 == 2u) {
                v = b4[(gp * pc.n + gc) >> 2];
            } else if (VEC4 != 0u) {
                if (gp < pc.k && gc < pc.n) {
                    v = b4[(gp * pc.n + gc) >> 2];
                }
            } else if (gp < pc.k) {
                uint base = gp * pc.n + gc;
                [[unroll]] for (uint c = 0u; c < 4u; ++c) {
                    if (gc + c < pc.n) {
                        v[c] = b4[(base + c) >> 2][(base + c) & 3u];
                    }
                }
            }
        }
        pb[i] = v;
    }
}

// store pa into shared buffer `stage`
void stash_a(uint stage, uint lid) {
    [[unroll]] for (uint i = 0u; i < LA; ++i) {
        uint e = lid + i * THREADS;
        if (e < A_LOAD4) {
            uint r = e / KQ;
            uint p = 4u * (e % KQ);
            uint at = stage * A_SLICE4 + (r >> 2);
            uint comp = r & 3u;
            [[unroll]] for (uint c = 0u; c < 4u; ++c) {
                sA[at + (p + c) * AROW4][comp] = pa[i][c];
            }
        }
    }
}

// store pb into shared buffer `stage`
void stash_b(uint stage, uint lid) {
    [[unroll]] for (uint i = 0u; i < LB; ++i) {
        uint e = lid + i * THREADS;
        if (e < B_LOAD4) {
            sB[stage * B_SLICE4 + e] = pb[i];
        }
    }
}

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint tx = lid % TX;
    uint ty = lid / TX;
    if (WARP_N > 0u) {
        // 32-invocation patches of (32/WARP_N) x WARP_N, TX/WARP_N of them per patch row
        uint pid = lid / 32u;
        uint lane = lid % 32u;
        uint per_row = TX / WARP_N;
        tx = (pid % per_row) * WARP_N + lane % WARP_N;
        ty = (pid / per_row) * (32u / WARP_N) + lane / WARP_N;
    }

    // block coordinates, optionally grouped GROUP_M block rows at a time
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

    float acc[TM * TN];
    [[unroll]] for (uint i = 0u; i < TM * TN; ++i) {
        acc[i] = 0.0;
    }
    vec4 ra[TM / 4u];
    vec4 rb[TN / 4u];

    uint slices = (pc.k + BK - 1u) / BK;
    fetch_a(row0, 0u, lid);
    fetch_b(col0, 0u, lid);
    stash_a(0u, lid);
    stash_b(0u, lid);
    barrier();

    for (uint s = 0u; s < slices; ++s) {
        uint stage = (STAGES == 2u) ? (s & 1u) : 0u;
        bool more = s + 1u < slices;
        uint next = (s + 1u) * BK;
        if (more) {  // in flight while this slice is multiplied
            fetch_a(row0, next, lid);
            if (!SPLIT_ON) {
                fetch_b(col0, next, lid);
            }
        }
        uint abase = stage * A_SLICE4 + ty;
        uint bbase = stage * B_SLICE4 + tx;
        [[unroll]] for (uint p = 0u; p < BK; ++p) {
            if (SPLIT_ON && p == BK / 2u && more) {
                // half way: A's next slice goes to the other buffer, B's is fetched in its registers
                stash_a(stage ^ 1u, lid);
                fetch_b(col0, next, lid);
            }
            [[unroll]] for (uint g = 0u; g < TM / 4u; ++g) {
                ra[g] = sA[abase + p * AROW4 + g * (BM / TM)];
            }
            [[unroll]] for (uint h = 0u; h < TN / 4u; ++h) {
                rb[h] = sB[bbase + p * BROW4 + h * (BN / TN)];
            }
            [[unroll]] for (uint g = 0u; g < TM / 4u; ++g) {
                [[unroll]] for (uint r = 0u; r < 4u; ++r) {
                    [[unroll]] for (uint h = 0u; h < TN / 4u; ++h) {
                        [[unroll]] for (uint c = 0u; c < 4u; ++c) {
                            uint o = (g * 4u + r) * TN + h * 4u + c;
                            acc[o] = fma(ra[g][r], rb[h][c], acc[o]);
                        }
                    }
                }
            }
        }
        if (STAGES == 2u) {
            if (more) {  // the other buffer: everyone finished it before the last barrier
                if (!SPLIT_ON) {
                    stash_a(stage ^ 1u, lid);
                }
                stash_b(stage ^ 1u, lid);
            }
            barrier();
        } else {
            barrier();  // everyone is done with the only buffer
            if (more) {
                stash_a(0u, lid);
                stash_b(0u, lid);
            }
            barrier();
        }
    }

    [[unroll]] for (uint g = 0u; g < TM / 4u; ++g) {
        [[unroll]] for (uint r = 0u; r < 4u; ++r) {
            uint gr = row0 + g * 4u * (BM / TM) + ty * 4u + r;
            if (VEC4 == 2u || gr < pc.m) {
                [[unroll]] for (uint h = 0u; h < TN / 4u; ++h) {
                    uint gc = col0 + h * 4u * (BN / TN) + tx * 4u;
                    uint o = (g * 4u + r) * TN + h * 4u;
                    vec4 v = vec4(acc[o], acc[o + 1u], acc[o + 2u], acc[o + 3u]);
                    if (VEC4 != 0u) {
                        if (VEC4 == 2u || gc < pc.n) {
                            c4[(gr * pc.n + gc) >> 2] = v;
                        }
                    } else {
                        uint base = gr * pc.n + gc;
                        [[unroll]] for (uint c = 0u; c < 4u; ++c) {
                            if (gc + c < pc.n) {
                                c4[(base + c) >> 2][(base + c) & 3u] = v[c];
                            }
                        }
                    }
                }
            }
        }
    }
}
