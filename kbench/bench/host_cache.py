"""A run's host arrays kept for its other implementations: a case's inputs and float64 reference.

Within one `kbench validate` or `kbench bench` run, the peer (and every foreign kernel group) checks
the same instances with the same seed as kbench: the same inputs and the same reference, which on
model-sized cases take seconds to make (quantizing 256 MiB of weight copies, a float64 matmul of
4096^3). The runner gives its workers a directory for the run's duration (CACHE_ENV); an array set
that took at least MIN_SECONDS to make is written there once and read back by the next
implementation instead of being made again. Arrays are stored as they were made (``.npy`` files,
no pickling), so what is read back is bit for bit what would be made.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

#: the directory a runner hands its workers (unset: nothing is kept)
CACHE_ENV = "KBENCH_HOST_CACHE"
#: array sets made faster than this are made again rather than written and read
MIN_SECONDS = 0.25


#: the run directories' name: the runner's pid says whether a directory is still in use
PREFIX = "kbench-host-cache-"


def _directory() -> Path | None:
    where = os.environ.get(CACHE_ENV, "")
    return Path(where) if where else None


def new_directory() -> Path:
    """A path for one run's arrays, made only when the first set is kept (a run that keeps
    nothing leaves nothing behind); directories of runs that were killed are removed here."""
    import tempfile

    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{PREFIX}*"):
        pid = old.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            remove(old)
    return root / f"{PREFIX}{os.getpid()}-{os.urandom(4).hex()}"


def remove(directory: Path) -> None:
    import shutil

    shutil.rmtree(directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def key(case_id: str, seed: int, lane: int, what: str) -> str:
    """The file stem of one array set: the instance, its seed and shard, and which set."""
    return hashlib.sha1(f"{case_id}|{int(seed)}|{int(lane)}|{what}".encode()).hexdigest()


def cached(stem: str, make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The array set `stem` names from the run's cache, else ``make()`` (kept when it took at
    least MIN_SECONDS and every value is a NumPy array)."""
    where = _directory()
    if where is None:
        return make()
    folder = where / stem
    done = folder / "complete"
    if done.exists():
        names = done.read_text(encoding="utf-8").split()
        try:
            return {name: np.load(folder / f"{name}.npy", allow_pickle=False) for name in names}
        except (OSError, ValueError):
            pass  # a set that cannot be read back is made again
    t0 = time.perf_counter()
    arrays = make()
    if time.perf_counter() - t0 < MIN_SECONDS or not all(isinstance(v, np.ndarray) and v.dtype != object
                                                         for v in arrays.values()):
        return arrays
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, value in arrays.items():
            tmp = folder / f".{name}.npy.{os.getpid()}"
            with open(tmp, "wb") as f:
                np.save(f, value, allow_pickle=False)
            os.replace(tmp, folder / f"{name}.npy")
        tmp = folder / f".complete.{os.getpid()}"
        tmp.write_text("\n".join(arrays), encoding="utf-8")
        os.replace(tmp, done)  # written last: a set is read only once every array is there
    except OSError:
        pass  # a full disk costs the reuse, not the run
    return arrays
