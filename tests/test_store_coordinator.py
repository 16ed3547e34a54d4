"""The coordinator and its incident store, end to end: a real `artemis-coordinator serve`,
a real agent and the real plugin over loopback (tests/daemon_harness.py).

A damaged store file is logged as an error naming the file and the coordinator
goes on scoring and writing its JSONL; a good store gets the job's row and its
per-window rows while the job runs, readable from another process meanwhile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from artemis.store.jsonl import JsonlIncidents
from daemon_harness import JOB, Coordinator, run_lockstep_job, wait_for

pytestmark = pytest.mark.slow

W_STEPS = 10
COLLS = 4
BASE_MS = (10.0, 5.0, 5.0, 5.0)
SPEED = (1.00, 1.01, 1.02, 0.99, 1.30, 1.015)  # rank 4 is the straggler
SLOW = 4


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ARTEMIS_DISABLE", "ARTEMIS_DEVICE_TIMING", "ARTEMIS_RING_SLOTS", "ARTEMIS_CLOCK"):
        monkeypatch.delenv(var, raising=False)


def _run(tmp: Path, plugin: Path, config: dict[str, Any], windows: int) -> Coordinator:
    compute = [[b * f for b in BASE_MS] for f in SPEED]
    return run_lockstep_job(
        tmp, plugin, compute, config, windows, window_steps=W_STEPS, colls_per_step=COLLS
    )


def test_damaged_store_logged_and_coordinator_keeps_going(
    tmp_path: Path, plugin_lib: Path, env: None
) -> None:
    bad = tmp_path / "state" / "artemis.db"
    bad.parent.mkdir()
    bad.write_bytes(b"this was a store once\n" * 500)
    coord = _run(tmp_path, plugin_lib, {"store": f"sqlite:///{bad}"}, windows=6)
    try:
        flagged = [f for f in coord.findings() if f["kind"] == "rank" and f["state"] == "flagged"]
        assert [f["rank"] for f in flagged] == [SLOW]  # scored and written as ever
        log = JsonlIncidents(tmp_path / "incidents.jsonl")  # and its incidents too
        assert [(r["kind"], r["rank"]) for r in log.incidents()] == [("rank", SLOW)]
        assert coord.daemon is not None
        errors = [
            r
            for r in coord.daemon.log_records()
            if r.get("level") == "error" and "incident store" in str(r.get("event"))
        ]
        assert len(errors) == 1, coord.daemon.log_text()[-3000:]
        assert str(bad) in errors[0]["error"] and "not an Artemis store" in errors[0]["error"]
    finally:
        assert coord.daemon is not None
        assert coord.daemon.stop() == 0  # and it stops cleanly, flushing its outputs
    assert bad.read_bytes() == b"this was a store once\n" * 500  # never overwritten


def test_store_written_while_the_job_runs(tmp_path: Path, plugin_lib: Path, env: None) -> None:
    from artemis.store import open_for_findings

    coord = _run(tmp_path, plugin_lib, {}, windows=6)  # store = "auto": next to the findings
    try:
        assert (tmp_path / "artemis.db").exists()

        # Read from this process while the coordinator holds the store open. Its
        # writes are queued (store/sink.py): the last window's lands just after.
        def stored_last() -> Any:
            with open_for_findings(coord.jsonl) as s:
                return [j.get("last_window") for j in s.jobs()] == [5]

        wait_for(stored_last, 30, "window 5 in the store")
        with open_for_findings(coord.jsonl) as s:
            (job,) = s.jobs()
            assert job["job"] == JOB and job["ranks"] == len(SPEED) and job["hosts"] == ["h0"]
            assert job["last_window"] == 5 and job["window_steps"] == W_STEPS
            assert job["ended"] is None
    finally:
        assert coord.daemon is not None
        assert coord.daemon.stop() == 0
    with open_for_findings(coord.jsonl) as s:
        (job,) = s.jobs()
        assert job["ended"] is not None  # the flush at shutdown ended the job
        # Every incident change went to both; the store has the latest of each.
        log = JsonlIncidents(tmp_path / "incidents.jsonl")
        assert s.incidents() == log.incidents()
        (inc,) = s.incidents()
        assert inc["rank"] == SLOW and inc["status"] == "closed"  # closed at the job's end
        rows = s.incident_windows(inc["id"])
        # from its onset (its suspect windows, kept until the flag opened it: issue 31
        # item 9, the pace drawn from onset) to its close
        assert inc["since"] <= inc["opened"]["window"]
        assert [r["window"] for r in rows] == list(range(inc["since"], inc["closed"]["window"] + 1))
