#version 450
// Fused decode attention, split over the sequence (flash-decoding style), all heads in two
// dispatches.  For every query head h (kv head kvh = h / group, group = n_heads / n_kv_heads):
//   s[t]   = q[h*HD + d] . kc[t*kv_stride + kvh*HD + d] * scale           (t < seq_len)
//   out[h*HD + d] = sum_t exp(s[t] - max s) * vc[t*kv_stride + kvh*HD + d] / sum_t exp(s[t] - max s)
//
// Variants:
//   partial.sg / partial.tree: workgroup (c, y) takes the keys [c*CHUNK, c*CHUNK + CHUNK) of kv
//     head kvh = y / head_blocks and up to HB of its query heads (block y % head_blocks), so each
//     K and V row is read once for HB heads.  It writes, per head, the chunk's maximum score m_c,
//     its sum of exp(s - m_c) l_c and o_c[d] = sum_t exp(s[t] - m_c) * v[t][d]:
//       part[(h*n_chunks + c)*HD + d] = o_c[d],  part[ml_off + 2*(h*n_chunks + c) + {0, 1}] = m_c, l_c.
//     Scores: a team of lanes (a subgroup in .sg, one invocation in .tree) per key row, q from
//     shared memory.  V: DX invocations across d (coalesced rows), WG/DX rows of them over the keys.
//   combine: out[h*HD + d] = sum_c o_c[d] * exp(m_c - M) / sum_c l_c * exp(m_c - M), M = max_c m_c;
//     workgroup (x, h) takes CX columns of head h, its WG/CX rows of invocations split the chunks,
//     each row in one pass with a running maximum (no separate pass for M).
// A NaN anywhere in a head's scores makes its l_c NaN (exp(NaN) is NaN), hence its output.
// DX and CX must be powers of two dividing the local size; the local size a power of two.
//
//   partial.stream (the same partials in the same layout, one pass over K and V): teams of T lanes
//     (aligned clusters of a subgroup) each take one key row at a time, a lane NV = HD/4/T vec4
//     columns of it (16-byte loads, a team reads whole rows), q of the block's HB heads in
//     registers.  Each team loads KU keys' K and V rows before using them (2*KU*NV loads in flight
//     per lane), sums the team's dot products with xor shuffles and keeps an online softmax per
//     head (running max m, sum l, o[d]) in registers: no shared memory and no barrier per key.  At
//     the end the teams of a subgroup merge by shuffles, the subgroups through shared memory.  The
//     chunk (keys per workgroup) is a push constant: one pipeline serves every split.
//     Needs head_dim % 4 == 0, subgroup shuffles and T <= the subgroup size.
//
// kbench: variant partial.sg ATTN_PARTIAL USE_SUBGROUP target=vulkan1.1
// kbench: variant partial.tree ATTN_PARTIAL
// kbench: variant partial.stream ATTN_STREAM target=vulkan1.1
// kbench: variant combine ATTN_COMBINE

#if defined(USE_SUBGROUP)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#if defined(ATTN_STREAM)
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
// [[unroll]]: every loop over the register arrays must unroll, or the arrays go to local memory
// (H200: 3x slower with 8 keys per batch, where the compiler left the loops rolled)
#extension GL_EXT_control_flow_attributes : require
#endif

// query heads per workgroup (sharing one kv head's rows); registers per invocation grow with it
#define HB 4
// keys each team loads before using them (scores), keys each invocation loads (V): loads in flight
#define KU 4
#define KV 8
// the empty maximum (as in softmax.comp: -FLT_MAX, never exp(-inf - -inf))
const float EMPTY_MAX = -3.402823466e38;

layout(local_size_x_id = 0) in;

#if defined(ATTN_PARTIAL)
layout(constant_id = 1) const uint CHUNK = 64;  // keys per workgroup
layout(constant_id = 2) const uint HD = 128;    // head_dim
layout(constant_id = 3) const uint DX = 128;    // invocations across d in the V pass

