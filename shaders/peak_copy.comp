#version 450
// kbench peak "copy_bandwidth": dst = src, one vec4 per invocation per step, grid-stride loop so
// that the dispatch stays within maxComputeWorkGroupCount on any buffer size. Bytes moved =
// 2 * 16 * n4 (read + write), the way clpeak/vkpeak count global memory bandwidth.

layout(local_size_x_id = 0) in;

layout(std430, binding = 0) readonly buffer Src { vec4 src[]; };
layout(std430, binding = 1) writeonly buffer Dst { vec4 dst[]; };

layout(push_constant) uniform Push {
    uint n4;  // vec4 elements
} p;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n4; i += stride) {
        dst[i] = src[i];
    }
}
