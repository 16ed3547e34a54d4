"""The whole pipeline downstream of the GPUs, in-process: for tests and benchmarks.

The lockstep model (`model.LockstepModel`) produces each rank's collective
timings; they become ring records exactly as the plugin writes them (one DONE
record per collective, device clock, start = the rank's arrival, end = the
collective's end; see `sim/hostproc.py`); one agent `WindowSummarizer` per rank
turns them into `RankWindow` summaries; the rank's simulated telemetry
(`telemetry.telemetry_plan`, read back through the agent's own
`SimulatedSource.overlay` and `merge`) rides on each summary; the one shell
(coordinator/local.py `LocalShell`: the job table and its monitor, as the
coordinator daemon and `artemis.job.Detector` drive them) assembles and scores
every window, with no sink but the caller. No daemons and no wire, so
thousands of rank-windows take seconds. One island (no bridge records). With
`tp > 1` each rank is summarised on its data-parallel communicator, its TP
collectives fed in as the agent does (`WindowSummarizer.feed_nested`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from artemis.agent.summary import WindowSummarizer
from artemis.agent.telemetry.base import merge
from artemis.agent.telemetry.simulated import overlay
from artemis.coordinator.local import LocalShell
from artemis.coordinator.sinks import Sinks
from artemis.detect.detector import Detector, WindowResult
from artemis.detect.findings import RANK_KINDS
from artemis.detect.settings import Settings
from artemis.protocol.records import RankWindow
from artemis.ring.format import CLOCK_DEVICE_NS, KIND_COLL, REC_DEVICE, SLOT_DTYPE, STATE_DONE
from artemis.sim.model import TP_BYTES, CollSpec, LockstepModel
from artemis.sim.scenario import Scenario
from artemis.sim.telemetry import telemetry_plan

JOB = "inproc"
COMM = "00000000000000b1"
FUNC_CODES = {"AllReduce": 1, "AllGather": 2, "Broadcast": 4}
DTYPE_INT8, DTYPE_FLOAT32 = 1, 8
CHANNELS = 2


class RecordMaker:
    """Each rank's ring records for one window of the model, as the plugin writes them
    (`tp = True`: those of its tensor-parallel communicator)."""

    def __init__(self, model: LockstepModel, tp: bool = False) -> None:
        pattern = list(model.pattern)
        if model.multi:
            raise ValueError("the in-process pipeline models one island (no bridge records)")
        if tp:
            pattern = [CollSpec("AllReduce", b, 0.0, 0.0) for b in TP_BYTES]
        self.func = np.array([FUNC_CODES[p.func] for p in pattern], dtype=np.uint8)
        self.nbytes = np.array([p.bytes for p in pattern], dtype=np.uint64)
        self.dtype = np.array(
            [DTYPE_FLOAT32 if p.func == "AllReduce" else DTYPE_INT8 for p in pattern],
            dtype=np.uint8,
        )

    def window(self, arrive: np.ndarray, end: np.ndarray, first_step: int) -> np.ndarray:
        """(ranks, steps x K) records from arrive/end [S, R, K] (device ns per host clock)."""
        s, r, k = arrive.shape
        n = s * k
        recs = np.zeros((r, n), dtype=SLOT_DTYPE)
        seqs = np.arange(first_step * k, first_step * k + n, dtype=np.uint64)
        recs["kind"] = KIND_COLL
        recs["state"] = STATE_DONE
        recs["clock"] = REC_DEVICE
        recs["nchannels"] = CHANNELS
        recs["peer"] = -1
        recs["func"] = np.tile(self.func, s)[None, :]
        recs["dtype"] = np.tile(self.dtype, s)[None, :]
        recs["bytes"] = np.tile(self.nbytes, s)[None, :]
        recs["seq"] = seqs[None, :]
        recs["coll_seq"] = seqs[None, :]
        # the plugin keeps the earliest channel start and the latest channel end
        start = arrive.transpose(1, 0, 2).reshape(r, n).astype(np.uint64)
        recs["start"] = start
        recs["enqueue_ns"] = start
        recs["end"] = end.transpose(1, 0, 2).reshape(r, n).astype(np.uint64)
        return recs


def summarised(sc: Scenario, summ: Sequence[WindowSummarizer]) -> Iterator[tuple[int, RankWindow]]:
    """(rank, summary) for every window each rank's summariser `summ[rank]` emits, in the
    order it emits them (one island, no telemetry); the last window flushes them. The
    caller builds the summarisers, so it chooses their job, hosts and clock."""
    model = LockstepModel(sc)
    maker = RecordMaker(model)
    for w in range(sc.windows):
        wt = model.window(w)
        recs = maker.window(wt.arrive, wt.end, wt.steps.start)
        for r, s in enumerate(summ):
            s.feed(recs[r])
            for rw in s.take_windows(final=w == sc.windows - 1):
                yield r, rw


@dataclass
class RunResult:
    flag_window: dict[int, int] = field(default_factory=dict)  # slow rank -> first flag window
    cause: dict[int, dict[str, Any] | None] = field(default_factory=dict)  # at that flag
    finding: dict[int, Any] = field(default_factory=dict)  # the flagged finding
    false_flags: int = 0  # flagged reports on any subject other than the slow ranks
    false_by_kind: dict[str, int] = field(default_factory=dict)
    healthy_rank_windows: int = 0  # judged rank-windows of the other ranks
    first_flag: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, subject)


def summaries(sc: Scenario, *, telemetry: bool = True) -> list[list[RankWindow]]:
    """Every window's rank summaries (with their telemetry), as the agents send them:
    window by window, each window's rows in rank order."""
    model = LockstepModel(sc)
    maker = RecordMaker(model)
    tp_maker = RecordMaker(model, tp=True) if sc.tp > 1 else None
    plan = telemetry_plan(sc) if telemetry else None
    summ = [
        WindowSummarizer(
            JOB,
            COMM,
            r,
            sc.ranks,
            sc.host_name(sc.host_of(r)),
            sc.window_steps,
            clock_kind=CLOCK_DEVICE_NS,
        )
        for r in range(sc.ranks)
    ]
    out: list[list[RankWindow]] = [[] for _ in range(sc.windows)]
    for w in range(sc.windows):
        wt = model.window(w)
        recs = maker.window(wt.arrive, wt.end, wt.steps.start)
        last = w == sc.windows - 1
        if tp_maker is not None and wt.tp_arrive is not None and wt.tp_end is not None:
            # each rank's TP communicator, as the agent routes it to the rank's main ring
            tp_recs = tp_maker.window(wt.tp_arrive, wt.tp_end, wt.steps.start)
            for r, s in enumerate(summ):
                s.feed_nested(tp_recs[r])
        for r, s in enumerate(summ):
            s.feed(recs[r])
            for rw in s.take_windows(final=last):
                if plan is not None:
                    rw = dataclasses.replace(rw, telemetry=merge([overlay(plan[r], rw.window)]))
                out[rw.window].append(rw)
    return out


