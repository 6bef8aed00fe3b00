#version 450
// kbench peak "fp16_fma": FP16 fused multiply-add throughput (needs shaderFloat16). Eight
// independent f16vec4 FMA chains per invocation (64 FLOPs per step); the result is stored as
// float32 so no 16-bit storage feature is needed.

#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x_id = 0) in;

layout(std430, binding = 0) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Push {
    uint iters;
} p;

void main() {
    uint gid = gl_GlobalInvocationID.x;
    float16_t s = float16_t(float(gid & 255u) * 1e-3);
    f16vec4 m = f16vec4(0.999hf, 0.998hf, 0.997hf, 0.996hf);
    f16vec4 c = f16vec4(1e-3hf, 2e-3hf, 3e-3hf, 4e-3hf);
    f16vec4 x0 = f16vec4(s), x1 = x0 + 0.1hf, x2 = x0 + 0.2hf, x3 = x0 + 0.3hf;
    f16vec4 x4 = x0 + 0.4hf, x5 = x0 + 0.5hf, x6 = x0 + 0.6hf, x7 = x0 + 0.7hf;
    for (uint k = 0u; k < p.iters; ++k) {
        x0 = fma(x0, m, c); x1 = fma(x1, m, c); x2 = fma(x2, m, c); x3 = fma(x3, m, c);
        x4 = fma(x4, m, c); x5 = fma(x5, m, c); x6 = fma(x6, m, c); x7 = fma(x7, m, c);
    }
    f16vec4 r = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
    o[gid] = float(r.x) + float(r.y) + float(r.z) + float(r.w);
}
