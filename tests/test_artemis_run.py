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
The scheduler does that at 40 too (rank 1 flagged at window 3 of a stall run, at a
quiet machine's start-up): every rank records its own CPU time and run delay per
step (tests/rank_truth.py), and a flag on a rank nothing was injected into has to be
borne out by that record, or the test fails.
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
from rank_truth import Truth, describe, flag_deadline, unexplained
from run_workdir import KEEP, keep_workdir

pytest.importorskip("torch")

BIN = Path(sys.executable).parent
JOB = Path(__file__).resolve().parent / "ddp_job.py"
WINDOW_STEPS = 40
STEPS = 595  # with the job's 5 start-up collectives, 600 collectives: whole windows
RANKS = 4
STALL_MS = 40.0


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
            "--truth",
            str(tmp / "truth"),
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
        str(STALL_MS),
        "--mark",
        str(mark),
        "--exit-code",
        "7",
    )
    assert code == 7, out  # COMMAND's exit code
    stall_window = json.loads(mark.read_text())["coll_seq"] // WINDOW_STEPS
    flags = _flagged(found)
    mine = [f for f in flags if (f["kind"], f["rank"]) == ("rank", 2)]
    assert mine, out
    # nothing else, but a rank the machine itself slowed (its own record says so)
    truth = Truth.load(tmp_path / "truth", RANKS)
    wrong = unexplained(flags, truth, 1, {2})
    assert not wrong, describe(wrong)
    first = mine[0]
    # within 2 windows, one more per window the machine slowed another rank as much
    last = flag_deadline(truth, stall_window, 2, WINDOW_STEPS, 2, STALL_MS)
    assert stall_window <= first["window"] <= last, (stall_window, last, first)
    assert first["cause"]["kind"] == "host", first["cause"]
    # an idle gap (the loader sleeps), told apart by the per-record CPU times
    cause = first["cause"]
    assert cause["text"].startswith("input stall: the process was idle"), cause
    ev = cause["evidence"]
    assert ev["gap_busy_pct"] <= 0.5 * ev["peers_gap_busy_pct"], ev
    # the live line and the summary were printed
    subjects = {(f["kind"], f["rank"]) for f in flags}
    assert "flagged rank 2" in out and f"summary: {len(subjects)} flagged" in out, out
    # incidents.jsonl next to the findings: one incident for rank 2 (others only for the
    # ranks borne out above), confirmed, closed at the job's end
    last = {r["id"]: r for r in map(json.loads, (tmp_path / "incidents.jsonl").open())}
    assert {r["rank"] for r in last.values()} <= {r for _k, r in subjects}, last
    (inc,) = [r for r in last.values() if r["rank"] == 2]
    assert inc["rank"] == 2 and inc["confirmed"] is not None, inc
    assert inc["verdict"] == "unresolved" and inc["closed"]["why"] == "job_end", inc["reason"]
    assert f"incident {inc['id']}: unresolved" in out and "check: input stall" in out, out
    # what was watched opens the summary; the incident's report is written and named
    assert "[artemis] watched 4 ranks on 1 host, " in out, out
    report = next(x for x in out.splitlines() if x.startswith("[artemis] report "))
    assert Path(report.split(" ", 2)[2]).is_file(), report


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_run_without_a_stall_flags_nothing(tmp_path: Path) -> None:
    code, out, found = _artemis_run(tmp_path)
    assert code == 0, out
    # nothing, but a rank the machine itself slowed (its own record says so)
    wrong = unexplained(_flagged(found), Truth.load(tmp_path / "truth", RANKS), 1, set())
    assert not wrong, describe(wrong)
    if not _flagged(found):
        assert "summary: nothing flagged" in out, out


def test_run_errors_are_clear(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "artemis"), "run", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )

    p = run("--", "no-such-command-xyz")
    assert p.returncode == 2 and "COMMAND not found: 'no-such-command-xyz'" in p.stderr
    p = run()
    assert p.returncode == 2 and "no COMMAND given" in p.stderr
    p = run("--rebalance", "maybe", "--", "true")
    assert p.returncode == 2 and "--rebalance: expected one of off, recommend, apply" in p.stderr
    p = run("--window-steps", "x", "--", "true")
    assert p.returncode == 2 and "window-steps" in p.stderr
    p = run("--", "sh", "-c", "exit 3")
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
        cwd=tmp_path,
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


