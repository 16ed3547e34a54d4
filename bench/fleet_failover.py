"""Failover of a coordinator fleet (issue 30 "Benchmark"): the time from the owner's
SIGKILL to the next window scored, over 20 kills; goal: p99 at most lease_s + 2 windows.

Three `artemis-coordinator serve --fleet` processes on one PostgreSQL (a server of
tests/pg.py started here, or ``ARTEMIS_BENCH_PG_URL``: a database this may fill, a fresh
one per run is created next to it), two `artemis-agent run` processes given the fleet's
addresses, and an 8-rank lockstep job written through the real plugin
(tests/fleet_harness.py), one window every ``--window-s`` seconds whatever the fleet
does (a job does not wait for its monitor). Then, ``--kills`` times: once the job's owner
(the one member exporting ``straggler_job_owner{job}``) has scored two windows in a row,
SIGKILL it, and time until another member scores a window of the job (its
``straggler_windows_scored_total{job}`` goes up; /metrics polled every ``POLL_S``); the
killed member is started again before the next kill, so the fleet stays three.

Printed: p50, p99 (nearest rank: of 20 kills, the largest), max, the goal, the load
average (1 min) seen during the run, and what the fleet's outputs say of the whole run:
windows scored twice across the fleet, windows never scored (tests/fleet_harness.py's
checks), and each failover split in two from the members' own logs: the kill to the
heir's `job lease taken`, and that to its first `window scored`.
`python -m bench.fleet_failover --each` prints every kill too.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tests/ is put on the path when the run starts
    from fleet_harness import Fleet, FleetJob, Member

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.02
JOB = "failover"
SLOW = 2


def _tests_on_path() -> None:
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


@contextlib.contextmanager
def _database() -> Iterator[str | None]:
    given = os.environ.get("ARTEMIS_BENCH_PG_URL")
    name = f"fleet_failover_{os.getpid()}"
    if given:
        import psycopg

        with psycopg.connect(given, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            c.execute(f'CREATE DATABASE "{name}"')
        yield f"{given.rsplit('/', 1)[0]}/{name}"
        return
    import pg

    if pg.missing() is not None:
        print(f"no PostgreSQL here: {pg.missing()}")
        yield None
        return
    srv = pg.PgServer()
    try:
        srv.start()
        yield srv.create_db(name)
    finally:
        srv.destroy()


def _plugin() -> Path:
    built = REPO / "profiler_plugin" / "build" / "libnccl-profiler-artemis.so"
    if built.exists():
        return built
    from artemis.agent.plugin_path import plugin_path

    return plugin_path()


class Pacer(threading.Thread):
    """The job: one window every `period` seconds, on time, until stopped."""

    def __init__(self, job: FleetJob, period: float) -> None:
        super().__init__(daemon=True, name="job")
        self.job, self.period = job, period
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        nxt = time.monotonic()
        try:
            while not self.stop.is_set():
                self.job.write_window()
                nxt += self.period
                self.stop.wait(max(0.0, nxt - time.monotonic()))
        except BaseException as e:  # reported by the run, not lost in a thread
            self.error = e


def _scored(m: Member) -> float:
    from daemon_harness import metric_by_label

    got = m.samples()
    return metric_by_label(got, "straggler_windows_scored_total", "job").get(JOB, 0.0)


def _one_kill(fl: Fleet, pacer: Pacer, timeout: float) -> tuple[float, str, str, float]:
    """Kill the owner once it scored two windows in a row; seconds until another member
    scores one; (seconds, killed, heir, the kill's wall-clock time)."""
    from daemon_harness import wait_for

    owner = fl.wait_owner(JOB, timeout)
    base = _scored(owner)
    wait_for(lambda: _scored(owner) >= base + 2 or pacer.error, timeout, "two windows scored")
    others = [m for m in fl.members if m is not owner]
    before = {m.name: _scored(m) for m in others}
    t0, wall = time.monotonic(), time.time()
    owner.kill()
    heir = None
    while heir is None:
        if time.monotonic() - t0 > timeout or pacer.error:
            raise RuntimeError(f"no window scored {timeout:.0f} s after killing {owner.name}")
        heir = next((m for m in others if _scored(m) > before[m.name]), None)
        if heir is None:
            time.sleep(POLL_S)
    took = time.monotonic() - t0
    owner.start()
    return took, owner.name, heir.name, wall


def _split(fl: Fleet, kills: list[float]) -> tuple[list[float], list[float], list[int]]:
    """From the members' own logs, each failover in two: the kill to the heir's `job lease
    taken`, and that to its first `window scored` (log times are UTC, as time.time());
    and the windows each heir replayed (committed since the last full snapshot)."""
    events = sorted(
        (
            datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")).timestamp(),
            r["event"],
            int(r.get("replayed_windows") or 0),
        )
        for m in fl.members
        for r in m.log_records()
        if r.get("event") in ("job lease taken", "window scored") and "timestamp" in r
    )
    lease, score, replayed = [], [], []
    for k in kills:
        taken = next(((t, n) for t, e, n in events if t > k and e == "job lease taken"), None)
        if taken is None:
            continue
        first = next((t for t, e, _n in events if t > taken[0] and e == "window scored"), None)
        lease.append(taken[0] - k)
        replayed.append(taken[1])
        if first is not None:
            score.append(first - taken[0])
    return lease, score, replayed


def run(
    kills: int,
    lease_s: float,
    renew_s: float,
    window_s: float,
    each: bool,
    keep: Path | None,
    snapshot_every: int = 10,
) -> int:
    _tests_on_path()
    from fleet_harness import (
        Fleet,
        FleetJob,
        check_owners_apart,
        check_scored_once,
        wait_for,
    )

    with tempfile.TemporaryDirectory(prefix="fleet-failover-") as d, _database() as url:
        if url is None:
            return 0
        tmp = Path(d) if keep is None else keep
        tmp.mkdir(parents=True, exist_ok=True)
        fl = Fleet(tmp, url, 3, lease_s=lease_s, renew_s=renew_s, snapshot_every=snapshot_every)
        times: list[tuple[float, str, str, float]] = []
        loads: list[float] = [os.getloadavg()[0]]
        pacer: Pacer | None = None
        try:
            fl.start()
            shm = [tmp / "shm" / f"h{h}" for h in range(2)]
            job = FleetJob(fl, _plugin(), JOB, [shm[r // 4] for r in range(8)], SLOW, 0xFA11)
            for h, folder in enumerate(shm):
                fl.start_agent(folder, f"h{h}")
            pacer = Pacer(job, window_s)
            pacer.start()
            for i in range(kills):
                took, killed, heir, wall = _one_kill(fl, pacer, timeout=10 * lease_s + 60)
                times.append((took, killed, heir, wall))
                loads.append(os.getloadavg()[0])
                if each:
                    print(f"kill {i + 1:>2}: {killed} -> {heir} in {took:.2f} s", flush=True)
            pacer.stop.set()
            pacer.join()
            last = job.finish()
            wait_for(lambda: fl.last_window(JOB) >= last, 60, "the last window")
        finally:
            if pacer is not None:
                pacer.stop.set()
            fl.stop()
        out = fl.outputs()
        lease, score, replayed = _split(fl, [w for _t, _k, _h, w in times])
    problems = check_scored_once(out, JOB, SLOW, range(1, last + 1)) + check_owners_apart(out, JOB)
    secs = sorted(t for t, _k, _h, _w in times)
    p99 = secs[math.ceil(0.99 * len(secs)) - 1]
    goal = lease_s + 2 * window_s
    print(
        f"fleet failover: 3 coordinators on one PostgreSQL, lease_s {lease_s:g}, renew_s"
        f" {renew_s:g}, a window every {window_s:g} s, 8 ranks on 2 agents, {_mode(snapshot_every)};"
        f" {len(secs)} owner kills (SIGKILL), from the kill to the next window scored"
    )
    print(f"{'kills':>5} {'p50 s':>6} {'p99 s':>6} {'max s':>6} {'goal s':>7} {'met':>4}")
    print(
        f"{len(secs):>5} {statistics.median(secs):>6.2f} {p99:>6.2f} {secs[-1]:>6.2f}"
        f" {goal:>7.2f} {'yes' if p99 <= goal else 'no':>4}"
    )
    print(f"load average (1 min) during the run: {min(loads):.1f}-{max(loads):.1f}")
    if lease and score:
        print(
            f"from the logs: kill -> lease taken {min(lease):.2f}-{max(lease):.2f} s"
            f" (median {statistics.median(lease):.2f}), lease taken -> first window scored"
            f" {min(score):.2f}-{max(score):.2f} s (median {statistics.median(score):.2f});"
            f" windows replayed by the heir {min(replayed)}-{max(replayed)}"
            f" (median {statistics.median(replayed):g})"
        )
    print(f"windows 0-{last}: {'scored once each' if not problems else '; '.join(problems)}")
    return 0 if p99 <= goal and not problems else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet_failover", description=__doc__)
    ap.add_argument("--kills", type=int, default=20, help="owner kills (default 20)")
    ap.add_argument("--lease-s", type=float, default=3.0, help="[fleet] lease_s (default 3)")
    ap.add_argument("--renew-s", type=float, default=0.5, help="[fleet] renew_s (default 0.5)")
    ap.add_argument("--window-s", type=float, default=0.5, help="seconds a window (default 0.5)")
    ap.add_argument(
        "--snapshot-every",
        type=int,
        default=10,
        help="[fleet] snapshot_every: the job's whole state every N windows (default 10;"
        " 1 = every window)",
    )
    ap.add_argument("--each", action="store_true", help="print every kill")
    ap.add_argument("--keep", type=Path, help="run in this folder and keep it (logs, outputs)")
    a = ap.parse_args(argv if argv is not None else [])
    if a.kills < 1 or a.window_s <= 0 or a.lease_s <= 0 or a.renew_s <= 0:
        ap.error("--kills must be >= 1 and --lease-s, --renew-s, --window-s > 0")
    if a.snapshot_every < 1:
        ap.error(f"--snapshot-every must be >= 1, got {a.snapshot_every}")
    return run(a.kills, a.lease_s, a.renew_s, a.window_s, a.each, a.keep, a.snapshot_every)


def _mode(snapshot_every: int) -> str:
    """The state mode a run measured, as its output says it."""
    if snapshot_every == 1:
        return "state: a full snapshot every window (snapshot_every 1)"
    return f"state: a full snapshot every {snapshot_every} windows, the journal between"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
