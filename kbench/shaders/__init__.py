"""The shipped SPIR-V: the one loader and the one manifest.

Every shader kbench runs is a GLSL source in ``shaders/`` compiled by the one build step
(``python -m kbench.shaders``, kbench.shaders.build) into ``kbench/spv/<name>.spv`` and listed in
``kbench/spv/manifest.json``; tests/test_shipped_spirv.py fails when a source changed without a
rebuild. Everyone loads SPIR-V through `load_spirv`: the backend's kernel table, the runtime's
built-in OpMult, the runtime and peak cases. Plain files, no Vulkan.
"""

from __future__ import annotations

import functools
from pathlib import Path

#: where the built SPIR-V and its manifest live (inside the package, so wheels ship them)
SPV_DIR = Path(__file__).resolve().parent.parent / "spv"

__all__ = ["SPV_DIR", "load_spirv"]


@functools.lru_cache(maxsize=None)
def load_spirv(name: str) -> bytes:
    """Bytes of the shipped ``kbench/spv/<name>`` (``".spv"`` may be left off:
    ``load_spirv("peak_copy")``, ``load_spirv("elementwise.add.spv")``); FileNotFoundError
    saying how to build it when it is missing."""
    file = name if name.endswith(".spv") else f"{name}.spv"
    path = SPV_DIR / file
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"shipped SPIR-V {path} is missing; build it with `python -m kbench.shaders` "
            f"(from shaders/ in a kbench checkout)") from None