layout(std430, binding = 0) readonly buffer Query { float q[]; };
layout(std430, binding = 1) readonly buffer KeyCache { float kc[]; };
layout(std430, binding = 2) readonly buffer ValueCache { float vc[]; };
layout(std430, binding = 3) writeonly buffer Partials { float part[]; };

layout(push_constant) uniform Push {
    uint seq_len;
    uint group;        // query heads per kv head
    uint kv_stride;    // floats per cache row (n_kv_heads * HD)
    uint n_chunks;
    uint ml_off;       // index of the first (m, l) pair in part
    uint head_blocks;  // ceil(group / HB)
    float scale;       // 1 / sqrt(HD)
} pc;

shared float s[HB * CHUNK];
shared float qs[HB * HD];
shared float red[HB * gl_WorkGroupSize.x];

// Every invocation gets the maximum (take_max) or the sum of v[j] over the workgroup.
void workgroup_reduce(inout float v[HB], bool take_max) {
    const uint WG = gl_WorkGroupSize.x;
    uint lid = gl_LocalInvocationID.x;
    barrier();  // red may still be read by the previous reduction
#if defined(USE_SUBGROUP)
    for (uint j = 0u; j < HB; ++j) {
        v[j] = take_max ? subgroupMax(v[j]) : subgroupAdd(v[j]);
    }
    if (gl_SubgroupInvocationID == 0u) {
        for (uint j = 0u; j < HB; ++j) {
            red[j * WG + gl_SubgroupID] = v[j];
        }
    }
    barrier();
    for (uint j = 0u; j < HB; ++j) {
        float r = red[j * WG];
        for (uint g = 1u; g < gl_NumSubgroups; ++g) {
            float x = red[j * WG + g];
            r = take_max ? max(r, x) : r + x;
        }
        v[j] = r;
    }
#else
    for (uint j = 0u; j < HB; ++j) {
        red[j * WG + lid] = v[j];
    }
    barrier();
    for (uint stride = WG / 2u; stride > 0u; stride >>= 1u) {
        if (lid < stride) {
            for (uint j = 0u; j < HB; ++j) {
                float a = red[j * WG + lid], b = red[j * WG + lid + stride];
                red[j * WG + lid] = take_max ? max(a, b) : a + b;
            }
        }
        barrier();
    }
    for (uint j = 0u; j < HB; ++j) {
        v[j] = red[j * WG];
    }
#endif
}

