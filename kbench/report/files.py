"""Report files are replaced whole: written to a temporary file beside the target and renamed over
it, so a reader never sees half a report, and a symlink at the target is replaced, never written
through (``report --out DIR`` must not overwrite what ``DIR/index.md`` points to)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def write_with(path: str | Path, write: Callable[[str], None]) -> None:
    """Call ``write(temporary_path)``, then rename the temporary file to ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # replaces a symlink itself, not its target
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_text(path: str | Path, text: str) -> None:
    """``path.write_text(text)`` (UTF-8), atomically and never through a symlink."""
    write_with(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
