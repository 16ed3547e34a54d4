"""``artemis.job.Detector`` keeps an incident store next to its findings, as the
coordinator does: a real 4-rank DDP job (tests/ddp_job.py) with a stalled data
loader, and what its store holds against its JSONL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from artemis.store import open_for_findings
from artemis.store.jsonl import JsonlIncidents
from artemis.store.sqlite import SqliteStore

pytest.importorskip("torch")

JOB = Path(__file__).resolve().parent / "ddp_job.py"
WINDOW_STEPS = 20
STEPS = 295  # 300 collectives with the 5 start-up ones: whole windows (as there)
# The job, stall and settings of tests/test_job_detector.py (see there why these are
# raised on a shared machine).
SETTINGS = {"suspect_ratio": 1.5, "drift_ratio": 2.0, "collective_ratio": 2.0}


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_in_process_detector_keeps_a_store(tmp_path: Path) -> None:
    det = tmp_path / "det"
    det.mkdir()
    p = subprocess.run(
        [
            sys.executable,
            str(JOB),
            *("--steps", str(STEPS), "--window-steps", str(WINDOW_STEPS)),
            *("--detector", str(det), "--settings", json.dumps(SETTINGS)),
            *("--stall-rank", "2", "--stall-from", "135", "--stall-ms", "40"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={
            "ARTEMIS_SHM_DIR": str(tmp_path / "shm"),
            "ARTEMIS_JOB": "inproc",
            "PATH": "/usr/bin:/bin",
            # a tree's own code first where the caller put it there (a worktree)
            **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
        },
    )
    assert p.returncode == 0, p.stdout + p.stderr
    found = [json.loads(x) for x in (det / "findings.jsonl").read_text().splitlines()]
    last = max(f["window"] for f in found)
    log = JsonlIncidents(det / "incidents.jsonl")
    with open_for_findings(det / "findings.jsonl") as s:
        assert isinstance(s, SqliteStore)
        assert s.incidents() == log.incidents()  # whole records, the latest of each id
        assert s.incidents(), "the stalled rank made an incident"
        (job,) = s.jobs()
        assert job["ranks"] == 4 and job["ended"] is not None and job["last_window"] == last
        assert [r["window"] for r in s.job_windows(job["job"])] == list(range(last + 1))
        for inc in s.incidents():
            iw = s.incident_windows(inc["id"])
            assert iw and iw[0]["window"] == inc["opened"]["window"]
