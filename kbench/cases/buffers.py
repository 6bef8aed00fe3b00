"""Buffer bookkeeping for backend cases: uploads, guarded outputs, read-back, release."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .compare import GUARD_BYTES, check_guards, guard_pattern


@dataclass(frozen=True)
class Guarded:
    """A buffer whose bytes [lead, lead + nbytes) are the checked region; the rest is guard."""

    handle: Any
    lead: int
    nbytes: int
    total: int


class BackendBuffers:
    """Allocations one case instance made on a ComputeBackend; `free_all` releases them."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.handles: list[Any] = []

    def alloc(self, nbytes: int) -> Any:
        h = self.backend.allocate(int(nbytes))
        self.handles.append(h)
        return h

    def upload(self, array: np.ndarray) -> Any:
        """New buffer holding `array`'s bytes (C order)."""
        data = np.ascontiguousarray(array).view(np.uint8).ravel()
        h = self.alloc(max(int(data.size), 1))
        if data.size:
            self.backend.copy_to_device(data, h)
        return h

    def guarded(self, nbytes: int, *, lead: int = 0, trail: int = GUARD_BYTES,
                payload: np.ndarray | None = None) -> Guarded:
        """Buffer of lead + nbytes + trail bytes, all guard bytes except `payload` (if given) in
        the checked region (in-place ops start from their input there)."""
        total = int(lead) + int(nbytes) + int(trail)
        init = guard_pattern(total)
        if payload is not None:
            raw = np.ascontiguousarray(payload).view(np.uint8).ravel()
            if raw.size != nbytes:
                raise ValueError(f"payload has {raw.size} bytes, the checked region {nbytes}")
            init[lead:lead + nbytes] = raw
        h = self.alloc(total)
        self.backend.copy_to_device(init, h)
        return Guarded(h, int(lead), int(nbytes), total)

    def read(self, handle: Any, nbytes: int) -> np.ndarray:
        out = np.zeros(int(nbytes), dtype=np.uint8)
        self.backend.copy_from_device(handle, out)
        return out

    def read_guarded(self, g: Guarded, what: str) -> np.ndarray:
        """The checked region's bytes; raises CaseFailure when a guard byte changed."""
        raw = self.read(g.handle, g.total)
        check_guards(raw, g.lead, g.lead + g.nbytes, what)
        return raw[g.lead:g.lead + g.nbytes].copy()

    def read_f32(self, g: Guarded, what: str) -> np.ndarray:
        return self.read_guarded(g, what).view(np.float32)

    def free_all(self) -> None:
        """Free every allocation; errors from a backend already torn down are ignored."""
        while self.handles:
            h = self.handles.pop()
            try:
                self.backend.free(h)
            except Exception:  # noqa: BLE001 - the backend may be gone after a device loss
                pass

    def forget(self, handle: Any) -> None:
        """Stop tracking a handle the case freed itself."""
        self.handles = [h for h in self.handles if h is not handle]
