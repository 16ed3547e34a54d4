"""atheris harness: fuzz_targets.ring (see run_fuzz.py; `make fuzz` runs it long)."""

import sys

from run_fuzz import main

if __name__ == "__main__":
    main("ring", sys.argv[1:])
