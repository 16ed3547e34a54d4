"""Where one rank stands (last collective done, the one it sits in, how long idle), from
the records the agent polls: the input of the coordinator's hang detection. Pure."""

from __future__ import annotations

import numpy as np
from artemis.agent.summary import is_done
from artemis.protocol.records import RankProgress
from artemis.ring.format import KIND_COLL


def ring_position(
    done: np.ndarray, inflight: np.ndarray, last_done: int = -1
) -> tuple[int, int | None]:
    """(last done coll_seq, collective the rank sits in) from polled records.

    Only collectives count. ``last_done`` carries the value from earlier polls;
    the rank sits in the oldest in-flight collective newer than it.
    """
    if done.size:
        d = done[(np.asarray(done["kind"]) == KIND_COLL) & is_done(done)]
        if d.size:
            last_done = max(last_done, int(d["coll_seq"].max()))
    sitting: int | None = None
    if inflight.size:
        f = inflight["coll_seq"][
            (np.asarray(inflight["kind"]) == KIND_COLL)
            & (inflight["coll_seq"].astype(np.int64) > last_done)
        ]
        if f.size:
            sitting = int(f.min())
    return last_done, sitting


class ProgressTracker:
    """Where one rank stands, from the agent's own monotonic observations.

    ``idle_s`` is the time since anything observed changed (last done, the
    in-flight collective, the ring's write index when given, or ``changed=True``
    from the caller, e.g. any record polled); ``inflight_s`` the time since the
    current in-flight collective was first seen.
    """

    def __init__(self, job: str, comm: str, rank: int, host: str) -> None:
        self.job, self.comm, self.rank, self.host = job, comm, rank, host
        self.last_done = -1
        self._state: tuple[int, int | None, int | None] | None = None
        self._changed_at = 0.0
        self._inflight: int | None = None
        self._inflight_since = 0.0
        self._current = RankProgress(job, comm, rank, host, -1, None, 0.0, 0.0)

    def observe(
        self,
        now: float,
        last_done: int | None,
        inflight: int | None,
        finished: bool = False,
        ring_index: int | None = None,
        changed: bool = False,
    ) -> RankProgress:
        """Record one observation; ``last_done`` None means no collective completed now."""
        if last_done is not None:
            self.last_done = max(self.last_done, last_done)
        state = (self.last_done, inflight, ring_index)
        if changed or state != self._state:
            self._state, self._changed_at = state, now
        if inflight != self._inflight:
            self._inflight, self._inflight_since = inflight, now
        self._current = RankProgress(
            job=self.job,
            comm=self.comm,
            rank=self.rank,
            host=self.host,
            last_done=self.last_done,
            inflight=inflight,
            inflight_s=0.0 if inflight is None else max(0.0, now - self._inflight_since),
            idle_s=max(0.0, now - self._changed_at),
            finished=finished,
        )
        return self._current

    def current(self) -> RankProgress:
        """The progress computed at the last observation."""
        return self._current

    def update(
        self,
        now: float,
        done: np.ndarray,
        inflight: np.ndarray,
        finished: bool = False,
        ring_index: int | None = None,
    ) -> RankProgress:
        """``observe`` from this poll's DONE and in-flight records."""
        last, sitting = ring_position(done, inflight, self.last_done)
        return self.observe(now, last, sitting, finished, ring_index)