void main() {
    const uint WG = gl_WorkGroupSize.x;
    uint lid = gl_LocalInvocationID.x;
    uint c = gl_WorkGroupID.x;
    uint kvh = gl_WorkGroupID.y / pc.head_blocks;
    uint j0 = (gl_WorkGroupID.y % pc.head_blocks) * HB;  // first head of the block in the group
    uint nh = min(uint(HB), pc.group - j0);                // heads this workgroup computes
    uint h0 = kvh * pc.group + j0;
    uint begin = c * CHUNK;
    uint n_keys = min(CHUNK, pc.seq_len - begin);
    uint kv_off = kvh * HD;

    for (uint i = lid; i < HB * HD; i += WG) {
        uint j = i / HD;
        qs[i] = j < nh ? q[(h0 + j) * HD + (i - j * HD)] : 0.0;
    }
    barrier();

    // 1. scores of the chunk's keys for the block's heads -> s
#if defined(USE_SUBGROUP)
    uint team = gl_SubgroupID, n_teams = gl_NumSubgroups;
    uint lane = gl_SubgroupInvocationID, team_size = gl_SubgroupSize;
#else
    uint team = lid, n_teams = WG, lane = 0u, team_size = 1u;
#endif
    for (uint i = team; i < n_keys; i += KU * n_teams) {
        float acc[KU * HB];
        for (uint u = 0u; u < KU * HB; ++u) {
            acc[u] = 0.0;
        }
        for (uint d = lane; d < HD; d += team_size) {
            float k[KU];
            for (uint u = 0u; u < KU; ++u) {
                uint key = i + u * n_teams;
                k[u] = key < n_keys ? kc[(begin + key) * pc.kv_stride + kv_off + d] : 0.0;
            }
            for (uint j = 0u; j < HB; ++j) {
                float qd = qs[j * HD + d];
                for (uint u = 0u; u < KU; ++u) {
                    acc[u * HB + j] = fma(qd, k[u], acc[u * HB + j]);
                }
            }
        }
        for (uint u = 0u; u < KU; ++u) {
            uint key = i + u * n_teams;
            for (uint j = 0u; j < HB; ++j) {
#if defined(USE_SUBGROUP)
                float dot = subgroupAdd(acc[u * HB + j]);
#else
                float dot = acc[u * HB + j];
#endif
                if (lane == 0u && key < n_keys) {
                    s[j * CHUNK + key] = dot * pc.scale;
                }
            }
        }
    }
    barrier();

    // 2. the chunk's maximum and sum of exp per head; s becomes exp(s - m)
    float m[HB], l[HB];
    for (uint j = 0u; j < HB; ++j) {
        m[j] = EMPTY_MAX;
        l[j] = 0.0;
    }
    for (uint i = lid; i < n_keys; i += WG) {
        for (uint j = 0u; j < HB; ++j) {
            m[j] = max(m[j], s[j * CHUNK + i]);
        }
    }
    workgroup_reduce(m, true);
    for (uint i = lid; i < n_keys; i += WG) {
        for (uint j = 0u; j < HB; ++j) {
            float p = exp(s[j * CHUNK + i] - m[j]);
            s[j * CHUNK + i] = p;
            l[j] += p;
        }
    }
    workgroup_reduce(l, false);  // its barriers also publish the exp values in s

    // 3. o_c[d] = sum_t p[t] * v[t][d], DX columns at a time
    uint rows = WG / DX;
    uint lx = lid % DX, ly = lid / DX;
    for (uint d0 = 0u; d0 < HD; d0 += DX) {
        uint d = d0 + lx;
        float acc[HB];
        for (uint j = 0u; j < HB; ++j) {
            acc[j] = 0.0;
        }
        if (d < HD) {
            for (uint i = ly; i < n_keys; i += KV * rows) {
                float v[KV];
                for (uint u = 0u; u < KV; ++u) {
                    uint key = i + u * rows;
                    v[u] = key < n_keys ? vc[(begin + key) * pc.kv_stride + kv_off + d] : 0.0;
                }
                for (uint u = 0u; u < KV; ++u) {
                    uint key = min(i + u * rows, n_keys - 1u);  // v[u] is 0 beyond the chunk
                    for (uint j = 0u; j < HB; ++j) {
                        acc[j] = fma(s[j * CHUNK + key], v[u], acc[j]);
                    }
                }
            }
        }
        if (rows > 1u) {
            barrier();
            for (uint j = 0u; j < HB; ++j) {
                red[j * WG + lid] = acc[j];
            }
            barrier();
            for (uint stride = rows / 2u; stride > 0u; stride >>= 1u) {
                if (ly < stride) {
                    for (uint j = 0u; j < HB; ++j) {
                        red[j * WG + lid] += red[j * WG + lid + stride * DX];
                    }
                }
                barrier();
            }
            for (uint j = 0u; j < HB; ++j) {
                acc[j] = red[j * WG + lx];
            }
        }
        if (ly == 0u && d < HD) {
            for (uint j = 0u; j < HB; ++j) {
                if (j < nh) {
                    part[((h0 + j) * pc.n_chunks + c) * HD + d] = acc[j];
                }
            }
        }
    }
    if (lid == 0u) {
        for (uint j = 0u; j < HB; ++j) {
            if (j < nh) {
                uint pair = pc.ml_off + 2u * ((h0 + j) * pc.n_chunks + c);
                part[pair] = m[j];
                part[pair + 1u] = l[j];
            }
        }
    }
}

