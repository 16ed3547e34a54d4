"""Closing the loop on the simulated cluster: plans recommended, applied, verified, restored.

Three scenarios (sim/scenarios/rebalance*.toml) run through the real coordinator,
agents, plugin and the simulated job's real `artemis.job.RebalanceClient`:

- rebalance.toml (apply mode, run once through the `artemis sim` console script):
  a plan moves samples off the slow rank, every rank acknowledges it, and the
  measured gain is at least half the throughput the fault cost;
- rebalance_ignored.toml: the job never uses artemis.job, so nothing is applied
  and nothing claims a recovery;
- rebalance_recovers.toml: when the fault ends, the uniform split comes back.

What the throughput should be is computed from the scenario and the simulated
hardware's definition (tests/e2e_expect.py: lockstep_throughput), not from a run.
Also: a malformed scenario makes `artemis sim` exit 2 naming the file and the key.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from artemis.rebalance.files import ack_path, plan_path
from artemis.sim.cluster import SimCluster
from artemis.sim.scenario import Fault, Scenario, load_scenario
from e2e_expect import (
    DEFAULT_MAX_SHIFT_FRAC,
    PLAN_KEYS,
    SIM_SCENARIOS,
    lockstep_throughput,
    read_jsonl,
)
from incidents_expect import check_incidents, incidents_file
from sim_runs import sim_options

pytestmark = pytest.mark.slow

ARTEMIS = Path(sys.executable).parent / "artemis"
STATUSES = {"recommended", "applied", "verified", "rolled_back"}


def _fault(sc: Scenario) -> Fault:
    (fault,) = sc.faults
    assert fault.kind == "clocks" and len(fault.ranks) == 1
    return fault


def _check_plan_lines(sc: Scenario, events: list[dict[str, Any]]) -> None:
    """Every plan line: DESIGN keys, the global batch kept, whole samples, bounds kept."""
    n, g = sc.ranks, sc.global_batch
    frac = float(sc.detector.get("max_shift_frac", DEFAULT_MAX_SHIFT_FRAC))
    lo = math.floor(g / n * (1 - frac))
    hi = math.ceil(g / n * (1 + frac))
    for ev in events:
        assert set(ev) >= PLAN_KEYS, f"plan line lacks {PLAN_KEYS - set(ev)}"
        assert ev["status"] in STATUSES, ev["status"]
        for split in (ev["before"], ev["after"]):
            assert len(split) == n
            assert all(isinstance(x, int) and x >= 1 for x in split), split
            assert sum(split) == g, split
            assert all(lo <= x <= hi for x in split), f"{split} outside [{lo}, {hi}]"
        # Every switch names a step on a window boundary, for all ranks together.
        assert ev["apply_at_step"] % sc.window_steps == 0


def _by_id(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for ev in events:
        out.setdefault(ev["id"], []).append(ev)
    return out


def _run_in_process(path: Path, tmp: Path) -> tuple[Scenario, list[dict[str, Any]], Path, str]:
    cluster = SimCluster(
        path,
        sim_options(tmp, timeout_s=120),
    )
    res = cluster.run()
    assert res.ok, f"{path.name}: {res.reason}"
    check_incidents(
        cluster.sc,
        read_jsonl(tmp / "findings.jsonl"),
        incidents_file(tmp / "findings.jsonl"),
        cluster.job,
    )
    return cluster.sc, read_jsonl(tmp / "plans.jsonl"), tmp / "work", cluster.job


def _shm_dirs(work: Path) -> list[Path]:
    return sorted(p for p in (work / "shm").iterdir() if p.is_dir())


# ---------------------------------------------------------------- apply
@pytest.fixture(scope="module")
def applied_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """rebalance.toml through the console script, as an operator would run it."""
    path = SIM_SCENARIOS / "rebalance.toml"
    tmp = tmp_path_factory.mktemp("rebalance")
    proc = subprocess.run(
        [
            str(ARTEMIS),
            "sim",
            "--scenario",
            str(path),
            "--jsonl",
            str(tmp / "findings.jsonl"),
            "--plans-jsonl",
            str(tmp / "plans.jsonl"),
            "--workdir",
            str(tmp / "work"),
            "--timeout-s",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    yield {
        "sc": load_scenario(path),
        "proc": proc,
        "plans": read_jsonl(tmp / "plans.jsonl"),
        "work": tmp / "work",
        "job": f"{path.stem}-sim",
    }


def test_console_script_completes(applied_run: dict[str, Any]) -> None:
    proc = applied_run["proc"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "completed" in proc.stdout, proc.stdout


def test_plan_recommended_applied_verified(applied_run: dict[str, Any]) -> None:
    sc: Scenario = applied_run["sc"]
    events: list[dict[str, Any]] = applied_run["plans"]
    assert applied_run["proc"].returncode == 0
    fault = _fault(sc)
    slow = fault.ranks[0]
    _check_plan_lines(sc, events)
    plans = _by_id(events)
    good = [evs for evs in plans.values() if "verified" in [e["status"] for e in evs]]
    assert good, f"no verified plan: {[(e['id'], e['status']) for e in events]}"
    evs = good[0]
    statuses = [e["status"] for e in evs]
    assert statuses[:3] == ["recommended", "applied", "verified"], statuses
    rec, verified = evs[0], evs[statuses.index("verified")]
    assert rec["rank"] == slow and rec["window"] >= fault.start_window

    uniform = sc.global_batch / sc.ranks
    after = verified["after"]
    assert verified["before"] == [sc.global_batch // sc.ranks] * sc.ranks
    assert after[slow] < uniform, after
    assert after[slow] == min(after) and after.count(after[slow]) == 1, after

    # Throughput: the lockstep model's healthy step vs the step the slow rank sets.
    tp = lockstep_throughput(sc, fault.slowdown)
    before, after_tp = verified["throughput_before"], verified["throughput_after"]
    # The measurement before the plan is the faulted throughput the model predicts.
    assert before == pytest.approx(tp.faulted, rel=0.05), (before, tp)
    gain = after_tp - before
    assert gain >= 0.5 * tp.lost, (
        f"gain {gain:.1f} samples/s is less than half the {tp.lost:.1f} lost to the fault"
    )
    # No split can beat the healthy job: the same work, one rank still slow.
    assert after_tp <= tp.healthy * 1.02, (after_tp, tp)


def test_incident_mitigated_with_the_measured_gain(applied_run: dict[str, Any]) -> None:
    """The plan's verified gain ends the incident `mitigated` (issue 12)."""
    findings = applied_run["work"].parent / "findings.jsonl"
    check_incidents(
        applied_run["sc"], read_jsonl(findings), incidents_file(findings), applied_run["job"]
    )


