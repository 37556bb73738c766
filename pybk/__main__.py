"""`python -m pybk ...` runs the `pybk` command (the same as the console script)."""
import sys

from pybk.cli import main

sys.exit(main())
