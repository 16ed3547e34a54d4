"""The plan and ack files on a node: names, format, atomic writes, readers. One source of truth.

The node agent publishes the active plan next to the rings; every rank of the job
on that node reads it; each rank acknowledges the split it switched to with a file
of its own. The agent (``artemis.agent.plans``), the job's client
(``artemis.job.RebalanceClient``) and the simulator all go through this module,
so the names and the format cannot drift apart (docs/DESIGN.md "Plans on the node").

    <shm_dir>/<job>.plan.json              {"version", "id", "apply_at_step", "samples",
                                            "global_batch", "weights"}
    <shm_dir>/<job>.plan-ack.r<rank>.json  {"version", "id", "rank", "step", "samples",
                                            "global_batch"}

Every write goes to a temporary file in the same folder and is renamed over the
target, so a reader sees the old file or the new one, never a partial one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_SHM_DIR",
    "FORMAT_VERSION",
    "UNIFORM_PLAN_ID",
    "PlanFormatError",
    "ack_path",
    "check_job",
    "make_ack",
    "make_plan",
    "plan_path",
    "read_acks",
    "read_json",
    "read_plan",
    "remove_job_files",
    "validate_plan",
    "write_json_atomic",
]

FORMAT_VERSION = 1
DEFAULT_SHM_DIR = "/dev/shm/artemis"
UNIFORM_PLAN_ID = "uniform"  # the ack id for the split a job starts with
_JOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_ACK_MID = ".plan-ack.r"


class PlanFormatError(ValueError):
    """A plan or ack file that does not follow the format."""


def check_job(job: str) -> str:
    # The job id becomes part of a file name: refuse anything that could leave the folder.
    if not _JOB_RE.match(job) or ".." in job:
        raise ValueError(f"job id {job!r} is not usable in a file name (letters, digits, . _ -)")
    return job


def plan_path(shm_dir: str | Path, job: str) -> Path:
    return Path(shm_dir) / f"{check_job(job)}.plan.json"


def ack_path(shm_dir: str | Path, job: str, rank: int) -> Path:
    return Path(shm_dir) / f"{check_job(job)}{_ACK_MID}{int(rank)}.json"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so that readers never see a partial file."""
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None when there is no such file."""
    try:
        with path.open("rb") as fh:
            return json.loads(fh.read())
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------- plans


def make_plan(
    plan_id: str, apply_at_step: int, samples: list[int], global_batch: int | None = None
) -> dict[str, Any]:
    """A validated plan record; ``weights`` are derived (gradient weight per rank)."""
    samples = [int(n) for n in samples]
    gb = sum(samples) if global_batch is None else int(global_batch)
    rec = {
        "version": FORMAT_VERSION,
        "id": str(plan_id),
        "apply_at_step": int(apply_at_step),
        "samples": samples,
        "global_batch": gb,
        "weights": [n * len(samples) / gb for n in samples] if gb > 0 else [],
    }
    return validate_plan(rec)


def validate_plan(rec: Any) -> dict[str, Any]:
    """``rec`` if it is a well-formed plan, else ``PlanFormatError`` saying why."""
    if not isinstance(rec, dict):
        raise PlanFormatError("a plan is a JSON object")
    try:
        pid = rec["id"]
        at = rec["apply_at_step"]
        samples = rec["samples"]
        gb = rec["global_batch"]
    except KeyError as e:
        raise PlanFormatError(f"plan lacks field {e.args[0]!r}") from None
    if not isinstance(pid, str) or not pid:
        raise PlanFormatError("plan id must be a non-empty string")
    if not isinstance(at, int) or isinstance(at, bool) or at < 0:
        raise PlanFormatError(f"apply_at_step must be a step number >= 0, got {at!r}")
    if (
        not isinstance(samples, list)
        or not samples
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in samples)
    ):
        raise PlanFormatError("samples must be a non-empty list of whole numbers")
    if min(samples) < 1:
        raise PlanFormatError(f"every rank needs at least one sample: {samples}")
    if not isinstance(gb, int) or sum(samples) != gb:
        raise PlanFormatError(f"samples {samples} do not sum to global_batch {gb}")
    return rec


def read_plan(shm_dir: str | Path, job: str) -> dict[str, Any] | None:
    """The published plan, validated; None when none is published.

    Raises ``PlanFormatError`` (or ``json.JSONDecodeError``) for a file that is not one.
    """
    rec = read_json(plan_path(shm_dir, job))
    return None if rec is None else dict(validate_plan(rec))


# --------------------------------------------------------------------------- acks


def make_ack(plan_id: str, rank: int, step: int, samples: int, global_batch: int) -> dict[str, Any]:
    """The ack a rank writes when it first uses a split (``UNIFORM_PLAN_ID`` at start)."""
    return {
        "version": FORMAT_VERSION,
        "id": str(plan_id),
        "rank": int(rank),
        "step": int(step),
        "samples": int(samples),
        "global_batch": int(global_batch),
    }


def read_acks(shm_dir: str | Path, job: str) -> dict[int, dict[str, Any]]:
    """Every rank's latest ack on this node: rank -> record. The one reader of ack files.

    A file that is not a valid ack (foreign, hand-edited, of another rank) is
    skipped: acks are advisory for the coordinator, and a bad one must not stop
    the agent.
    """
    prefix = f"{check_job(job)}{_ACK_MID}"
    out: dict[int, dict[str, Any]] = {}
    for p in Path(shm_dir).glob(f"{prefix}*.json"):
        tail = p.name[len(prefix) : -len(".json")]
        if not tail.isdigit():
            continue
        try:
            rec = read_json(p)
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(rec, dict) or rec.get("rank") != int(tail):
            continue
        pid, step = rec.get("id"), rec.get("step")
        if isinstance(pid, str) and pid and isinstance(step, int) and not isinstance(step, bool):
            out[int(tail)] = rec
    return out


def remove_job_files(shm_dir: str | Path, job: str) -> None:
    """Remove the job's plan and every ack file (the job is gone)."""
    folder = Path(shm_dir)
    for p in [plan_path(folder, job), *folder.glob(f"{check_job(job)}{_ACK_MID}*.json")]:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
