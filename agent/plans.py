"""The agent's applier of control "plan": turn the coordinator's plan into the node's files.

Thin I/O over ``artemis.rebalance.files`` (the one definition of names, format
and readers). The daemon calls ``publish_plan`` when the coordinator sends a
control of action ``"plan"``, ``clear_plan`` to undo it, and ``read_ack_records``
once per tick to forward the job's acks upstream. It stays in the agent because
only the agent applies controls (and only as far as the node's policy allows):
the coordinator and the job never call it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from artemis.rebalance.files import (
    UNIFORM_PLAN_ID,
    PlanFormatError,
    make_plan,
    plan_path,
    read_acks,
    read_plan,
    remove_job_files,
    write_json_atomic,
)
from artemis.rebalance.split import uniform_split

__all__ = [
    "UNIFORM_PLAN_ID",
    "PlanFormatError",
    "clear_plan",
    "publish_plan",
    "read_ack_records",
    "read_plan",
]

# Every rank's latest valid ack on this node: rank -> record (id, rank, step, samples, ...).
read_ack_records = read_acks


def publish_plan(shm_dir: str | Path, job: str, plan: dict[str, Any]) -> Path:
    """Atomically publish ``plan`` (id, apply_at_step, samples[, global_batch]) for ``job``.

    Raises ``PlanFormatError`` for a plan that would starve a rank or change the
    global batch: such a plan never reaches the job.
    """
    rec = make_plan(
        plan["id"], plan["apply_at_step"], list(plan["samples"]), plan.get("global_batch")
    )
    Path(shm_dir).mkdir(parents=True, exist_ok=True)
    path = plan_path(shm_dir, job)
    write_json_atomic(path, rec)
    return path


def clear_plan(
    shm_dir: str | Path,
    job: str,
    *,
    plan_id: str | None = None,
    apply_at_step: int | None = None,
    nranks: int | None = None,
    global_batch: int | None = None,
) -> Path | None:
    """Undo a plan on the node.

    With ``plan_id``, ``apply_at_step``, ``nranks`` and ``global_batch``: publish the
    uniform split, switching at that step (ranks already on a plan must switch back
    together, which takes a named step). Without them (the job is gone): remove the
    plan and ack files. Returns the published path, or None after a removal.
    """
    if plan_id is not None and apply_at_step is not None and nranks and global_batch:
        return publish_plan(
            shm_dir,
            job,
            {
                "id": plan_id,
                "apply_at_step": apply_at_step,
                "samples": uniform_split(global_batch, nranks),
                "global_batch": global_batch,
            },
        )
    remove_job_files(shm_dir, job)
    return None


# Fault injection for the simulator (docs/RELIABILITY.md section 8): with this set to
# "exit_after_plan", the agent exits with FAILPOINT_EXIT right after it publishes a
# plan, before it can forward a single acknowledgement of it. A kill from outside at
# that moment races the ranks' acks, which the agent forwards within a poll.
FAILPOINT_ENV = "ARTEMIS_AGENT_FAILPOINT"
FAILPOINT_EXIT = 86


def plan_control(shm_dir: str | Path, body: Mapping[str, Any]) -> tuple[bool, str]:
    """A `plan` control's body carried out (the node's consent checked by the caller):
    the plan published to the job's ranks, or cleared when it is None: (ok, detail)."""
    job = str(body.get("job", ""))
    plan = body.get("plan")
    if not job:
        return False, "plan control without a job"
    if plan is None:
        clear_plan(shm_dir, job)
        return True, "plan cleared"
    publish_plan(shm_dir, job, dict(plan))
    if os.environ.get(FAILPOINT_ENV) == "exit_after_plan":
        os._exit(FAILPOINT_EXIT)
    return True, f"plan {plan.get('id')} published"
