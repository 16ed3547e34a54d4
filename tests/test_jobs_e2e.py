"""Jobs on a real coordinator, end to end: real processes, real plugin, loopback TCP.

- two jobs on one coordinator, each with its own straggler: both flagged, findings
  carry the job, the series are disjoint, one job ending leaves the other's alone;
- a job id reused by a new run (a new communicator) after a coordinator restart is
  scored, afresh;
- SIGKILL of the coordinator mid-finding with a rebalance plan applied: after the
  restart the straggler stays `ongoing` with the same `since`, no window is scored
  twice, and the plan is still in force and gets verified;
- `artemis-coordinator set max_shift_frac 0.1` reaches a running job's next plan, and
  `set max_shift_frac 1.0` is refused naming the bounds.

The "training jobs" are tests/daemon_harness.LockstepFeeder: compute times chosen
here, written through the real plugin. The plan-following job of the last two tests
reads the plan file the agent publishes and acknowledges it in the ack files, as
`artemis.job` does (docs/DESIGN.md, "Plans on the node").
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import (
    BIN,
    Coordinator,
    Daemon,
    LockstepFeeder,
    metric,
    start_agent,
    wait_for,
    write_secret,
)

pytestmark = pytest.mark.slow

W_STEPS = 10
COLLS = 4
BASE_MS = (6.0, 3.0, 3.0, 3.0)  # compute before each collective at the uniform split
N = 8
HOST_OF = (0, 0, 0, 0, 1, 1, 1, 1)
UNIFORM = 40  # samples per rank per step


def compute(slow: int, factor: float = 1.3, samples: list[int] | None = None) -> list[list[float]]:
    """Compute per collective: proportional to a rank's samples, `factor` slower on `slow`."""
    s = samples or [UNIFORM] * N
    return [
        [b * s[r] / UNIFORM * (factor if r == slow else 1.0) for b in BASE_MS] for r in range(N)
    ]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ARTEMIS_DISABLE", "ARTEMIS_DEVICE_TIMING", "ARTEMIS_RING_SLOTS", "ARTEMIS_CLOCK"):
        monkeypatch.delenv(var, raising=False)


class Site:
    """One coordinator and one agent per host dir, for any number of jobs."""

    def __init__(self, tmp: Path, **coord: Any) -> None:
        self.tmp = tmp
        self.secret = write_secret(tmp / "secret")
        self.shm = [tmp / "shm" / f"h{h}" for h in range(2)]
        self.coord = Coordinator(tmp, self.secret, **coord)
        self.agents: list[Daemon] = []

    def job(self, plugin: Path, name: str, slow: int, comm: int) -> LockstepFeeder:
        return LockstepFeeder(
            plugin, [self.shm[h] for h in HOST_OF], compute(slow), job=name, comm_hash=comm
        )

    def start(self) -> Site:
        self.coord.start()
        for h, shm in enumerate(self.shm):
            self.agents.append(
                start_agent(
                    self.tmp,
                    self.coord.address,
                    shm,
                    self.secret,
                    f"h{h}",
                    window_steps=W_STEPS,
                    colls_per_step=COLLS,
                )
            )
        self.wait_agents()
        return self

    def wait_agents(self) -> None:
        wait_for(
            lambda: self.coord.value("straggler_agents_connected") == len(self.shm),
            30,
            "agents connected",
        )

    def last(self, job: str) -> int:
        v = self.coord.value("straggler_last_window", job=job)
        return -1 if v is None else int(v)

    def wait_window(self, job: str, w: int, timeout: float = 40) -> None:
        wait_for(lambda: self.last(job) >= w, timeout, f"{job}: window {w} scored")

    def stop(self) -> None:
        for a in self.agents:
            a.stop()
        if self.coord.daemon is not None:
            self.coord.daemon.stop()

    def lines(self, job: str, kind: str = "rank") -> list[dict[str, Any]]:
        return [f for f in self.coord.findings() if f["job"] == job and f["kind"] == kind]