def _summary_types(obj: dict[str, Any]) -> None:
    """--summary-json's keys and their types (docs/DESIGN.md, "Command line")."""
    types = {
        "job": str,
        "ranks": int,
        "hosts": list,
        "windows_scored": int,
        "collectives_seen": bool,
        "exit_code": int,
        "findings": list,
        "incidents": list,
    }
    assert set(obj) == set(types), obj
    for k, t in types.items():
        assert type(obj[k]) is t, (k, obj[k])
    assert all(isinstance(h, str) for h in obj["hosts"]), obj


def test_run_that_saw_no_collective_says_why_and_keeps_its_files(tmp_path: Path) -> None:
    """A job that runs no collective: the run says so and names the likely reasons, still
    exits with the job's code, and keeps its files under ./artemis-out/<job>/."""
    summary = tmp_path / "summary.json"
    p = subprocess.run(
        [
            str(BIN / "artemis"), "run", "--job", "quiet", "--summary-json", str(summary),
            "--", sys.executable, "-c", "import sys; sys.exit(5)",
        ],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    out = p.stdout + p.stderr
    assert p.returncode == 5, out
    assert "[artemis] watched 0 ranks on 0 hosts, 0 windows scored" in out, out
    assert "no collective seen from the job" in out, out
    assert "init_process_group('artemis')" in out and "NCCL" in out, out
    assert "summary: nothing flagged" in out, out
    home = tmp_path / "artemis-out" / "quiet"
    assert (home / "findings.jsonl").is_file(), out
    assert (home / "state" / "artemis.db").is_file(), sorted(map(str, home.rglob("*")))
    # named at the start and at the end of the run
    assert out.count(str(home / "findings.jsonl")) == 2, out
    assert out.count(str(home / "state")) == 2, out
    obj = json.loads(summary.read_text())
    _summary_types(obj)
    assert obj["job"] == "quiet" and obj["exit_code"] == 5 and obj["ranks"] == 0, obj
    assert obj["collectives_seen"] is False and obj["windows_scored"] == 0, obj


def test_run_with_jsonl_leaves_only_findings_and_incidents_beside_it(tmp_path: Path) -> None:
    """--jsonl f.jsonl once dropped artemis.db, f.assembly and f.assembly.jobs/ beside the
    user's file: the coordinator's state now goes under ./artemis-out/<job>/state/."""
    user = tmp_path / "user"
    user.mkdir()
    p = subprocess.run(
        [
            str(BIN / "artemis"), "run", "--job", "mine", "--jsonl", str(user / "f.jsonl"),
            "--", "sh", "-c", "exit 0",
        ],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert {x.name for x in user.iterdir()} <= {"f.jsonl", "incidents.jsonl"}, list(user.iterdir())
    state = tmp_path / "artemis-out" / "mine" / "state"
    assert (state / "artemis.db").is_file() and (state / "journal.assembly").exists(), out
    assert str(user / "incidents.jsonl") in out, out


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_run_of_a_job_shorter_than_a_window_says_so_without_waiting(tmp_path: Path) -> None:
    """16 steps and the job's 5 start-up collectives: 21 of a 50-step window. The run says
    so plainly, and does not wait for a job end the coordinator never sees."""
    summary = tmp_path / "summary.json"
    ended = tmp_path / "ended"  # the job's end, stamped by the shell that ran it
    p = subprocess.run(
        [
            str(BIN / "artemis"), "run", KEEP, "--summary-json", str(summary),
            "--window-steps", "50", "--", "sh", "-c",
            f'"$0" "$@"; rc=$?; date +%s.%N > {ended}; exit $rc',
            sys.executable, str(JOB), "--steps", "16",
        ],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )  # fmt: skip
    after_job_s = time.time() - float(ended.read_text())
    out = p.stdout + p.stderr
    keep_workdir(p.stdout, tmp_path)
    assert p.returncode == 0, out
    assert "ended before its first full window: 21 of 50 steps" in out, out
    assert "did not finish the job" not in out, out
    assert "no collective seen" not in out, out
    assert "[artemis] watched 4 ranks on 1 host, 0 windows scored" in out, out
    obj = json.loads(summary.read_text())
    _summary_types(obj)
    assert obj["ranks"] == 4 and len(obj["hosts"]) == 1 and obj["collectives_seen"], obj
    assert obj["windows_scored"] == 0 and obj["findings"] == [], obj
    # from the job's end to the run's: the summary and the daemons' stop, not the 30 s
    # the run once waited for a job end that never came
    assert after_job_s < 20, (after_job_s, out)
