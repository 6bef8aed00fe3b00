#version 450
// kbench runtime case "kp_push_consts": adds the three push constants to elements 0..2 (one
// invocation), so successive dispatches with different push values accumulate.
//
// kbench: variant float32 T=float
// kbench: variant int32 T=int
// kbench: variant uint32 T=uint

layout(local_size_x = 1) in;

layout(std430, binding = 0) buffer A { T a[]; };

layout(push_constant) uniform Push {
    T x;
    T y;
    T z;
} p;

void main() {
    a[0] += p.x;
    a[1] += p.y;
    a[2] += p.z;
}
