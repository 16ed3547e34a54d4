"""Run every bench module's ``main()`` in turn: ``python -m bench [name ...]``."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def discover() -> list[str]:
    here = Path(__file__).parent
    return sorted(
        m.name
        for m in pkgutil.iter_modules([str(here)])
        if not m.name.startswith("_") and not m.ispkg
    )


def run(names: list[str]) -> int:
    failed = 0
    for name in names:
        mod = importlib.import_module(f"bench.{name}")
        entry = getattr(mod, "main", None)
        if not callable(entry):
            continue
        print(f"== bench.{name}", flush=True)
        rc = entry()
        failed += bool(rc)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:] or discover()))
