#version 450
// A kernel of your own: out = x * sigmoid(x), one float per invocation, 128 per workgroup.
layout(local_size_x = 128) in;
layout(set = 0, binding = 0) readonly buffer In { float x[]; };
layout(set = 0, binding = 1) writeonly buffer Out { float y[]; };
layout(push_constant) uniform Push { uint n; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < n) {
        float v = x[i];
        y[i] = v / (1.0 + exp(-v));
    }
}