@pytest.fixture
def site(tmp_path: Path, env: None) -> Any:
    made: list[Site] = []

    def make(**coord: Any) -> Site:
        s = Site(tmp_path, **coord)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def _series(samples: dict[Any, float], job: str) -> set[Any]:
    return {k for k in samples if ("job", job) in k[1]}


def _stable(series: set[Any]) -> set[Any]:
    """The series without their `cause` label: these feeders have no GPU telemetry, so
    the cause comes from this host's own CPU readings, and it may move (host <->
    unknown) with the machine's load between two scrapes; the series is the same."""
    return {(name, frozenset(kv for kv in labels if kv[0] != "cause")) for name, labels in series}


# ---------------------------------------------------------------- two jobs


def test_two_jobs_on_one_coordinator_keep_their_own_findings_and_series(
    site: Any, plugin_lib: Path
) -> None:
    s = site(config={"job_linger_s": 1.0})
    a = s.job(plugin_lib, "job-a", slow=2, comm=0xA000_0000_0000_0001)
    b = s.job(plugin_lib, "job-b", slow=6, comm=0xB000_0000_0000_0001)
    s.start()
    n = 6
    for _ in range(n + 1):  # a window closes when the next one starts
        a.write_steps(W_STEPS)
        b.write_steps(W_STEPS)
    s.wait_window("job-a", n - 1)
    s.wait_window("job-b", n - 1)
    # Both stragglers flagged, each in its own job, and nothing else.
    for job, feeder, slow in (("job-a", a, 2), ("job-b", b, 6)):
        lines = s.lines(job)
        assert {f["rank"] for f in lines} == {slow}, lines
        assert [f["state"] for f in lines][:3] == ["suspect", "suspect", "flagged"]
        assert lines[0]["ratio"] == pytest.approx(feeder.pace(slow), rel=1e-3)
    assert {f["job"] for f in s.coord.findings()} == {"job-a", "job-b"}
    # The series are disjoint: rank 2 of job-a is the straggler, rank 2 of job-b is not.
    got = s.coord.samples()
    pace = "straggler_rank_pace_ratio"
    assert metric(got, pace, job="job-a", rank="2", island="default") == pytest.approx(
        a.pace(2), rel=1e-6
    )
    assert metric(got, pace, job="job-b", rank="2", island="default") == pytest.approx(
        b.pace(2), rel=1e-6
    )
    assert b.pace(2) < 1.05 < 1.25 < a.pace(2)
    for job, slow in (("job-a", "2"), ("job-b", "6")):
        assert metric(got, "straggler_flagged", job=job, kind="rank", subject=slow) == 1
    assert metric(got, "straggler_flagged", job="job-a", kind="rank", subject="6") is None
    b_series = _series(got, "job-b")

    # job-a ends: after the linger its series go, job-b's stay and keep moving.
    a.finish()
    wait_for(lambda: not _series(s.coord.samples(), "job-a"), 30, "job-a's series removed")
    b.write_steps(W_STEPS)
    s.wait_window("job-b", n)
    left = s.coord.samples()
    assert _stable(b_series) <= _stable(_series(left, "job-b"))
    assert metric(left, "straggler_flagged", job="job-b", kind="rank", subject="6") == 1
    # Process-wide series have no job label and stay.
    assert metric(left, "straggler_agents_connected") == 2
    log = [r for r in s.coord.daemon.log_records() if r.get("event", "").startswith("job ended")]
    assert [r["job"] for r in log] == ["job-a"]


# ---------------------------------------------------------------- a job id reused


