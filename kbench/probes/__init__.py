"""Probes: measurements of one device beside the suites, run as ``kbench probe NAME [ARGS]``
(or ``python -m kbench.probes NAME [ARGS]``); ``kbench probe NAME --help`` says what each takes.
Their logs of record are under results/<device>/probes/ and are cited in the README.

- ``matmul``: tile variants of the fp32 and fp16 matmul kernels, timed and checked;
- ``qmatvec``: quantized_matmul kernel variants (generic, fast, integer-dot, packed weights);
- ``read_floor``: how fast any kernel reads a quantized_matmul call's weight bytes;
- ``transfer``: host<->device transfer speed, the host copy and the DMA apart;
- ``lifetimes``: resources leaked across create/destroy cycles on the real driver;
- ``attention``: chunk sizes and partial passes of the fused decode attention, beside torch's SDPA;
- ``h200``: the large-buffer slowdown and dispatch round trip with the SM clock sampled (NVML);
- ``soak``: resident memory over a million backend ops and ten thousand Manager lifetimes.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

#: probe name -> what it measures (the modules of this package)
PROBES = {
    "matmul": "tile variants of the fp32 and fp16 matmul kernels",
    "qmatvec": "quantized_matmul kernel variants, timed and checked against float64",
    "read_floor": "the weight-read floor of quantized_matmul on this device",
    "transfer": "host<->device transfer speed (host copy and DMA apart)",
    "lifetimes": "resources leaked across create/destroy cycles",
    "attention": "chunk sizes and partial passes of the fused decode attention (and torch SDPA)",
    "h200": "large-buffer slowdown and dispatch round trip with the SM clock (NVML)",
    "soak": "RSS over 1M backend ops and 10k Manager cycles (leaks)",
}


def run_probe(name: str, args: Sequence[str] = ()) -> int:
    """Run probe ``name`` with command-line ``args``; its exit code."""
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r}; probes: {', '.join(PROBES)}")
    module = importlib.import_module(f"{__name__}.{name}")
    saved = sys.argv
    sys.argv = [f"kbench probe {name}", *args]
    try:
        code = module.main()
    finally:
        sys.argv = saved
    return int(code or 0)