#elif defined(ATTN_STREAM)
layout(constant_id = 1) const uint HD = 128;    // head_dim, a multiple of 4
layout(constant_id = 2) const uint T = 32;      // lanes per key row: a power of two <= the subgroup size
layout(constant_id = 3) const uint HBS = 4;     // query heads per workgroup (sharing the kv head's rows)
layout(constant_id = 4) const uint KUS = 4;     // keys per team loaded before use
layout(constant_id = 5) const uint SLOTS = 8;   // >= subgroups per workgroup (shared memory of the merge)
// 1: the grid is (kv head blocks, chunks), so workgroups launched together read neighbouring
// heads of the same cache rows; 0: (chunks, kv head blocks)
layout(constant_id = 6) const uint HEADS_FIRST = 0;
// 1: each team loads its next batch before using the current one (twice the registers)
layout(constant_id = 7) const uint PREFETCH = 0;
// the subgroup size (gl_SubgroupSize as a constant: the team merge's loop unrolls); a Vulkan 1.1
// shader's subgroups are the device's subgroupSize
layout(constant_id = 8) const uint SG = 32;
const uint HD4 = HD / 4u;
const uint NV = (HD4 + T - 1u) / T;             // vec4 columns per lane

layout(std430, binding = 0) readonly buffer Query { vec4 q[]; };
layout(std430, binding = 1) readonly buffer KeyCache { vec4 kc[]; };
layout(std430, binding = 2) readonly buffer ValueCache { vec4 vc[]; };
layout(std430, binding = 3) writeonly buffer Partials { float part[]; };

layout(push_constant) uniform Push {
    uint seq_len;
    uint group;        // query heads per kv head
    uint kv_stride;    // floats per cache row (n_kv_heads * HD)
    uint n_chunks;
    uint ml_off;       // index of the first (m, l) pair in part
    uint head_blocks;  // ceil(group / HBS)
    uint chunk;        // keys per workgroup
    float scale;       // 1 / sqrt(HD)
} pc;

shared vec4 so[SLOTS * HBS * HD4];

// K and V rows of the keys first, first + n_teams, ... (KUS of them) of this team; zeros beyond
// the chunk (no load)
#define LOAD_BATCH(first, K, V)                                   \
    [[unroll]] for (uint u = 0u; u < KUS; ++u) {                             \
        uint key = (first) + u * n_teams;                         \
        [[unroll]] for (uint i = 0u; i < NV; ++i) {                          \
            uint d4 = lane + i * T;                               \
            bool live = key < n_keys && d4 < HD4;                 \
            uint a = row0 + key * stride4 + d4;                   \
            K[u * NV + i] = live ? kc[a] : vec4(0.0);             \
            V[u * NV + i] = live ? vc[a] : vec4(0.0);             \
        }                                                         \
    }
shared float sm[SLOTS * HBS];
shared float sl[SLOTS * HBS];

