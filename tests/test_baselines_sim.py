"""Baselines across jobs on the whole simulated cluster: runs of one workload share a store.

Each run is `artemis sim --store URL` (real plugin, agents and coordinator;
simulated GPUs), in this order, on one store:

1. `base`: the old driver, healthy: its confirmed windows become the baseline.
2. `newdriver_slow`: a new driver and every rank 8% slower from the start
   (`[[fault]] kind = "software"`): a `change` finding naming the driver.
3. `same_slow`: the old fingerprint, the same slowdown: `regression`, cause
   `unknown`.
4. `straggler`: the old fingerprint, rank 2's clocks low from window 8: the
   straggler is flagged and confirmed, and the baseline does not move.
5. `newdriver`: the new driver at the old speed: nothing, and a baseline of the
   new fingerprint next to the old one.

On PostgreSQL (a real server, tests/pg.py) the first two runs play the same way
on one database: `test_two_runs_share_a_postgresql_store`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from artemis.detect.baselines import software_hash
from artemis.store import open_store
from artemis.store.base import store_url as sqlite_url
from sim_cli import artemis_sim

pytestmark = pytest.mark.slow

JOB = """
[job]
ranks = 8
ranks_per_host = 4
step_ms = 50.0
collectives_per_step = 4
window_steps = 20
windows = 16
noise = 0.02
seed = {seed}
"""
OLD_DRIVER, NEW_DRIVER = "535.104.05", "550.54.14"
SOFTWARE = """
[software]
gpu_model = "NVIDIA H100 80GB HBM3"
driver = "{driver}"
cuda = "12.2"
nccl = "2.19.3"
torch = "2.3.1"
kernel = "5.15.0-105-generic"
env = {{ NCCL_ALGO = "Ring" }}
"""
SLOW = """
[[fault]]
kind = "software"
start_window = 0
slowdown = 0.08
"""
STRAGGLER_ONSET = 8
STRAGGLER = f"""
[[fault]]
kind = "clocks"
rank = 2
start_window = {STRAGGLER_ONSET}
slowdown = 0.3
"""
# (name, seed, driver, faults), in the order they run
RUNS = (
    ("base", 3, OLD_DRIVER, ""),
    ("newdriver_slow", 4, NEW_DRIVER, SLOW),
    ("same_slow", 5, OLD_DRIVER, SLOW),
    ("straggler", 6, OLD_DRIVER, STRAGGLER),
    ("newdriver", 7, NEW_DRIVER, ""),
)


@dataclass
class Run:
    findings: list[dict[str, Any]]
    incidents: list[dict[str, Any]]
    baselines: list[dict[str, Any]]  # the store's, after the run


def run_sim(name: str, text: str, tmp: Path, store: str) -> None:
    scenario = tmp / f"{name}.toml"
    scenario.write_text(text)
    artemis_sim(scenario, tmp / name / "findings.jsonl", "--store", store)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module", params=["sqlite"])
def baseline_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    yield sqlite_url(tmp_path_factory.mktemp("baselines-store") / "fleet.db")


def play(runs: tuple[tuple[str, int, str, str], ...], tmp: Path, store: str) -> dict[str, Run]:
    """The runs in order on one store; each run's outputs and the store's baselines after it."""
    out: dict[str, Run] = {}
    for name, seed, driver, faults in runs:
        text = JOB.format(seed=seed) + SOFTWARE.format(driver=driver) + faults
        run_sim(name, text, tmp, store)
        with open_store(store, readonly=True) as s:
            stored = s.baselines()
        out[name] = Run(
            read_jsonl(tmp / name / "findings.jsonl"),
            read_jsonl(tmp / name / "incidents.jsonl"),
            stored,
        )
    return out


@pytest.fixture(scope="module")
def runs(baseline_store: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return play(RUNS, tmp_path_factory.mktemp("baselines-sim"), baseline_store)


def software(driver: str) -> dict[str, Any]:
    """The job's software fingerprint as the scenario's [software] makes it."""
    return {
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "driver": driver,
        "cuda": "12.2",
        "nccl": "2.19.3",
        "torch": "2.3.1",
        "kernel": "5.15.0-105-generic",
        "env": {"NCCL_ALGO": "Ring"},
    }


def of_kind(run: Run, *kinds: str) -> list[dict[str, Any]]:
    return [f for f in run.findings if f["kind"] in kinds]


def kinds(run: Run) -> set[str]:
    """The kinds the run found, but `missing`: a machine under load can be late with a
    host's summaries past the sim's assembly deadline (2 s), which says nothing of the
    baselines (its windows are then not healthy, so fewer of them are stored)."""
    return {f["kind"] for f in run.findings} - {"missing"}


def test_the_first_run_stores_a_baseline(runs: dict[str, Run]) -> None:
    base = runs["base"]
    assert not kinds(base), base.findings
    (b,) = base.baselines
    assert b["software_hash"] == software_hash(software(OLD_DRIVER))
    assert b["software"] == software(OLD_DRIVER)
    assert [j["job"] for j in b["jobs"]] == ["base-sim"] and b["windows"] >= 1


def test_a_new_driver_8pct_slower_gives_a_change_naming_the_driver(runs: dict[str, Run]) -> None:
    run = runs["newdriver_slow"]
    assert kinds(run) == {"change"}, run.findings
    flagged = [f for f in of_kind(run, "change") if f["state"] == "flagged"]
    assert len(flagged) == 1
    f = flagged[0]
    assert f["evidence"]["changed"] == {"driver": [OLD_DRIVER, NEW_DRIVER]}
    assert (
        f["cause"]["kind"] == "software"
        and f"driver {OLD_DRIVER} -> {NEW_DRIVER}" in (f["cause"]["text"])
    )
    assert 6.0 < f["evidence"]["slower_pct"] < 10.0, f["evidence"]
    assert f["ranks"] == list(range(8)) and f["basis"] == "baseline"
    (inc,) = {r["id"]: r for r in run.incidents if r["kind"] != "missing"}.values()
    assert inc["kind"] == "change" and inc["confirmed"] is not None
    assert inc["status"] == "closed" and not inc["actions"]
    # its slow windows are no baseline: the store holds the old one only
    assert run.baselines == runs["base"].baselines


def test_the_same_slowdown_with_the_same_fingerprint_is_a_regression(
    runs: dict[str, Run],
) -> None:
    run = runs["same_slow"]
    assert kinds(run) == {"regression"}, run.findings
    f = next(f for f in of_kind(run, "regression") if f["state"] == "flagged")
    assert f["cause"]["kind"] == "unknown" and "changed" not in f["evidence"]
    assert "driver" in f["evidence"]["checked"] and "env.NCCL_ALGO" in f["evidence"]["checked"]
    assert 6.0 < f["evidence"]["slower_pct"] < 10.0
    assert run.baselines == runs["base"].baselines


def test_a_straggler_does_not_move_the_baseline(runs: dict[str, Run]) -> None:
    run = runs["straggler"]
    incs = {r["id"]: r for r in run.incidents}
    assert any(r["kind"] == "rank" and r["rank"] == 2 and r["confirmed"] for r in incs.values())
    assert not of_kind(run, "change", "regression")  # one slow rank is not the whole class
    # no window of it confirmed healthy: the stored baseline is the same row, untouched
    assert run.baselines == runs["base"].baselines


def test_a_new_driver_at_the_same_speed_stores_a_baseline_of_its_own(
    runs: dict[str, Run],
) -> None:
    run = runs["newdriver"]
    assert not kinds(run), run.findings
    latest, old = run.baselines
    assert old == runs["base"].baselines[0]
    assert latest["software_hash"] == software_hash(software(NEW_DRIVER))
    assert latest["workload"] == old["workload"] and latest["hw_class"] == old["hw_class"]
    assert [j["job"] for j in latest["jobs"]] == ["newdriver-sim"]
    assert abs(latest["gap_q2_ms"] / old["gap_q2_ms"] - 1.0) < 0.02


def test_two_runs_share_a_postgresql_store(pg_url: str, tmp_path: Path) -> None:
    """The fleet's path: two coordinators (two `artemis sim` runs) sharing one
    PostgreSQL database (tests/pg.py: a real server). The first run's healthy windows
    become the baseline there, and the second, with a new driver and 8% slower, is
    judged by it: a `change` naming the driver. The same assertions as the SQLite
    runs above; the other three runs' logic does not depend on the engine (the
    store's baseline SQL runs on both in tests/test_store_baselines.py), so they play
    on SQLite only, within the suite's time."""
    two = play(RUNS[:2], tmp_path, pg_url)
    test_the_first_run_stores_a_baseline(two)
    test_a_new_driver_8pct_slower_gives_a_change_naming_the_driver(two)
