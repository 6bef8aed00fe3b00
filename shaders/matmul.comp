#version 450
// fp32 matrix product C[m,n] = A[m,k] @ B[k,n], all row-major, any m, n, k >= 1.
//
// Each workgroup computes a BM x BN tile of C; each invocation a TM x TN block of it held in
// registers, as TM/4 x TN/4 groups of 4x4 so that operands come from shared memory as vec4
// loads.  The invocation grid is (BM/TM) x (BN/TN); the 4-row groups of one invocation are
// BM/(TM/4) rows apart (and likewise for columns), so that neighbouring invocations read
// neighbouring vec4s of shared memory and write neighbouring vec4s of C.
// A and B pass through shared memory in BK-deep slices, zero-padded at the matrix edges (no
// size needs to be a multiple of a tile).  While one slice is multiplied, the next is already
// loaded into registers.  The A slice is stored transposed (k-major) with a padded stride so
// that the transposing stores do not all fall into one bank.
// Constraints (checked by the backend): TM and TN multiples of 4, BM*BK and BK*BN multiples of
// the invocation count, local_size_x = (BM/TM)*(BN/TN).  Grid: (ceil(n/BN), ceil(m/BM)).

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 128;
layout(constant_id = 2) const uint BN = 128;
layout(constant_id = 3) const uint BK = 16;
layout(constant_id = 4) const uint TM = 8;
layout(constant_id = 5) const uint TN = 8;

layout(std430, binding = 0) readonly buffer MatA { float a[]; };
layout(std430, binding = 1) readonly buffer MatB { float b[]; };
layout(std430, binding = 2) writeonly buffer MatC { float c[]; };

layout(push_constant) uniform Push {
    uint m;
    uint n;
    uint k;
} pc;

const uint ROW_T = BM / TM;            // invocations along the tile's rows
const uint COL_T = BN / TN;            // ... and columns
const uint THREADS = ROW_T * COL_T;
const uint A_PER = (BM * BK) / THREADS;  // A-slice elements each invocation moves
const uint B_PER = (BK * BN) / THREADS;
const uint SA = BM + 4;                // padded stride of the transposed A slice (floats)

shared vec4 tile_a[(BK * SA) / 4];     // element (p, r) at float index p*SA + r
shared vec4 tile_b[(BK * BN) / 4];     // element (p, j) at float index p*BN + j

float next_a[A_PER];
float next_b[B_PER];

void load_slice(uint k0, uint row0, uint col0) {
    uint lid = gl_LocalInvocationID.x;
    for (uint q = 0u; q < A_PER; ++q) {
        uint e = lid + q * THREADS;
        uint r = e / BK;
        uint p = e % BK;
        uint gr = row0 + r;
        uint gp = k0 + p;
        next_a[q] = (gr < pc.m && gp < pc.k) ? a[gr * pc.k + gp] : 0.0;
    }
    for (uint q = 0u; q < B_PER; ++q) {
        uint e = lid + q * THREADS;
        uint p = e / BN;
        uint j = e % BN;
        uint gp = k0 + p;
        uint gc = col0 + j;
        next_b[q] = (gp < pc.k && gc < pc.n) ? b[gp * pc.n + gc] : 0.0;
    }
}

void store_slice() {
    uint lid = gl_LocalInvocationID.x;
    for (uint q = 0u; q < A_PER; ++q) {
        uint e = lid + q * THREADS;
        uint f = (e % BK) * SA + e / BK;
        tile_a[f >> 2][f & 3u] = next_a[q];
    }
    for (uint q = 0u; q < B_PER; ++q) {
        uint f = lid + q * THREADS;  // = p*BN + j
        tile_b[f >> 2][f & 3u] = next_b[q];
    }
}

void main() {
    uint lid = gl_LocalInvocationID.x;
    uint tr = lid / COL_T;
    uint tc = lid % COL_T;
    uint row0 = gl_WorkGroupID.y * BM;
    uint col0 = gl_WorkGroupID.x * BN;

    vec4 acc[TM * (TN / 4)];  // acc[row * (TN/4) + h] holds 4 columns
    for (uint i = 0u; i < TM * (TN / 4); ++i) {
        acc[i] = vec4(0.0);
    }

    load_slice(0u, row0, col0);
    store_slice();
    barrier();
    for (uint k0 = 0u; k0 < pc.k; k0 += BK) {
        bool more = k0 + BK < pc.k;
        if (more) {
            load_slice(k0 + BK, row0, col0);  // in flight while this slice is multiplied
        }
        for (uint p = 0u; p < BK; ++p) {
            vec4 va[TM / 4];
            vec4 vb[TN / 4];
            for (uint g = 0u; g < TM / 4; ++g) {
                va[g] = tile_a[(p * SA) / 4u + g * ROW_T + tr];
            }
            for (uint h = 0u; h < TN / 4; ++h) {
                vb[h] = tile_b[(p * BN) / 4u + h * COL_T + tc];
            }
            for (uint g = 0u; g < TM / 4; ++g) {
                for (uint i = 0u; i < 4u; ++i) {
                    for (uint h = 0u; h < TN / 4; ++h) {
                        uint idx = (g * 4u + i) * (TN / 4) + h;
                        acc[idx] = fma(vec4(va[g][i]), vb[h], acc[idx]);
                    }
                }
            }
        }
        barrier();
        if (more) {
            store_slice();
            barrier();
        }
    }

    for (uint g = 0u; g < TM / 4; ++g) {
        for (uint i = 0u; i < 4u; ++i) {
            uint gr = row0 + g * 4u * ROW_T + tr * 4u + i;
            if (gr >= pc.m) {
                continue;
            }
            for (uint h = 0u; h < TN / 4; ++h) {
                uint gc = col0 + h * 4u * COL_T + tc * 4u;
                vec4 v = acc[(g * 4u + i) * (TN / 4) + h];
                for (uint j = 0u; j < 4u; ++j) {
                    if (gc + j < pc.n) {
                        c[gr * pc.n + gc + j] = v[j];
                    }
                }
            }
        }
    }
}
