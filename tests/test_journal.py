"""The assembly journal: what a coordinator took but did not score survives its death."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import msgpack
import pytest
from artemis.coordinator.journal import AssemblyJournal
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.service import Coordinator
from artemis.protocol.columns import WindowColumns
from artemis.protocol.messages import Windows
from artemis.protocol.peers import PeerInfo
from artemis.protocol.records import RankWindow, Telemetry
from service_records import file_coordinator, host_peer, rank_window

C = TypeVar("C", bound=Coordinator)

JOB = "jj"


def rw(rank: int, window: int) -> RankWindow:
    gap = 130.0 if rank == 1 else 100.0  # rank 1 is 30% slow
    return rank_window(JOB, rank, window, gap_ms=gap, step_ms=140.0, collectives=40)


def peer(host: str) -> PeerInfo:
    return host_peer(JOB, host, minor=0)


def make(tmp: Path, now: list[float], grace_s: float) -> tuple[Coordinator, Metrics]:
    c = file_coordinator(tmp, lambda: now[0], grace_s=grace_s)
    return c, c.metrics


def scored(m: Metrics) -> float:
    return m.registry.get_sample_value("straggler_windows_scored_total", {"job": JOB}) or 0.0


def test_windows_half_assembled_at_a_crash_are_scored_after_the_restart(tmp_path: Path) -> None:
    now = [0.0]

    async def run() -> None:
        a, ma = make(tmp_path, now, grace_s=0.0)
        a.on_connect(peer("h0"))
        a.on_connect(peer("h1"))
        for w in range(3):  # windows 0-2 from both hosts: scored by the first life
            await a.on_message(peer("h0"), Windows(host="h0", windows=(rw(0, w), rw(1, w))))
            await a.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, w), rw(3, w))))
        assert scored(ma) == 3
        # Window 3: host h0's part arrives and is acked, then the process dies.
        await a.on_message(peer("h0"), Windows(host="h0", windows=(rw(0, 3), rw(1, 3))))
        assert scored(ma) == 3
        del a  # no flush, no close: as after SIGKILL

        now[0] = 10.0
        b, mb = make(tmp_path, now, grace_s=1.0)  # the restart replays the journal
        b.on_connect(peer("h0"))
        assert b.assembler.pending == 1  # window 3, with h0's two ranks
        now[0] = 10.5
        b.on_connect(peer("h1"))  # h1 reconnects within the grace
        # ...and resends what the dead coordinator never acked (its part of window 3).
        await b.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, 3), rw(3, 3))))
        now[0] = 11.5
        await b.tick()
        assert scored(mb) == 1
        # ...and an old resend of a window scored before the crash is late, not rescored.
        await b.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, 2), rw(3, 2))))
        assert scored(mb) == 1 and b.assembler.late == 2  # two rank summaries
        b.flush()

    asyncio.run(run())
    lines = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    w3 = [f for f in lines if f["window"] == 3]
    # Window 3 was scored once, with all four ranks (rank 1 judged against its peers).
    assert len(w3) == 1 and w3[0]["rank"] == 1 and w3[0]["basis"] == "peers"
    # ...by the detector state the first life saved: suspect in windows 1 and 2, so the
    # third bad window flags it, since window 1 (a fresh detector would say suspect).
    states = [(f["window"], f["state"], f["since"], f["job"]) for f in lines if f["kind"] == "rank"]
    assert states == [(1, "suspect", 1, JOB), (2, "suspect", 1, JOB), (3, "flagged", 1, JOB)]


def test_summaries_come_back_exactly_and_a_torn_tail_is_ignored(tmp_path: Path) -> None:
    tel = Telemetry(vendor="amd", sm_mhz=2100.0, throttle={"hw_thermal": True}, missing=("ncpu",))
    first = dataclasses.replace(rw(0, 0), telemetry=tel, samples=33, bridge_ms=1.5)
    j = AssemblyJournal(tmp_path / "x.assembly")
    j.open([])
    j.added([first, rw(1, 0)])
    j.close()
    with open(tmp_path / "x.assembly", "ab") as fh:
        fh.write(b"\x92\xa1w\x8f")  # a write cut short
    pending, released = AssemblyJournal(tmp_path / "x.assembly").load()
    assert pending == [first, rw(1, 0)] and released == set()


def test_batches_are_columns_and_release_marks_filter_them(tmp_path: Path) -> None:
    j = AssemblyJournal(tmp_path / "c.assembly")
    j.open([])
    j.added(WindowColumns.from_records([rw(0, 0), rw(1, 0), rw(0, 1)]))
    j.added(Windows(host="h0", windows=(rw(1, 1), rw(2, 1))).columns)
    j.released(JOB, 0)
    j.close()
    cols, released = AssemblyJournal(tmp_path / "c.assembly").load_columns()
    assert released == {(JOB, None, 0)}
    assert cols.rows() == [rw(0, 1), rw(1, 1), rw(2, 1)]
    # Each batch is one entry, the columnar wire map: no record per rank.
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed((tmp_path / "c.assembly").read_bytes())
    items = list(unpacker)
    assert [i[0] for i in items] == ["h", "c", "c", "r"]
    assert items[1][1]["n"] == 3 and items[1][1]["rank"][0] == "<i8"


def test_a_journal_of_the_first_format_is_still_read(tmp_path: Path) -> None:
    # Written as the previous coordinator did: field names in the header, then values.
    rw_names = [f for f in RankWindow.__dataclass_fields__ if f != "telemetry"]
    tel_names = list(Telemetry.__dataclass_fields__)
    tel = Telemetry(sm_mhz=1900.0, missing=("ncpu",))
    w = dataclasses.replace(rw(3, 5), telemetry=tel)
    with open(tmp_path / "old.assembly", "wb") as fh:
        fh.write(msgpack.packb(["h", rw_names, tel_names]))
        for x in (w, rw(2, 5), rw(2, 4)):
            vals = [getattr(x, k) for k in rw_names]
            tvals = [list(v) if isinstance(v, tuple) else v for v in
                     (getattr(x.telemetry, k) for k in tel_names)]  # fmt: skip
            fh.write(msgpack.packb(["w", vals, tvals]))
        fh.write(msgpack.packb(["r", JOB, 4]))
    pending, released = AssemblyJournal(tmp_path / "old.assembly").load()
    assert pending == [w, rw(2, 5)] and released == {(JOB, None, 4)}


def test_a_release_mark_names_its_run_so_a_new_run_of_the_job_is_not_filtered(
    tmp_path: Path,
) -> None:
    j = AssemblyJournal(tmp_path / "r.assembly")
    j.open([])
    old, new = rw(0, 0), dataclasses.replace(rw(0, 0), comm="c1")  # a new run: window 0 again
    j.added([old])
    j.released(JOB, 0, ["c0"])
    j.added([new])
    j.close()
    pending, released = AssemblyJournal(tmp_path / "r.assembly").load()
    assert pending == [new] and released == {(JOB, "c0", 0)}
    # The compacted file says the same.
    j2 = AssemblyJournal(tmp_path / "r.assembly")
    j2.open(pending, [(JOB, 0, ["c0"])])
    j2.close()
    assert AssemblyJournal(tmp_path / "r.assembly").load() == (pending, released)


def test_a_batch_off_the_wire_is_journaled_as_it_came(tmp_path: Path) -> None:
    from artemis.protocol.codec import decode_frame_body, encode

    tel = Telemetry(sm_mhz=1500.0, missing=("ncpu",))
    sent = Windows(host="h0", windows=(dataclasses.replace(rw(0, 7), telemetry=tel), rw(1, 7)))
    got = decode_frame_body(encode(sent)[4:])
    assert isinstance(got, Windows) and got.columns.wire is not None
    j = AssemblyJournal(tmp_path / "w.assembly")
    j.open([])
    j.added(got.columns)
    j.close()
    pending, _ = AssemblyJournal(tmp_path / "w.assembly").load()
    assert pending == list(sent.windows)


class Crash(Exception):
    """The process dies here (as SIGKILL would: nothing after it runs)."""


class CrashingCoordinator(Coordinator):
    """Dies once, at `at`: "save" (its outputs written, its state not saved) or "mark"
    (its state saved, its release mark not written) of window `window`."""

    at = ""
    window = -1

    def _save(self, job: str) -> None:
        if self.at == "save" and self.monitors[job].last_window == self.window:
            raise Crash
        super()._save(job)


class CrashingJournal(AssemblyJournal):
    window = -1

    def released(
        self, job: str, window: int, comms: Sequence[str] = (), missing: Sequence[int] = ()
    ) -> bool:
        if window == self.window:
            raise Crash
        return super().released(job, window, comms, missing)


def _rank_lines(tmp: Path) -> list[tuple[int, str, int]]:
    lines = [json.loads(x) for x in (tmp / "f.jsonl").read_text().splitlines()]
    return [(f["window"], f["state"], f["since"]) for f in lines if f["kind"] == "rank"]


@pytest.mark.parametrize("at", ["save", "mark"])
def test_a_crash_inside_a_windows_outputs_scores_it_once(tmp_path: Path, at: str) -> None:
    """The DESIGN "Coordinator crash" gap, closed: killed after window 3's findings line
    but before its state (or its release mark) was written, the restart neither loses
    window 3 nor writes its line twice."""
    now = [0.0]

    async def run() -> None:
        a = file_coordinator(tmp_path, lambda: now[0], CrashingCoordinator, restore=False)
        j = CrashingJournal(tmp_path / "f.assembly")
        a.restore(j)
        a.on_connect(peer("h0"))
        a.on_connect(peer("h1"))
        for w in range(4):
            if w == 3:
                a.at, a.window, j.window = at, 3, 3 if at == "mark" else -1
            await a.on_message(peer("h0"), Windows(host="h0", windows=(rw(0, w), rw(1, w))))
            try:
                await a.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, w), rw(3, w))))
            except Crash:
                assert w == 3
        # Window 3's line is in the file: the dead coordinator wrote it.
        assert _rank_lines(tmp_path)[-1][0] == 3
        del a

        now[0] = 10.0
        b, _ = make(tmp_path, now, grace_s=1.0)
        b.on_connect(peer("h0"))
        b.on_connect(peer("h1"))
        # The agents resend what was never acked (window 3 of h1) and go on.
        await b.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, 3), rw(3, 3))))
        await b.on_message(peer("h0"), Windows(host="h0", windows=(rw(0, 4), rw(1, 4))))
        await b.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, 4), rw(3, 4))))
        b.flush()

    asyncio.run(run())
    assert _rank_lines(tmp_path) == [
        (1, "suspect", 1),
        (2, "suspect", 1),
        (3, "flagged", 1),
        (4, "ongoing", 1),
    ]


def _journal_sizes(tmp: Path, windows: int) -> list[int]:
    now = [0.0]
    sizes = []

    async def run() -> None:
        a, ma = make(tmp, now, grace_s=0.0)
        a.on_connect(peer("h0"))
        a.on_connect(peer("h1"))
        for w in range(windows):
            await a.on_message(peer("h0"), Windows(host="h0", windows=(rw(0, w), rw(1, w))))
            await a.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, w), rw(3, w))))
            sizes.append((tmp / "f.assembly").stat().st_size)
        assert scored(ma) == windows
        a.flush()

    asyncio.run(run())
    return sizes


def test_the_journal_is_compacted_by_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scored windows' batches are dead weight: the file is rewritten once
    COMPACT_MIN_BYTES (or 4 x its live part) were appended, so it stays about that size
    however long the coordinator runs."""
    from artemis.coordinator import journal

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setattr(journal, "COMPACT_MIN_BYTES", 1 << 40)
    grown = _journal_sizes(tmp_path / "a", 300)  # as before: every batch kept
    monkeypatch.setattr(journal, "COMPACT_MIN_BYTES", 8192)
    sizes = _journal_sizes(tmp_path / "b", 300)
    # What is left after a rewrite: the release marks the assembler keeps (one per
    # window here, all 300 under its 4096), about 10 bytes each, and no batch.
    assert grown[-1] > 300 * 300, grown[-1]
    assert max(sizes) < 8192 + 5 * (300 * 12 + 2 * 300), max(sizes)
    assert sizes[-1] < grown[-1] / 5, (sizes[-1], grown[-1])


