"""Rebalancing a real job: ``artemis run --rebalance apply`` over a real 4-rank DDP job
(gloo through the ``artemis`` backend) that follows plans with ``RebalanceClient``,
``UnevenBatchSplitter`` and ``install_weighted_allreduce`` (tests/torch_rebalance_job.py),
under a real coordinator and agent on loopback, started by the CLI as a user would.

* A slower device, modelled as time per sample on rank 2 (a sleep proportional to
  its local batch, which takes no core from the others): the plan moves samples
  off it, every rank switches at the plan's step, the coordinator verifies the plan
  from the job's real samples/s (``verified``), and the job's own step time, on its
  own clock, falls.
* A fixed per-step stall on rank 2 from the middle of the run (the same sleep
  whatever its share): the plan moves samples, the step does not get faster, and
  it is ``rolled_back``, the uniform split restored. (With the stall there from
  window 0 the policy has no healthy throughput to weigh the loss against, and a
  1% gain from the slow rank's lighter compute passed as "half of what was lost":
  rebalance/README.md, "Verified / rolled back".)

The sleeps are long against the ranks' compute (milliseconds per step for this
model), so the machine's own load, which changes the compute from window to window
on these 2 shared cores, moves a step by a few per cent at most. The agent is told
the job's collectives per step (``--colls-per-step 1``: this model's gradients fit in
one DDP bucket) so its first windows are not held back while it infers the period
(about 130 collectives past DDP's start-up ones) and the plan reaches the job before
its step.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from job_runs import artemis_run

JOB = Path(__file__).resolve().parent / "torch_rebalance_job.py"
GLOBAL_BATCH = 64

# Two real 2-rank DDP jobs under the daemons (about 110 s): with the other real-PyTorch
# end-to-end runs in `make test-torch`, to keep `make test` within its 20 minutes.
pytestmark = [pytest.mark.slow, pytest.mark.torch_e2e]


def _run(tmp: Path, steps: int, window_steps: int, *job_args: str) -> dict[str, Any]:
    plans, out = tmp / "plans.jsonl", tmp / "job.json"
    opts = [
        *("--rebalance", "apply", "--jsonl", str(tmp / "findings.jsonl")),
        *("--plans-jsonl", str(plans), "--window-steps", str(window_steps)),
        *("--colls-per-step", "1"),
    ]
    job = [
        *(sys.executable, str(JOB), "--steps", str(steps)),
        *("--global-batch", str(GLOBAL_BATCH), "--slow-rank", "2", "--out", str(out)),
        *job_args,
    ]
    code, log = artemis_run(tmp, opts, job, timeout=280)
    assert code == 0, log
    events = [json.loads(x) for x in plans.read_text().splitlines()] if plans.exists() else []
    return {"log": log, "plans": events, "job": json.loads(out.read_text())}


def _step_ms(job: dict[str, Any], plan: str | None) -> float:
    """Median of the job's own step times (rank 0's clock) under ``plan``."""
    pairs = itertools.pairwise(job["steps"])
    return statistics.median((b["t"] - a["t"]) * 1e3 for a, b in pairs if b["plan"] == plan)


def test_a_per_sample_slowdown_gets_a_verified_plan_and_the_job_speeds_up(
    tmp_path: Path,
) -> None:
    r = _run(tmp_path, 300, 20, "--per-sample-ms", "5")
    by = {}
    for ev in r["plans"]:
        by.setdefault(ev["id"], []).append(ev["status"])
    assert by, r["log"]
    first = r["plans"][0]
    plan = first["id"]
    assert by[plan][:3] == ["recommended", "applied", "verified"], (by, r["log"])
    # samples moved off the slow rank, the global batch kept
    after = first["after"]
    assert after[2] < GLOBAL_BATCH // 4 and sum(after) == GLOBAL_BATCH, first
    verified = next(e for e in r["plans"] if e["status"] == "verified")
    assert verified["throughput_after"] > verified["throughput_before"], verified
    # the job itself switched at the plan's step, every rank together ...
    job = r["job"]
    switched = [s for s in job["steps"] if s["plan"] == plan]
    assert switched and switched[0]["step"] == first["apply_at_step"], switched[:1]
    assert switched[0]["split"] == after
    # ... and its own samples/s rose (its own clock, every step before vs after)
    before_ms, after_ms = _step_ms(job, None), _step_ms(job, plan)
    assert GLOBAL_BATCH / after_ms >= 1.10 * GLOBAL_BATCH / before_ms, (before_ms, after_ms)


def test_a_fixed_per_step_stall_is_rolled_back(tmp_path: Path) -> None:
    # from step 50 (window 5): the windows before it are the job's healthy throughput,
    # against which the policy weighs what the stall costs and what the plan won back
    r = _run(tmp_path, 200, 10, "--stall-ms", "250", "--slow-from", "50")
    statuses = [(e["id"], e["status"]) for e in r["plans"]]
    assert statuses, r["log"]
    plan = r["plans"][0]["id"]
    assert (plan, "applied") in statuses and (plan, "rolled_back") in statuses, statuses
    assert (plan, "verified") not in statuses, statuses
    rb = next(e for e in r["plans"] if e["status"] == "rolled_back")
    assert rb["escalate"] is True, rb  # not about compute per sample: wants a human
    # the job went back to the uniform split
    last = r["job"]["steps"][-1]
    assert last["split"] == [GLOBAL_BATCH // 4] * 4, last
