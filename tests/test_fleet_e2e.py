"""The coordinator fleet end to end (issue 30 "Tests"): real coordinators on one real
PostgreSQL, real agents given the fleet's addresses, the real plugin writing the jobs'
rings (tests/fleet_harness.py).

- three coordinators, a job straggling with a rebalance plan applied, the owner
  SIGKILLed mid-job: every window scored exactly once across the fleet, the
  straggler's finding continues, its incident keeps one ID, the plan is verified;
- PostgreSQL restarted mid-job: the same four outcomes;
- two jobs owned by different coordinators, one agent serving ranks of both: each
  job scored by its own owner alone, with every rank;
- a rolling restart of the fleet, one coordinator at a time, mid-job;
- an agent of the previous protocol minor against a coordinator that does not own
  its job: a fatal `not_owner` error naming the owner.

The member cut off from PostgreSQL by a network namespace is in
tests/test_fleet_e2e_netns.py (it makes namespaces and veth pairs: run alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from artemis.protocol.auth import load_secret
from artemis.protocol.client import AgentIdentity, AgentLink
from artemis.protocol.messages import FLEET_MINOR, PROTOCOL_VERSION
from artemis.protocol.records import RankInfo
from artemis.protocol.tcp import TcpTransport
from fleet_harness import (
    Fleet,
    FleetJob,
    Outputs,
    check_finding_continues,
    check_one_incident,
    check_owners_apart,
    check_plan_verified,
    check_scored_once,
    wait_for,
)
from pg import pg_started

pytestmark = pytest.mark.slow

SLOW = 2  # the straggler of the 8-rank jobs
HOSTS_8 = (0, 0, 0, 0, 1, 1, 1, 1)  # rank -> host folder


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ARTEMIS_DISABLE", "ARTEMIS_DEVICE_TIMING", "ARTEMIS_RING_SLOTS", "ARTEMIS_CLOCK"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str, env: None) -> Iterator[Any]:
    made: list[Fleet] = []

    def make(n: int = 3, **kw: Any) -> Fleet:
        f = Fleet(tmp_path, pg_url, n, **kw)
        made.append(f)
        return f.start()

    yield make
    for f in made:
        f.stop()


def _shm(fl: Fleet, n: int = 2) -> list[Path]:
    return [fl.tmp / "shm" / f"h{h}" for h in range(n)]


def _job8(fl: Fleet, plugin: Path, count: int | None = None) -> FleetJob:
    """The 8-rank job on two agents, given `count` of the fleet's addresses (all)."""
    shm = _shm(fl)
    job = FleetJob(fl, plugin, "fleetjob", [shm[h] for h in HOSTS_8], SLOW, 0xF1EE_0001)
    for h, d in enumerate(shm):
        fl.start_agent(d, f"h{h}", count=count)
    return job


def _status(fl: Fleet, job: str, status: str) -> bool:
    return any(p["job"] == job and p["status"] == status for p in fl.outputs().plans)


def _flagged(fl: Fleet, job: str) -> bool:
    return any(f["state"] == "flagged" for f in fl.outputs().rank_lines(job, SLOW))


def _not_taken(fl: Fleet) -> float:
    return sum(m.value("straggler_windows_not_taken_total") or 0.0 for m in fl.members)


def _judge(out: Outputs, job: str, last: int, *, plan: bool) -> None:
    problems = [
        *check_scored_once(out, job, SLOW, range(1, last + 1)),
        *check_finding_continues(out, job, SLOW),
        *check_one_incident(out, job, SLOW),
        *(check_plan_verified(out, job) if plan else []),
    ]
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- the owner killed


def test_owner_sigkilled_mid_job_loses_nothing_and_scores_nothing_twice(
    fleet: Any, plugin_lib: Path
) -> None:
    fl = fleet(3, detector={"rebalance": "apply"})
    job = _job8(fl, plugin_lib)
    owner = fl.wait_owner(job.name)
    job.drive(lambda: _status(fl, job.name, "applied"), 20, "a plan applied")
    assert not _status(fl, job.name, "verified")

    owner.kill()  # mid-finding, the plan in force and not verified yet
    job.write_window()  # written while nobody serves the job: kept by the agents
    heir = fl.wait_owner(job.name, timeout=40, other_than=owner)
    job.drive(lambda: _status(fl, job.name, "verified"), job.next_window + 12, "plan verified")
    last = job.finish()

    out = fl.outputs()
    _judge(out, job.name, last, plan=True)
    # The heir scored from where the owner stopped: both wrote some of the windows.
    by = {m for ms in out.scored_by(job.name).values() for m in ms}
    assert by == {owner.name, heir.name}, by


# ---------------------------------------------------------------- PostgreSQL restarted


def test_postgres_restarted_mid_job(tmp_path: Path, plugin_lib: Path, env: None) -> None:
    with pg_started() as srv:
        fl = Fleet(tmp_path, srv.create_db("fleet"), 3)
        try:
            fl.start()
            job = _job8(fl, plugin_lib)
            fl.wait_owner(job.name)
            job.drive(lambda: _flagged(fl, job.name), 12, "the straggler flagged")
            done = job.next_window - 1

            srv.stop()
            # Windows written while the database is away cannot be made durable, so they
            # are not taken (not acknowledged): the agents keep them for whoever owns the
            # job once it is back.
            job.write_window()
            job.write_window()
            wait_for(lambda: _not_taken(fl) > 0, 30, "a batch refused while the store is down")
            srv.start()
            job.drive(lambda: fl.last_window(job.name) >= done + 4, done + 12, "scoring resumed")
            last = job.finish()
        finally:
            fl.stop()
        _judge(fl.outputs(), job.name, last, plan=False)


