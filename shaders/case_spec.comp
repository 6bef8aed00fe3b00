#version 450
// kbench runtime case "kp_spec_consts": out[i] = a[i] * SCALE + BIAS + offset, with two float
// specialization constants and a mixed float/uint push-constant block.

layout(local_size_x = 64) in;

layout(constant_id = 0) const float SCALE = 1.0;
layout(constant_id = 1) const float BIAS = 0.0;

layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) writeonly buffer O { float o[]; };

layout(push_constant) uniform Push {
    float offset;
    uint n;  // elements
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < p.n) {
        o[i] = a[i] * SCALE + BIAS + p.offset;
    }
}