void main() {
    const uint WG = gl_WorkGroupSize.x;
    uint lid = gl_LocalInvocationID.x;
    uint sgl = gl_SubgroupInvocationID;
    uint lane = sgl % T;
    uint per_sg = gl_SubgroupSize / T;
    uint team = gl_SubgroupID * per_sg + sgl / T;
    uint n_teams = gl_NumSubgroups * per_sg;
    uint c = HEADS_FIRST != 0u ? gl_WorkGroupID.y : gl_WorkGroupID.x;
    uint block = HEADS_FIRST != 0u ? gl_WorkGroupID.x : gl_WorkGroupID.y;
    uint kvh = block / pc.head_blocks;
    uint j0 = (block % pc.head_blocks) * HBS;
    uint nh = min(HBS, pc.group - j0);
    uint h0 = kvh * pc.group + j0;
    uint begin = c * pc.chunk;
    uint n_keys = min(pc.chunk, pc.seq_len - begin);
    uint stride4 = pc.kv_stride / 4u;
    uint row0 = begin * stride4 + kvh * HD4;

    vec4 qr[HBS * NV];
    vec4 o[HBS * NV];
    float m[HBS], l[HBS];
    [[unroll]] for (uint j = 0u; j < HBS; ++j) {
        [[unroll]] for (uint i = 0u; i < NV; ++i) {
            uint d4 = lane + i * T;
            qr[j * NV + i] = (j < nh && d4 < HD4) ? q[(h0 + j) * HD4 + d4] : vec4(0.0);
            o[j * NV + i] = vec4(0.0);
        }
        m[j] = EMPTY_MAX;
        l[j] = 0.0;
    }

    // every lane of a team runs the same iterations, so the shuffles below (within the team) see
    // only active lanes
    uint step = KUS * n_teams;
    vec4 kr[KUS * NV], vr[KUS * NV];
    LOAD_BATCH(team, kr, vr);
    for (uint i0 = team; i0 < n_keys; i0 += step) {
        // PREFETCH: the next batch's loads go out before this batch's arithmetic
        vec4 kn[KUS * NV], vn[KUS * NV];
        if (PREFETCH != 0u) {
            LOAD_BATCH(i0 + step, kn, vn);
        }
        float s[KUS * HBS];
        [[unroll]] for (uint u = 0u; u < KUS; ++u) {
            [[unroll]] for (uint j = 0u; j < HBS; ++j) {
                float acc = 0.0;
                [[unroll]] for (uint i = 0u; i < NV; ++i) {
                    acc += dot(qr[j * NV + i], kr[u * NV + i]);
                }
                s[u * HBS + j] = acc;
            }
        }
        [[unroll]] for (uint off = T / 2u; off > 0u; off >>= 1u) {
            [[unroll]] for (uint x = 0u; x < KUS * HBS; ++x) {
                s[x] += subgroupShuffleXor(s[x], off);
            }
        }
        [[unroll]] for (uint j = 0u; j < HBS; ++j) {
            float mx = m[j];
            [[unroll]] for (uint u = 0u; u < KUS; ++u) {
                s[u * HBS + j] *= pc.scale;
                if (i0 + u * n_teams < n_keys) {
                    mx = max(mx, s[u * HBS + j]);
                }
            }
            float alpha = exp(m[j] - mx);
            m[j] = mx;
            l[j] *= alpha;
            [[unroll]] for (uint i = 0u; i < NV; ++i) {
                o[j * NV + i] *= alpha;
            }
            [[unroll]] for (uint u = 0u; u < KUS; ++u) {
                // beyond the chunk: p = 0 (v is 0 there too)
                float p = i0 + u * n_teams < n_keys ? exp(s[u * HBS + j] - mx) : 0.0;
                l[j] += p;
                [[unroll]] for (uint i = 0u; i < NV; ++i) {
                    o[j * NV + i] = fma(vec4(p), vr[u * NV + i], o[j * NV + i]);
                }
            }
        }
        if (PREFETCH == 0u) {
            LOAD_BATCH(i0 + step, kn, vn);
        }
        [[unroll]] for (uint x = 0u; x < KUS * NV; ++x) {
            kr[x] = kn[x];
            vr[x] = vn[x];
        }
    }

    // merge the teams of a subgroup (lanes with the same column, T apart); an empty team has
    // m = EMPTY_MAX, l = 0, o = 0 and weighs exp(EMPTY_MAX - max) = 0 against any real one
    [[unroll]] for (uint off = T; off < SG; off <<= 1u) {
        [[unroll]] for (uint j = 0u; j < HBS; ++j) {
            float mo = subgroupShuffleXor(m[j], off);
            float lo = subgroupShuffleXor(l[j], off);
            float mx = max(m[j], mo);
            float a = exp(m[j] - mx), b = exp(mo - mx);
            l[j] = l[j] * a + lo * b;
            [[unroll]] for (uint i = 0u; i < NV; ++i) {
                vec4 oo = subgroupShuffleXor(o[j * NV + i], off);
                o[j * NV + i] = o[j * NV + i] * a + oo * b;
            }
            m[j] = mx;
        }
    }
    uint sg = gl_SubgroupID;
    if (sgl < T) {
        [[unroll]] for (uint j = 0u; j < HBS; ++j) {
            [[unroll]] for (uint i = 0u; i < NV; ++i) {
                uint d4 = lane + i * T;
                if (d4 < HD4) {
                    so[(sg * HBS + j) * HD4 + d4] = o[j * NV + i];
                }
            }
            if (lane == 0u) {
                sm[sg * HBS + j] = m[j];
                sl[sg * HBS + j] = l[j];
            }
        }
    }
    barrier();

    // merge the subgroups: one (head, vec4 column) per invocation
    uint n_sg = gl_NumSubgroups;
    for (uint x = lid; x < HBS * HD4; x += WG) {
        uint j = x / HD4, d4 = x - j * HD4;
        if (j >= nh) {
            continue;
        }
        float mx = EMPTY_MAX;
        for (uint g = 0u; g < n_sg; ++g) {
            mx = max(mx, sm[g * HBS + j]);
        }
        vec4 acc = vec4(0.0);
        float lsum = 0.0;
        for (uint g = 0u; g < n_sg; ++g) {
            float w = exp(sm[g * HBS + j] - mx);
            acc = fma(vec4(w), so[(g * HBS + j) * HD4 + d4], acc);
            lsum = fma(sl[g * HBS + j], w, lsum);
        }
        uint base = ((h0 + j) * pc.n_chunks + c) * HD + 4u * d4;
        part[base] = acc.x;
        part[base + 1u] = acc.y;
        part[base + 2u] = acc.z;
        part[base + 3u] = acc.w;
        if (d4 == 0u) {
            uint pair = pc.ml_off + 2u * ((h0 + j) * pc.n_chunks + c);
            part[pair] = mx;
            part[pair + 1u] = lsum;
        }
    }
}

