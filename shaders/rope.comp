#version 450
// Rotary position embedding, interleaved pairs (GPT-J / ggml "normal" mode), in place on q and k.
// For head h, pair i < head_dim/2: theta = pos * freq_base^(-2i/head_dim) and
// (x0, x1) <- (x0*cos - x1*sin, x0*sin + x1*cos).  One invocation per pair; invocations
// [0, nq_pairs) rotate q, the rest rotate k.  Pair t of a tensor covers elements 2t, 2t+1.
//
// Accuracy at large positions: the angle is computed in turns (theta / 2pi) from a table of
// per-pair frequencies g_i = freq_base^(-2i/head_dim) / 2pi that the host computes in float64
// and splits as g0 + g1 + g2, where g0 and g1 carry 12 significant bits each.  With
// pos = pos_hi + pos_lo (12 significant bits each, pos < 2^24), the products pos_x * g0 and
// pos_x * g1 are exact in float32, so their fractional parts are exact; only the tiny
// pos * g2 term and the final sum of fractions round.  sin and cos are then evaluated by
// polynomials on [-pi/4, pi/4] after a quadrant reduction, not by the built-ins (Vulkan
// bounds their error only to 2^-11).  `precise` keeps the compiler from fusing or
// reordering the exact steps.

layout(local_size_x_id = 0) in;

layout(std430, binding = 0) buffer Q { vec2 q[]; };
layout(std430, binding = 1) buffer K { vec2 k[]; };
layout(std430, binding = 2) readonly buffer Freq { vec4 freq[]; };  // (g0, g1, g2, unused)

layout(push_constant) uniform Push {
    uint pos;
    uint half_dim;     // head_dim / 2
    uint nq_pairs;     // n_heads_q * half_dim
    uint total_pairs;  // (n_heads_q + n_heads_k) * half_dim
} pc;

const float TWO_PI = 6.28318530717958647692;

float frac_exact(float v) {
    precise float r = v - floor(v);
    return r;
}

// Fraction of a turn in [-0.5, 0.5] for pos * g_i.
float turns(uint i) {
    vec4 g = freq[i];
    precise float pos_hi = float(pc.pos & 0xFFF000u);
    precise float pos_lo = float(pc.pos & 0xFFFu);
    precise float t0 = frac_exact(pos_hi * g.x);
    precise float t1 = frac_exact(pos_lo * g.x);
    precise float t2 = frac_exact(pos_hi * g.y);
    precise float t3 = frac_exact(pos_lo * g.y);
    precise float t4 = frac_exact(float(pc.pos) * g.z);
    precise float s = frac_exact(t0 + t1) + frac_exact(t2 + t3);
    s = frac_exact(s + t4);
    return s - round(s);
}

// sin and cos of 2*pi*t for t in [-0.5, 0.5].
vec2 sincos_turns(float t) {
    float quadrant = round(t * 4.0);
    precise float rest = t - quadrant * 0.25;  // exact, |rest| <= 1/8 turn
    float x = rest * TWO_PI;                   // |x| <= pi/4
    float x2 = x * x;
    // Taylor polynomials; truncation error below 2e-9 on [-pi/4, pi/4].
    float s = x * (1.0 + x2 * (-1.0 / 6.0 + x2 * (1.0 / 120.0 + x2 * (-1.0 / 5040.0 + x2 * (1.0 / 362880.0)))));
    float c = 1.0 + x2 * (-0.5 + x2 * (1.0 / 24.0 + x2 * (-1.0 / 720.0 + x2 * (1.0 / 40320.0 + x2 * (-1.0 / 3628800.0)))));
    int qi = int(quadrant) & 3;
    if (qi == 0) return vec2(s, c);
    if (qi == 1) return vec2(c, -s);
    if (qi == 2) return vec2(-s, -c);
    return vec2(-c, s);
}

vec2 rotate(vec2 v, vec2 sc) {
    return vec2(v.x * sc.y - v.y * sc.x, v.x * sc.x + v.y * sc.y);
}

void main() {
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint t = group * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (t >= pc.total_pairs) {
        return;
    }
    if (t < pc.nq_pairs) {
        vec2 sc = sincos_turns(turns(t % pc.half_dim));
        q[t] = rotate(q[t], sc);
    } else {
        uint tk = t - pc.nq_pairs;
        vec2 sc = sincos_turns(turns(tk % pc.half_dim));
        k[tk] = rotate(k[tk], sc);
    }
}
