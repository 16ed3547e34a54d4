"""A fleet job's state between full snapshots: which commit writes the whole state, what
the marker says, and what an heir replays (docs/DESIGN.md "The coordinator fleet").

A full snapshot of a big job is megabytes (2.57 MB at 16k ranks); the store's journal
already holds every batch of summaries the owner took. So a committed window writes
the whole state only every `snapshot_every` scored windows; in between it writes the
marker alone, and the marker lists each window committed since the last full snapshot
with the wall time it was scored at (`Delta`). An heir restores the full snapshot and
re-scores those windows from the journal with their outputs suppressed (their owner
wrote them), which rebuilds the state exactly, then scores the rest normally.

That holds only while nothing but scoring a window from its batches changed the job
since the last full snapshot. Anything else makes the job `dirty` (the shell says so:
a hello, a heartbeat that taught a rank or host, a plan ack, a correction, a
settings change, a fingerprint, a dump, a hang, a baseline read, a new run, a late
part, a window released incomplete), and its next commit is a full snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Delta", "Replay", "SnapshotPolicy"]

# (run, window, wall): a window committed as a delta, and the wall time (unix s) it was
# scored at (its incident records carry it: a replay must use the same).
Delta = tuple[str, int, float]


@dataclass
class _Chain:
    """What this owner committed of a job since its last full snapshot."""

    deltas: list[Delta] = field(default_factory=list)
    full: int | None = None  # the window the last full snapshot covers (-1: none scored)


class SnapshotPolicy:
    """Per job: full snapshot or delta for the next commit, and the marker's delta part.
    `every`: the `[fleet] snapshot_every` key (1 = a full snapshot every commit)."""

    def __init__(self, every: int) -> None:
        if every < 1:
            raise ValueError(f"[fleet] snapshot_every must be >= 1, got {every}")
        self.every = every
        self._chains: dict[str, _Chain] = {}  # jobs with a full snapshot by this owner
        self._dirty: set[str] = set()
        self._window: tuple[str, Delta] | None = None  # the window being scored, if eligible
        # Ranks each job's hellos and heartbeats have announced in this owner's life: a
        # heartbeat of one of them cannot change the job's state (expect only grows).
        self.announced: dict[str, set[int]] = {}

    def dirty(self, *jobs: str) -> None:
        """Something a replay of the journal cannot redo changed these jobs."""
        self._dirty.update(jobs)

    def forget(self, job: str) -> None:
        self._chains.pop(job, None)
        self._dirty.discard(job)
        self.announced.pop(job, None)
        if self._window is not None and self._window[0] == job:
            self._window = None

    def scoring(self, job: str, delta: Delta | None) -> None:
        """A window of `job` is being scored; `delta` None: it may not be a delta (a late
        part, released incomplete, a new run, one refused): its commit is full."""
        if delta is None:
            self._dirty.add(job)
        self._window = None if delta is None else (job, delta)

    def scored(self) -> None:
        self._window = None

    def take(self, job: str) -> Delta | None:
        """The delta the job's next commit may be, or None: a full snapshot is due."""
        w, self._window = self._window, None
        chain = self._chains.get(job)
        if w is None or w[0] != job or job in self._dirty or chain is None:
            return None
        if len(chain.deltas) + 1 >= self.every:
            return None  # every `every` scored windows: the whole state
        return w[1]

    def committed(self, job: str, delta: Delta | None, window: int | None) -> None:
        """A commit went through: a delta joins the chain; a full snapshot (at `window`)
        starts a new one."""
        if delta is None:
            self._chains[job] = _Chain(full=window)
            self._dirty.discard(job)
        else:
            self._chains[job].deltas.append(delta)

    def marker(self, job: str, delta: Delta | None, window: int | None) -> dict[str, Any]:
        """The marker's delta part for a commit: the window the last full snapshot covers
        and every window committed since (with this one)."""
        if delta is None:
            return {"full": window, "delta": []}
        chain = self._chains[job]
        return {"full": chain.full, "delta": [list(d) for d in [*chain.deltas, delta]]}


class Replay:
    """The windows an heir re-scores with their outputs suppressed: those the marker lists
    as committed since the full snapshot, each with its wall time. A marker of an older
    coordinator (no delta) lists none: its state was full at every commit."""

    def __init__(self, marker: Mapping[str, Any]) -> None:
        self.walls: dict[tuple[str, int], float] = {}
        for item in marker.get("delta") or ():
            if not isinstance(item, list | tuple) or len(item) != 3:
                raise ValueError(
                    f"fleet marker: a delta entry must be [run, window, wall], got {item!r}"
                )
            self.walls[(str(item[0]), int(item[1]))] = float(item[2])
        self.upto = max((w for _r, w in self.walls), default=None)
        self.replayed = 0

    def take(self, run: str, window: int) -> float | None:
        """The wall time to re-score (run, window) at, or None: not one to replay."""
        wall = self.walls.pop((run, window), None)
        if wall is not None:
            self.replayed += 1
        return wall

    @property
    def done(self) -> bool:
        return not self.walls
