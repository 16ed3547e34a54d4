"""Writes the pre-redesign restore fixture (issue 28: saved state restores after it).

Run from the repository root, with the code of the commit before the redesign:

    python tests/data/pre_redesign/make_fixture.py

A short deterministic job (4 ranks on 2 hosts, rank 1 30% slow from window 1 on, well
again from window 9) goes through the coordinator's entry points: `Coordinator.restore`
on an empty journal, the hosts' `Windows` messages, then a death after window 6's first
half was taken (no flush, as after SIGKILL). What that life persisted is kept under
`state/`: the job's monitor snapshot (`f.assembly.jobs/*.state`, written by `_save`),
the assembly journal (`f.assembly`), the SQLite store (`artemis.db`) and the JSONL
outputs so far. A second life restores a copy of it and continues the job to its end;
what it wrote is `expected.json`, which tests/test_restore_fixture.py compares with what
the current code writes from the same state.

Only the coordinator's stable entry points are used (constructor, restore, on_connect,
on_message, tick, flush), so both files outlive the refactoring of its insides.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/: service_records

from artemis.coordinator.journal import AssemblyJournal  # noqa: E402
from artemis.coordinator.metrics import Metrics  # noqa: E402
from artemis.coordinator.service import Coordinator  # noqa: E402
from artemis.coordinator.sinks import FindingsWriter  # noqa: E402
from artemis.detect.settings import Settings  # noqa: E402
from artemis.protocol.messages import Windows  # noqa: E402
from artemis.protocol.records import RankWindow  # noqa: E402
from artemis.rebalance.outputs import PlansWriter  # noqa: E402
from artemis.store.base import open_store, store_url  # noqa: E402
from artemis.store.sink import StoreSink  # noqa: E402
from service_records import host_peer, rank_window  # noqa: E402

JOB = "pre"
WALL0 = 1_750_000_000.0  # the incident records' unix time: wall = WALL0 + clock
CRASH_AT = 6  # the first life dies after host h0's half of this window
LAST = 12  # the second life goes on to this window, then shuts down cleanly
WELL_FROM = 9  # rank 1 is slow in windows 1..WELL_FROM-1
OUTPUTS = ("f.jsonl", "incidents.jsonl", "p.jsonl")  # the JSONL outputs a life writes


def rw(rank: int, window: int) -> RankWindow:
    slow = rank == 1 and 1 <= window < WELL_FROM
    return rank_window(
        JOB, rank, window, gap_ms=130.0 if slow else 100.0, step_ms=140.0, collectives=40
    )


def half(host: str, window: int) -> Windows:
    h = int(host[1:])
    return Windows(host=host, windows=(rw(2 * h, window), rw(2 * h + 1, window)))


def coordinator(d: Path, now: list[float]) -> Coordinator:
    """A coordinator on directory `d`, restored from what is there (nothing: a first life)."""
    findings = FindingsWriter(d / "f.jsonl")
    store = StoreSink.open("auto", findings.path)  # artemis.db beside the findings
    c = Coordinator(
        Settings(), findings, PlansWriter(d / "p.jsonl"), Metrics(), deadline_s=30.0,
        grace_s=1.0, clock=lambda: now[0], wall=lambda: WALL0 + now[0], store=store,
    )  # fmt: skip
    c.restore(AssemblyJournal(d / "f.assembly"))
    return c


def first_life(d: Path) -> None:
    """Windows 0..CRASH_AT-1 scored, CRASH_AT half taken, then killed (nothing flushed
    but the store's queue: its rows were written before the death in a real run too)."""
    now = [0.0]

    async def run() -> None:
        c = coordinator(d, now)
        for h in ("h0", "h1"):
            c.on_connect(host_peer(JOB, h))
        for w in range(CRASH_AT):
            now[0] = float(w)
            for h in ("h0", "h1"):
                await c.on_message(host_peer(JOB, h), half(h, w))
        now[0] = float(CRASH_AT)
        await c.on_message(host_peer(JOB, "h0"), half("h0", CRASH_AT))
        c.store.close()
        for out in (c.findings, c.incidents, c.plans):
            out.close()  # the lines written so far (a killed process's are in the page cache)
        assert c.journal is not None
        c.journal.close()

    asyncio.run(run())


def second_life(d: Path) -> None:
    """Restore `d`, take h1's resend of window CRASH_AT, go on to LAST, shut down."""
    now = [100.0]

    async def run() -> None:
        c = coordinator(d, now)
        for h in ("h0", "h1"):
            c.on_connect(host_peer(JOB, h))
        await c.on_message(host_peer(JOB, "h1"), half("h1", CRASH_AT))
        for w in range(CRASH_AT + 1, LAST + 1):
            now[0] = 100.0 + w
            for h in ("h0", "h1"):
                await c.on_message(host_peer(JOB, h), half(h, w))
            await c.tick()
        c.flush()

    asyncio.run(run())


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _window(mark: dict[str, Any] | None) -> int | None:
    return None if mark is None else mark.get("window")


def outcome(d: Path, skip: dict[str, int]) -> dict[str, Any]:
    """What a second life wrote into `d`: its findings (subject, state, window), its
    incident records' ids and changes, and the store's incidents. `skip`: the lines each
    JSONL held before it."""
    findings = _lines(d / "f.jsonl")[skip["f.jsonl"] :]
    incidents = _lines(d / "incidents.jsonl")[skip["incidents.jsonl"] :]
    with open_store(store_url(d / "artemis.db"), readonly=True) as store:
        stored = sorted(
            (r["id"], r["job"], r["status"], _window(r["closed"])) for r in store.incidents()
        )
    return {
        "findings": [
            {
                "job": f["job"],
                "kind": f["kind"],
                "subject": f.get("subject"),
                "rank": f.get("rank"),
                "state": f["state"],
                "window": f["window"],
                "since": f.get("since"),
                "basis": f.get("basis"),
            }
            for f in findings
        ],
        "incidents": [
            {
                "id": r["id"],
                "change": r["change"],
                "status": r["status"],
                "closed": _window(r["closed"]),
            }
            for r in incidents
        ],
        "store_incidents": [list(r) for r in stored],
    }


def line_counts(d: Path) -> dict[str, int]:
    return {name: len(_lines(d / name)) for name in OUTPUTS}


def main() -> None:
    state = HERE / "state"
    work = HERE / "work"
    for p in (state, work):
        shutil.rmtree(p, ignore_errors=True)
    state.mkdir()
    first_life(state)
    shutil.copytree(state, work)
    skip = line_counts(work)
    second_life(work)
    expected = {"lines_before": skip, **outcome(work, skip)}
    (HERE / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(work)
    total = sum(p.stat().st_size for p in HERE.rglob("*") if p.is_file())
    print(f"fixture written: {state} ({total} bytes in all)")


if __name__ == "__main__":
    main()