# ---------------------------------------------------------------- two jobs, two owners


def test_two_jobs_two_owners_one_agent_serving_both(fleet: Any, plugin_lib: Path) -> None:
    fl = fleet(3)
    h0, h1 = _shm(fl)
    # Job b has ranks on both folders; job a only on h0. The agent of h1 (b alone) goes to
    # c1 first, so c1 takes b; then h0's agent goes to c0, which takes a and sends b's
    # ranks to c1: one agent, two uplinks.
    a = FleetJob(fl, plugin_lib, "job-a", [h0] * 4, slow=1, comm=0xA1)
    b = FleetJob(fl, plugin_lib, "job-b", [h0, h0, h1, h1], slow=3, comm=0xB1)
    fl.start_agent(h1, "h1", first=1)
    owner_b = fl.wait_owner("job-b")
    fl.start_agent(h0, "h0", first=0)
    owner_a = fl.wait_owner("job-a")
    assert (owner_a.name, owner_b.name) == ("c0", "c1")

    for _ in range(7):
        w = a.next_window
        a.write_window()
        b.write_window()
        if w:
            fl.wait_window("job-a", w - 1)
            fl.wait_window("job-b", w - 1)
    last_a, last_b = a.finish(), b.finish()

    out = fl.outputs()
    problems = [
        *check_scored_once(out, "job-a", 1, range(1, last_a + 1)),
        *check_scored_once(out, "job-b", 3, range(1, last_b + 1)),
        *check_owners_apart(out, "job-a"),
        *check_owners_apart(out, "job-b"),
    ]
    assert not problems, "\n".join(problems)
    for job, owner in (("job-a", "c0"), ("job-b", "c1")):
        assert {m for ms in out.scored_by(job).values() for m in ms} == {owner}, job
        scored = [r for r in out.logs if r.get("event") == "window scored" and r["job"] == job]
        # Every window with all four ranks: the shared agent's ranks of b reached c1.
        assert scored and all(r["ranks"] == 4 and r["missing"] == 0 for r in scored), scored
        assert {r["_by"] for r in scored} == {owner}


# ---------------------------------------------------------------- a rolling restart


def test_rolling_restart_of_the_fleet_mid_job(fleet: Any, plugin_lib: Path) -> None:
    fl = fleet(3, detector={"rebalance": "apply"})
    job = _job8(fl, plugin_lib)
    fl.wait_owner(job.name)
    job.drive(lambda: _status(fl, job.name, "applied"), 20, "a plan applied")
    served: list[str] = []
    for m in fl.members:  # one at a time: stopped cleanly (its leases released), back
        served.append(fl.wait_owner(job.name).name)
        assert m.stop() == 0, m.daemon.log_text()[-2000:] if m.daemon else ""
        job.step()
        job.step()
        m.start()
    job.drive(lambda: _status(fl, job.name, "verified"), job.next_window + 12, "plan verified")
    last = job.finish()
    out = fl.outputs()
    _judge(out, job.name, last, plan=True)
    # The job moved at least once: the restarts did not all miss its owner.
    assert len({m for ms in out.scored_by(job.name).values() for m in ms}) >= 2, served


# ---------------------------------------------------------------- an agent of the previous minor


def test_agent_of_the_previous_minor_gets_not_owner(fleet: Any, plugin_lib: Path) -> None:
    assert PROTOCOL_VERSION[1] >= FLEET_MINOR
    fl = fleet(2)
    job = _job8(fl, plugin_lib, count=1)  # its agents stay with the owner
    owner = fl.wait_owner(job.name)
    other = next(m for m in fl.members if m is not owner)
    ranks = tuple(RankInfo(job=job.name, comm="f1ee", rank=r, nranks=8) for r in (0, 1))
    link = AgentLink(
        TcpTransport(),
        other.address,
        load_secret(fl.secret),
        AgentIdentity(agent_id="old-agent", host="old", agent_version="0", ranks=ranks),
        version=(PROTOCOL_VERSION[0], FLEET_MINOR - 1),
        backoff_base=0.5,
    )

    def closing(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
        return [e for e in logs if e.get("reason") == "not_owner"]

    async def told(logs: list[MutableMapping[str, Any]]) -> None:
        link.start()
        try:
            for _ in range(600):  # up to 30 s
                if closing(logs) or link.stats.refusals:
                    return
                await asyncio.sleep(0.05)
        finally:
            await link.close(timeout=1.0)

    with structlog.testing.capture_logs() as logs:
        asyncio.run(told(logs))
    # The session was closed with the fatal `not_owner` error naming the owner (its id
    # and address): the old agent is told where its job is served, not left retrying
    # blind; it never acknowledged anything there.
    assert closing(logs), [e["event"] for e in logs]
    text = closing(logs)[0].get("detail", "")
    assert owner.address in text and f" {owner.name} " in text and job.name in text, text
    assert link.stats.acked_upto == 0
    # The job itself went on at its owner, untouched.
    job.step()
    job.step()
    assert fl.wait_owner(job.name) is owner
