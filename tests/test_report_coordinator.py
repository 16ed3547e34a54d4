"""report_dir: a real `artemis-coordinator serve` writes each job's incident report at
the job's end (here, its shutdown flush), from its own store (tests/daemon_harness.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from artemis.store import open_for_findings
from daemon_harness import JOB, Coordinator, run_lockstep_job

pytestmark = pytest.mark.slow

W_STEPS, COLLS, WINDOWS = 10, 4, 8
BASE_MS = (10.0, 5.0, 5.0, 5.0)
SPEED = (1.00, 1.01, 1.02, 0.99, 1.30, 1.015)  # rank 4 is slow


def test_report_written_at_job_end(
    tmp_path: Path, plugin_lib: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("ARTEMIS_DISABLE", "ARTEMIS_DEVICE_TIMING", "ARTEMIS_RING_SLOTS", "ARTEMIS_CLOCK"):
        monkeypatch.delenv(var, raising=False)
    reports = tmp_path / "reports"

    def not_yet(coord: Coordinator) -> None:
        assert not reports.exists()  # not before the job's end

    compute = [[b * f for b in BASE_MS] for f in SPEED]
    coord = run_lockstep_job(
        tmp_path,
        plugin_lib,
        compute,
        {"report_dir": str(reports)},
        WINDOWS,
        window_steps=W_STEPS,
        colls_per_step=COLLS,
        before_agent_stops=not_yet,
    )
    assert coord.daemon is not None
    assert coord.daemon.stop() == 0
    page = reports / f"{JOB}.html"
    assert page.is_file(), coord.daemon.log_text()[-3000:]
    html = page.read_text()
    assert f'data-job="{JOB}"' in html
    assert re.search(r'<tr data-key="ranks"><th>ranks</th><td>6</td>', html)
    with open_for_findings(coord.jsonl) as s:
        incidents = s.incidents(job=JOB)
    # Every incident the coordinator stored has its section (none before the
    # incident core is merged: then the page says so).
    for inc in incidents:
        assert f'data-incident="{inc["id"]}"' in html
    if not incidents:
        assert "No incidents" in html
    written = [r for r in coord.daemon.log_records() if r.get("event") == "incident report written"]
    assert [r["path"] for r in written] == [str(page)]
