"""Incidents (detect/incidents.py) through the per-job core, on real summariser output.

Windows come from the simulator's lockstep model turned into ring records and
summarised by the agent's own `WindowSummarizer` (as sim/inproc.py does), with
the simulated telemetry, and go through `JobMonitor` as the coordinator feeds
it. Expectations come from the scenario (the fault's rank, kind and windows)
and docs/DESIGN.md "Incidents", never from a run's output.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from artemis.agent.summary import WindowSummarizer
from artemis.agent.telemetry.base import merge
from artemis.agent.telemetry.simulated import overlay
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.sinks import IncidentsWriter, incidents_path
from artemis.detect import findings as F
from artemis.detect.incident_record import no_action
from artemis.detect.incidents import MARKERS, IncidentBook, WindowView
from artemis.detect.monitor import JobMonitor, MonitorOutput
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import RankWindow
from artemis.rebalance.policy import PlanEvent, PolicySettings, RebalancePolicy
from artemis.ring.format import CLOCK_DEVICE_NS
from artemis.sim.inproc import summarised
from artemis.sim.scenario import Scenario, load_scenario
from artemis.sim.telemetry import telemetry_plan
from window_records import window_record

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "sim" / "scenarios"
T0 = 1_764_584_400.0  # a wall time; the core only carries it


def sim_windows(sc: Scenario) -> list[tuple[int, list[RankWindow]]]:
    """Every window of the scenario as the agents would summarise it (one island)."""
    plan = telemetry_plan(sc)
    summ = [
        WindowSummarizer(
            "job",
            "00000000000000b1",
            r,
            sc.ranks,
            sc.host_name(sc.host_of(r)),
            sc.window_steps,
            clock_kind=CLOCK_DEVICE_NS,
        )
        for r in range(sc.ranks)
    ]
    pending: dict[int, list[RankWindow]] = {}
    for r, rw in summarised(sc, summ):
        rw = dataclasses.replace(rw, telemetry=merge([overlay(plan[r], rw.window)]))
        pending.setdefault(rw.window, []).append(rw)
    return sorted(pending.items())


def drive(
    m: JobMonitor,
    windows: list[tuple[int, list[RankWindow]]],
    *,
    stop: int | None = None,
    on_out: Callable[[MonitorOutput], None] | None = None,
) -> list[MonitorOutput]:
    outs = []
    for w, rows in windows:
        if stop is not None and w >= stop:
            break
        out = m.on_window(w, rows, wall=T0 + w)
        outs.append(out)
        if on_out is not None:
            on_out(out)
    return outs


def records(outs: list[MonitorOutput]) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for o in outs:
        for r in o.incidents:
            by.setdefault(r["id"], []).append(r)
    return by


@pytest.fixture(scope="module")
def flagship() -> Scenario:
    sc = load_scenario(SCENARIOS / "flagship.toml")
    return dataclasses.replace(sc, islands=("nvidia",) * sc.ranks)


def _fault(sc: Scenario) -> Any:
    (f,) = sc.faults
    return f


# --------------------------------------------------------------------------- the flagship


def test_flagship_one_incident_confirmed_at_flag_unresolved(flagship: Scenario) -> None:
    fault = _fault(flagship)
    m = JobMonitor("flagship", Settings(), nranks=flagship.ranks)
    outs = drive(m, sim_windows(flagship))
    outs.append(m.finish(wall=T0 + 1000))
    by = records(outs)
    assert len(by) == 1, list(by)
    (lines,) = by.values()
    first, last = lines[0], lines[-1]
    assert first["change"] == "opened" and first["status"] == "open"
    assert first["verdict"] is None
    assert last["change"] == "closed" and last["status"] == "closed"
    assert last["kind"] == "rank" and last["rank"] == fault.ranks[0]
    assert last["subject"] == str(fault.ranks[0])
    flag = last["opened"]["window"]
    assert fault.start_window <= flag <= fault.start_window + 3
    assert last["opened"]["time"] == T0 + flag
    # the shift is clear (15% on 1% noise): confirmed in the window that flagged it
    assert last["confirmed"]["window"] == flag
    assert last["confirmed"]["rule"] == "q1>peers_median"
    assert last["confirmed"]["q1_ms"] > last["confirmed"]["peers_median_ms"]
    assert last["closed"] == {"window": flagship.windows - 1, "time": T0 + 1000, "why": "job_end"}
    assert last["verdict"] == "unresolved", last["reason"]
    assert last["cause"]["kind"] == "clocks"
    esc = last["escalation"]
    assert esc["cause"] == "clocks" and "nvidia-smi -q -d CLOCK" in esc["check"]
    sm = last["evidence"]["telemetry"]["sm_mhz"]
    assert sm["rank"] < sm["peers"]
    assert f"{sm['rank']:.0f} MHz" in esc["check"]
    # telemetry and cost: episode means against the fault's size
    assert last["evidence"]["ratio"] == pytest.approx(1 + fault.slowdown, abs=0.03)
    assert last["evidence"]["windows"] == flagship.windows - flag
    cost = last["cost"]
    assert cost["loss_pct"] == pytest.approx(100 * fault.slowdown / (1 + fault.slowdown), abs=2.0)
    assert cost["gpu_hours"] > 0
    assert cost["gpu_hours_per_day"] == pytest.approx(
        cost["loss_pct"] / 100 * flagship.ranks * 24, rel=1e-3
    )
    marks = [(x["marker"], x["window"]) for x in last["markers"]]
    assert marks == [("onset", fault.start_window), ("flagged", flag), ("confirmed", flag)]


def test_incident_rows_bands_and_subject(flagship: Scenario) -> None:
    m = JobMonitor("flagship", Settings(), nranks=flagship.ranks)
    outs = drive(m, sim_windows(flagship))
    job_rows = [r for o in outs for r in o.incident_rows if r["row"] == "job"]
    subj = [r for o in outs for r in o.incident_rows if r["row"] == "subject"]
    assert [r["window"] for r in job_rows] == list(range(flagship.windows))
    for r in job_rows:
        assert r["ratio_p10"] <= r["ratio_p50"] <= r["ratio_p90"]
        assert r["step_ms"] > 0 and r["time"] == T0 + r["window"]
    # the subject's own line from its flag to the end, above the peers' band: the
    # band is the peers' alone (a straggler among 8 ranks would lift a p90 of all)
    assert subj and len({r["incident"] for r in subj}) == 1
    assert [r["window"] for r in subj] == list(range(subj[0]["window"], flagship.windows))
    bands = {r["window"]: r for r in job_rows}
    for r in subj:
        assert r["ratio"] > bands[r["window"]]["ratio_p90"]
        assert bands[r["window"]]["ratio_p90"] - 1 < (r["ratio"] - 1) / 4
        assert r["gap_ms"] > r["peers_gap_ms"]


def test_blip_shorter_than_the_flag_rule_makes_no_incident(flagship: Scenario) -> None:
    s = Settings()
    fault = dataclasses.replace(
        _fault(flagship), end_window=_fault(flagship).start_window + s.flag_after - 1
    )
    sc = dataclasses.replace(flagship, faults=(fault,))
    m = JobMonitor("blip", s, nranks=sc.ranks)
    outs = drive(m, sim_windows(sc))
    outs.append(m.finish())
    states = [f.state for o in outs for f in o.findings if f.rank == fault.ranks[0]]
    assert "suspect" in states and "flagged" not in states  # seen, never flagged
    assert not records(outs)


# --------------------------------------------------------------------------- restore


def test_snapshot_restore_mid_episode_carries_on(flagship: Scenario) -> None:
    wins = sim_windows(flagship)
    flag_at = _fault(flagship).start_window + 4  # inside the episode
    whole = JobMonitor("flagship", Settings(), nranks=flagship.ranks)
    ref = drive(whole, wins)
    ref.append(whole.finish(wall=T0 + 1000))

    first = JobMonitor("flagship", Settings(), nranks=flagship.ranks)
    a = drive(first, wins, stop=flag_at)
    state = msgpack.unpackb(
        msgpack.packb(first.snapshot(), use_bin_type=True), raw=False, strict_map_key=False
    )
    second = JobMonitor.restore(state, Settings())
    b = drive(second, [(w, r) for w, r in wins if w >= flag_at])
    b.append(second.finish(wall=T0 + 1000))
    assert records(a + b) == records(ref)


def test_restore_of_a_snapshot_without_incidents() -> None:
    """A version-1 snapshot written before incidents existed restores with none open."""
    m = JobMonitor("j", Settings(), nranks=4)
    state = m.snapshot()
    del state["incidents"]
    back = JobMonitor.restore(state, Settings())
    assert back.incidents.open_incidents == []


# --------------------------------------------------------------------------- verdicts


def _cols(nranks: int, gap: dict[int, tuple[float, float, float]]) -> WindowColumns:
    rows = []
    for r in range(nranks):
        q1, q2, q3 = gap.get(r, (99.0, 100.0, 101.0))
        quartiles = {"gap_ms": q2, "gap_q1_ms": q1, "gap_q2_ms": q2, "gap_q3_ms": q3}
        rows.append(
            window_record(
                r, nranks=nranks, coll_hi=100, step_ms=120.0, island="nv", samples=64, **quartiles
            )
        )
    return WindowColumns.from_records(rows)


def _view(window: int, cols: WindowColumns, pace: float = 1.15) -> WindowView:
    n = cols.n
    return WindowView(
        window=window,
        time=T0 + window,
        cols=cols,
        ranks=np.arange(n),
        pace=np.array([pace if r == 2 else 1.0 for r in range(n)]),
        islands=np.array(["nv"] * n, dtype=object),
        step_ms=120.0,
        samples_per_s=64 * n / 0.12,
        gpus=n,
    )


def _finding(state: str, window: int, ratio: float = 1.15) -> F.Finding:
    return F.rank_finding(
        job="j",
        state=state,
        window=window,
        steps=[window * 50, window * 50 + 50],
        rank=2,
        island="nv",
        hosts=["h"],
        since=3,
        ratio=ratio,
        z=9.0,
        history=None,
        excess_ms=15.0 if state != "cleared" else 0.0,
        loss_pct=12.5 if state != "cleared" else 0.0,
        evidence={"gpu_hours": 0.01 * window, "gap_ms": 115.0, "peers_gap_ms": 100.0},
        cause={"kind": "clocks", "text": "clocks low", "evidence": {"sm_mhz": 1110}},
    )


SLOW = {2: (112.0, 115.0, 118.0)}


def _plan(status: str, window: int, before: float, after: float | None) -> PlanEvent:
    return PlanEvent(
        id="p1",
        window=window,
        rank=2,
        finding=None,
        speeds=[1.0] * 4,
        before=[64] * 4,
        after=[70, 70, 46, 70],
        apply_at_step=0,
        status=status,
        throughput_before=before,
        throughput_after=after,
        escalate=status == "rolled_back",
    )


def _applied_then(status: str, after: float) -> list[tuple[int, PlanEvent]]:
    """Plan p1 for window 7's flag: recommended at window 7, applied at 9, and at 12
    `status` with the throughput `after` it measured (2000 before)."""
    return [
        (7, _plan("recommended", 7, 2000.0, None)),
        (9, _plan("applied", 7, 2000.0, None)),
        (12, _plan(status, 7, 2000.0, after)),
    ]


def _book_through(plans: list[tuple[int, PlanEvent]], end: str) -> dict[str, Any]:
    b = IncidentBook("j", flag_window=4)
    out: list[dict[str, Any]] = []
    for w in range(5, 15):
        state = "flagged" if w == 5 else "ongoing"
        if end == "cleared" and w == 14:
            state = "cleared"
        b.on_window(_view(w, _cols(4, SLOW)), [_finding(state, w)])
        b.on_plans([ev for pw, ev in plans if pw == w], window=w)
        out += b.take()[0]
    if end == "job_end":
        b.close_all(14, T0 + 99)
        out += b.take()[0]
    assert b.open_incidents == []  # closed incidents leave the book
    return out[-1]


def test_verdict_unresolved_without_actions() -> None:
    rec = _book_through([], "job_end")
    assert rec["verdict"] == "unresolved" and rec["escalation"]["cause"] == "clocks"


def test_verdict_mitigated_with_measured_gain() -> None:
    plans = _applied_then("verified", 2300.0)
    rec = _book_through(plans, "job_end")
    assert rec["verdict"] == "mitigated", rec["reason"]
    (a,) = rec["actions"]
    assert a["status"] == "verified" and a["gain_pct"] == pytest.approx(15.0)
    assert [h["status"] for h in a["history"]] == ["recommended", "applied", "verified"]
    assert [h["window"] for h in a["history"]] == [7, 9, 12]
    assert rec["escalation"] is not None
    marks = [m["marker"] for m in rec["markers"]]
    assert marks == ["onset", "flagged", "confirmed", "applied", "verified"]


def test_verdict_escalated_when_the_plan_is_rolled_back() -> None:
    plans = _applied_then("rolled_back", 1990.0)
    rec = _book_through(plans, "job_end")
    assert rec["verdict"] == "escalated", rec["reason"]
    assert rec["escalation"]["check"]
    assert [m["marker"] for m in rec["markers"]][-1] == "rolled_back"


def test_verdict_recovered_when_cleared() -> None:
    plans = [(9, _plan("applied", 7, 2000.0, None)), (12, _plan("verified", 7, 2000.0, 2300.0))]
    rec = _book_through(plans, "cleared")
    assert rec["verdict"] == "recovered" and rec["closed"]["why"] == "cleared"
    assert rec["recovery"]["window"] == 14
    marks = [m["marker"] for m in rec["markers"]]
    assert marks == ["onset", "flagged", "confirmed", "applied", "verified", "cleared"]
    assert marks == sorted(marks, key=MARKERS.index)


def test_dismissed_when_cleared_before_confirmation() -> None:
    b = IncidentBook("j", flag_window=4)
    tail = {2: (99.0, 115.0, 160.0)}  # median up, lower quartile at the peers' median
    b.on_window(_view(5, _cols(4, tail)), [_finding("flagged", 5)])
    b.on_window(_view(6, _cols(4, tail)), [_finding("ongoing", 6)])
    b.on_window(_view(7, _cols(4, tail)), [_finding("cleared", 7)])
    recs, _ = b.take()
    rec = recs[-1]
    assert rec["verdict"] == "dismissed" and rec["confirmed"] is None
    assert rec["escalation"] is None
    assert "99.0 ms" in rec["reason"] and "100.0 ms" in rec["reason"]


def test_confirmed_later_within_the_wait() -> None:
    b = IncidentBook("j", flag_window=4)
    b.on_window(_view(5, _cols(4, {2: (99.0, 115.0, 160.0)})), [_finding("flagged", 5)])
    assert not b.allows(_finding("flagged", 5))  # the policy does not see it yet
    b.on_window(_view(6, _cols(4, SLOW)), [_finding("ongoing", 6)])
    assert b.allows(_finding("ongoing", 6))
    recs, _ = b.take()
    assert recs[-1]["confirmed"]["window"] == 6
    assert "confirmed" in recs[-1]["changes"]


def test_dismissed_after_the_wait_and_ignored_until_cleared() -> None:
    b = IncidentBook("j", flag_window=2)
    tail = {2: (99.0, 115.0, 160.0)}
    for w in range(5, 10):
        b.on_window(_view(w, _cols(4, tail)), [_finding("flagged" if w == 5 else "ongoing", w)])
    recs, _ = b.take()
    assert {r["id"] for r in recs} == {recs[0]["id"]}  # no second incident for the episode
    assert recs[-1]["verdict"] == "dismissed" and recs[-1]["closed"]["why"] == "dismissed"
    assert recs[-1]["closed"]["window"] == 6
    assert not b.allows(_finding("ongoing", 9))
    b.on_window(_view(10, _cols(4, tail)), [_finding("cleared", 10)])
    b.on_window(_view(11, _cols(4, SLOW)), [_finding("flagged", 11)])
    recs, _ = b.take()
    assert recs and recs[0]["opened"]["window"] == 11  # a new episode is a new incident


def test_no_quartiles_confirm_at_flag_and_scalar_kinds_too() -> None:
    b = IncidentBook("j", flag_window=4)
    cols = _cols(4, {})
    cols.cols["gap_q1_ms"][:] = np.nan  # an older agent
    b.on_window(_view(5, cols), [_finding("flagged", 5)])
    isl = F.scalar_finding(
        "island",
        job="j",
        state="flagged",
        window=5,
        steps=[250, 300],
        subject="amd",
        ranks=[4, 5],
        hosts=["h"],
        since=3,
        excess_ms=20.0,
        loss_pct=10.0,
        ratio=1.2,
        evidence={"gpu_hours": 0.1, "median_gap_ms": 120.0, "baseline_gap_ms": 100.0},
    )
    b.on_finding(isl)
    recs, _ = b.take()
    by = {r["kind"]: r for r in recs}
    assert by["rank"]["confirmed"]["rule"].startswith("flag: no per-step gap quartiles")
    assert by["island"]["confirmed"]["rule"].startswith("flag:")
    assert "120.0 ms" in by["island"]["escalation"]["check"]


# --------------------------------------------------------------------------- outputs


def test_metrics_series_removed_when_closed() -> None:
    from prometheus_client import generate_latest

    metrics = Metrics()
    b = IncidentBook("j", flag_window=4)
    b.on_window(_view(5, _cols(4, SLOW)), [_finding("flagged", 5)])
    recs, rows = b.take()
    metrics.observe_incidents(recs)
    b.on_window(_view(6, _cols(4, SLOW)), [_finding("ongoing", 6)])
    recs, rows = b.take()
    metrics.observe_incident_rows(rows)
    text = generate_latest(metrics.registry).decode()
    ident = b.open_incidents[0]["id"]
    assert 'straggler_incident_open{cause="clocks",job="j",kind="rank",subject="2"} 1.0' in text
    assert f'straggler_incident_gpu_hours_lost{{incident="{ident}",job="j"}} 0.06' in text
    b.close_all(6, T0)
    metrics.observe_incidents(b.take()[0])
    text = generate_latest(metrics.registry).decode()
    assert "straggler_incident_open{" not in text
    assert "straggler_incident_gpu_hours_lost{" not in text
    assert 'straggler_incidents_total{job="j",kind="rank",verdict="unresolved"} 1.0' in text


def test_incidents_writer_appends_json_lines(tmp_path: Path) -> None:
    assert incidents_path(tmp_path / "out" / "findings.jsonl") == tmp_path / "out" / (
        "incidents.jsonl"
    )
    b = IncidentBook("j", flag_window=4)
    b.on_window(_view(5, _cols(4, SLOW)), [_finding("flagged", 5)])
    b.close_all(5, T0)
    path = incidents_path(tmp_path / "findings.jsonl")
    with IncidentsWriter(path) as w:
        assert w.write(b.take()[0]) == 1
    with IncidentsWriter(path) as w:  # appends
        w.write([{"id": "x", "job": "j", "n": float("nan")}])
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["verdict"] == "unresolved" and lines[1]["n"] is None
    keys = {
        "id", "job", "run", "kind", "subject", "rank", "ranks", "island", "hosts", "change",
        "status", "opened", "confirmed", "closed", "cause", "evidence", "cost", "actions",
        "escalation", "verdict", "reason", "markers",
    }  # fmt: skip
    assert keys <= set(lines[0])


def test_peers_are_the_ranks_island_and_class() -> None:
    """Where classes split an island the confirm test compares within the class (the
    detector's scoring group): an older GPU's slower pace is not the subject's peers'."""
    cols = _cols(6, {2: (112.0, 115.0, 118.0), 4: (139.0, 140.0, 141.0), 5: (139.0, 140.0, 141.0)})
    cols.cols["hw_class"][:] = ["A100", "A100", "A100", "A100", "V100", "V100"]
    view = _view(5, cols)
    f = _finding("flagged", 5)
    f = dataclasses.replace(f, evidence={**(f.evidence or {}), "hw_class": "A100"})
    book = IncidentBook("j")
    row, peers = book._rows_of(f, view)
    assert row == 2 and sorted(cols.ints("rank")[peers].tolist()) == [0, 1, 3]
    book.on_window(view, [f])
    (rec,) = book.take()[0]
    assert rec["confirmed"] is not None and rec["confirmed"]["peers"] == 3
    assert rec["confirmed"]["peers_median_ms"] == 100.0


def test_plan_applied_marker_is_the_window_of_its_switch_step() -> None:
    """A plan is acknowledged (applied) a window or two before its `apply_at_step`;
    the marker goes to the window that step falls in, where step time can move."""
    applied = dataclasses.replace(_plan("applied", 7, 2000.0, None), apply_at_step=11 * 50 + 20)
    plans = [(7, _plan("recommended", 7, 2000.0, None)), (9, applied)]
    rec = _book_through(plans, "job_end")
    (a,) = rec["actions"]
    assert [h["window"] for h in a["history"]] == [7, 9]  # when it happened
    assert a["apply_at_step"] == 570
    marks = {m["marker"]: m["window"] for m in rec["markers"]}
    assert marks["applied"] == 11  # where it takes effect


def test_metrics_name_the_report_of_an_open_incident_when_report_dir_is_set() -> None:
    from prometheus_client import generate_latest

    metrics = Metrics()
    metrics.report_dir = "/srv/reports"
    b = IncidentBook("j", flag_window=4)
    b.on_window(_view(5, _cols(4, SLOW)), [_finding("flagged", 5)])
    metrics.observe_incidents(b.take()[0])
    ident = b.open_incidents[0]["id"]
    text = generate_latest(metrics.registry).decode()
    assert (
        f'straggler_incident_report{{incident="{ident}",job="j",'
        f'path="/srv/reports/j.html#incident-{ident}"}} 1.0'
    ) in text
    b.close_all(6, T0)
    metrics.observe_incidents(b.take()[0])
    assert "straggler_incident_report{" not in generate_latest(metrics.registry).decode()


def test_subject_rows_start_at_onset() -> None:
    """(issue 31, item 9) The pace is drawn from onset: the rows of the suspect
    windows before the flag, and of a window of the streak with no line (the flag
    rule needs 3 suspect windows of 4) from its pace, come out when the incident opens."""
    b = IncidentBook("j", flag_window=4)
    lines = {3: "suspect", 5: "suspect", 6: "flagged", 7: "ongoing"}
    rows: list[dict[str, Any]] = []
    for w in range(1, 8):
        pace = 1.15 if w >= 3 else 1.0
        state = lines.get(w)
        b.on_window(_view(w, _cols(4, SLOW), pace), [_finding(state, w)] if state else [])
        got = [r for r in b.take()[1] if r["row"] == "subject"]
        if w < 6:
            assert got == [], (w, got)  # nothing until the incident opens
        rows += got
    assert len({r["incident"] for r in rows}) == 1
    assert [r["window"] for r in rows] == [3, 4, 5, 6, 7]
    assert [r["ratio"] for r in rows] == [1.15] * 5  # window 4's from the window's pace
    assert [r["gap_ms"] for r in rows] == [115.0, None, 115.0, 115.0, 115.0]
    # a suspect window's cost is not yet the incident's
    assert [r["gpu_hours"] is None for r in rows] == [True, True, True, False, False]


def test_an_unresolved_incident_says_why_no_plan_was_made(flagship: Scenario) -> None:
    """The reason names why the incident had no rebalancing action: the policy off; on,
    but the job reports no sample counts (a script without the rebalance client: the
    reason once said "no rebalancing action allowed" under `--rebalance apply`); on
    with samples, and no plan made."""
    m = JobMonitor("flagship", Settings(), nranks=flagship.ranks)
    outs = drive(m, sim_windows(flagship))
    outs.append(m.finish(wall=T0 + 1000))
    (lines,) = records(outs).values()
    assert lines[-1]["reason"] == "still slow at the end of the job, no action: rebalancing is off"
    settings = PolicySettings.from_settings(Settings(rebalance="apply"), window_steps=50)
    assert "no sample counts" in no_action(RebalancePolicy(settings, 4, None))
    assert no_action(RebalancePolicy(settings, 4, 64)) == (
        "no action: the rebalance policy made no plan for it"
    )
    off = PolicySettings.from_settings(Settings(), window_steps=50)
    assert no_action(RebalancePolicy(off, 4, 64)) == "no action: rebalancing is off"
    assert no_action(None) == "no action: rebalancing is off"
