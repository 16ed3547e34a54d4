"""A hang reported exactly once across coordinator crashes (docs/RELIABILITY.md section 2),
through the real Coordinator service, its journal, state files and findings file.

The kill trials lost the hang when the coordinator was SIGKILLed between asking for
the dumps and reporting: its restart held no hang (only a reported one was saved), and
by the time the agents were back the job had given up and every rank was finished, so
the hang could never be found again from progress. Here the job ends while the
coordinator is down, as it did there.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from artemis.coordinator.service import Coordinator
from artemis.detect.monitor import RESTORED_DUMP_WAIT_S
from artemis.detect.settings import Settings
from artemis.protocol.messages import Dump, Heartbeat, Windows
from artemis.protocol.peers import PeerInfo
from artemis.protocol.records import RankProgress, RankWindow
from service_records import file_coordinator, host_peer, rank_window

JOB = "hj"
DUMP_WAIT_S = 5.0


def rw(rank: int, window: int) -> RankWindow:
    return rank_window(JOB, rank, window)


def peer(host: str) -> PeerInfo:
    return host_peer(JOB, host)


def heartbeat(host: str, finished: bool = False) -> Heartbeat:
    """Rank 3 stopped after collective 99, the others sit in 100 (`finished`: the job
    gave up and closed its rings)."""
    h = int(host[1:])
    return Heartbeat(
        progress=tuple(
            RankProgress(
                JOB, "c0", r, host, 99, None if r == 3 or finished else 100, 12.0, 12.0, finished
            )
            for r in (2 * h, 2 * h + 1)
        )
    )


def dump(rank: int) -> Dump:
    return Dump(job=JOB, comm="c0", rank=rank, records=({"seq": 99, "rank": rank},))


class Crash(Exception):
    """The process dies here (as SIGKILL would: nothing after it runs)."""


class DiesAfterTheHangLine(Coordinator):
    """Dies once its hang finding is written, before the state that says so is saved."""

    def _save(self, job: str, stopped: bool = False) -> None:
        h = self.monitors[job].hang
        if h is not None and h.reported:
            raise Crash
        super()._save(job, stopped)


def make(tmp: Path, now: list[float], cls: type[Coordinator] = Coordinator) -> Coordinator:
    c = file_coordinator(
        tmp, lambda: now[0], cls, settings=Settings(hang_floor_s=1.0), dump_wait_s=DUMP_WAIT_S
    )
    for h in ("h0", "h1"):
        c.on_connect(peer(h))
    return c


async def suspect(c: Coordinator) -> None:
    """Three windows scored, then the hang: suspected, its dumps asked for."""
    for w in range(3):
        await c.on_message(peer("h0"), Windows(host="h0", windows=(rw(0, w), rw(1, w))))
        await c.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, w), rw(3, w))))
    for h in ("h0", "h1"):
        await c.on_message(peer(h), heartbeat(h))
    await c.tick()
    assert [a for _j, a, _b in c._outbox] == ["dump"], "the hang was suspected"


def hangs(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "f.jsonl"  # healthy windows write no line: no file until the hang's
    lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [f for f in lines if f["kind"] == "hang"]


def test_killed_after_the_dump_request_the_restart_reports_the_hang_once(tmp_path: Path) -> None:
    now = [0.0]

    async def run() -> None:
        a = make(tmp_path, now)
        await suspect(a)
        await a.on_message(peer("h0"), dump(0))  # h0's dumps are in, h1's not yet
        await a.on_message(peer("h0"), dump(1))
        del a  # SIGKILL: no flush

        # Back 20 s later; the job gave up meanwhile: every rank reports finished.
        now[0] = 20.0
        b = make(tmp_path, now)
        asked = [(ag, body["ranks"]) for ag, act, body in b._direct if act == "dump"]
        for h in ("h0", "h1"):
            await b.on_message(peer(h), heartbeat(h, finished=True))
        await b.tick()
        assert hangs(tmp_path) == []  # the dump wait starts again at the restart
        await b.on_message(peer("h1"), dump(2))  # h1 answers for rank 2 only
        now[0] = 20.0 + RESTORED_DUMP_WAIT_S - 0.1
        await b.tick()
        assert hangs(tmp_path) == []  # a restored hang waits longer (the agents come back)
        now[0] = 20.0 + RESTORED_DUMP_WAIT_S
        await b.tick()
        (h,) = hangs(tmp_path)
        assert (h["ranks"], h["window"], h["steps"]) == ([3], 5, [50, 51])
        assert [Path(p).name for p in h["evidence"]["dumps"]] == [
            f"{JOB}-r{r}-c0.jsonl" for r in (0, 1, 2)
        ]
        # When they connected, h1 was asked again for its ranks' dumps; h0 (whose
        # dumps were in) was not (the protocol server, absent here, would send them).
        assert asked == [("h1", [2, 3])]
        del b

        # Killed again after the report was saved: never reported twice, nothing asked.
        now[0] = 60.0
        c = make(tmp_path, now)
        assert [d for d in c._direct if d[1] == "dump"] == []
        for hh in ("h0", "h1"):
            await c.on_message(peer(hh), heartbeat(hh))
        for t in (60.0, 70.0, 100.0):
            now[0] = t
            await c.tick()
        c.flush()

    asyncio.run(run())
    assert len(hangs(tmp_path)) == 1


def test_killed_between_the_hang_line_and_its_state_the_line_is_written_once(
    tmp_path: Path,
) -> None:
    """The line written, the state not saved: the restart cuts the line back (its group
    was never seen through) and must write it again itself, the job being gone."""
    now = [0.0]

    async def run() -> None:
        a = make(tmp_path, now, DiesAfterTheHangLine)
        await suspect(a)
        for r in range(4):
            await a.on_message(peer(f"h{r // 2}"), dump(r))
        now[0] = 1.0
        try:
            await a.tick()  # every dump in: reported, and the process dies
        except Crash:
            pass
        else:
            raise AssertionError("the hang was not reported")
        assert len(hangs(tmp_path)) == 1  # the dead coordinator wrote it
        del a

        now[0] = 20.0
        b = make(tmp_path, now)
        assert hangs(tmp_path) == []  # cut back: its group was interrupted
        for h in ("h0", "h1"):
            await b.on_message(peer(h), heartbeat(h, finished=True))
        await b.tick()  # all four dumps were saved with the hang: reported at once
        (h,) = hangs(tmp_path)
        assert len(h["evidence"]["dumps"]) == 4 and h["ranks"] == [3]
        now[0] = 40.0
        await b.tick()
        b.flush()

    asyncio.run(run())
    assert len(hangs(tmp_path)) == 1
