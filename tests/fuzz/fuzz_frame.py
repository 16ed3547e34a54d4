"""atheris harness: fuzz_targets.frame (see run_fuzz.py; `make fuzz` runs it long)."""

import sys

from run_fuzz import main

if __name__ == "__main__":
    main("frame", sys.argv[1:])