def test_a_job_id_reused_by_a_new_run_after_a_restart_is_scored(
    site: Any, plugin_lib: Path
) -> None:
    s = site()
    first = s.job(plugin_lib, "reused", slow=4, comm=0x1111_0000_0000_0001)
    s.start()
    n = 5
    first.write_steps(n * W_STEPS)
    first.finish()
    s.wait_window("reused", n - 1)
    assert s.coord.daemon is not None
    s.coord.daemon.stop()
    # A new run under the same job id: a new communicator, windows from 0 again.
    second = s.job(plugin_lib, "reused", slow=1, comm=0x2222_0000_0000_0002)
    s.coord.start()
    s.wait_agents()
    second.write_steps(n * W_STEPS)
    second.finish()
    s.wait_window("reused", n - 1)
    wait_for(
        lambda: s.coord.value("straggler_windows_scored_total", job="reused") == n,
        30,
        "every window of the new run scored",
    )
    lines = s.lines("reused")
    old = [f for f in lines if f["rank"] == 4]
    new = [f for f in lines if f["rank"] == 1]
    assert [f["window"] for f in old] == list(range(1, n))
    # The new run is scored afresh: its straggler is suspect from its own window 1.
    assert [(f["window"], f["state"], f["since"]) for f in new] == [
        (1, "suspect", 1),
        (2, "suspect", 1),
        (3, "flagged", 1),
        (4, "ongoing", 1),
    ]
    assert new[0]["ratio"] == pytest.approx(second.pace(1), rel=1e-3)
    log = s.coord.daemon.log_records()
    assert [r["job"] for r in log if r.get("event", "").startswith("new run of a job")] == [
        "reused"
    ]
    # The old run's rings, still on disk, were read again by nobody: nothing was dropped
    # from the new run.
    dropped = {
        dict(k[1]).get("reason"): v
        for k, v in s.coord.samples().items()
        if k[0] == "straggler_windows_dropped_total" and ("job", "reused") in k[1]
    }
    assert "old_run" not in dropped, dropped


# ---------------------------------------------------------------- plans


class PlanFollower:
    """The job side of a rebalance plan, as `artemis.job` does it: acknowledge the split
    at start (id `uniform`), then follow each published plan at its step."""

    def __init__(self, site: Site, feeder: LockstepFeeder, job: str, slow: int) -> None:
        self.site, self.feeder, self.job, self.slow = site, feeder, job, slow
        self.samples = [UNIFORM] * N
        self.pending: dict[str, Any] | None = None
        self.seen: set[str] = set()
        self._ack("uniform", 0, self.samples)

    def _ack(self, plan_id: str, step: int, samples: list[int]) -> None:
        for r in range(N):
            shm = self.site.shm[HOST_OF[r]]
            rec = {
                "id": plan_id,
                "rank": r,
                "step": step,
                "samples": samples[r],
                "global_batch": sum(samples),
            }
            tmp = shm / f".{self.job}.ack{r}.tmp"
            tmp.write_text(json.dumps(rec))
            os.replace(tmp, shm / f"{self.job}.plan-ack.r{r}.json")

    def window(self) -> bool:
        """Write one window's steps, switching to a published plan at its step (True)."""
        for shm in self.site.shm:
            path = shm / f"{self.job}.plan.json"
            if path.exists():
                plan = json.loads(path.read_text())
                if plan["id"] not in self.seen:
                    self.seen.add(plan["id"])
                    self.pending = plan
        switched = False
        if self.pending is not None and self.feeder.steps >= self.pending["apply_at_step"]:
            self.samples = list(self.pending["samples"])
            self.feeder.set_compute(compute(self.slow, samples=self.samples))
            self._ack(self.pending["id"], self.feeder.steps, self.samples)
            self.pending, switched = None, True
        self.feeder.write_steps(W_STEPS)
        return switched


def _plans(s: Site) -> list[dict[str, Any]]:
    path = s.tmp / "plans.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _status(s: Site, st: str) -> bool:
    return any(p["status"] == st for p in _plans(s))


