"""Tensor parallelism (`[job] tp`): a slow rank delays its TP group's collectives,
and the detector still names it alone.

With tp = 2 each rank has two communicators: its TP group's (2 ranks) and its
data-parallel one (one per TP position). The rank's TP partner waits inside
every TP collective for the slow rank, so on the DP communicator alone its
compute gap would read as slow too. The agent leaves the time inside the
rank's other communicators' collectives out of the gap (`feed_nested`), and
the coordinator judges each rank on its largest communicator
(detect/DETECTOR.md, "Several communicators per rank").
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from artemis.agent.summary import WindowSummarizer
from artemis.ring.format import CLOCK_DEVICE_NS
from artemis.sim import inproc
from artemis.sim.cluster import SimCluster, SimOptions
from artemis.sim.model import LockstepModel
from artemis.sim.scenario import ScenarioError, parse_scenario
from e2e_expect import read_jsonl

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

JOB = """
[job]
ranks = 8
ranks_per_host = 4
step_ms = 20.0
collectives_per_step = 2
window_steps = 20
windows = {windows}
noise = 0.01
seed = 5
tp = 2
"""
FAULT = """
[[fault]]
kind = "clocks"
rank = 2
start_window = 3
slowdown = 0.15
"""


def _gaps(sc_text: str, nested: bool) -> np.ndarray:
    """gap_ms [window, rank] on each rank's DP communicator, in process."""
    sc = parse_scenario(tomllib.loads(sc_text))
    model = LockstepModel(sc)
    dp, tp = inproc.RecordMaker(model), inproc.RecordMaker(model, tp=True)
    summ = [
        WindowSummarizer("j", "dp", r, 4, "h", sc.window_steps, clock_kind=CLOCK_DEVICE_NS)
        for r in range(sc.ranks)
    ]
    for w in range(sc.windows):
        wt = model.window(w)
        assert wt.tp_arrive is not None and wt.tp_end is not None
        recs = dp.window(wt.arrive, wt.end, wt.steps.start)
        trecs = tp.window(wt.tp_arrive, wt.tp_end, wt.steps.start)
        for r, s in enumerate(summ):
            if nested:
                s.feed_nested(trecs[r])
            s.feed(recs[r])
    out = [[w.gap_ms for w in s.take_windows(final=True)] for s in summ]
    return np.array(out).T


def test_the_partner_waits_inside_tp_collectives_not_in_its_gap() -> None:
    text = JOB.format(windows=6) + FAULT
    with_tp = _gaps(text, nested=True)
    without = _gaps(text, nested=False)
    # from the onset, rank 2 computes 15% longer; its partner rank 3 only waits
    assert with_tp[4, 2] / np.median(with_tp[4]) == pytest.approx(1.15, abs=0.02)
    assert with_tp[4, 3] / np.median(with_tp[4]) == pytest.approx(1.0, abs=0.01)
    # the DP communicator alone would read the partner's waits as compute
    assert without[4, 3] / np.median(without[4]) > 1.03


def test_tp_must_divide_ranks_and_hosts() -> None:
    bad = JOB.format(windows=6).replace("tp = 2", "tp = 3")
    with pytest.raises(ScenarioError, match=r"\[job\]\.tp"):
        parse_scenario(tomllib.loads(bad))


@pytest.mark.slow
def test_a_straggler_in_a_tp_job_is_flagged_alone_and_diagnosed(tmp_path: Path) -> None:
    path = tmp_path / "tp.toml"
    path.write_text(JOB.format(windows=9) + FAULT)
    out = tmp_path / "findings.jsonl"
    res = SimCluster(
        path, SimOptions(jsonl=out, plans_jsonl=tmp_path / "plans.jsonl", timeout_s=180)
    ).run()
    assert res.ok, res.reason
    assert res.windows_scored == 9
    found = read_jsonl(out)
    flagged = [f for f in found if f["state"] == "flagged"]
    assert [(f["kind"], f["rank"]) for f in flagged] == [("rank", 2)], flagged
    (f,) = flagged
    assert f["window"] <= 3 + 2  # the onset window counts as the first of 3
    assert f["cause"]["kind"] == "clocks"
    # nobody else was even suspected: not the TP partner (rank 3), not its DP peers
    assert {x["rank"] for x in found if x["kind"] in ("rank", "degraded")} == {2}
