"""Splitting the agent's data messages by job, for uplinks that serve different jobs.

In a coordinator fleet (docs/DESIGN.md "Protocol") each job has one owner, and an
agent whose ranks belong to jobs of different owners keeps one uplink per owner. A
message queued before a job moved (a windows batch of several jobs, a heartbeat with
their progress and plan acks) is cut in two here: the rows of the moving jobs, in
their order, and the rest. Pure functions: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
from artemis.protocol.messages import (
    DataMessage,
    Dump,
    Fingerprint,
    Heartbeat,
    Message,
    Windows,
)


def jobs_of(msg: Message) -> set[str]:
    """The jobs a data message speaks about (empty: about none, e.g. a bare heartbeat)."""
    if isinstance(msg, Windows):
        return set(msg.columns["job"])
    if isinstance(msg, Heartbeat):
        acks = {str(a.get("job", "")) for a in msg.plan_acks}
        return ({p.job for p in msg.progress} | acks) - {""}
    if isinstance(msg, Dump | Fingerprint):
        return {msg.job}
    return set()


def split_by_job(
    msg: DataMessage, jobs: Collection[str]
) -> tuple[DataMessage | None, DataMessage | None]:
    """(what stays, what moves): the parts of ``msg`` about ``jobs`` move, the rest stays.

    A heartbeat always stays (it is also the link's liveness); its moving part carries
    only the moving jobs' progress and plan acks. None: nothing on that side.
    """
    if isinstance(msg, Windows):
        job_col = msg.columns["job"]
        moving = np.fromiter((j in jobs for j in job_col), dtype=bool, count=len(job_col))
        if not moving.any():
            return msg, None
        if moving.all():
            return None, msg
        stay_ix = np.flatnonzero(~moving)
        move_ix = np.flatnonzero(moving)
        return (
            Windows(host=msg.host, columns=msg.columns.take(stay_ix)),
            Windows(host=msg.host, columns=msg.columns.take(move_ix)),
        )
    if isinstance(msg, Heartbeat):
        prog_move = tuple(p for p in msg.progress if p.job in jobs)
        acks_move = tuple(a for a in msg.plan_acks if str(a.get("job", "")) in jobs)
        if not prog_move and not acks_move:
            return msg, None
        stay = Heartbeat(
            progress=tuple(p for p in msg.progress if p.job not in jobs),
            buffered=msg.buffered,
            dropped=msg.dropped,
            plan_acks=tuple(a for a in msg.plan_acks if str(a.get("job", "")) not in jobs),
        )
        move = Heartbeat(
            progress=prog_move, buffered=msg.buffered, dropped=msg.dropped, plan_acks=acks_move
        )
        return stay, move
    if msg.job in jobs:
        return None, msg
    return msg, None


__all__ = ["jobs_of", "split_by_job"]
