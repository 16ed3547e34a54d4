"""Inputs for the coordinator's in-process tests (journal, hang restarts, saved state):
a rank's window summary in a 4-rank, 2-host communicator `c0`, the peer of the host
that sends it, and the coordinator itself on a test's own files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from artemis.coordinator.journal import AssemblyJournal
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.service import Coordinator
from artemis.coordinator.sinks import FindingsWriter
from artemis.detect.settings import Settings
from artemis.protocol.messages import RankInfo
from artemis.protocol.peers import PeerInfo
from artemis.protocol.records import RankWindow
from artemis.rebalance.outputs import PlansWriter

C = TypeVar("C", bound=Coordinator)


def rank_window(
    job: str,
    rank: int,
    window: int,
    *,
    gap_ms: float = 100.0,
    step_ms: float = 110.0,
    collectives: int = 20,
) -> RankWindow:
    """Rank `rank`'s window `window` (10 steps, `collectives` collectives of 10 ms)."""
    return RankWindow(
        job=job,
        comm="c0",
        rank=rank,
        nranks=4,
        host=f"h{rank // 2}",
        window=window,
        step_lo=window * 10,
        step_hi=window * 10 + 10,
        coll_lo=window * collectives,
        coll_hi=(window + 1) * collectives,
        gap_ms=gap_ms,
        coll_ms=10.0,
        step_ms=step_ms,
        collectives=collectives,
        bytes=0,
        lost=0,
        clock="device",
    )


def host_peer(job: str, host: str, minor: int = 1) -> PeerInfo:
    """The agent of host `hN` (ranks 2N and 2N+1), speaking protocol 1.`minor`."""
    h = int(host[1:])
    ranks = tuple(RankInfo(job, "c0", r, 4) for r in (2 * h, 2 * h + 1))
    return PeerInfo(host, host, "t", "i", ranks, "127.0.0.1:1", (1, minor), 0.0, 1)


def file_coordinator(
    tmp: Path,
    clock: Callable[[], float],
    cls: type[C] = Coordinator,  # type: ignore[assignment]
    *,
    settings: Settings | None = None,
    restore: bool = True,
    **kw: Any,
) -> C:
    """A coordinator (or a subclass that fails on cue) writing ``tmp``'s f.jsonl and
    p.jsonl, a 30 s deadline and no grace unless ``kw`` says otherwise, its journal
    (f.assembly) restored unless ``restore`` is false (the caller restores its own)."""
    kw = {"deadline_s": 30.0, "grace_s": 0.0, **kw}
    c = cls(
        settings or Settings(),
        FindingsWriter(tmp / "f.jsonl"),
        PlansWriter(tmp / "p.jsonl"),
        Metrics(),
        clock=clock,
        **kw,
    )
    if restore:
        c.restore(AssemblyJournal(tmp / "f.assembly"))
    return c
