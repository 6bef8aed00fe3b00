#version 450
// kbench peak "dispatch_latency": the smallest useful dispatch (one invocation writes one
// value); its submit-and-wait round trip is the dispatch latency.

layout(local_size_x = 1) in;

layout(std430, binding = 0) writeonly buffer Out { uint o[]; };

void main() {
    o[0] = 1u;
}
