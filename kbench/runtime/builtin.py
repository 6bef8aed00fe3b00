"""Shaders the runtime itself ships (Kompute's built-in OpMult): shaders/op_mult.comp, built and
loaded as every other shader (kbench.shaders)."""
from __future__ import annotations


def mult_spirv() -> bytes:
    """SPIR-V of the built-in multiply (kbench/spv/op_mult.spv)."""
    from kbench.shaders import load_spirv

    return load_spirv("op_mult")


def grid_1d(groups: int, max_x: int) -> tuple[int, int, int]:
    """A grid of at least ``groups`` workgroups, spread over y when x alone cannot hold them."""
    if groups <= max_x:
        return (groups, 1, 1)
    y = (groups + max_x - 1) // max_x
    return ((groups + y - 1) // y, y, 1)
