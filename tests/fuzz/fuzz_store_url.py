"""atheris harness: fuzz_targets.store_url (see run_fuzz.py; `make fuzz` runs it long)."""

import sys

from run_fuzz import main

if __name__ == "__main__":
    main("store_url", sys.argv[1:])