def test_a_crash_between_two_windows_released_together_loses_neither(tmp_path: Path) -> None:
    """Windows 3 and 4 complete in one batch (h1 sends both), so the assembler releases
    them together; the coordinator dies while scoring window 4. The state saved after
    window 3 must not count window 4 as released, or the restart would take its
    journaled summaries for resends (late) and window 4 would never be scored."""
    now = [0.0]

    async def run() -> None:
        a = file_coordinator(tmp_path, lambda: now[0], CrashingCoordinator)
        a.on_connect(peer("h0"))
        a.on_connect(peer("h1"))
        for w in range(3):
            await a.on_message(peer("h0"), Windows(host="h0", windows=(rw(0, w), rw(1, w))))
            await a.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, w), rw(3, w))))
        for w in (3, 4):
            await a.on_message(peer("h0"), Windows(host="h0", windows=(rw(0, w), rw(1, w))))
        a.at, a.window = "save", 4
        both = (rw(2, 3), rw(3, 3), rw(2, 4), rw(3, 4))
        with pytest.raises(Crash):
            await a.on_message(peer("h1"), Windows(host="h1", windows=both))
        del a

        now[0] = 10.0
        b, mb = make(tmp_path, now, grace_s=1.0)
        b.on_connect(peer("h0"))
        b.on_connect(peer("h1"))
        await b.on_message(peer("h1"), Windows(host="h1", windows=both))  # resent: not acked
        now[0] = 11.5  # past the restart's grace
        await b.tick()
        assert scored(mb) == 1  # window 4, from the journal and the resend
        b.flush()

    asyncio.run(run())
    assert [w for w, _st, _s in _rank_lines(tmp_path)] == [1, 2, 3, 4]