def test_job_acknowledged_the_plan(applied_run: dict[str, Any]) -> None:
    sc: Scenario = applied_run["sc"]
    job: str = applied_run["job"]
    (shm,) = _shm_dirs(applied_run["work"])  # one host
    assert plan_path(shm, job).is_file()
    for r in range(sc.ranks):
        assert ack_path(shm, job, r).is_file(), f"rank {r} never acknowledged a plan"


# ---------------------------------------------------------------- ignored
def test_ignored_plans_never_applied(tmp_path: Path) -> None:
    sc, events, work, job = _run_in_process(SIM_SCENARIOS / "rebalance_ignored.toml", tmp_path)
    assert not sc.honours_plans
    _fault(sc)
    _check_plan_lines(sc, events)
    statuses = [e["status"] for e in events]
    # The policy did act (apply mode, same fault as rebalance.toml) ...
    assert "recommended" in statuses, statuses
    # ... but a job without artemis.job never switches, so nothing claims a recovery.
    assert not {"applied", "verified"} & set(statuses), statuses
    published = [d for d in _shm_dirs(work) if plan_path(d, job).is_file()]
    assert published, "the plan never reached the node"
    for d in _shm_dirs(work):
        for r in range(sc.ranks):
            assert not ack_path(d, job, r).exists(), f"rank {r} acknowledged a plan"


# ---------------------------------------------------------------- recovery
def test_uniform_split_restored_after_recovery(tmp_path: Path) -> None:
    sc, events, _work, _job = _run_in_process(SIM_SCENARIOS / "rebalance_recovers.toml", tmp_path)
    fault = _fault(sc)
    assert fault.end_window is not None
    _check_plan_lines(sc, events)
    uniform = [sc.global_batch // sc.ranks] * sc.ranks
    assert sc.global_batch % sc.ranks == 0
    plans = _by_id(events)
    # First the slow rank's load was moved and verified while the fault lasted ...
    moved = [
        evs
        for evs in plans.values()
        if evs[0]["after"] != uniform and "verified" in [e["status"] for e in evs]
    ]
    assert moved, f"no verified uneven plan: {[(e['id'], e['status']) for e in events]}"
    assert moved[0][0]["after"][fault.ranks[0]] < uniform[0]
    assert moved[0][0]["window"] < fault.end_window
    # ... then, after the fault ended, a plan restored the uniform split.
    restored = [
        evs for evs in plans.values() if evs[0]["after"] == uniform and evs[0]["before"] != uniform
    ]
    assert restored, f"no restoring plan: {[(e['id'], e['status'], e['after']) for e in events]}"
    evs = restored[0]
    statuses = [e["status"] for e in evs]
    assert "applied" in statuses and "verified" in statuses, statuses
    assert evs[0]["window"] >= fault.end_window
    assert evs[0]["before"] == moved[0][0]["after"]


# ---------------------------------------------------------------- malformed
@pytest.mark.parametrize(
    ("body", "key"),
    [
        (
            "[job]\nranks = 4\nranks_per_host = 4\nstep_ms = 50.0\ncollectives_per_step = 2\n"
            "window_steps = 20\nwindows = 10\nrankz = 3\n",
            "[job].rankz",
        ),
        (
            "[job]\nranks = 4\nranks_per_host = 4\nstep_ms = 50.0\ncollectives_per_step = 2\n"
            'window_steps = 20\nwindows = 10\n\n[[fault]]\nkind = "clocks"\nrank = 1\n'
            'start_window = 3\nslowdown = "fast"\n',
            "slowdown",
        ),
    ],
    ids=["unknown-key", "bad-slowdown"],
)
def test_malformed_scenario_exits_2(tmp_path: Path, body: str, key: str) -> None:
    bad = tmp_path / "broken_scenario.toml"
    bad.write_text(body)
    proc = subprocess.run(
        [str(ARTEMIS), "sim", "--scenario", str(bad), "--jsonl", str(tmp_path / "f.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(bad) in proc.stderr and key in proc.stderr, proc.stderr
    assert not (tmp_path / "f.jsonl").exists()
