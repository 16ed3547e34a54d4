"""What a fleet job's state costs (issue 30 item 3): bytes committed per scored window,
full snapshots vs incremental (`[fleet] snapshot_every`), and the heir's restore time.

In-process, on one PostgreSQL (a tests/pg.py server, or ``ARTEMIS_BENCH_PG_URL`` as in
bench/fleet_failover.py): for each mode, owner A (a `FleetCoordinator`) takes a job of
``--ranks`` ranks on agents of 256, scores ``--windows`` windows (every rank's summary,
one rank 30% slow: a finding and an incident open), and dies right after the last one
(its renewals stop; nothing flushed). Its last window is the one before a full snapshot
is due, so the heir replays the most windows a mode allows (snapshot_every - 1). B then
takes the lease; the time of that (the lease, the load of the last full snapshot and the
journal, the restore, the replay) is the restore time.

Printed per mode: the state committed per window (the full snapshots and markers, as
written to the store, averaged over the run), the journal per window (the batches of
summaries, written in either mode before their acks), the time per window to score and
commit, the heir's restore time with the windows it replayed, and whether its state is
exactly A's last committed one (it must be).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import numpy as np
import structlog
from artemis.coordinator.fleet import FleetCoordinator
from artemis.protocol.columns import to_wire
from artemis.protocol.messages import Windows
from artemis.protocol.peers import PeerInfo
from artemis.protocol.records import RankInfo

from bench._windows import bench_window
from bench.fleet_failover import _database, _tests_on_path

PER_AGENT = 256
LEASE_S = 1.0  # tests/test_fleet_coordinator.py's


def _peer(job: str, agent: int, ranks: range, n: int) -> PeerInfo:
    infos = tuple(RankInfo(job, "c0", r, n) for r in ranks)
    return PeerInfo(f"a{agent}", f"h{agent}", "t", "i", infos, "127.0.0.1:1", (1, 3), 0.0, agent)


def _batch(job: str, agent: int, ranks: range, gap: np.ndarray, w: int) -> Windows:
    rows = tuple(dataclasses.replace(bench_window(r, w, gap), job=job) for r in ranks)
    return Windows(host=f"h{agent}", windows=rows)


def _state(c: FleetCoordinator, job: str) -> Any:
    st = c.jobs.state(job)
    assert st is not None
    st["corrections"] = c.corrections.snapshot(job)
    st.pop("out_seq")  # the process's counter of output groups, not the job's
    return msgpack.unpackb(msgpack.packb(st, use_bin_type=True), raw=False, strict_map_key=False)


async def _mode(tmp: Path, url: str, n: int, windows: int, every: int) -> dict[str, Any]:
    job = f"state-{every}"
    agents = [
        (a, range(a * PER_AGENT, min(n, (a + 1) * PER_AGENT))) for a in range(-(-n // PER_AGENT))
    ]
    peers = {a: _peer(job, a, rs, n) for a, rs in agents}
    from test_fleet_coordinator import fleet_coordinator

    now = [0.0]  # no window waits for a deadline here
    a = fleet_coordinator(tmp / f"a{every}", url, f"a{every}", now, snapshot_every=every)
    b = fleet_coordinator(tmp / f"b{every}", url, f"b{every}", now, snapshot_every=every)
    gap = np.full(n, 100.0)
    gap[1] = 130.0  # rank 1 is 30% slow: a finding, an incident open
    out: dict[str, Any] = {"every": every}
    try:
        assert a.route(peers[0]) == []
        for p in peers.values():
            a.on_connect(p)
        journal = 0
        busy = 0.0
        for w in range(windows):
            msgs = [_batch(job, ag, rs, gap, w) for ag, rs in agents]
            journal += sum(len(msgspec.msgpack.encode(to_wire(m.columns))) for m in msgs)
            t0 = time.perf_counter()
            for ag, _rs in agents:
                await a.on_message(peers[ag], msgs[ag])
            busy += time.perf_counter() - t0
        want = _state(a, job)
        out |= {
            "state_b": a.state_bytes / a.commits,
            "commits": a.commits,
            "journal_b": journal / windows,
            "window_s": busy / windows,
        }
        a.fleet._stop.set()  # dies: no flush, no release
        until = time.monotonic() + 10 * LEASE_S
        while True:
            t0 = time.perf_counter()
            if b.route(peers[0]) == []:
                break
            assert time.monotonic() < until, "the heir never took the lease"
            await asyncio.sleep(0.05)
        out["restore_s"] = time.perf_counter() - t0
        saved = b.fleet.store.load(job)
        out["replayed"] = len(saved.marker.get("delta") or ())
        out["exact"] = _state(b, job) == want
    finally:
        b.flush()
        a.fleet.stop(release=False)
    return out


def run(ranks: int, windows: int, modes: list[int]) -> int:
    _tests_on_path()
    # The coordinators' per-window log lines are not the figures.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    logging.disable(logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fleet-state-") as d, _database() as url:
        if url is None:
            return 0
        for every in modes:
            # The last window is the one before a full snapshot is due: the longest replay.
            w = windows if every == 1 else max(windows // every, 1) * every + every
            rows.append(asyncio.run(_mode(Path(d), url, ranks, w, every)) | {"windows": w})
    print(
        f"fleet job state, {ranks} ranks on agents of {PER_AGENT}, one PostgreSQL over loopback"
        " (in-process owner and heir)"
    )
    print(
        f"{'mode':>24} {'windows':>7} {'state/window':>13} {'journal/window':>15}"
        f" {'score+commit':>13} {'heir restore':>13} {'replayed':>8} {'exact':>5}"
    )
    for r in rows:
        mode = "full every window" if r["every"] == 1 else f"full every {r['every']} windows"
        print(
            f"{mode:>24} {r['windows']:>7} {r['state_b'] / 1e6:>10.3f} MB"
            f" {r['journal_b'] / 1e6:>12.3f} MB {r['window_s'] * 1e3:>10.1f} ms"
            f" {r['restore_s']:>11.2f} s {r['replayed']:>8} {'yes' if r['exact'] else 'NO':>5}"
        )
    return 0 if all(r["exact"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet_state", description=__doc__)
    ap.add_argument("--ranks", type=int, default=16_384, help="ranks of the job (default 16384)")
    ap.add_argument("--windows", type=int, default=20, help="windows at least (default 20)")
    ap.add_argument(
        "--modes", default="1,10", help="snapshot_every values to compare (default %(default)s)"
    )
    a = ap.parse_args(argv if argv is not None else [])
    try:
        modes = [int(m) for m in a.modes.split(",") if m.strip()]
    except ValueError:
        ap.error(f"--modes: expected a comma list of integers, got {a.modes!r}")
    if a.ranks < 4 or a.windows < 2 or not modes or min(modes) < 1:
        ap.error("--ranks must be >= 4, --windows >= 2, --modes integers >= 1")
    return run(a.ranks, a.windows, modes)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
