#version 450
// Elementwise ops over one flat float32 vector: add, mul (element_mul) and silu.
// One vec4 per invocation; the last, partial vec4 is handled component by component so that
// no byte past `size` floats is read or written (outputs may be exactly size*4 bytes long).
// Inputs may alias the output (in-place ops): every invocation reads its elements before it
// writes them and touches no other invocation's elements.
//
// kbench: variant add OP_ADD
// kbench: variant mul OP_MUL
// kbench: variant silu OP_SILU

layout(local_size_x_id = 0) in;

#if defined(OP_SILU)
layout(std430, binding = 0) readonly buffer InA { vec4 a[]; };
layout(std430, binding = 1) writeonly buffer Out { vec4 o[]; };
#else
layout(std430, binding = 0) readonly buffer InA { vec4 a[]; };
layout(std430, binding = 1) readonly buffer InB { vec4 b[]; };
layout(std430, binding = 2) writeonly buffer Out { vec4 o[]; };
#endif

layout(push_constant) uniform Push {
    uint size;  // elements
} pc;

#if defined(OP_SILU)
vec4 apply4(uint i) { vec4 x = a[i]; return x / (1.0 + exp(-x)); }
float apply1(uint i, uint c) { float x = a[i][c]; return x / (1.0 + exp(-x)); }
#elif defined(OP_ADD)
vec4 apply4(uint i) { return a[i] + b[i]; }
float apply1(uint i, uint c) { return a[i][c] + b[i][c]; }
#else
vec4 apply4(uint i) { return a[i] * b[i]; }
float apply1(uint i, uint c) { return a[i][c] * b[i][c]; }
#endif

void main() {
    // Grids larger than maxComputeWorkGroupCount[0] are spread over y.
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint i = group * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    uint first = i * 4u;
    if (first >= pc.size) {
        return;
    }
    if (first + 4u <= pc.size) {
        o[i] = apply4(i);
    } else {
        for (uint c = 0u; first + c < pc.size; ++c) {
            o[i][c] = apply1(i, c);
        }
    }
}
