"""A fleet member cut off from PostgreSQL (issue 30 "Tests"), in a network namespace.

Member c0 runs in a namespace of its own, joined to the test's by a veth pair;
PostgreSQL listens on loopback (c1, c2) and on an address of that pair (c0)
(tests/fleet_harness.py: Cutoff, pg_also_on). c0 owns a straggling job; then a
blackhole route takes the database away from c0 alone, its agents still reaching
it (a paused network: nothing is refused, packets just vanish). c0 cannot renew
its lease: PostgreSQL's clock expires it and another member takes the job. c0
must then stop writing for the job (its epoch is stale: every write is fenced),
and two owners never score the same window. After the route comes back c0 finds
the job owned by another and stays out of it.

It makes namespaces and veth pairs: the Makefile runs it alone (SERIAL_TESTS).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fleet_harness import (
    Cutoff,
    Fleet,
    FleetJob,
    check_finding_continues,
    check_one_incident,
    check_owners_apart,
    check_scored_once,
    pg_also_on,
    wait_for,
)
from netns_harness import unavailable

REASON = unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(REASON is not None, reason=f"namespace tests skipped: {REASON}"),
]

SLOW = 2
HOSTS_8 = (0, 0, 0, 0, 1, 1, 1, 1)
PACE_S = 0.5  # seconds a window while the job runs on its own


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ARTEMIS_DISABLE", "ARTEMIS_DEVICE_TIMING", "ARTEMIS_RING_SLOTS", "ARTEMIS_CLOCK"):
        monkeypatch.delenv(var, raising=False)


def test_member_cut_off_from_postgres_loses_the_lease_and_stops_writing(
    tmp_path: Path, plugin_lib: Path, env: None
) -> None:
    with Cutoff("x") as cut, pg_also_on([cut.pg]) as srv:
        url = srv.create_db("fleet")
        fl = Fleet(tmp_path, url, 3)
        c0 = fl.members[0]
        c0.host, c0.netns, c0.store = cut.inner, cut.ns, cut.store_url(srv, "fleet")
        try:
            fl.start()
            shm = [tmp_path / "shm" / f"h{h}" for h in range(2)]
            job = FleetJob(fl, plugin_lib, "cutjob", [shm[h] for h in HOSTS_8], SLOW, 0xC07)
            for h, d in enumerate(shm):
                fl.start_agent(d, f"h{h}", first=0)
            assert fl.wait_owner(job.name) is c0
            job.drive(lambda: bool(fl.outputs().rank_lines(job.name, SLOW)), 8, "a finding")
            job.step()

            cut.cut()
            # The job goes on; the agents keep what c0 can no longer make durable and take
            # it to whoever owns the job next.
            end = time.monotonic() + 45  # lease_s is 3: c0 must lose it well before
            while not (heirs := [m for m in fl.owners(job.name) if m is not c0]):
                assert time.monotonic() < end, "no other member took the job in 45 s"
                job.write_window()
                time.sleep(PACE_S)  # the job's own pace: it does not wait for its monitor
            heir = heirs[0]
            wait_for(lambda: c0.disowns(job.name), 30, "c0 answering without the job")
            for _ in range(3):
                job.step()
            took = {w for w, by in fl.outputs().scored_by(job.name).items() if heir.name in by}
            c0_lines = [f for f in fl.outputs().findings if f["_by"] == c0.name]

            cut.heal()  # c0 back on the database: the job is another's, it stays out
            for _ in range(3):
                job.step()
            last = job.finish()
        finally:
            cut.heal()
            fl.stop()
        out = fl.outputs()
    assert took, "the heir scored nothing"
    # c0 wrote nothing of the job from the heir's first window on, cut off or healed.
    late = [f["window"] for f in out.findings if f["_by"] == c0.name and f["window"] >= min(took)]
    assert not late, f"c0 wrote windows {late} after {heir.name} took the job at {min(took)}"
    assert len(c0_lines) == len([f for f in out.findings if f["_by"] == c0.name])
    problems = [
        *check_owners_apart(out, job.name),
        *check_scored_once(out, job.name, SLOW, range(1, last + 1)),
        *check_finding_continues(out, job.name, SLOW),
        *check_one_incident(out, job.name, SLOW),
    ]
    assert not problems, "\n".join(problems)
