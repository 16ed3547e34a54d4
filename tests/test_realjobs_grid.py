"""The real-job grid (bench/realjobs): its arithmetic on recorded and built records,
and one real cell end to end (a SIGSTOP duty cycle on the GPT job's rank 2)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from bench.realjobs import grid
from bench.realjobs.judge import (
    Expected,
    binom_cdf,
    colls_per_step,
    judge,
    onset_step,
    onset_window,
    slowdown,
    upper_bound,
    window_step_ms,
)

RECORDED = Path(__file__).parent / "data" / "realjobs"
HOST_RANK2 = Expected("rank", (2,), "host")


def line(kind: str, rank: int, window: int, state: str, cause: str = "host") -> dict[str, Any]:
    """A findings line, as the grid reads it."""
    return {"kind": kind, "rank": rank, "window": window, "state": state, "cause": {"kind": cause}}


def _trace(step_ms: list[float], colls: int = 2, first: int = 4) -> dict[str, Any]:
    """A rank's trace: ``first`` start-up collectives, then ``colls`` per step."""
    t, seqs, times = 0, [], []
    for i, ms in enumerate([*step_ms, 0.0]):
        seqs.append(first + colls * i)
        times.append(t)
        t += int(ms * 1e6)
    return {"coll_seq": seqs, "t_ns": times}


def test_onset_is_the_first_whole_window_under_the_fault() -> None:
    wc = 50
    assert onset_window(500, wc) == 10  # the fault starts with window 10
    assert onset_window(501, wc) == 11  # window 10 is only partly under it
    assert onset_window(549, wc) == 11


def test_slowdown_is_the_faulted_windows_against_the_same_runs_earlier_windows() -> None:
    ws, base, slow = 25, 40.0, 52.0
    fault_step = 10 * ws + ws // 2
    tr = _trace([base] * fault_step + [slow] * (8 * ws + 5))
    wc = ws * colls_per_step(tr["coll_seq"])
    assert wc == 50
    onset_seq = tr["coll_seq"][fault_step]
    per = window_step_ms(tr["coll_seq"], tr["t_ns"], wc)
    # the window the fault began in mixes both, the trace's cut-short last one is gone
    first = onset_seq // wc
    assert base < per[first] < slow
    assert max(per) < (tr["coll_seq"][-1]) // wc
    assert math.isclose(slowdown(per, onset_seq, wc) or 0, slow / base - 1, rel_tol=1e-9)
    # no window before the fault (past warm-up): nothing to compare with
    assert slowdown(per, 2 * wc, wc) is None


def test_a_healthy_run_reads_the_slowdowns_own_noise_from_the_fault_cells_onset() -> None:
    """A healthy run has no onset; judged from the step a fault cell's would be, its
    `aa_slowdown` is what the arithmetic reads with no fault (here the host's drift
    of 4 ms a step), and the goals name that blur."""
    ws = 25
    step = onset_step(10, ws)
    assert step == 10 * ws + ws // 2
    tr = _trace([40.0] * step + [44.0] * (8 * ws + 5))
    summary = {"windows_scored": 19, "ranks": 4, "findings": []}
    got = judge(tr, ws, None, [], summary, None, healthy_from=step)
    assert math.isclose(got["aa_slowdown"], 0.1, rel_tol=1e-9)
    assert "aa_slowdown" not in judge(tr, ws, None, [], summary, None)
    rec = {"cell": {"workload": "gpt", "mechanism": "none", "size": 0.0}, "load": [1.0, 1.0]}
    lines = grid.goal_lines([rec | got, rec | got | {"aa_slowdown": -0.02}])
    assert any(
        "healthy runs" in x and "[-2.0, +10.0] over 2 runs, 1 at 10% or more" in x for x in lines
    ), lines


