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
        (_with(ranks=1), "[job].ranks: expected an integer >= 2"),
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
