"""Faults during rebalancing (docs/RELIABILITY.md section 8): three simulated runs, real
coordinator, agents, plugin and `artemis.job.RebalanceClient`, side by side.

- reliability/rebalance_fault_recovers_mid_apply.toml: the slow rank recovers while its plan is
  being applied;
- reliability/rebalance_fault_second_rank.toml: a second rank slows while the plan is verified;
- reliability/rebalance_fault_agent_dies.toml: the agent of the slow rank's host dies while the
  plan waits for its ranks' acknowledgements.

Each must end consistent: no plan left applied without a verification or a
rollback, the reason in the plans file, and every rank of the job on the same
split (each rank's last acknowledgement, read from the node's ack files, holds
the split the plans file ends on).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from artemis.rebalance.files import ack_path
from artemis.rebalance.split import uniform_split
from artemis.sim.cluster import SimCluster
from artemis.sim.scenario import Scenario
from e2e_expect import SIM_SCENARIOS, read_jsonl
from sim_runs import sim_options

pytestmark = pytest.mark.slow

NAMES = ("recovers_mid_apply", "second_rank", "agent_dies")


def _run(name: str, tmp: Path) -> tuple[Scenario, list[dict[str, Any]], Path, str, str]:
    cluster = SimCluster(
        SIM_SCENARIOS / "reliability" / f"rebalance_fault_{name}.toml",
        sim_options(tmp, timeout_s=400),
    )
    res = cluster.run()
    return cluster.sc, read_jsonl(tmp / "plans.jsonl"), tmp / "work", cluster.job, res.reason


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("rebalance-faults")
    with ThreadPoolExecutor(max_workers=len(NAMES)) as pool:
        got = pool.map(lambda n: _run(n, tmp / n), NAMES)
        return dict(zip(NAMES, got, strict=True))


def _last(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for ev in events:
        out[ev["id"]] = ev
    return out


def _check_consistent(sc: Scenario, events: list[dict[str, Any]], work: Path, job: str) -> None:
    assert events, "no plan was made"
    for pid, ev in _last(events).items():
        assert ev["status"] != "applied", f"{pid} left applied without a verification"
        assert ev["reason"], ev
    # The split the plans file ends on: uniform unless an uneven plan is verified last.
    final = uniform_split(sc.global_batch, sc.ranks)
    for ev in events:
        if ev["status"] == "verified":
            final = ev["after"]
        elif ev["status"] == "rolled_back" or (
            ev["status"] == "recommended" and "withdrawn" in ev["reason"]
        ):
            final = ev["before"]
    # Every rank's last acknowledgement, on whichever node it runs: the same split.
    for r in range(sc.ranks):
        path = ack_path(work / "shm" / sc.host_name(sc.host_of(r)), job, r)
        ack = json.loads(path.read_text())
        assert ack["samples"] == final[r], (r, ack, final)


@pytest.mark.timeout(900)
def test_slow_rank_recovers_mid_apply(runs: dict[str, Any]) -> None:
    sc, events, work, job, reason = runs["recovers_mid_apply"]
    assert not reason, reason
    _check_consistent(sc, events, work, job)
    first = [e for e in events if e["id"] == events[0]["id"]]
    assert [e["status"] for e in first] == ["recommended", "applied", "verified"], first
    # The gain came from the rank's recovery, and the plans file says so.
    slow = sc.faults[0].ranks[0]
    assert f"rank {slow} as fast per sample as its peers again" in first[-1]["reason"], first[-1]
    # ...and the uniform split came back, verified.
    uniform = uniform_split(sc.global_batch, sc.ranks)
    restore = [e for e in events if e["after"] == uniform and e["status"] == "verified"]
    assert restore, [(e["id"], e["status"], e["after"]) for e in events]


def test_second_rank_slows_during_verification(runs: dict[str, Any]) -> None:
    sc, events, work, job, reason = runs["second_rank"]
    assert not reason, reason
    _check_consistent(sc, events, work, job)
    second = sc.faults[1]
    judged = [e for e in events if e["status"] in ("verified", "rolled_back")]
    assert judged, [(e["id"], e["status"]) for e in events]
    # The verification that ran while rank 2 slowed names it.
    during = [e for e in judged if e["window"] >= second.start_window]
    assert (
        during
        and f"ranks {list(second.ranks)} flagged during the verification" in (during[0]["reason"])
    ), during


def test_agent_dies_while_its_ranks_have_a_plan(runs: dict[str, Any]) -> None:
    sc, events, work, job, reason = runs["agent_dies"]
    assert not reason, reason
    _check_consistent(sc, events, work, job)
    down = next(f for f in sc.faults if f.kind == "agent_down")
    host = sc.host_of(down.ranks[0])
    gone = [r for r in range(sc.ranks) if sc.host_of(r) == host]
    withdrawn = [e for e in events if "withdrawn" in e["reason"]]
    assert withdrawn, [(e["id"], e["status"], e["reason"]) for e in events]
    assert f"ranks {gone} stopped reporting before acknowledging" in withdrawn[0]["reason"]
    assert withdrawn[0]["status"] == "recommended"  # nothing was applied, nothing claimed
