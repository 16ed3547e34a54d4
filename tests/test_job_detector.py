"""``artemis.job.Detector`` in a real 4-rank DDP job (tests/ddp_job.py): no agent, no
coordinator. Same job and stall as tests/test_artemis_run.py, at the default detector
settings (see there how they cope with this shared machine, and how a flag on a rank
the machine itself slowed is told from a false one: tests/rank_truth.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rank_truth import Truth, describe, flag_deadline, unexplained

pytest.importorskip("torch")

from job_runs import inproc_ddp_job

WINDOW_STEPS = 20
STEPS = 295  # 300 collectives with the 5 start-up ones: whole windows
SETTINGS: dict[str, Any] = {}  # the defaults
RANKS = 4
STALL_MS = 40.0


def _run(tmp: Path, *args: str) -> list[dict[str, Any]]:
    return inproc_ddp_job(
        tmp,
        ["--steps", str(STEPS), "--truth", str(tmp / "truth"), *args],
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
        str(STALL_MS),
        "--mark",
        str(mark),
    )
    stall_window = json.loads(mark.read_text())["coll_seq"] // WINDOW_STEPS
    flags = [f for f in found if f["state"] == "flagged"]
    mine = [f for f in flags if (f["kind"], f["rank"]) == ("rank", 2)]
    assert mine, flags
    # nothing else, but a rank the machine itself slowed (its own record says so)
    truth = Truth.load(tmp_path / "truth", RANKS)
    wrong = unexplained(flags, truth, 1, {2})
    assert not wrong, describe(wrong)
    # within 2 windows, one more per window the machine slowed another rank as much
    last = flag_deadline(truth, stall_window, 2, WINDOW_STEPS, 2, STALL_MS)
    assert stall_window <= mine[0]["window"] <= last, (stall_window, last, mine[0])
    assert mine[0]["cause"]["kind"] == "host", mine[0]["cause"]
    # an idle gap (the loader sleeps), told apart by the per-record CPU times
    cause = mine[0]["cause"]
    assert cause["text"].startswith("input stall: the process was idle"), cause
    ev = cause["evidence"]
    assert ev["gap_busy_pct"] <= 0.5 * ev["peers_gap_busy_pct"], ev
    # every window of the run was scored, the partial last one included
    assert max(f["window"] for f in found) == 300 // WINDOW_STEPS - 1
    # the host's evidence reached every window past the first (whose samples only prime
    # the deltas), though host samples are no longer taken at every poll: each field
    # this machine gives, the cgroup's throttling and the process's run delay among them
    given = _host_fields()
    assert {"run_delay_pct", "proc_cpu_pct", "cpu_pct"} <= given, given
    for f in found:
        if f["window"] >= 1:
            assert not given & set(f["missing"]), (f["window"], f["rank"], f["missing"])
    for k in given & set(ev):
        assert ev[k] is not None and ev.get(f"peers_{k}", 0) is not None, (k, ev)
    # one incident, confirmed (every step stalls: the whole distribution moved), open
    # to the end of the job, with the check for an input stall (docs/DESIGN.md "Incidents")
    lines = (tmp_path / "det" / "incidents.jsonl").read_text().splitlines()
    last = {r["id"]: r for r in map(json.loads, lines)}
    assert {r["rank"] for r in last.values()} <= {f["rank"] for f in flags}, last
    (inc,) = [r for r in last.values() if r["rank"] == 2]
    assert inc["opened"]["window"] == mine[0]["window"], inc
    assert inc["confirmed"] is not None and inc["verdict"] == "unresolved", inc["reason"]
    assert inc["escalation"]["cause"] == "host" and "input stall" in inc["escalation"]["check"]


def _host_fields() -> set[str]:
    """The host telemetry fields this machine gives (two samples of this process)."""
    import os

    from artemis.agent.telemetry.base import RankTarget
    from artemis.agent.telemetry.host import HostSource
    from artemis.protocol.records import HOST_FIELDS

    src, me = HostSource(), RankTarget(rank=0, pid=os.getpid())
    src.sample(me)
    sum(range(2_000_000))  # a tick of CPU time between the two
    return set(src.sample(me)) & set(HOST_FIELDS)


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_detector_without_a_stall_flags_nothing(tmp_path: Path) -> None:
    found = _run(tmp_path)
    flags = [f for f in found if f["state"] == "flagged"]
    # nothing, but a rank the machine itself slowed (its own record says so)
    wrong = unexplained(flags, Truth.load(tmp_path / "truth", RANKS), 1, set())
    assert not wrong, describe(wrong)


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_host_evidence_reaches_every_window_when_windows_are_shorter_than_a_sample(
    tmp_path: Path,
) -> None:
    """Host samples are taken a second apart (the agent's cadence) and as each batch of
    windows goes out: with 5-step windows (about half a second here) most batches after
    the first (the step period is found after some 200 collectives) come less than a
    second after the last sample, and each must still carry host evidence (a batch
    between two samples would have none: its fields missing)."""
    found = inproc_ddp_job(
        tmp_path,
        ["--steps", "280", "--stall-rank", "2", "--stall-from", "30", "--stall-ms", "40"],
        window_steps=5,
        settings=SETTINGS,
        timeout=240,
    )
    given = _host_fields()
    mine = sorted({f["window"] for f in found if f["rank"] == 2 and f["window"] >= 1})
    assert len(mine) >= 8, [(f["window"], f["rank"], f["state"]) for f in found]
    for f in found:
        if f["window"] >= 1:
            assert not given & set(f["missing"]), (f["window"], f["rank"], f["missing"])
