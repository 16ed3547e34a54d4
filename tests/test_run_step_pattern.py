"""`artemis run` on jobs whose scripts add collectives of their own (agent/summary.py
``infer_period``, its control collectives).

A stranger's script (one gradient bucket a step, its loss all-reduced every 10 steps,
a barrier every 100) ran 600 steps under `artemis run` and ended in "watched 4 ranks on
1 host, 0 windows scored" and "nothing flagged": its collectives had no period of at
most 64, and the agent waited for one to the end. Real 2-rank DDP jobs here, on the
``artemis`` backend, under a real coordinator and agent on loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_harness import json_records
from run_workdir import KEEP, keep_workdir

pytest.importorskip("torch")

BIN = Path(sys.executable).parent
JOB = Path(__file__).resolve().parent / "pattern_job.py"


def _run(tmp: Path, *job_args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    summary = tmp / "summary.json"
    p = subprocess.run(
        [
            str(BIN / "artemis"), "run", KEEP, "--summary-json", str(summary),
            "--window-steps", "20", "--", sys.executable, str(JOB), *job_args,
        ],
        capture_output=True, text=True, timeout=240, cwd=tmp,
    )  # fmt: skip
    keep_workdir(p.stdout, tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    return p, json.loads(summary.read_text())


def test_a_loss_logged_every_10_steps_and_a_barrier_every_100_leave_the_steps_scored(
    tmp_path: Path,
) -> None:
    p, obj = _run(tmp_path, "--steps", "300", "--log-every", "10", "--barrier-every", "100")
    out = p.stdout + p.stderr
    # 300 steps of one bucket and 33 of the script's own: windows of 20 collectives
    assert obj["ranks"] == 2 and obj["windows_scored"] >= 14, out
    assert "no window was scored" not in out, out


def test_collectives_in_no_pattern_say_so_at_the_end(tmp_path: Path) -> None:
    # 1,040 steps of two collectives: past the 2,048 after which the agent says so too
    p, obj = _run(tmp_path, "--steps", "1040", "--varying")
    out = p.stdout + p.stderr
    assert obj["windows_scored"] == 0 and obj["collectives_seen"], out
    assert "no window was scored although a ring holds" in out, out
    assert "--colls-per-step" in out, out
    warned = [
        r
        for r in json_records((tmp_path / "artemis-run" / "agent.log").read_text())
        if str(r.get("event", "")).startswith("no repeating step")
    ]
    assert len(warned) == 2 and all(r["collectives"] >= 2048 for r in warned), warned
