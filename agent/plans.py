"""Node side of rebalance plans: publish the plan next to the rings, collect the job's acks.

Thin I/O around ``artemis.job.plan_files`` (the one definition of names and format).
The agent calls ``publish_plan`` when the coordinator sends a control of action
``"plan"``, and polls an ``AckWatcher`` each tick to forward new acks upstream.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from artemis.job.plan_files import (
    PlanFormatError,
    check_job,
    make_plan,
    plan_path,
    read_json,
    write_json_atomic,
)

__all__ = [
    "AckWatcher",
    "PlanFormatError",
    "clear_plan",
    "publish_plan",
    "read_ack_records",
    "read_acks",
    "read_plan",
]


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
        q, r = divmod(global_batch, nranks)
        uniform = [q + 1 if i < r else q for i in range(nranks)]
        return publish_plan(
            shm_dir,
            job,
            {
                "id": plan_id,
                "apply_at_step": apply_at_step,
                "samples": uniform,
                "global_batch": global_batch,
            },
        )
    check_job(job)
    folder = Path(shm_dir)
    for p in [plan_path(folder, job), *folder.glob(f"{job}.plan-ack.r*.json")]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
    return None


def read_plan(shm_dir: str | Path, job: str) -> dict[str, Any] | None:
    rec = read_json(plan_path(shm_dir, job))
    return None if rec is None else dict(rec)


def read_ack_records(shm_dir: str | Path, job: str) -> dict[int, dict[str, Any]]:
    """Every rank's latest ack record on this node (id, step, samples, global_batch)."""
    check_job(job)
    prefix = f"{job}.plan-ack.r"
    out: dict[int, dict[str, Any]] = {}
    for p in Path(shm_dir).glob(f"{prefix}*.json"):
        tail = p.name[len(prefix) : -len(".json")]
        if not tail.isdigit():
            continue
        try:
            rec = read_json(p)
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(rec, dict) and rec.get("rank") == int(tail):
            out[int(tail)] = rec
    return out


def read_acks(shm_dir: str | Path, job: str) -> dict[int, tuple[str, int]]:
    """Every rank's latest ack on this node: rank -> (plan id, step it switched at).

    A file that is not a valid ack (foreign, hand-edited) is skipped: acks are
    advisory for the coordinator, and a bad one must not stop the agent.
    """
    check_job(job)
    prefix = f"{job}.plan-ack.r"
    out: dict[int, tuple[str, int]] = {}
    for p in Path(shm_dir).glob(f"{prefix}*.json"):
        tail = p.name[len(prefix) : -len(".json")]
        if not tail.isdigit():
            continue
        try:
            rec = read_json(p)
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(rec, dict):
            continue
        pid, step, rank = rec.get("id"), rec.get("step"), rec.get("rank")
        if isinstance(pid, str) and isinstance(step, int) and rank == int(tail):
            out[int(tail)] = (pid, step)
    return out


class AckWatcher:
    """Reports each (rank, plan id) ack once, for the agent to forward to the coordinator."""

    def __init__(self, shm_dir: str | Path, job: str) -> None:
        self.shm_dir = Path(shm_dir)
        self.job = check_job(job)
        self._seen: dict[int, tuple[str, int]] = {}

    def poll(self) -> list[tuple[int, str, int]]:
        """New acks since the last poll, as (rank, plan id, step), by rank."""
        new: list[tuple[int, str, int]] = []
        for rank, ack in sorted(read_acks(self.shm_dir, self.job).items()):
            if self._seen.get(rank) != ack:
                self._seen[rank] = ack
                new.append((rank, ack[0], ack[1]))
        return new
