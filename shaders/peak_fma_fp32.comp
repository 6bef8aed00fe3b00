#version 450
// kbench peak "fp32_fma": FP32 fused multiply-add throughput. Each invocation runs eight
// independent vec4 FMA chains for `iters` steps (8 chains * 4 lanes * 2 FLOPs = 64 FLOPs per
// step) and stores one float so the compiler cannot drop the work.

layout(local_size_x_id = 0) in;

layout(std430, binding = 0) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint iters;
} p;

void main() {
    uint gid = gl_GlobalInvocationID.x;
    float s = float(gid & 255u) * 1e-6;
    vec4 m = vec4(0.999, 0.998, 0.997, 0.996);
    vec4 c = vec4(1e-7, 2e-7, 3e-7, 4e-7);
    vec4 x0 = vec4(s), x1 = x0 + 0.1, x2 = x0 + 0.2, x3 = x0 + 0.3;
    vec4 x4 = x0 + 0.4, x5 = x0 + 0.5, x6 = x0 + 0.6, x7 = x0 + 0.7;
    for (uint k = 0u; k < p.iters; ++k) {
        x0 = fma(x0, m, c); x1 = fma(x1, m, c); x2 = fma(x2, m, c); x3 = fma(x3, m, c);
        x4 = fma(x4, m, c); x5 = fma(x5, m, c); x6 = fma(x6, m, c); x7 = fma(x7, m, c);
    }
    vec4 r = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
    o[gid] = r.x + r.y + r.z + r.w;
}