def test_windows_to_flag_and_the_cause_in_the_line_and_the_summary() -> None:
    ws = 25
    fault_step = 10 * ws + ws // 2
    tr = _trace([40.0] * fault_step + [60.0] * (8 * ws))
    onset = {"coll_seq": tr["coll_seq"][fault_step], "t_ns": tr["t_ns"][fault_step]}
    start = onset_window(onset["coll_seq"], 50)

    lines = [
        line("rank", 1, 3, "flagged", "unknown"),  # before the fault, another rank: false
        line("rank", 2, 5, "flagged", "host"),  # the subject, before the fault: false
        line("rank", 2, start, "suspect", "host"),
        line("rank", 2, start + 2, "flagged", "host"),
    ]
    summary = {
        "ranks": 4,
        "windows_scored": 20,
        "findings": [line("rank", 2, 19, "ongoing", "unknown")],
    }
    got = judge(tr, ws, onset, lines, summary, HOST_RANK2, {3: 3.5})
    # as the simulator's bench counts: the onset window is 1
    assert got["windows_to_flag"] == 3 and got["seconds_to_flag"] == 3.5
    assert got["cause_right_flag"] and not got["cause_right_summary"]  # the summary said unknown
    assert not grid.cause_ok(got)
    assert got["false_flags"] == 2
    # every rank's 20 windows, less rank 2's from the window the fault began in
    assert got["healthy_rank_windows"] == 4 * 20 - (20 - start + 1)
    # a healthy run: every flag is false, every rank-window healthy
    healthy = judge(tr, ws, None, lines, summary, None)
    assert healthy["false_flags"] == 3 and healthy["healthy_rank_windows"] == 80


def test_a_two_rank_jobs_degraded_line_names_the_rank() -> None:
    """A 2-rank job has no peer group (min_island_peers 3): its slowed rank is judged
    against its own history, kind `degraded`. That line names the faulted rank, as a
    `rank` line would; the other rank's flag, or the link's, is still false."""
    ws = 25
    fault_step = 10 * ws + ws // 2
    tr = _trace([40.0] * fault_step + [70.0] * (8 * ws))
    onset = {"coll_seq": tr["coll_seq"][fault_step], "t_ns": tr["t_ns"][fault_step]}
    start = onset_window(onset["coll_seq"], 50)
    exp = Expected("rank", (1,), "host")

    lines = [
        line("degraded", 1, start, "suspect"),
        line("degraded", 1, start + 1, "flagged"),
        line("degraded", 0, start + 1, "flagged"),
        line("link", 1, start + 1, "flagged"),
    ]
    summary = {"ranks": 2, "windows_scored": 20, "findings": [line("degraded", 1, 19, "ongoing")]}
    got = judge(tr, ws, onset, lines, summary, exp)
    assert got["windows_to_flag"] == 2 and got["flag_cause"] == "host"
    assert got["cause_right_flag"] and got["cause_right_summary"]
    assert sorted(got["false_flag_subjects"]) == [
        f"degraded 0 w{start + 1}",
        f"link 1 w{start + 1}",
    ]


def test_pinned_ranks_share_a_cpu_in_blocks_and_the_hog_expects_its_cpus_ranks() -> None:
    """Consecutive ranks share a CPU (not rank mod CPUs: that pairing made 13 false
    flags in 20 hog runs before the fault); the hog's answer is every rank on
    the hogged rank's CPU, the rank itself among them."""
    from bench.realjobs.faults import ranks_on_cpu
    from bench.realjobs.runner import Cell
    from bench.realjobs.workloads import pinned_cpu

    n = len(os.sched_getaffinity(0))
    for world in (2, 4, 8):
        cpus = [pinned_cpu(r, world) for r in range(world)]
        assert cpus == sorted(cpus)  # blocks: never back to an earlier CPU
        assert len(set(cpus)) == min(n, world)
    cell = Cell("gpt", "hog", 0.3, rank=2, world=4)
    exp = cell.expected()
    assert exp is not None and 2 in exp.ranks
    assert list(exp.ranks) == ranks_on_cpu(pinned_cpu(2, 4), 4)
    if n == 2:
        assert exp.ranks == (2, 3)


def test_upper_bound_is_clopper_pearsons() -> None:
    for n in (10, 300, 2000):
        # no event: the bound solves (1 - p)^n = 0.05 (about 3/n, the rule of three)
        assert math.isclose(upper_bound(0, n), 1 - 0.05 ** (1 / n), rel_tol=1e-6)
    for k, n in ((1, 50), (3, 2000), (7, 40)):
        ub = upper_bound(k, n)
        assert k / n < ub < 1
        assert math.isclose(binom_cdf(k, n, ub), 0.05, rel_tol=1e-4)
    assert upper_bound(5, 5) == 1.0
    with pytest.raises(ValueError, match="n=0"):
        upper_bound(0, 0)


