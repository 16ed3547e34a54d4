"""Device-clock anomalies through the whole simulated cluster: the real plugin writes the
bad timer values into real rings (sim/clockfault.py), real agents read and summarise
them, the real coordinator scores them (docs/RELIABILITY.md "4. Device-clock anomalies").

One scenario per anomaly (sim/scenarios/clock_*.toml, rank 5 from window 6): the run
completes, rank 5 is never in a finding, the anomaly is counted under its own reason
(and no other) in `straggler_clock_anomalies_total`, and a real fault in the same job
(clock_rate.toml: rank 2 runs hot) is still found. The unit test of the agent's
correction with the real ring reader is tests/test_clock_anomalies.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from artemis.sim.cluster import SimCluster, SimContext, SimOptions
from artemis.sim.scenario import COMPUTE_FAULTS, load_scenario
from daemon_harness import scrape

pytestmark = pytest.mark.slow

SCENARIOS = Path(__file__).resolve().parents[1] / "sim" / "scenarios"
ANOMALIES = ("reversed", "jump", "wrap", "reset", "rate")
REASONS = ("reversed", "jump", "wrap", "reset", "rate")
# How many anomalies each scenario puts in rank 5's records (sim/clockfault.py): two
# reversed records in each of windows 6-9; one jump, one wrap, one reset; the rate in
# every window from 6 on (the coordinator rescales each of them).
EXPECTED = {"reversed": 8, "jump": 1, "wrap": 1, "reset": 1}
FIGURES: dict[str, Any] = {}


def _counts(url: str) -> dict[str, float]:
    out = {}
    for (name, labels), v in scrape(url).items():
        if name == "straggler_clock_anomalies_total":
            out[dict(labels)["reason"]] = v
    return out


# `make test` runs the rate scenario (the one a wrong clock would turn into a false
# flag at once, with a real fault beside it); `make reliability` runs all five.
@pytest.mark.parametrize(
    "anomaly",
    [a if a == "rate" else pytest.param(a, marks=pytest.mark.reliability) for a in ANOMALIES],
)
def test_clock_anomaly_is_counted_and_never_flagged(anomaly: str, tmp_path: Path) -> None:
    path = SCENARIOS / f"clock_{anomaly}.toml"
    sc = load_scenario(path)
    seen: dict[str, float] = {}

    def tick(ctx: SimContext) -> None:
        c = _counts(ctx.metrics_url)
        if c:
            seen.clear()
            seen.update(c)

    res = SimCluster(
        path,
        SimOptions(
            jsonl=tmp_path / "findings.jsonl",
            workdir=tmp_path / "work",
            timeout_s=120,
            on_tick=tick,
            on_end=tick,  # the run ends once the last window is scored: one more read
        ),
    ).run()
    assert res.ok, res.reason
    assert res.windows_scored >= sc.windows - 1
    findings = [json.loads(x) for x in res.findings.read_text().splitlines() if x.strip()]
    about_5 = [f for f in findings if f["rank"] == 5 or 5 in (f["ranks"] or [])]
    assert not about_5, [(f["kind"], f["state"], f["window"]) for f in about_5]
    real = {r for f in sc.faults if f.kind in COMPUTE_FAULTS for r in f.ranks}
    flagged = {f["rank"] for f in findings if f["state"] == "flagged" and f["kind"] == "rank"}
    assert flagged == real, (flagged, real)
    counts = {k: int(v) for k, v in seen.items() if v}
    if anomaly == "rate":
        # every scored window from the fault's on (the last one may be partial)
        assert set(counts) == {"rate"}, counts
        assert sc.windows - 6 - 1 <= counts["rate"] <= sc.windows - 6, counts
    else:
        assert counts == {anomaly: EXPECTED[anomaly]}, counts
    FIGURES[anomaly] = {"counts": counts, "findings_about_rank_5": 0, "flagged": sorted(flagged)}
    print(json.dumps({anomaly: FIGURES[anomaly]}))
