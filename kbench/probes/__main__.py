"""`python -m kbench.probes NAME [ARGS]`: run one probe (see kbench.probes)."""

import sys

from . import PROBES, run_probe

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in PROBES:
        print("usage: python -m kbench.probes NAME [ARGS]; probes: " + ", ".join(PROBES), file=sys.stderr)
        sys.exit(2)
    sys.exit(run_probe(sys.argv[1], sys.argv[2:]))
