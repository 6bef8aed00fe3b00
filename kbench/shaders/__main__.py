"""`python -m kbench.shaders [--check|--force|--list]`: build shaders/*.comp into kbench/spv/."""

import sys

from .build import main

sys.exit(main())