#else  // ATTN_COMBINE
layout(constant_id = 1) const uint HD = 128;
layout(constant_id = 2) const uint CX = 32;  // columns per workgroup

layout(std430, binding = 0) readonly buffer Partials { float part[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint n_chunks;
    uint ml_off;
} pc;

shared float red_m[gl_WorkGroupSize.x];
shared float red_a[gl_WorkGroupSize.x];
shared float red_l[gl_WorkGroupSize.x];

// (m, l, acc) absorbs (mo, lo, ao): both rescaled to the larger maximum.  An empty side has
// m = EMPTY_MAX, l = acc = 0 and weighs exp(EMPTY_MAX - max) = 0 against any real one.
void absorb(inout float m, inout float l, inout float acc, float mo, float lo, float ao) {
    float mx = max(m, mo);
    float a = exp(m - mx), b = exp(mo - mx);
    l = l * a + lo * b;
    acc = acc * a + ao * b;
    m = mx;
}

void main() {
    const uint WG = gl_WorkGroupSize.x;
    uint lid = gl_LocalInvocationID.x;
    uint rows = WG / CX;
    uint lx = lid % CX, ly = lid / CX;
    uint h = gl_WorkGroupID.y;
    uint d = gl_WorkGroupID.x * CX + lx;
    uint pairs = pc.ml_off + 2u * h * pc.n_chunks;

    // one pass: every row takes its chunks with a running maximum, then a tree over the rows
    float m = EMPTY_MAX, l = 0.0, acc = 0.0;
    for (uint c = ly; c < pc.n_chunks; c += rows) {
        absorb(m, l, acc, part[pairs + 2u * c], part[pairs + 2u * c + 1u],
               d < HD ? part[(h * pc.n_chunks + c) * HD + d] : 0.0);
    }
    red_m[lid] = m;
    red_l[lid] = l;
    red_a[lid] = acc;
    barrier();
    for (uint stride = rows / 2u; stride > 0u; stride >>= 1u) {
        if (ly < stride) {
            uint other = lid + stride * CX;
            absorb(m, l, acc, red_m[other], red_l[other], red_a[other]);
            red_m[lid] = m;
            red_l[lid] = l;
            red_a[lid] = acc;
        }
        barrier();
    }
    if (ly == 0u && d < HD) {
        o[h * HD + d] = acc / l;
    }
}
#endif
