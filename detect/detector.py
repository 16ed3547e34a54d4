"""The detector: a pure state machine fed one assembled window at a time.

`Detector.score_window` takes the window summaries of one (job, window) as
columns (`WindowColumns`: one array per field) and returns every finding
report for that window. It holds baselines and persistence state between
windows and nothing else: no clock, no I/O, so the daemon, the simulator and
the in-process detector all drive the same code. Per-rank work is numpy over
the columns; Python runs per finding, never per rank. DETECTOR.md describes
the rules; the comments here say why the code does what it does.

This module composes the rooms of one job's scoring and keeps its state:
    view.py          the window's columns as usable rows (`Roster`, `View`)
    rank_rule.py     every rank's verdict; rank and degraded findings
    rank_history.py  each rank's warm-up baseline and the noise model
    scalars.py       island, collective and link findings
    lifecycle.py     suspect -> flagged -> ongoing -> cleared, and its cost
    late.py          what a window with ranks missing keeps for them
    tuning.py        the tuned constants
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from artemis.detect.arrays import I64, objects
from artemis.detect.findings import KINDS
from artemis.detect.late import LateRef, order_sample
from artemis.detect.lifecycle import Ledger
from artemis.detect.rank_history import RankHistory
from artemis.detect.rank_rule import RankRule, weighted
from artemis.detect.results import LateResult, WindowResult
from artemis.detect.scalars import ScalarBaseline, ScalarRule
from artemis.detect.settings import Settings
from artemis.detect.state import DetectorState, plain, read
from artemis.detect.tuning import LATE_PEERS, LATE_WINDOWS
from artemis.detect.view import Ctx, Roster, View, context
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import RankWindow

# The names other modules and tests import from here.
__all__ = ["LATE_PEERS", "LATE_WINDOWS", "Detector", "LateResult", "WindowResult"]


class Detector:
    """Scores windows of one job; see DETECTOR.md for the rules."""

    def __init__(
        self,
        settings: Settings,
        job: str,
        nranks: int,
        hosts: Mapping[int, str] | None = None,
        *,
        islands: Mapping[int, str] | None = None,
        classes: Mapping[int, str] | None = None,
        island_order: Sequence[str] | None = None,
    ) -> None:
        if nranks < 1:
            raise ValueError(f"nranks must be at least 1, got {nranks}")
        self.settings = settings
        self.job = job
        self.nranks = 0
        self.roster = Roster(islands, classes, island_order)
        self.history = RankHistory(settings.warmup_windows)
        self.ledger = Ledger()
        self.ranks = RankRule(job, self.history, self.ledger, self.roster)
        self.scalars = ScalarRule(job, self.ledger, self.roster)
        self.resize(nranks)
        self.roster.configure(hosts)
        self._late: dict[int, LateRef] = {}  # window -> its peers, for late summaries
        self._last_window = -1

    # -- size and settings --------------------------------------------------

    def resize(self, nranks: int) -> None:
        """Grow to `nranks` ranks, keeping every track and baseline (never shrinks)."""
        if nranks <= self.nranks:
            return
        cap = self.history.capacity
        if nranks <= cap:
            self.nranks = nranks
            return
        # Capacity doubles: agents announce their ranks a few at a time, and growing
        # by exactly what each announces would copy every array once per agent.
        extra = max(nranks, 2 * cap) - cap
        self.roster.grow(extra)
        self.history.grow(extra)
        self.nranks = nranks

    def update_settings(self, settings: Settings) -> None:
        """New settings take effect from the next window; state is kept."""
        w = settings.warmup_windows
        if w != self.history.rank_samples.shape[1]:
            self.history.set_warmup(w)
            for b in self.scalars.baselines.values():
                del b.samples[w:]
        if settings.flag_window != self.settings.flag_window:
            self.ledger.resize(settings.flag_window)
        self.settings = settings

    @property
    def gpu_hours_lost(self) -> float:
        return self.ledger.gpu_hours

    def active(self) -> list[tuple[str, str]]:
        """(kind, subject) of every finding currently flagged (not yet cleared)."""
        return self.ledger.active()

    def islands(self) -> dict[int, str]:
        """rank -> island, for every rank whose island is known (hang findings)."""
        return self.roster.islands()

    def hosts(self) -> dict[int, str]:
        return self.roster.hosts()

    # -- state --------------------------------------------------------------

    def state(self) -> DetectorState:
        """The whole scoring state (numbers as raw bytes)."""
        n = self.nranks
        return DetectorState(
            nranks=n,
            **self.history.snapshot(n),
            host=self.roster.host[:n].tolist(),
            island_of=self.roster.island_of[:n].tolist(),
            baselines=[
                [k, s, b.samples, b.recent, b.tail()]
                for (k, s), b in self.scalars.baselines.items()
            ],
            tracks=self.ledger.state(),
            gpu_hours=self.ledger.gpu_hours,
            last_window=self._last_window,
            late=[ref.snapshot(w) for w, ref in self._late.items()],
            causes=[[k, s, c, m, w] for (k, s), (c, m, w) in self.ranks.causes.items()],
        )

    def snapshot(self) -> dict[str, Any]:
        """`state()` as plain data (msgpack-able)."""
        return plain(self.state())

    def restore_state(self, state: Mapping[str, Any] | DetectorState) -> None:
        """Take back a `snapshot()`; config facts (islands, classes) stay the constructor's.
        Raises msgspec.ValidationError (a ValueError) naming a field of the wrong type."""
        st = read(state, DetectorState)
        n = st.nranks
        self.resize(n)
        w = self.settings.warmup_windows
        self.history.restore(st, n, w)
        self.roster.host[:n] = objects(st.host)
        self.roster.hosts_seen = None
        self.roster.island_of[:n] = objects(st.island_of)
        # (snapshots from before the scalar noise history have no `recent`)
        self.scalars.baselines = {
            (b[0], b[1]): ScalarBaseline(b[2][:w], *b[3:5]) for b in st.baselines
        }
        self.ledger.restore(st.tracks, st.gpu_hours, self.settings.flag_window)
        self._last_window = st.last_window
        self._late = dict(LateRef.restore(e) for e in st.late)
        self.ranks.causes = {
            (str(e[0]), str(e[1])): (dict(e[2]), [str(x) for x in e[3]], int(e[4]))
            for e in st.causes
        }

    # -- one window ---------------------------------------------------------

    def score_window(
        self,
        window: int,
        ranks: WindowColumns | Sequence[RankWindow],
        missing: Sequence[int] = (),
    ) -> WindowResult:
        cols = ranks if isinstance(ranks, WindowColumns) else WindowColumns.from_records(ranks)
        v, unusable = self.roster.view(cols, self.nranks, self.settings)
        missing_out = sorted(set(missing) | set(unusable.tolist()))
        if v is None:
            self._keep_late(window, None, None, missing_out)
            empty = np.zeros(0, dtype=np.int64)
            return WindowResult(
                self.job,
                window,
                [],
                empty,
                np.zeros(0),
                objects([]),
                math.nan,
                missing_out,
                self.ledger.gpu_hours,
            )
        ctx = context(window, v, self.settings, self.nranks)
        sc = self.ranks.judge(window, v, self.settings)
        findings, active = self.ranks.findings(v, sc, ctx, self.settings)
        self.ranks.feed(window, v, sc, active, self.settings)
        # With ranks missing, the last arrival may be among them: the transfer time
        # (and a bridge's) is then a wait for it, and a straggler there would read
        # as a slow collective or link. Those windows do not judge them (DETECTOR.md
        # "Late summaries").
        partial = bool(missing_out)
        findings += self.scalars.island_findings(
            ctx, v, self.settings, judge_transfer=not partial, held=active
        )
        if not partial:
            findings += self.scalars.link_findings(ctx, v, self.settings)
        findings.sort(key=lambda f: (KINDS.index(f.kind), f.subject))
        self._keep_late(window, v, ctx, missing_out)
        pace = np.where(sc.peers_ok | np.isnan(sc.history), sc.peers.ratio, sc.history)
        return WindowResult(
            job=self.job,
            window=window,
            findings=findings,
            ranks=v.r,
            pace_values=pace,
            island_labels=v.isl_labels,
            step_ms=ctx.step_ms,
            missing=missing_out,
            gpu_hours_lost=self.ledger.gpu_hours,
            steps=ctx.steps,
        )

    # -- late summaries -----------------------------------------------------

    def _keep_late(
        self, window: int, v: View | None, ctx: Ctx | None, missing: Sequence[int]
    ) -> None:
        """After a window is judged: keep its peers if ranks are missing from it (their
        summaries may still come, DETECTOR.md "Late summaries"); forget windows
        LATE_WINDOWS behind. A complete window keeps nothing: no rank can join it."""
        self._last_window = max(self._last_window, window)
        for w in [w for w in self._late if w <= self._last_window - LATE_WINDOWS]:
            del self._late[w]
        if not missing or v is None or ctx is None:
            return
        idx, weight = order_sample(v.gap, v.gid, np.ones(v.r.size, dtype=np.int64))
        live = self.history.live.now() if self.settings.mode == "adaptive" else math.nan
        self._late[window] = LateRef(
            ctx=ctx,
            live=live,
            rows=v.cols.take(v.row[idx]),
            weight=weight,
            pending=np.unique(np.asarray(missing, dtype=np.int64)),
        )

    def late_columns(self, window: int) -> WindowColumns:
        """A kept window's rows: its peers' sample and the late rows scored since."""
        ref = self._late.get(window)
        return WindowColumns.empty() if ref is None else ref.rows

    def late_pending(self, window: int) -> I64 | None:
        """The ranks of a kept window still missing (None: nothing kept for it)."""
        ref = self._late.get(window)
        return None if ref is None else ref.pending

    def score_late(self, window: int, ranks: WindowColumns | Sequence[RankWindow]) -> LateResult:
        """Late summaries of a window already judged (its deadline passed with these
        ranks missing): each rank still missing from it is judged against the
        window's own peers (kept by `_keep_late`) and the other late ranks, with the
        window's context, and its state advances by this window. A rank the window
        had is not judged again (`duplicate`); a window no longer kept: `expired`.
        The caller gives a rank's late windows in window order (the agents send
        them so), before its next window is judged."""
        cols = ranks if isinstance(ranks, WindowColumns) else WindowColumns.from_records(ranks)
        ref = self._late.get(window)
        if cols.n == 0:
            return LateResult(None)
        r_all = cols.ints("rank")
        if ref is None:
            return LateResult(None, expired=int(np.unique(r_all).size))
        # the last row of each rank still missing from the window
        _, first_rev = np.unique(r_all[::-1], return_index=True)
        last = np.sort(r_all.size - 1 - first_rev)
        fresh = last[np.isin(r_all[last], ref.pending)]
        dup = int(last.size - fresh.size)
        if fresh.size == 0:
            return LateResult(None, duplicate=dup)
        late = cols.take(fresh)
        u = WindowColumns.concat([ref.rows, late])
        w_u = np.concatenate([ref.weight, np.ones(late.n, dtype=np.int64)])
        v, unusable = self.roster.view(u, self.nranks, self.settings)
        lr = late.ints("rank")
        ref.pending = np.setdiff1d(ref.pending, lr)
        if v is None:
            return LateResult(None, scored=int(fresh.size), duplicate=dup)
        only = v.row >= u.n - late.n
        rep = w_u[v.row]
        pre = (weighted(v.gap, v.gid, rep), weighted(v.actual, v.gid, rep))
        if not ref.pending.size:
            del self._late[window]  # nobody left to come: nothing to keep
        else:
            # the late rows are peers of the later late ones: kept in the sample, which
            # stays at most LATE_PEERS rows a group
            idx, weight = order_sample(v.gap, v.gid, rep)
            ref.rows, ref.weight, ref.wire = u.take(v.row[idx]), weight, None
        ctx = ref.ctx
        sc = self.ranks.judge(window, v, self.settings, pre=pre, live=ref.live, only=only)
        findings, active = self.ranks.findings(v, sc, ctx, self.settings, only=only)
        self.ranks.feed(window, v, sc, active, self.settings, only=only)
        findings.sort(key=lambda f: (KINDS.index(f.kind), f.subject))
        pace = np.where(sc.peers_ok | np.isnan(sc.history), sc.peers.ratio, sc.history)
        res = WindowResult(
            job=self.job,
            window=window,
            findings=findings,
            ranks=v.r[only],
            pace_values=pace[only],
            island_labels=v.isl_labels[only],
            step_ms=ctx.step_ms,
            missing=sorted(set(ref.pending.tolist()) | set(np.intersect1d(unusable, lr).tolist())),
            gpu_hours_lost=self.ledger.gpu_hours,
            steps=ctx.steps,
        )
        union = dataclasses.replace(res, ranks=v.r, pace_values=pace, island_labels=v.isl_labels)
        return LateResult(res, scored=int(fresh.size), duplicate=dup, union=union)
