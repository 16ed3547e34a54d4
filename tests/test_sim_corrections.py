"""The simulator honours corrections: a fault that is a GPU setting (a locked clock, a
lowered power limit) ends when the setting is undone, one that is not (thermal) does not.

A whole simulated cluster runs (real coordinator, agents, plugin); part way through,
the test undoes the faulty rank's setting through the simulated agent's own
correction backend (``SimulatedControl`` on the control file beside the rank's ring,
as the agent does for a ``correction`` control). The rank's pace (its compute gap
over its peers', ``straggler_rank_pace_ratio``) is read from the coordinator
before and after: a ``clocks`` fault's rank returns to its peers' pace; a
``thermal`` fault's rank, whose clocks the same reset leaves as they were, does not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from artemis.agent.corrections.simulated import SimulatedControl, read_gpu_state
from artemis.sim.cluster import SimCluster, SimContext
from artemis.sim.hostproc import metric_value
from daemon_harness import metric_by_label, scrape
from sim_runs import sim_options

SCENARIO = """
[job]
ranks = 4
ranks_per_host = 2
step_ms = 40.0
collectives_per_step = 4
window_steps = 20
windows = {windows}
noise = 0.01
seed = 5

[[fault]]
kind = "{kind}"
rank = 1
start_window = 3
slowdown = 0.3
"""
FIX_AT = 9  # the window the setting is undone after
WINDOWS = 20


def pace(url: str, rank: int) -> float | None:
    return metric_by_label(scrape(url), "straggler_rank_pace_ratio", "rank").get(str(rank))


@pytest.mark.parametrize(
    ("kind", "action", "recovers"),
    [
        ("clocks", "reset_clocks", True),
        ("power", "restore_power_limit", True),
        ("thermal", "reset_clocks", False),
    ],
)
def test_undoing_the_setting_ends_clocks_and_power_faults_only(
    tmp_path: Path, kind: str, action: str, recovers: bool
) -> None:
    scenario = tmp_path / f"{kind}.toml"
    scenario.write_text(SCENARIO.format(kind=kind, windows=WINDOWS))
    seen: dict[str, Any] = {}

    def tick(ctx: SimContext) -> None:
        last = metric_value(ctx.metrics_url, "straggler_last_window")
        if "fixed" in seen or last is None or last < FIX_AT:
            return
        seen["before"] = pace(ctx.metrics_url, 1)
        ring = next((tmp_path / "work" / "shm" / "sim-node-0").glob("*.r1.ring"))
        ctl = SimulatedControl([ring])
        seen["state"] = ctl.state(action, -1)
        seen["after_state"] = ctl.apply(action, -1, seen["state"])
        seen["fixed"] = int(last)

    def end(ctx: SimContext) -> None:
        seen["end"] = pace(ctx.metrics_url, 1)
        seen["peers"] = [pace(ctx.metrics_url, r) for r in (0, 2, 3)]

    res = SimCluster(scenario, sim_options(tmp_path, on_tick=tick, on_end=end)).run()
    assert res.ok, res.reason
    assert seen["fixed"] <= WINDOWS - 6, "the fix came too late to be seen"
    assert seen["before"] is not None and seen["before"] > 1.2  # the fault's slowdown
    before, after = seen["state"], seen["after_state"]
    if kind == "power":  # a lowered limit, the default beside it; restored
        assert before["power_limit_w"] < before["default_w"] == after["power_limit_w"]
    else:  # clocks: a locked clock, unlocked; thermal: nothing was locked
        assert (before["locked_sm_mhz"] is not None) == recovers
        assert after["locked_sm_mhz"] is None
    print(kind, seen)  # the figures, with -s
    end_pace = seen["end"]
    assert end_pace is not None
    if recovers:
        assert abs(end_pace - 1.0) < 0.05, seen
    else:
        assert end_pace > 1.2, seen
    # the rank's telemetry follows its GPU: the simulator rewrote it from the fix on
    simtel = tmp_path / "work" / "shm" / "sim-node-0" / f"{kind}-sim.simtel.r1.json"
    segs = read_gpu_state(simtel) or {}
    ends = [s["end_window"] for s in segs.get("segments", [])]
    assert (any(e is not None and e > 3 for e in ends)) == recovers, segs


def test_a_fault_is_cut_where_its_setting_was_off_and_resumes_after_a_rollback(
    tmp_path: Path,
) -> None:
    """GpuStates over real control files: undo the lock before window 6, put it back
    before window 9; the clocks fault runs [3, 6) and [9, end), its other rank untouched."""
    from artemis.agent.corrections.simulated import gpu_state_path, write_gpu_state
    from artemis.sim.gpustate import GpuStates, control_path, initial_state
    from artemis.sim.model import LockstepModel
    from artemis.sim.scenario import parse_scenario
    from artemis.sim.telemetry import telemetry_plan

    sc = parse_scenario(
        {
            "job": {"ranks": 4, "ranks_per_host": 2, "step_ms": 10.0, "collectives_per_step": 2}
            | {"window_steps": 10, "windows": 12},
            "fault": [{"kind": "clocks", "ranks": [1, 2], "start_window": 3, "slowdown": 0.3}],
        }
    )
    plan = telemetry_plan(sc)
    for r in range(sc.ranks):
        path = control_path(sc, "j", "run1", tmp_path, r)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_gpu_state(path, initial_state(sc, r, plan[r]["base"]))
    path = control_path(sc, "j", "run1", tmp_path, 1)
    assert path == gpu_state_path(str(path).removesuffix(".gpu.json"))
    assert path.name.endswith(".r1.ring.gpu.json") and path.parent.name == "sim-node-0"
    states = GpuStates(sc, "j", "run1", tmp_path)
    locked = read_gpu_state(path) or {}
    assert locked["locked_sm_mhz"] is not None
    assert states.update(4) == set()
    write_gpu_state(path, {**locked, "locked_sm_mhz": None})
    assert states.update(6) == {1}
    write_gpu_state(path, locked)
    assert states.update(9) == {1}
    eff = states.effective()
    spans = sorted((f.ranks, f.start_window, f.end_window) for f in eff.faults)
    assert spans == [((1,), 3, 6), ((1,), 9, None), ((2,), 3, None)]
    model = LockstepModel(eff)
    slow = [model.slowdowns(w)[0][1] for w in (5, 7, 10)]
    assert slow[0] > 0.25 and slow[1] == 0.0 and slow[2] > 0.25


def test_a_scenario_passes_detector_corrections_through_and_names_a_bad_one() -> None:
    from artemis.sim.scenario import ScenarioError, parse_scenario

    job = {"ranks": 2, "ranks_per_host": 2, "step_ms": 10.0, "collectives_per_step": 2}
    job |= {"window_steps": 10, "windows": 4}
    sc = parse_scenario({"job": job, "detector": {"corrections": "apply"}})
    assert sc.detector["corrections"] == "apply"  # the coordinator's [detector] key
    with pytest.raises(ScenarioError, match=r"\[detector\]\.corrections: expected one of off"):
        parse_scenario({"job": job, "detector": {"corrections": "always"}})
