"""`artemis run` end to end: a real 4-rank DDP job (gloo through the ``artemis`` backend)
under a real coordinator and agent on loopback, started by the CLI as a user would.

The job is tests/ddp_job.py. In the stall run, rank 2's data loader sleeps 40 ms
per step from step 275 on (collective 280: the start of window 7) (an input stall).
The job writes where the stall started in collective numbering (``--mark``), so the
window it starts in is known exactly. The detector runs at its default settings:
four ranks share this machine's two cores with whatever else runs, so which rank
the scheduler delays in a window is luck, and how much changes with the load; the
adaptive rule measures that noise as the run goes (detect/DETECTOR.md, "The
combined test": the job's live noise) and judges the stall against it. Windows are
40 steps (about 0.2 s): at 20 (0.1 s) a clean run once had rank 3 flagged for half a
second of real CPU contention at its start (its gap 1.24x its peers' in 5 windows).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from run_workdir import KEEP, keep_workdir

pytest.importorskip("torch")

BIN = Path(sys.executable).parent
JOB = Path(__file__).resolve().parent / "ddp_job.py"
WINDOW_STEPS = 40
STEPS = 595  # with the job's 5 start-up collectives, 600 collectives: whole windows


def _artemis_run(
    tmp: Path, *job_args: str, timeout: float = 240.0
) -> tuple[int, str, list[dict[str, Any]]]:
    jsonl = tmp / "findings.jsonl"
    p = subprocess.run(
        [
            str(BIN / "artemis"),
            "run",
            KEEP,
            "--jsonl",
            str(jsonl),
            "--window-steps",
            str(WINDOW_STEPS),
            "--",
            sys.executable,
            str(JOB),
            "--steps",
            str(STEPS),
            *job_args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp,
    )
    found = [json.loads(x) for x in jsonl.read_text().splitlines()] if jsonl.exists() else []
    keep_workdir(p.stdout, tmp)
    return p.returncode, p.stdout + p.stderr, found


def _flagged(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in found if f["state"] == "flagged"]


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_run_flags_a_stalled_data_loader(tmp_path: Path) -> None:
    mark = tmp_path / "stall.json"
    code, out, found = _artemis_run(
        tmp_path,
        "--stall-rank",
        "2",
        "--stall-from",
        "275",
        "--stall-ms",
        "40",
        "--mark",
        str(mark),
        "--exit-code",
        "7",
    )
    assert code == 7, out  # COMMAND's exit code
    stall_window = json.loads(mark.read_text())["coll_seq"] // WINDOW_STEPS
    flags = _flagged(found)
    assert flags, out
    assert {(f["kind"], f["rank"]) for f in flags} == {("rank", 2)}, flags  # nothing else
    first = flags[0]
    assert stall_window <= first["window"] <= stall_window + 2, (stall_window, first)
    assert first["cause"]["kind"] == "host", first["cause"]
    # an idle gap (the loader sleeps), told apart by the per-record CPU times
    cause = first["cause"]
    assert cause["text"].startswith("input stall: the process was idle"), cause
    ev = cause["evidence"]
    assert ev["gap_busy_pct"] <= 0.5 * ev["peers_gap_busy_pct"], ev
    # the live line and the summary were printed
    assert "flagged rank 2" in out and "summary: 1 flagged" in out, out
    # incidents.jsonl next to the findings: one incident, confirmed, closed at the job's end
    last = {r["id"]: r for r in map(json.loads, (tmp_path / "incidents.jsonl").open())}
    (inc,) = last.values()
    assert inc["rank"] == 2 and inc["confirmed"] is not None, inc
    assert inc["verdict"] == "unresolved" and inc["closed"]["why"] == "job_end", inc["reason"]
    assert f"incident {inc['id']}: unresolved" in out and "check: input stall" in out, out


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_run_without_a_stall_flags_nothing(tmp_path: Path) -> None:
    code, out, found = _artemis_run(tmp_path)
    assert code == 0, out
    assert found == [] or not _flagged(found), _flagged(found)
    assert "summary: nothing flagged" in out, out


def test_run_errors_are_clear(tmp_path: Path) -> None:
    art = str(BIN / "artemis")
    p = subprocess.run(
        [art, "run", "--", "no-such-command-xyz"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2 and "COMMAND not found: 'no-such-command-xyz'" in p.stderr
    p = subprocess.run([art, "run"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no COMMAND given" in p.stderr
    p = subprocess.run(
        [art, "run", "--rebalance", "maybe", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "--rebalance: expected one of off, recommend, apply" in p.stderr
    p = subprocess.run(
        [art, "run", "--window-steps", "x", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "window-steps" in p.stderr
    p = subprocess.run(
        [art, "run", "--", "sh", "-c", "exit 3"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 3, p.stdout + p.stderr


def test_run_ctrl_c_reaches_the_job_first(tmp_path: Path) -> None:
    """SIGINT to the foreground group (what a terminal's Ctrl-C sends) ends the job, whose
    handler runs and whose exit code comes back; the run then still prints its summary."""
    script = tmp_path / "job.py"
    script.write_text(
        "import signal, sys, time\n"
        "def h(*_):\n"
        "    print('job got SIGINT', flush=True); sys.exit(42)\n"
        "signal.signal(signal.SIGINT, h)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    p = subprocess.Popen(
        [str(BIN / "artemis"), "run", "--", sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: the test plays the terminal
    )
    assert p.stdout is not None
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        lines.append(line)
        if line.strip() == "ready":
            break
    else:
        p.kill()
        pytest.fail("".join(lines))
    os.killpg(p.pid, signal.SIGINT)
    rest, _ = p.communicate(timeout=60)
    out = "".join(lines) + rest
    assert p.returncode == 42, out
    assert "job got SIGINT" in out and "summary: nothing flagged" in out, out
