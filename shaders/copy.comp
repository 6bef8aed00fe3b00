#version 450
// Buffer-to-buffer copy of whole 4-byte words (variant words) or 16-byte vectors (variant
// vec4), one unit per invocation: dst[dst_off + i] = src[src_off + i] for i < count, offsets
// and count in units.  The backend uses it for copies whose offsets and size are aligned to
// the unit (a shader copy runs at full memory bandwidth where some drivers' vkCmdCopyBuffer
// does not) and the runtime's transfer copy for everything else.
//
// kbench: variant words UNIT_WORDS
// kbench: variant vec4 UNIT_VEC4

layout(local_size_x_id = 0) in;

#if defined(UNIT_VEC4)
#define UNIT uvec4
#else
#define UNIT uint
#endif

layout(std430, binding = 0) readonly buffer Src { UNIT src[]; };
layout(std430, binding = 1) writeonly buffer Dst { UNIT dst[]; };

layout(push_constant) uniform Push {
    uint src_off;
    uint dst_off;
    uint count;
} pc;

void main() {
    uint group = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    uint i = group * gl_WorkGroupSize.x + gl_LocalInvocationID.x;
    if (i < pc.count) {
        dst[pc.dst_off + i] = src[pc.src_off + i];
    }
}
