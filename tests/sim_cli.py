"""`artemis sim` as an operator runs it: the console script in a subprocess.

Shared by the tests that check what a whole simulated cluster leaves behind
(store, baselines, fingerprints), so the command line is spelled once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ARTEMIS = Path(sys.executable).parent / "artemis"


def artemis_sim(
    scenario: Path, jsonl: Path, *extra: str, timeout_s: int = 120
) -> subprocess.CompletedProcess[str]:
    """Runs the scenario to its end; fails the test, with the output's tail, if it fails.

    The subprocess gets a minute more than the simulation's own timeout, so a hang
    is reported by `artemis sim` itself when it can be.
    """
    r = subprocess.run(
        [
            str(ARTEMIS),
            "sim",
            "--scenario",
            str(scenario),
            "--jsonl",
            str(jsonl),
            *extra,
            "--timeout-s",
            str(timeout_s),
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s + 60,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r