def _late_scored(m: Metrics) -> float:
    return m.registry.get_sample_value("straggler_windows_late_scored_total", {"job": JOB}) or 0.0


def test_a_late_summary_taken_but_not_scored_at_a_crash_is_scored_once(tmp_path: Path) -> None:
    """Window 3 is scored at its deadline without host h1 (a partition). h1's late rank
    3 arrives and is acked, but its late part waits for rank 2: the coordinator dies.
    The restart replays it from the journal (its mark still lists ranks 2 and 3),
    scores it late with rank 2 against window 3's own peers, and a resend of rank 3
    (never acked in the agent's view) is not scored twice."""
    now = [0.0]

    async def run() -> None:
        a, ma = make(tmp_path, now, grace_s=0.0)
        a.on_connect(peer("h0"))
        a.on_connect(peer("h1"))
        for w in range(3):
            await a.on_message(peer("h0"), Windows(host="h0", windows=(rw(0, w), rw(1, w))))
            await a.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, w), rw(3, w))))
        await a.on_message(peer("h0"), Windows(host="h0", windows=(rw(0, 3), rw(1, 3))))
        now[0] = 31.0
        await a.tick()  # window 3's deadline: scored with ranks 2 and 3 missing
        assert scored(ma) == 4
        await a.on_message(peer("h1"), Windows(host="h1", windows=(rw(3, 3),)))
        assert _late_scored(ma) == 0 and a.assembler.pending == 1  # a late part, waiting
        del a  # SIGKILL

        now[0] = 40.0
        b, mb = make(tmp_path, now, grace_s=0.0)
        assert b.assembler.pending == 1  # rank 3's late summary, from the journal
        b.on_connect(peer("h0"))
        b.on_connect(peer("h1"))
        await b.on_message(peer("h1"), Windows(host="h1", windows=(rw(2, 3), rw(3, 3))))
        assert _late_scored(mb) == 2  # ranks 2 and 3, once each
        assert b.assembler.duplicates == 1 and not b.assembler.dropped  # rank 3 resent
        assert b.assembler.still_missing(JOB, "c0", 3) == []
        b.flush()

    asyncio.run(run())
    journal = AssemblyJournal(tmp_path / "f.assembly")
    pending, released = journal.load_columns()
    assert pending.n == 0 and (JOB, "c0", 3) in released and not journal.open_marks
