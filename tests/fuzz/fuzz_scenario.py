"""atheris harness: fuzz_targets.scenario (see run_fuzz.py; `make fuzz` runs it long)."""

import sys

from run_fuzz import main

if __name__ == "__main__":
    main("scenario", sys.argv[1:])
