#version 450
// fp32 matrix product C[m,n] = A[m,k] @ B[k,n], all row-major, any m, n, k >= 1.
//
// Each workgroup computes a BM x BN tile of C; each invocation a TM x TN sub-tile held in
// registers.  A and B are staged through shared memory in BK-deep slices (zero-padded at the
// matrix edges, so no size needs to be a multiple of a tile).  The invocation's rows and
// columns are strided by BM/TM and BN/TN so that neighbouring invocations read neighbouring
// shared-memory words and write neighbouring elements of C.
// local_size_x must equal (BM/TM) * (BN/TN); the backend derives all of them from the
// device's limits.  Grid: (ceil(n/BN), ceil(m/BM)).

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 64;
layout(constant_id = 2) const uint BN = 64;
layout(constant_id = 3) const uint BK = 16;
layout(constant_id = 4) const uint TM = 4;
layout(constant_id = 5) const uint TN = 4;

layout(std430, binding = 0) readonly buffer MatA { float a[]; };
layout(std430, binding = 1) readonly buffer MatB { float b[]; };
layout(std430, binding = 2) writeonly buffer MatC { float c[]; };

layout(push_constant) uniform Push {
    uint m;
    uint n;
    uint k;
} pc;

shared float tile_a[BK * BM];  // tile_a[p * BM + r] = A[row0 + r, k0 + p]
shared float tile_b[BK * BN];  // tile_b[p * BN + j] = B[k0 + p, col0 + j]

void main() {
    const uint threads = (BM / TM) * (BN / TN);
    const uint row_step = BM / TM;
    const uint col_step = BN / TN;
    uint lid = gl_LocalInvocationID.x;
    uint tr = lid / col_step;
    uint tc = lid % col_step;
    uint row0 = gl_WorkGroupID.y * BM;
    uint col0 = gl_WorkGroupID.x * BN;

    float acc[TM * TN];
    for (uint i = 0u; i < TM * TN; ++i) {
        acc[i] = 0.0;
    }
    float ra[TM];
    float rb[TN];

    for (uint k0 = 0u; k0 < pc.k; k0 += BK) {
        for (uint e = lid; e < BM * BK; e += threads) {
            uint r = e / BK;
            uint p = e % BK;
            uint gr = row0 + r;
            uint gp = k0 + p;
            tile_a[p * BM + r] = (gr < pc.m && gp < pc.k) ? a[gr * pc.k + gp] : 0.0;
        }
        for (uint e = lid; e < BK * BN; e += threads) {
            uint p = e / BN;
            uint j = e % BN;
            uint gp = k0 + p;
            uint gc = col0 + j;
            tile_b[p * BN + j] = (gp < pc.k && gc < pc.n) ? b[gp * pc.n + gc] : 0.0;
        }
        barrier();
        for (uint p = 0u; p < BK; ++p) {
            for (uint i = 0u; i < TM; ++i) {
                ra[i] = tile_a[p * BM + tr + i * row_step];
            }
            for (uint j = 0u; j < TN; ++j) {
                rb[j] = tile_b[p * BN + tc + j * col_step];
            }
            for (uint i = 0u; i < TM; ++i) {
                for (uint j = 0u; j < TN; ++j) {
                    acc[i * TN + j] = fma(ra[i], rb[j], acc[i * TN + j]);
                }
            }
        }
        barrier();
    }

    for (uint i = 0u; i < TM; ++i) {
        uint gr = row0 + tr + i * row_step;
        if (gr >= pc.m) {
            break;
        }
        for (uint j = 0u; j < TN; ++j) {
            uint gc = col0 + tc + j * col_step;
            if (gc < pc.n) {
                c[gr * pc.n + gc] = acc[i * TN + j];
            }
        }
    }
}
