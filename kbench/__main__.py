"""`python -m kbench` is the `kbench` command."""

import sys

from kbench.cli import main

sys.exit(main())
