#version 450
// kbench runtime case "kp_mul": out[i] = a[i] * b[i] in the tensors' own element type, the way a
// Kompute user multiplies typed tensors. 8/16/64-bit types need the matching device features.
//
// kbench: variant float32 T=float
// kbench: variant float64 T=double
// kbench: variant int32 T=int
// kbench: variant uint32 T=uint
// kbench: variant int64 T=int64_t NEED_INT64
// kbench: variant int16 T=int16_t NEED_INT16
// kbench: variant float16 T=float16_t NEED_FLOAT16
// kbench: variant int8 T=int8_t NEED_INT8
// kbench: variant uint8 T=uint8_t NEED_INT8

#if defined(NEED_INT64)
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#endif
#if defined(NEED_INT16)
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_EXT_shader_16bit_storage : require
#endif
#if defined(NEED_FLOAT16)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_16bit_storage : require
#endif
#if defined(NEED_INT8)
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_8bit_storage : require
#endif

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer A { T a[]; };
layout(std430, binding = 1) readonly buffer B { T b[]; };
layout(std430, binding = 2) writeonly buffer O { T o[]; };

layout(push_constant) uniform Push {
    uint n;  // elements
} p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < p.n) {
        o[i] = a[i] * b[i];
    }
}
