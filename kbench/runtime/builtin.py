"""Shaders the runtime itself ships (Kompute's built-in OpMult)."""
from __future__ import annotations

import functools
from importlib import resources

MULT_GLSL = """#version 450
// out[i] = a[i] * b[i]; 64 invocations per workgroup, bounds-checked against the element count;
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
"""


@functools.lru_cache(maxsize=None)
def mult_spirv() -> bytes:
    """SPIR-V of the built-in multiply (shipped; compiled from MULT_GLSL if missing)."""
    try:
        return resources.files("kbench.runtime").joinpath("spv/op_mult.spv").read_bytes()
    except FileNotFoundError:  # pragma: no cover - a source checkout without the built file
        from .compiler import compile_source

        return compile_source(MULT_GLSL)


def grid_1d(groups: int, max_x: int) -> tuple[int, int, int]:
    """A grid of at least ``groups`` workgroups, spread over y when x alone cannot hold them."""
    if groups <= max_x:
        return (groups, 1, 1)
    y = (groups + max_x - 1) // max_x
    return ((groups + y - 1) // y, y, 1)
