"""`python -m kbench.shaders [--check|--force|--list]`: build shaders/*.comp into kbench/spv/."""

import sys

from .build import main

if __name__ == "__main__":
    sys.exit(main())
