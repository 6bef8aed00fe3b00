"""GLSL to SPIR-V through glslangValidator (thread-safe: every call has its own temp folder)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from .errors import ShaderCompileError


def find_glslang() -> str | None:
    """Path of a glslangValidator: $KBENCH_GLSLANG, then PATH."""
    env = os.environ.get("KBENCH_GLSLANG")
    if env:
        return env
    return shutil.which("glslangValidator")


def compile_source(
    source: str,
    defines: dict[str, str | int] | None = None,
    target_env: str = "vulkan1.1",
    glslang: str | None = None,
    include_dirs: list[str] | None = None,
) -> bytes:
    """Compile GLSL compute shader ``source`` to SPIR-V bytes.

    Raises ShaderCompileError with the compiler's own message on a GLSL error, and
    FileNotFoundError when no glslangValidator is installed. ``include_dirs`` are searched for
    ``#include`` files (the source is compiled from a temporary folder, not from where it lives).
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a str of GLSL, got {type(source).__name__}")
    exe = glslang or find_glslang()
    if exe is None:
        raise FileNotFoundError(
            "glslangValidator not found: install glslang-tools (Debian) or set KBENCH_GLSLANG"
        )
    with tempfile.TemporaryDirectory(prefix="kbench-glsl-") as tmp:
        src = os.path.join(tmp, "shader.comp")
        out = os.path.join(tmp, "shader.spv")
        with open(src, "w", encoding="utf-8") as f:
            f.write(source)
        cmd = [exe, "-V", "--target-env", target_env, "-S", "comp", src, "-o", out]
        for k, v in (defines or {}).items():
            cmd.append(f"-D{k}={v}")
        for d in include_dirs or ():
            cmd.append(f"-I{d}")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not os.path.exists(out):
            msg = (proc.stdout + proc.stderr).replace(src, "<source>").strip()
            raise ShaderCompileError(f"GLSL compilation failed:\n{msg}")
        with open(out, "rb") as f:
            return f.read()
