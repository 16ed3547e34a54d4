"""``artemis.job.Detector`` in a real 4-rank DDP job (tests/ddp_job.py): no agent, no
coordinator. Same job and stall as tests/test_artemis_run.py, at the default detector
settings (see there how they cope with this shared machine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from job_runs import inproc_ddp_job

WINDOW_STEPS = 20
STEPS = 295  # 300 collectives with the 5 start-up ones: whole windows
SETTINGS: dict[str, Any] = {}  # the defaults


def _run(tmp: Path, *args: str) -> list[dict[str, Any]]:
    return inproc_ddp_job(
        tmp,
        ["--steps", str(STEPS), *args],
        window_steps=WINDOW_STEPS,
        settings=SETTINGS,
        timeout=240,
    )


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_detector_flags_a_stalled_data_loader_in_process(tmp_path: Path) -> None:
    mark = tmp_path / "stall.json"
    found = _run(
        tmp_path,
        "--stall-rank",
        "2",
        "--stall-from",
        "135",
        "--stall-ms",
        "40",
        "--mark",
        str(mark),
    )
    stall_window = json.loads(mark.read_text())["coll_seq"] // WINDOW_STEPS
    flags = [f for f in found if f["state"] == "flagged"]
    assert {(f["kind"], f["rank"]) for f in flags} == {("rank", 2)}, flags
    assert stall_window <= flags[0]["window"] <= stall_window + 2, (stall_window, flags[0])
    assert flags[0]["cause"]["kind"] == "host", flags[0]["cause"]
    # an idle gap (the loader sleeps), told apart by the per-record CPU times
    cause = flags[0]["cause"]
    assert cause["text"].startswith("input stall: the process was idle"), cause
    ev = cause["evidence"]
    assert ev["gap_busy_pct"] <= 0.5 * ev["peers_gap_busy_pct"], ev
    # every window of the run was scored, the partial last one included
    assert max(f["window"] for f in found) == 300 // WINDOW_STEPS - 1
    # one incident, confirmed (every step stalls: the whole distribution moved), open
    # to the end of the job, with the check for an input stall (docs/DESIGN.md "Incidents")
    lines = (tmp_path / "det" / "incidents.jsonl").read_text().splitlines()
    last = {r["id"]: r for r in map(json.loads, lines)}
    (inc,) = last.values()
    assert inc["rank"] == 2 and inc["opened"]["window"] == flags[0]["window"], inc
    assert inc["confirmed"] is not None and inc["verdict"] == "unresolved", inc["reason"]
    assert inc["escalation"]["cause"] == "host" and "input stall" in inc["escalation"]["check"]


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_detector_without_a_stall_flags_nothing(tmp_path: Path) -> None:
    found = _run(tmp_path)
    assert not [f for f in found if f["state"] == "flagged"], found
