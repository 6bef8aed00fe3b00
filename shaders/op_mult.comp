#version 450
// The runtime's built-in OpMult (as Kompute's): out[i] = a[i] * b[i]; 64 invocations per workgroup,
// bounds-checked against the element count;
// large grids are spread over y (lavapipe allows only 65535 workgroups along x).
layout(local_size_x = 64) in;
layout(set = 0, binding = 0) readonly buffer A { float a[]; };
layout(set = 0, binding = 1) readonly buffer B { float b[]; };
layout(set = 0, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform P { uint n; } p;
void main() {
    uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
    if (i < p.n) o[i] = a[i] * b[i];
}
