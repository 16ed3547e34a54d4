"""Scenario parsing and the lockstep model (pure parts of the simulator)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from artemis.sim.model import LockstepModel
from artemis.sim.scenario import ScenarioError, load_scenario, parse_scenario

SHARED = Path(__file__).resolve().parents[2] / "shared" / "scenarios"
SCENARIOS = sorted(SHARED.glob("*.toml")) + sorted(
    (Path(__file__).resolve().parents[1] / "sim" / "scenarios").glob("*.toml")
)

BASE = {
    "job": {
        "ranks": 4,
        "ranks_per_host": 2,
        "step_ms": 10.0,
        "collectives_per_step": 3,
        "window_steps": 10,
        "windows": 6,
    }
}


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_shipped_scenario_parses(path: Path) -> None:
    sc = load_scenario(path)
    assert sc.ranks == len(sc.islands)
    for f in sc.faults:
        assert 0 <= f.start_window < sc.windows


def _with(**job: object) -> dict:
    d = {"job": {**BASE["job"], **job}}
    return d


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"job": {**BASE["job"], "rank": 3}}, "[job].rank: unknown key"),
        (_with(ranks=1), "[job].ranks: expected an integer in [2, 1048576]"),
        (_with(islands=["a", "b"]), "[job].islands: expected 4 entries"),
        (_with(noise=0.9), "[job].noise"),
        (
            {**BASE, "fault": [{"kind": "gremlin", "rank": 1, "start_window": 1}]},
            "kind: expected one of",
        ),
        (
            {**BASE, "fault": [{"kind": "clocks", "rank": 9, "start_window": 1, "slowdown": 0.1}]},
            "expected a rank in [0, 3]",
        ),
        (
            {**BASE, "fault": [{"kind": "clocks", "rank": 1, "start_window": 1}]},
            "slowdown: required",
        ),
        (
            {**BASE, "fault": [{"kind": "island", "start_window": 1, "slowdown": 0.1}]},
            "island: required",
        ),
        (
            {**BASE, "fault": [{"kind": "link", "start_window": 1, "slowdown": 0.1}]},
            "'link' needs a job with two or more islands",
        ),
        ({**BASE, "fault": [{"kind": "hang", "rank": 1, "start_window": 9}]}, "start_window"),
        (
            {**BASE, "fault": [{"kind": "hang", "rank": 1, "start_window": 1, "on_plan": True}]},
            "on_plan: only for kind 'agent_down'",
        ),
        (
            {**BASE, "fault": [{"kind": "agent_down", "rank": 1, "start_window": 1, "on_plan": 1}]},
            "on_plan: expected true or false",
        ),
        ({**BASE, "detector": {"rebalance": "always"}}, "[detector].rebalance"),
        ({**BASE, "extra": {}}, "unknown table"),
    ],
)
def test_errors_name_the_file_key_and_what_is_allowed(data: dict, needle: str) -> None:
    with pytest.raises(ScenarioError) as e:
        parse_scenario(data, "my.toml")
    assert str(e.value).startswith("my.toml: ")
    assert needle in str(e.value)


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text("[job\nranks = 2")
    with pytest.raises(ScenarioError, match=r"bad\.toml: not valid TOML"):
        load_scenario(p)


def test_lockstep_collective_ends_when_last_rank_arrives() -> None:
    sc = parse_scenario(
        {**BASE, "fault": [{"kind": "clocks", "rank": 1, "start_window": 2, "slowdown": 0.5}]}
    )
    m = LockstepModel(sc)
    w0 = m.window(0)
    w2 = [m.window(1), m.window(2)][1]
    host_off = m.host_offset[None, :, None]
    for wt in (w0, w2):
        a = wt.arrive - host_off
        e = wt.end - host_off
        # Everyone ends together, after the last arrival.
        assert (e == e[:, :1, :]).all()
        assert (e[:, 0, :] > a.max(axis=1)).all()
    # Rank 1 is the late one once its fault starts: it arrives last at each collective.
    late = (w2.arrive - host_off).argmax(axis=1)
    assert (late == 1).mean() > 0.95
    comp = w2.compute_ms
    assert comp[:, 1].mean() / np.delete(comp, 1, axis=1).mean() == pytest.approx(1.5, rel=0.02)


def test_hosts_do_not_share_a_clock() -> None:
    sc = parse_scenario(BASE)
    m = LockstepModel(sc)
    assert len(set(m.host_offset.tolist())) == sc.hosts


# ------------------------------------------------------------------ the noise model


def _noisy(**job: object) -> dict:
    return _with(
        **{"ranks": 8, "ranks_per_host": 4, "windows": 20, "noise": 0.01, "seed": 3, **job}
    )


def test_noise_keys_default_to_the_seed_model() -> None:
    """A scenario without the new keys draws exactly the compute it drew before."""
    plain = LockstepModel(parse_scenario(_noisy()))
    explicit = LockstepModel(
        parse_scenario(_noisy(rank_spread=0.0, shared_jitter=0.0, stall_prob=0.0))
    )
    for w in range(3):
        assert np.array_equal(plain.window(w).compute_ms, explicit.window(w).compute_ms)
    sc = parse_scenario(_noisy())
    assert (sc.rank_spread, sc.shared_jitter, sc.stall_prob, sc.telemetry_noise) == (0, 0, 0, 0)
    assert sc.stall_ms == 40.0


@pytest.mark.parametrize(
    "key,value",
    [("rank_spread", -0.1), ("shared_jitter", 0.9), ("stall_prob", "x"), ("telemetry_noise", 1)],
)
def test_noise_keys_are_validated(key: str, value: object) -> None:
    with pytest.raises(ScenarioError, match=key):
        parse_scenario(_noisy(**{key: value}))


def test_rank_spread_jitter_and_stalls_shape_compute() -> None:
    sc = parse_scenario(
        _noisy(noise=0.0, rank_spread=0.05, shared_jitter=0.05, stall_prob=0.05, stall_ms=50.0)
    )
    m = LockstepModel(sc)
    comp = np.concatenate([m.window(w).compute_ms for w in range(6)])  # [S, R]
    med = np.median(comp, axis=0)
    assert med.std() / med.mean() > 0.01  # ranks differ by a fixed offset
    rel = comp / med[None, :]
    shared = np.median(rel, axis=1)
    assert shared.std() > 0.02  # a shared per-step jitter moves every rank together
    stalls = (comp - med[None, :] * shared[:, None]) > 10.0
    assert 0.02 < stalls.mean() < 0.1  # about stall_prob of the steps


def test_transfers_and_bridges_vary() -> None:
    d = _noisy(islands=["a"] * 4 + ["b"] * 4, noise=0.02)
    wt = LockstepModel(parse_scenario(d)).window(1)
    assert wt.bridge_end is not None and wt.bridge_start is not None
    bridge = (wt.bridge_end - wt.bridge_start)[:, 0]
    assert bridge.std() > 0


def _fault(**f: object) -> dict:
    d = _noisy()
    d["fault"] = [{"kind": "clocks", "rank": 2, "start_window": 4, "slowdown": 0.2, **f}]
    return d


def test_ramp_grows_linearly_and_duty_is_fixed_by_seed() -> None:
    ramp = parse_scenario(_fault(ramp_windows=4)).faults[0]
    assert [ramp.level(w) for w in range(3, 9)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    duty = parse_scenario(_fault(duty=0.5)).faults[0]
    on = [duty.level(w) > 0 for w in range(4, 20)]
    assert 4 <= sum(on) <= 12
    assert on == [parse_scenario(_fault(duty=0.5)).faults[0].level(w) > 0 for w in range(4, 20)]
    with pytest.raises(ScenarioError, match="duty"):
        parse_scenario(_fault(duty=0.0))
    with pytest.raises(ScenarioError, match="ramp_windows"):
        parse_scenario(_fault(ramp_windows=-1))


def test_fault_telemetry_is_cause_and_effect() -> None:
    """Thermal: at the regulator's limit and the clocks fall by what explains the
    slowdown; power cap: at (a lowered) limit; locked clocks: cooler, less power;
    host: the process gets less CPU and the run queue grows."""
    from artemis.sim.physics import slowdown_of_clock
    from artemis.sim.telemetry import fault_fields, telemetry_plan

    sc = parse_scenario(_noisy())
    base = telemetry_plan(sc)[2]["base"]
    th = fault_fields("thermal", 0.11, base)
    clock = th["sm_mhz"] / base["sm_mhz"]
    assert 0.88 < clock < 0.9 and slowdown_of_clock(clock) == pytest.approx(0.11, abs=2e-3)
    assert th["temp_c"] > base["temp_c"] + 15 and th["throttle"] == {"sw_thermal": True}
    pw = fault_fields("power", 0.08, base)
    assert pw["power_w"] / pw["power_limit_w"] > 0.99 and pw["power_limit_w"] < 700
    ck = fault_fields("clocks", 0.08, base)
    assert ck["power_w"] < base["power_w"] and ck["temp_c"] < base["temp_c"]
    assert ck["throttle"] == {}
    ho = fault_fields("host", 0.05, base)
    assert ho["proc_cpu_pct"] < base["proc_cpu_pct"] and ho["load1"] > base["ncpu"]
    assert "steal_pct" not in ho  # a bare-metal host: no steal to copy


def test_telemetry_varies_per_window_and_per_rank() -> None:
    from artemis.sim.telemetry import telemetry_plan

    sc = parse_scenario(_noisy(telemetry_noise=0.03))
    plan = telemetry_plan(sc)
    temps = [s["fields"]["temp_c"] for s in plan[0]["segments"]]
    assert len(temps) == sc.windows and np.std(temps) > 0
    assert np.std([plan[r]["base"]["temp_c"] for r in range(sc.ranks)]) > 0.5