def _drive(s: Site, f: PlanFollower, w: int, until: Any, limit: int, what: str) -> int:
    """Write window w, wait until w - 1 is scored (a window closes when the next one
    starts), and so on until `until()`; returns the next window to write. Once the job
    switched to a plan, nothing more is written until the coordinator says `applied`."""
    while not until():
        assert w < limit, f"{what} did not happen by window {limit}: {_plans(s)}"
        if f.window():
            wait_for(lambda: _status(s, "applied"), 30, "the plan acknowledged (applied)")
        if w:
            s.wait_window(f.job, w - 1)
        w += 1
    return w


def test_sigkill_mid_finding_keeps_the_straggler_ongoing_and_the_plan_in_force(
    site: Any, plugin_lib: Path
) -> None:
    s = site(deadline_s=4.0, detector={"rebalance": "apply"})
    job = "planned"
    f = PlanFollower(s, s.job(plugin_lib, job, slow=2, comm=0x3333_0000_0000_0003), job, 2)
    s.start()

    w = _drive(s, f, 0, lambda: _status(s, "applied"), 20, "an applied plan")
    (rec,) = [p for p in _plans(s) if p["status"] == "recommended"]
    assert rec["job"] == job and rec["rank"] == 2
    before = s.lines(job)
    assert before[-1]["state"] == "ongoing" and before[-1]["since"] == 1
    applied = next(p for p in _plans(s) if p["status"] == "applied")
    assert applied["id"] == rec["id"] and applied["job"] == job

    assert s.coord.daemon is not None
    assert not _status(s, "verified")
    s.coord.daemon.kill()  # mid-finding, the plan applied but not verified yet
    f.window()  # written while the coordinator is down: kept by the agents
    s.coord.start()
    s.wait_agents()
    w = _drive(s, f, w + 1, lambda: _status(s, "verified"), w + 12, "the plan verified")
    verified = next(p for p in _plans(s) if p["status"] == "verified")
    assert verified["id"] == rec["id"] and verified["job"] == job, _plans(s)
    lines = s.lines(job)
    counts = collections.Counter(x["window"] for x in lines)
    assert all(v == 1 for v in counts.values()), f"windows reported twice: {counts}"
    assert sorted(counts) == list(range(1, w - 1)), sorted(counts)  # w - 1: written last
    # One finding, never broken by the restart: suspect, suspect, flagged, then ongoing.
    assert [x["state"] for x in lines][:3] == ["suspect", "suspect", "flagged"]
    assert all(x["state"] == "ongoing" and x["since"] == 1 for x in lines[3:]), lines
    assert {x["rank"] for x in lines} == {2}
    restored = [r for r in s.coord.daemon.log_records() if r.get("event") == "job state restored"]
    assert restored and restored[0]["job"] == job and restored[0]["open_findings"] == 1


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "artemis-coordinator"), *args], capture_output=True, text=True, timeout=30
    )


def test_live_max_shift_frac_reaches_the_next_plan_and_1_0_is_refused(
    site: Any, plugin_lib: Path
) -> None:
    s = site(detector={"rebalance": "apply"})
    job = "tuned"
    f = PlanFollower(s, s.job(plugin_lib, job, slow=2, comm=0x4444_0000_0000_0004), job, 2)
    s.start()
    f.window()
    f.window()
    s.wait_window(job, 0)
    bad = _cli("set", "max_shift_frac", "1.0", "--socket", str(s.coord.sock))
    assert bad.returncode == 1 and "max_shift_frac" in bad.stderr and "[0, 1)" in bad.stderr
    ok = _cli("set", "max_shift_frac", "0.1", "--socket", str(s.coord.sock))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "max_shift_frac = 0.1"
    _drive(s, f, 2, lambda: bool(_plans(s)), 20, "a plan")
    plan = _plans(s)[0]
    assert plan["job"] == job and plan["rank"] == 2 and sum(plan["after"]) == N * UNIFORM
    # Rank 2 is 30% slow: the default 25% bound would take it to 30 samples, 10% to 36.
    assert plan["after"][2] == UNIFORM * 0.9 and max(plan["after"]) <= UNIFORM * 1.1