def test_recorded_runs_are_judged_and_tabled() -> None:
    """Runs recorded by ``python -m bench.realjobs`` (tests/data/realjobs): judged again
    from their trace, findings and summary, they give what the grid recorded."""
    runs = sorted(p for p in RECORDED.iterdir() if p.is_dir())
    assert runs
    records = []
    for d in runs:
        rec = json.loads((d / "record.json").read_text())
        exp = Expected(**rec["expected"]) if rec["expected"] else None
        lines = [json.loads(x) for x in (d / "findings.jsonl").read_text().splitlines()]
        got = judge(
            json.loads((d / "trace0.json").read_text()),
            rec["cell"]["window_steps"],
            json.loads((d / "onset.json").read_text()) if exp else None,
            lines,
            json.loads((d / "summary.json").read_text()),
            exp,
        )
        keys = ("slowdown", "windows_to_flag", "flag_cause", "cause_right_summary", "false_flags")
        for key in (*keys, "healthy_rank_windows"):
            assert got.get(key) == rec.get(key), (d.name, key)
        records.append(rec)
        if d.name == "gpt-hog-1":
            # both ranks on the hogged CPU flagged; cleared before the end, so the
            # summary's line has no cause: not right there
            assert got["expected_flagged"] == [0, 2] and got["summary_state"] == "cleared"
            assert got["cause_right_flag"] and not got["cause_right_summary"]
        if d.name == "conv-none":  # a healthy run: its one flag is false
            assert (
                got["false_flags"] == 1 and got["healthy_rank_windows"] == 4 * got["windows_scored"]
            )
    rows = grid.cell_rows(records)
    assert len(rows) == 2 + len(
        {(r["cell"]["workload"], r["cell"]["mechanism"], r["cell"]["size"]) for r in records}
    )
    assert any("false flags" in x for x in grid.goal_lines(records))


@pytest.mark.slow
@pytest.mark.realjobs
def test_sigstop_duty_cycle_on_the_gpt_job_flags_the_rank_as_host(tmp_path: Path) -> None:
    """One real cell: rank 2 of the 4-rank GPT job SIGSTOPped 40 ms of every 100 ms
    from mid-window 10, under ``artemis run``. The issue's goals hold at a load average
    of 4 or less; above it (on this shared 2-core machine, 9-35 while this was
    written) the other tenants' load moves the job's step time by more than the fault
    does, and the grid measured this cell flagged in 1 of 3 runs at load 11-35."""
    pytest.importorskip("torch")
    if os.getloadavg()[0] > 4:
        pytest.skip(
            f"load average {os.getloadavg()[0]:.1f} > 4: the issue's goals are for a quiet machine"
        )
    from bench.realjobs.runner import Cell, run

    rec = run(Cell("gpt", "sigstop", 40.0), tmp_path, f"e2e-{os.getpid()}")
    assert "error" not in rec, rec.get("error")
    assert rec["flag_window"] is not None, rec
    assert rec["expected_flagged"] == [2], rec
    assert rec["flag_cause"] == "host" and rec["cause_right_summary"], rec
    assert rec["false_flags"] == 0, rec


def test_rescore_replays_a_kept_journal_through_todays_detector(tmp_path: Path) -> None:
    """`bench.realjobs rescore`: a kept run (its journal, trace and onset, written here
    as the grid writes them) is scored again offline and judged like a live run: the
    rank slow from the fault's window is flagged at the 3-of-4 rule's fastest (no
    telemetry: the cause is not asked), and no healthy rank is flagged."""
    import dataclasses

    from artemis.coordinator.journal import AssemblyJournal
    from test_detector_support import make_window

    from bench.realjobs.rescore import rescore

    ws, colls, fault_w = 25, 2, 8
    journal = AssemblyJournal(tmp_path / "journal.assembly")
    journal.open([])
    for w in range(14):
        gaps = [20.0, 20.4, 19.8, 20.2]
        if w >= fault_w:
            gaps[2] = 30.0  # rank 2 50% slower from the fault's window on
        rows = make_window(w, gaps, job="rj")
        journal.added([dataclasses.replace(r, step_lo=w * ws, step_hi=(w + 1) * ws) for r in rows])
    journal.close()
    steps = [40.0] * (fault_w * ws) + [50.0] * (6 * ws)
    (tmp_path / "trace0.json").write_text(json.dumps(_trace(steps, colls, first=0)))
    onset = {"step": fault_w * ws, "coll_seq": fault_w * ws * colls, "t_ns": 0}
    (tmp_path / "onset.json").write_text(json.dumps(onset))
    rec = {
        "tag": "t",
        "kept": str(tmp_path),
        "cell": {"mechanism": "sigstop", "world": 4, "window_steps": ws},
        "expected": {"kind": "rank", "ranks": [2], "cause": None},
        "windows_scored": 14,
        "ranks": 4,
    }
    got = rescore(rec)
    assert got is not None
    assert got["onset_window"] == fault_w
    assert got["flag_window"] == fault_w + 2 and got["windows_to_flag"] == 3
    assert got["false_flags"] == 0, got["false_flag_subjects"]
    assert rescore(rec | {"kept": str(tmp_path / "none")}) is None  # no journal kept