def run(
    sc: Scenario,
    slow_ranks: Collection[int] = (),
    settings: Settings | None = None,
    *,
    telemetry: bool = True,
) -> RunResult:
    """The scenario's windows through the one shell (`LocalShell`, as the coordinator and
    `artemis.job.Detector` drive it), with no sink but the caller: what the detector
    reported at each window is counted into a `RunResult`."""
    windows = summaries(sc, telemetry=telemetry)
    # `Detector` read at call time: a test may put its own class here (a tap).
    shell = LocalShell(JOB, COMM, sc.ranks, settings or Settings(), Sinks(), detector=Detector)
    out = RunResult()
    slow = set(slow_ranks)

    def count(res: WindowResult) -> None:
        # The detector's own reports, as before the shell: the monitor's additions
        # (missing ranks, baselines) are not the rank rule's figures.
        w = res.window
        if w >= 1:
            out.healthy_rank_windows += sc.ranks - len(res.missing) - len(slow)
        for f in res.findings:
            if f.state != "flagged":
                continue
            subject = str(f.rank) if f.rank is not None else str(f.island)
            out.first_flag.setdefault((f.kind, subject), w)
            if f.kind in RANK_KINDS and f.rank in slow:
                if f.rank not in out.flag_window:
                    out.flag_window[f.rank] = w
                    out.cause[f.rank] = f.cause
                    out.finding[f.rank] = f
            else:
                out.false_flags += 1
                out.false_by_kind[f.kind] = out.false_by_kind.get(f.kind, 0) + 1

    # Simulated time: one second a window, so no window waits for its deadline.
    for w in range(sc.windows):
        for mo in shell.add(windows[w], now=float(w)):
            if mo.result is not None:
                count(mo.result)
    for mo in shell.expire(now=float(sc.windows) + shell.assembler.deadline_s):
        if mo.result is not None:
            count(mo.result)
    shell.close()
    return out
