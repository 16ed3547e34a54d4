"""Kills at random moments: SIGKILL of the coordinator, an agent, or both (docs/RELIABILITY.md
section 2; the harness and what is judged: tests/kills.py).

Five kills of each kind inside `make test`: one run of the scenario per kind,
the three runs side by side (their processes mostly wait: on deadlines, on
the agents' back-off, on the job's pacing). `make reliability` sets
ARTEMIS_KILL_TRIALS=50 (ten runs of five per kind, seeds in a row) and
ARTEMIS_RELIABILITY_OUT (a folder for the figures). ARTEMIS_KILL_SEED (and
ARTEMIS_KILL_KINDS) replay a run whose kills a failure printed.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pytest
from kills import KINDS, Outcome, run_trial

pytestmark = pytest.mark.slow

TRIALS = int(os.environ.get("ARTEMIS_KILL_TRIALS", "5"))
SEED = int(os.environ.get("ARTEMIS_KILL_SEED", "1400"))
RUN_KINDS = os.environ.get("ARTEMIS_KILL_KINDS", ",".join(KINDS)).split(",")
SUMMARY = os.environ.get("ARTEMIS_RELIABILITY_OUT")  # a folder for the figures, if set


def _row(out: Outcome) -> dict[str, Any]:
    return {
        "seed": out.seed,
        "kills": [[k.at, k.fired] for k in out.kills],
        "lost_windows": out.lost_windows,
        "late_unaccounted": out.late_unaccounted,
        "unacked_at_end": out.unacked_at_end,
        "plans_cut_by_hang": out.plans_cut_by_hang,
        "twice_lines": [list(x) for x in out.twice_lines],
        "missing_rank_windows": out.missing_rank_windows,
        "plans": out.plans_end,
        "plan_reasons": out.plan_reasons,
        "hang_dumps": out.hang_dumps,
        "restored_open": out.restored_open,
        "cut_back": out.cut_back,
        "run_s": round(out.run_s, 1),
        "problems": out.problems(),
    }


RUNS = max(1, -(-TRIALS // 5))


# Three runs side by side take 1-3 minutes; more on a loaded machine.
@pytest.mark.timeout(600 * RUNS)
def test_kills_lose_nothing_and_score_nothing_twice(tmp_path: Path) -> None:
    runs = RUNS
    jobs = [(kind, SEED + i) for i in range(runs) for kind in RUN_KINDS]
    outs: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=len(RUN_KINDS)) as pool:
        futures = [pool.submit(run_trial, k, sd, tmp_path / f"{k}-{sd}") for k, sd in jobs]
        for fut in as_completed(futures):
            outs.append(fut.result())
            if SUMMARY:  # as each run ends: a long campaign's figures survive a stop
                Path(SUMMARY).mkdir(parents=True, exist_ok=True)
                for kind in RUN_KINDS:
                    rows = [_row(o) for o in sorted(outs, key=lambda o: o.seed) if o.kind == kind]
                    path = Path(SUMMARY) / f"kills-{kind}.json"
                    path.write_text(json.dumps(rows, indent=1) + "\n")
    failures = [
        f"{o.kind} seed {o.seed}: {o.problems()}\n  {o.replay()}" for o in outs if o.problems()
    ]
    assert not failures, "\n".join(failures)
