"""What a training script uses to follow rebalance plans: how many samples this rank takes.

A plan names the step at which it applies, so every rank switches at the same
step without talking to the others: each rank's ``RebalanceClient`` reads the
plan file the node agent published and answers, for any step, this rank's share
of the global batch and the gradient weight that keeps the update exact
(``grad_weight`` = my_samples * world_size / global_batch: averaging the
weighted per-rank mean gradients over ranks gives the mean over every sample).

Using this is optional. A job that never creates a client just runs its uniform
split; the coordinator sees no acknowledgement and claims nothing.

Rules that keep ranks consistent:

* The answer for a step never changes once given: a plan first read when step S
  is asked about applies at ``max(apply_at_step, S)``, never to earlier steps.
  When the agent published it in time (the coordinator places apply_at_step two
  windows ahead), that is ``apply_at_step`` on every rank.
* Each plan id is acknowledged once, with the step it took effect, when the rank
  first uses it; the coordinator calls a plan applied only when every rank did.
* A plan that does not fit this job (other world size or global batch) or an
  unreadable file is ignored with one warning; the job never fails because of it.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from artemis.rebalance.files import (
    DEFAULT_SHM_DIR,
    UNIFORM_PLAN_ID,
    PlanFormatError,
    ack_path,
    check_job,
    make_ack,
    plan_path,
    read_json,
    validate_plan,
    write_json_atomic,
)
from artemis.rebalance.split import rank_slice, uniform_split

log = logging.getLogger("artemis.job")

_JOB_ENV = ("ARTEMIS_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")
_KEEP = 8  # schedule entries kept: enough for a sampler running a few steps ahead

__all__ = ["UNIFORM_PLAN_ID", "RebalanceClient", "rank_slice", "uniform_split"]


@dataclass(frozen=True, slots=True)
class _Entry:
    start: int  # first step this split is used for
    plan_id: str | None  # None: the uniform split the job started with
    sizes: tuple[int, ...]


class RebalanceClient:
    """This rank's view of the rebalance plan, per step.

    ``rank``/``world_size`` default to ``RANK``/``WORLD_SIZE``; ``job`` to
    ``ARTEMIS_JOB`` (else ``SLURM_JOB_ID``, ``TORCHELASTIC_RUN_ID``); ``shm_dir``
    to ``ARTEMIS_SHM_DIR`` (else /dev/shm/artemis). Without a job id the client
    stays on the uniform split (there is no plan file to find).
    """

    def __init__(
        self,
        rank: int | None,
        world_size: int | None,
        global_batch: int,
        job: str | None = None,
        shm_dir: str | Path | None = None,
    ) -> None:
        self.rank = int(os.environ.get("RANK", "0")) if rank is None else int(rank)
        ws = os.environ.get("WORLD_SIZE", "1") if world_size is None else world_size
        self.world_size = int(ws)
        self.global_batch = int(global_batch)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        if self.global_batch < self.world_size:
            raise ValueError(
                f"global batch {self.global_batch} < world size {self.world_size}: "
                "some rank would get no sample"
            )
        if job is None:
            job = next((os.environ[k] for k in _JOB_ENV if os.environ.get(k)), None)
        self.job = None if job is None else check_job(job)
        self.shm_dir = Path(shm_dir or os.environ.get("ARTEMIS_SHM_DIR") or DEFAULT_SHM_DIR)
        self._plan_file = None if self.job is None else plan_path(self.shm_dir, self.job)
        self._sched: list[_Entry] = [
            _Entry(0, None, tuple(uniform_split(self.global_batch, self.world_size)))
        ]
        self._max_step = -1
        self._sig: tuple[int, int, int] | None = None
        self._known: set[str] = set()  # plan ids read (used or refused)
        self._acked: set[str] = set()
        self._warned: set[str] = set()
        # Say at once how many samples this rank runs (the uniform split): the
        # agent reports it with every window, which is how the coordinator learns
        # the global batch and measures useful throughput before any plan.
        self._ack(self._sched[0])

    # ------------------------------------------------------------------ per step

    def split_for_step(self, step: int) -> list[int]:
        """Samples per rank (all ranks) for ``step``; sums to the global batch."""
        return list(self._entry(step).sizes)

    def samples_for_step(self, step: int) -> int:
        """This rank's sample count for ``step``."""
        return self._entry(step).sizes[self.rank]

    def slice_for_step(self, step: int) -> tuple[int, int]:
        """[lo, hi) of this rank's samples inside the step's global batch."""
        return rank_slice(list(self._entry(step).sizes), self.rank)

    def grad_weight(self, step: int) -> float:
        """Weight for this rank's mean-loss gradient so that the all-reduce mean is exact."""
        return self.samples_for_step(step) * self.world_size / self.global_batch

    def plan_for_step(self, step: int) -> str | None:
        """Id of the plan in force at ``step`` (None: the initial uniform split)."""
        return self._entry(step).plan_id

    @property
    def acked(self) -> frozenset[str]:
        return frozenset(self._acked)

    # ------------------------------------------------------------------ internals

    def _entry(self, step: int) -> _Entry:
        step = int(step)
        if step > self._max_step:
            self._poll(step)
            self._max_step = step
        e = self._sched[0]
        for cand in self._sched:
            if cand.start <= step:
                e = cand
        if e.plan_id is not None and e.plan_id not in self._acked:
            self._ack(e)
        return e

    def _poll(self, step: int) -> None:
        path = self._plan_file
        if path is None:
            return
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return  # no plan, or the agent removed it: keep what is in force
        except OSError as e:
            self._warn("stat", f"cannot stat plan file {path}: {e}")
            return
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig == self._sig:
            return
        self._sig = sig
        try:
            rec = validate_plan(read_json(path))
        except FileNotFoundError:
            return
        except (OSError, json.JSONDecodeError, PlanFormatError) as e:
            self._warn(f"bad:{sig}", f"ignoring plan file {path}: {e}")
            return
        pid = rec["id"]
        if pid in self._known:
            return
        self._known.add(pid)
        sizes = tuple(rec["samples"])
        if len(sizes) != self.world_size or rec["global_batch"] != self.global_batch:
            self._warn(
                pid,
                f"ignoring plan {pid}: it is for {len(sizes)} ranks and global batch "
                f"{rec['global_batch']}, this job has {self.world_size} and {self.global_batch}",
            )
            return
        # The answer for steps already asked about must not change (a sampler may have
        # built those batches already), so a late plan starts at the step being asked.
        start = max(int(rec["apply_at_step"]), step)
        if start > rec["apply_at_step"]:
            log.warning(
                "artemis: plan %s read at step %d, after its step %d; switching now",
                pid,
                step,
                rec["apply_at_step"],
            )
        keep = [e for e in self._sched if e.start < start]
        self._sched = [*keep, _Entry(start, pid, sizes)][-_KEEP:]

    def _ack(self, e: _Entry) -> None:
        pid = e.plan_id or UNIFORM_PLAN_ID
        self._acked.add(pid)
        if self.job is None:
            return
        rec = make_ack(pid, self.rank, e.start, e.sizes[self.rank], self.global_batch)
        try:
            write_json_atomic(ack_path(self.shm_dir, self.job, self.rank), rec)
        except OSError as err:
            self._warn(f"ack:{e.plan_id}", f"cannot write the ack for plan {e.plan_id}: {err}")

    def _warn(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("artemis: %s", msg)
