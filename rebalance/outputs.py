"""Outputs of the rebalance policy: the plans file (JSONL) and the plan metrics.

The plans file (``--plans-jsonl``) gets one JSON object per line at every change
of a plan's status, flushed at once so an operator tailing it sees each change
as it happens and a crash loses nothing already reported. Field names are the
DESIGN contract ("Rebalance plans"), produced by ``PlanEvent.to_dict``.

The plan metrics are job-scoped: every series carries a ``job`` label, taken
from the event, so two jobs on one coordinator never share a series and one
job's clean-up (``forget``) leaves the others alone.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

from artemis.common.diskio import JsonlAppender, Retention
from prometheus_client import CollectorRegistry, Counter, Gauge

from .events import STATUSES, PlanEvent


class PlansWriter:
    """Appends plan events to a JSONL file, one line per status change, written at once
    (through `JsonlAppender`, common/diskio.py: a full disk holds the lines in
    memory until space returns; `retention` rotates the file)."""

    def __init__(self, path: str | Path, retention: Retention | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The file exists from the start, empty while no plan was made (as before).
        with contextlib.suppress(OSError):
            self.path.touch()
        self.out: JsonlAppender | None = JsonlAppender(self.path, "plans", retention)
        self.health = self.out.health
        # The coordinator may write from its event loop and a shutdown hook alike;
        # one lock keeps lines whole.
        self._lock = threading.Lock()
        self.lines = 0

    def write(self, event: PlanEvent | dict[str, Any]) -> None:
        rec = event.to_dict() if isinstance(event, PlanEvent) else dict(event)
        line = json.dumps(rec, separators=(",", ":"), allow_nan=False)
        with self._lock:
            if self.out is None:
                raise ValueError(f"plans file {self.path} is closed")
            self.out.write_lines([line])
            self.lines += 1

    def retry(self) -> None:
        with self._lock:
            if self.out is not None:
                self.out.retry()

    def write_all(self, events: list[PlanEvent]) -> None:
        for e in events:
            self.write(e)

    def close(self) -> None:
        with self._lock:
            if self.out is not None:
                self.out.close()
                self.out = None

    def __enter__(self) -> PlansWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PlanMetrics:
    """Prometheus series for rebalance plans, registered on one registry, by job."""

    def __init__(
        self, plans: Counter, throughput: Gauge, escalations: Counter, active: Gauge
    ) -> None:
        self.plans = plans  # straggler_plans_total{job,status}
        self.throughput = throughput  # straggler_throughput_samples_per_second{job,phase}
        self.escalations = escalations  # straggler_plan_escalations_total{job}
        self.active = active  # straggler_plan_active{job}: 1 while on an uneven split
        self._jobs: set[str] = set()

    def add_job(self, job: str) -> None:
        """Make the job's series visible at 0 before its first plan."""
        if job in self._jobs:
            return
        self._jobs.add(job)
        for s in STATUSES:
            self.plans.labels(job=job, status=s)
        self.escalations.labels(job=job)
        self.active.labels(job=job).set(0.0)

    def forget(self, job: str) -> None:
        """Remove every series of ``job`` (it ended); other jobs' series stay."""
        if job not in self._jobs:
            return
        self._jobs.discard(job)
        for s in STATUSES:
            self.plans.remove(job, s)
        for phase in ("before", "after"):
            with contextlib.suppress(KeyError):
                self.throughput.remove(job, phase)
        self.escalations.remove(job)
        self.active.remove(job)

    def observe(self, event: PlanEvent, job: str | None = None) -> None:
        """Count ``event`` under ``job`` (default: the event's own ``job``)."""
        job = event.job if job is None else job
        self.add_job(job)
        self.plans.labels(job=job, status=event.status).inc()
        if event.throughput_before is not None:
            self.throughput.labels(job=job, phase="before").set(event.throughput_before)
        if event.throughput_after is not None:
            self.throughput.labels(job=job, phase="after").set(event.throughput_after)
        if event.escalate:
            self.escalations.labels(job=job).inc()
        if event.status == "verified":
            self.active.labels(job=job).set(0.0 if _even(event.after) else 1.0)
        elif event.status == "rolled_back":
            self.active.labels(job=job).set(0.0 if _even(event.before) else 1.0)


def register_plan_metrics(registry: CollectorRegistry) -> PlanMetrics:
    return PlanMetrics(
        plans=Counter(
            "straggler_plans",
            "Rebalance plan status changes, by job and status",
            ["job", "status"],
            registry=registry,
        ),
        throughput=Gauge(
            "straggler_throughput_samples_per_second",
            "Useful throughput (samples/s) measured before and after the job's latest plan",
            ["job", "phase"],
            registry=registry,
        ),
        escalations=Counter(
            "straggler_plan_escalations",
            "Plans rolled back because throughput did not recover, by job",
            ["job"],
            registry=registry,
        ),
        active=Gauge(
            "straggler_plan_active",
            "1 while a verified uneven split is in force for the job, else 0",
            ["job"],
            registry=registry,
        ),
    )


def _even(split: list[int]) -> bool:
    return max(split) - min(split) <= 1 if split else True
