"""A whole simulated cluster (`artemis sim`: real plugin, agents, coordinator) writes
its incident store next to its findings; what the store holds is what the JSONL
says, with the per-window rows that redraw the plots; `artemis incidents` reads it.

The rebalance scenario: rank 1's clocks drop at window 8 and Artemis rebalances
(apply), so its one incident carries a plan with its measured throughput.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from artemis.sim.scenario import load_scenario
from artemis.store import open_for_findings
from artemis.store.jsonl import JsonlIncidents
from artemis.store.sqlite import SqliteStore
from sim_cli import artemis_sim
from test_incidents_cli import _in_pty, _plain

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "sim" / "scenarios" / "rebalance.toml"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("store-sim")
    artemis_sim(
        SCENARIO, tmp / "findings.jsonl", "--plans-jsonl", str(tmp / "plans.jsonl"), timeout_s=240
    )
    return tmp / "findings.jsonl"


def test_store_holds_what_the_jsonl_says(outputs: Path) -> None:
    sc = load_scenario(SCENARIO)
    (fault,) = sc.faults
    assert (outputs.parent / "artemis.db").exists()
    log = JsonlIncidents(outputs.parent / "incidents.jsonl")
    assert log.skipped == 0
    with open_for_findings(outputs) as s:
        assert isinstance(s, SqliteStore)
        assert s.incidents() == log.incidents()  # the latest line of every id, whole
        (inc,) = s.incidents()
        assert inc["kind"] == "rank" and [inc["rank"]] == list(fault.ranks)
        # One actions row per plan of the record, as the record has it (issue 29: the
        # default corrections = "recommend" adds a correction entry beside them).
        rows = s.db.execute(
            "SELECT plan, status, throughput_before, throughput_after, gain_pct FROM actions"
            " WHERE incident = ? AND type = 'plan' ORDER BY seq",
            (inc["id"],),
        ).fetchall()
        assert rows == [
            (
                a["plan"],
                a["status"],
                a["throughput_before"],
                a["throughput_after"],
                a["gain_pct"],
            )
            for a in inc["actions"]
            if a["type"] == "plan"
        ]
        assert rows, "the apply scenario made a plan"
        (job,) = s.jobs()
        assert job["job"] == inc["job"] and job["ranks"] == sc.ranks
        assert job["run"] == inc["run"] and job["ended"] is not None
        last = job["last_window"]
        assert last == sc.windows - 1
        # The job's rows: every scored window of its run, with ordered bands.
        jw = s.job_windows(inc["job"], run=inc["run"])
        assert [r["window"] for r in jw] == list(range(last + 1))
        for r in jw:
            assert r["run"] == inc["run"] and r["step_ms"] > 0
            if r["ratio_p50"] is not None:
                assert r["ratio_p10"] <= r["ratio_p50"] <= r["ratio_p90"]
        assert s.job_windows(inc["job"]) == jw  # the latest run by default
        # The subject's rows: every window from its onset (its suspect windows, kept
        # until the flag opened it: issue 31 item 9, the pace drawn from onset) to its close.
        iw = s.incident_windows(inc["id"])
        since, opened = inc["since"], inc["opened"]["window"]
        closed = inc["closed"]["window"]
        assert since < opened
        assert [r["window"] for r in iw] == list(range(since, closed + 1))
        slow: list[Any] = [r["ratio"] for r in iw[: opened - since + 3]]
        assert all(x is not None and x > 1.1 for x in slow), slow  # slow from onset


def test_incidents_cli_over_the_run(outputs: Path) -> None:
    with open_for_findings(outputs) as s:
        (inc,) = s.incidents()
    code, raw = _in_pty(["incidents", "list", "--findings", str(outputs)])
    out = _plain(raw)
    assert code == 0 and inc["id"] in out and str(inc["verdict"]) in out, out
    code, raw = _in_pty(["incidents", "show", inc["id"], "--findings", str(outputs)])
    out = " ".join(_plain(raw).split())
    assert code == 0, out
    assert f"verdict {inc['verdict']}" in out
    for a in inc["actions"]:
        assert a.get("plan", a.get("action")) in out and a["status"] in out
    assert inc["escalation"]["check"].split()[0] in out
