"""The one shell: the job table's rules (detect/jobs.py), the sinks' one order
(coordinator/sinks.py), the in-process shell (coordinator/local.py), and the
in-process detector's rank-to-rank channel on the protocol's codec."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from artemis.coordinator.local import LocalShell
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.sinks import FindingsWriter, IncidentsWriter, MemorySink, Sinks, StateFiles
from artemis.detect.assembly import AssembledWindow, WindowAssembler
from artemis.detect.jobs import BASELINE_RETRY_S, JobTable
from artemis.detect.monitor import Intent
from artemis.detect.settings import Settings
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.columns import WindowColumns
from artemis.protocol.messages import Windows
from artemis.protocol.records import RankProgress, RankWindow
from artemis.rebalance.outputs import PlansWriter
from service_records import rank_window

JOB = "j"


def rw(rank: int, window: int, comm: str = "c0", **kw: Any) -> RankWindow:
    return dataclasses.replace(rank_window(JOB, rank, window, **kw), comm=comm)


def table(**kw: Any) -> JobTable:
    return JobTable(Settings(), WindowAssembler(deadline_s=5.0, grace_s=0.0), **kw)


def aw(run: str, window: int = 0) -> AssembledWindow:
    return AssembledWindow(JOB, run, window, WindowColumns.from_records([]), [], True)


def test_a_window_of_a_new_run_is_told_from_a_stale_one() -> None:
    t = table()
    t.monitor(JOB)  # at the job's first hello: no run yet
    t.assembler.add([rw(0, 0, "c0")], 0.0)
    assert t.run_of(aw("c0")) == "current"  # the monitor made at the hello takes the run
    assert t.monitors[JOB].run == "c0"
    assert t.run_of(aw("old")) == "stale"  # not the assembler's run of the job
    t.assembler.add([rw(0, 0, "c1")], 1.0)  # window 0 again: a rerun
    assert t.run_of(aw("c1")) == "new"
    old = t.monitors[JOB]
    old.hosts[0] = "h0"
    t.forget(JOB, keep_assembly=True)
    fresh = t.new_run(JOB, "c1", old)
    assert fresh is not old and fresh.run == "c1" and fresh.hosts == {0: "h0"}


def test_a_job_ends_once_every_rank_finished_for_the_linger() -> None:
    t = table(job_linger_s=10.0)
    m = t.monitor(JOB)
    t.assembler.expect(JOB, [0, 1])
    m.last_window = 3
    prog = [
        RankProgress(
            job=JOB,
            comm="c",
            rank=r,
            host="h",
            last_done=5,
            inflight=None,
            inflight_s=0.0,
            idle_s=0.0,
            finished=True,
        )
        for r in (0, 1)
    ]
    t.on_progress("a", prog[:1])
    assert not t.ended(JOB, 0.0)  # rank 1 not finished
    t.on_progress("a", prog[1:])
    assert not t.ended(JOB, 1.0) and not t.ended(JOB, 10.9)
    assert t.ended(JOB, 11.0)


def test_a_reconnecting_agent_gets_the_last_plan_control_again() -> None:
    t = table()
    assert t.connect("a1", "h", [(JOB, 0)]) == []
    t.controls(JOB, [Intent("dump", {"x": 1}), Intent("plan", {"job": JOB, "plan": 1})])
    assert t.connect("a2", "h2", [(JOB, 1)]) == [("a2", "plan", {"job": JOB, "plan": 1})]
    assert t.agents[JOB] == {"a1", "a2"}


def test_a_failed_baseline_read_waits_before_it_is_tried_again() -> None:
    t = table(baselines=True)
    assert t.baseline_due(JOB, 0.0)
    t.baseline_failed(JOB, 0.0)
    assert not t.baseline_due(JOB, BASELINE_RETRY_S - 1)
    assert t.baseline_due(JOB, BASELINE_RETRY_S)
    assert not table().baseline_due(JOB, 0.0)  # no store: never


def test_a_saved_state_never_says_an_unscored_window_was_scored() -> None:
    t = table()
    t.assembler.expect(JOB, [0])
    released = t.assembler.add([rw(0, w, "c0") for w in (0, 1)], 0.0)
    assert [a.window for a in released] == [0, 1]
    t.monitor(JOB, "c0")
    t.unscored = {(JOB, "c0", 1)}
    st = t.state(JOB)
    assert st is not None and [it[1] for it in st["assembly"]["released"]] == [0]
    assert st["assembly"]["front"] == 0


def test_an_intent_newer_than_the_saved_state_was_interrupted() -> None:
    t = table()
    states = [{"job": JOB, "out_seq": 4}, {"job": "other", "out_seq": 9}]
    assert not t.interrupted(JOB, 4, states) and t.out_seq == 9
    assert t.interrupted(JOB, 5, states) and t.begin() == 10
    assert not t.interrupted("", 0, [])


def test_the_sinks_write_in_one_order(tmp_path: Path) -> None:
    s = Sinks(
        findings=FindingsWriter(tmp_path / "f.jsonl"),
        incidents=IncidentsWriter(tmp_path / "i.jsonl"),
        plans=PlansWriter(tmp_path / "p.jsonl"),
        metrics=Metrics(),
        memory=MemorySink(),
        state=StateFiles(),
    )
    order = [type(x).__name__ for x in s.sinks]
    assert order == [
        "FindingsSink",
        "IncidentsSink",
        "PlansSink",
        "MetricsSink",
        "StoreOutputs",
        "MemorySink",
        "StateFiles",
    ]
    assert s.files() == [tmp_path / "f.jsonl", tmp_path / "p.jsonl", tmp_path / "i.jsonl"]
    s.close()


def test_the_state_is_committed_with_the_outputs(tmp_path: Path) -> None:
    st = StateFiles(tmp_path / "jobs")
    s = Sinks(state=st)
    s.commit(JOB, None)  # nothing to keep
    assert not (tmp_path / "jobs").exists()
    s.commit(JOB, {"job": JOB, "out_seq": 1})
    ((_path, back),) = st.load()
    assert back == {"job": JOB, "out_seq": 1} and not st.health.failing


def test_the_local_shell_scores_a_job_and_writes_it(tmp_path: Path) -> None:
    mem = MemorySink()
    sinks = Sinks(findings=FindingsWriter(tmp_path / "f.jsonl"), memory=mem)
    shell = LocalShell(JOB, "inproc", 4, Settings(), sinks, deadline_s=5.0)
    outs = []
    for w in range(12):
        gaps = [100.0, 100.0, 100.0, 160.0 if w >= 2 else 100.0]
        rows = [
            rw(r, w, "inproc", gap_ms=g, step_ms=200.0, collectives=40) for r, g in enumerate(gaps)
        ]
        outs += shell.add(rows[:3], float(w))
        assert len(outs) == w  # incomplete until its last rank
        outs += shell.add(rows[3:], float(w))
    shell.close()
    assert shell.last_window == 11 and len(outs) == 12
    flagged = [f for f in mem.findings if f.state == "flagged" and f.kind == "rank"]
    assert [f.rank for f in flagged] == [3]
    lines = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert len(lines) == len(mem.findings)


def test_the_shell_scores_with_the_detector_class_it_is_given() -> None:
    """A tap on the detector (the simulator's tests use one) sees every window the
    shell scores, and the simulator's in-process path is this shell."""
    from artemis.detect.detector import Detector
    from artemis.sim import inproc

    seen: list[int] = []

    class Tap(Detector):
        def score_window(self, window: int, ranks: Any, missing: Any = ()) -> Any:
            seen.append(window)
            return super().score_window(window, ranks, missing)

    shell = LocalShell(JOB, "inproc", 2, Settings(), Sinks(), detector=Tap)
    for w in range(3):
        shell.add([rw(r, w, "inproc") for r in range(2)], float(w))
    shell.close()
    assert seen == [0, 1, 2]
    assert isinstance(shell.monitor.detector, Tap)
    assert inproc.LocalShell is LocalShell


def test_the_rank_channel_is_the_protocols_windows_message() -> None:
    rows = [rw(r, 0, "inproc") for r in range(3)]
    frame = encode(Windows(host="h", windows=rows), seq=1)
    dec = FrameDecoder()
    (msg,) = dec.feed(frame[:5]) + dec.feed(frame[5:])
    assert isinstance(msg, Windows) and list(msg.windows) == rows


def test_an_in_process_rank_takes_its_island_from_the_backends_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No simulated source in the detector: the island the backend composes by is the
    rank's vendor (what the agent's simulated source read back from the backend's file)."""
    pytest.importorskip("torch")
    from artemis.job.detector import _island

    monkeypatch.setenv("ARTEMIS_ISLANDS", "nvidia,nvidia,amd,amd")
    assert [_island(r) for r in range(4)] == ["nvidia", "nvidia", "amd", "amd"]
    monkeypatch.delenv("ARTEMIS_ISLANDS")
    assert _island(0) is None