def test_a_pair_slowed_together_at_the_start_meets_a_widened_noise_gate() -> None:
    """A kept run (the hog cell, ranks pinned rank mod 2 as the grid then did): ranks 0
    and 2, sharing a CPU, ran 17% over their peers in windows 1-3, before any fault,
    and the live run flagged rank 0 at window 3 against a noise gate measured on the
    8 values of two windows (1.05). Replayed with the gate widened for so few values
    (rank_history.LiveNoise.now, tuning.NOISE_SMALL) it is not flagged, and the hogged
    ranks are still flagged by the fault's first whole window, the episode's cause
    `host`."""
    from bench.realjobs.rescore import rescore

    d = RECORDED / "gpt-hog-pair-start"
    rec = json.loads((d / "record.json").read_text()) | {"kept": str(d)}
    assert rec["false_flag_subjects"] == ["rank 0 w3"]  # as it ran live
    got = rescore(rec)
    assert got is not None
    assert got["false_flags"] == 0, got["false_flag_subjects"]
    # flagged by the fault's first whole window (it began mid-window, in the one before)
    assert got["onset_window"] - 1 <= got["flag_window"] <= got["onset_window"]
    # (flagged in the window the hog began in, half of it under the hog, the flag
    # line's host figures explain less than half: `unknown`; the episode's, `host`)
    assert got["cause_right_summary"]


def test_recurring_stops_are_judged_in_their_own_statistics_noise() -> None:
    """A kept run: rank 2 of the GPT job SIGSTOPped 35 ms of every 100 ms (+39%).
    The stall test judges each rank's trimmed mean gap; live, it asked that to pass
    the live noise of the median gap, a noisier statistic, and the rank was flagged 5
    windows after onset. Judged in the trimmed mean's own live noise
    (rank_history.LiveNoise, `live_mean`), it is flagged within 2, cause `host`,
    nothing else flagged."""
    from bench.realjobs.rescore import rescore

    d = RECORDED / "gpt-sigstop-35-stalls"
    rec = json.loads((d / "record.json").read_text()) | {"kept": str(d)}
    assert rec["windows_to_flag"] == 5  # as it ran live
    got = rescore(rec)
    assert got is not None
    assert got["windows_to_flag"] is not None and got["windows_to_flag"] <= 2, got
    assert got["cause_right_flag"] and got["cause_right_summary"]
    assert got["false_flags"] == 0, got["false_flag_subjects"]


def test_the_net_fault_limits_its_own_namespaces_loopback_and_leaves_nothing() -> None:
    """The `net` cell's fault (bench/realjobs/faults.py `NetRate`): a token bucket on
    the loopback of the job's own network namespace, the host's untouched; undone."""
    import shutil
    import subprocess

    from netns_harness import unavailable

    from bench.realjobs import faults
    from bench.realjobs.judge import Expected
    from bench.realjobs.runner import Cell

    assert Cell("gpt", "net", 900.0).expected() == Expected("collective")
    why = unavailable() or (None if shutil.which("tc") else "no tc (iproute2)")
    if why is not None:
        pytest.skip(f"namespace test skipped: {why}")

    def qdiscs(*ns: str) -> str:
        pre = ["ip", "netns", "exec", *ns] if ns else []
        cmd = [*pre, "tc", "qdisc", "show", "dev", "lo"]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

    name = f"rjtest{os.getpid()}"
    ns = faults.NetNamespace(name)
    try:
        rate = faults.NetRate(name, 900.0)
        rate.start()
        assert "tbf" in qdiscs(name) and "rate 900Mbit" in qdiscs(name), qdiscs(name)
        assert "tbf" not in qdiscs()  # the host's loopback is not the job's
        rate.stop()
        assert "tbf" not in qdiscs(name)
    finally:
        ns.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in listed
