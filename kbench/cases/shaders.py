"""SPIR-V for the runtime and peak cases: the shipped kbench/spv/<name>.spv, or, in a source
checkout where it was not built yet, shaders/<stem>.comp compiled with its variant's defines."""

from __future__ import annotations

import functools
import re
from importlib import resources
from pathlib import Path

_VARIANT = re.compile(r"^\s*//\s*kbench:\s*variant\s+(\S+)\s*(.*?)\s*$")
SOURCE_DIR = Path(__file__).resolve().parents[2] / "shaders"


@functools.lru_cache(maxsize=None)
def load_spirv(name: str) -> bytes:
    """SPIR-V bytes for `name` ("case_mul.float32", "peak_copy", ...).

    Raises FileNotFoundError naming both places looked at when neither exists.
    """
    try:
        return resources.files("kbench").joinpath(f"spv/{name}.spv").read_bytes()
    except (FileNotFoundError, OSError):
        pass
    stem, _, variant = name.partition(".")
    source = SOURCE_DIR / f"{stem}.comp"
    if not source.is_file():
        raise FileNotFoundError(f"no SPIR-V kbench/spv/{name}.spv and no source {source}")
    text = source.read_text(encoding="utf-8")
    defines: dict[str, str | int] = {}
    if variant:
        for line in text.splitlines():
            m = _VARIANT.match(line)
            if m and m.group(1) == variant:
                for item in m.group(2).split():
                    if item.startswith("target="):
                        continue
                    key, _, value = item.partition("=")
                    defines[key] = value if value else 1
                break
        else:
            raise FileNotFoundError(f"{source} declares no variant {variant!r}")
    from kbench.runtime import compile_source

    return compile_source(text, defines)
