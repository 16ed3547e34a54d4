"""The rank rule: every rank's verdict in one window, and its rank/degraded findings.

A rank is judged against its scoring group's leave-one-out median (`rank`), or,
where the group is too small for peers, against its own warm-up gap
(`degraded`). In adaptive mode (DETECTOR.md "The combined test") the peer test
is also scaled to the group's spread and the job's live noise, and a CUSUM
change test follows each rank's log peer ratio against its own confirmed pace.
Numpy over every rank; Python per finding only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from artemis.detect import findings as F
from artemis.detect import scoring
from artemis.detect.arrays import F64, I64, finite_or_none, pct
from artemis.detect.diagnosis import diagnose
from artemis.detect.findings import RANK_KINDS, Finding
from artemis.detect.host_lost import host_test
from artemis.detect.incident_confirm import shape_of
from artemis.detect.lifecycle import Ledger, Track
from artemis.detect.rank_history import RankHistory
from artemis.detect.settings import Settings
from artemis.detect.tuning import (
    CHANGE_Z,
    CUSUM_CAP,
    CUSUM_H,
    DIAG_PEERS,
    MIN_SHIFT,
    NOISE_Z,
    PEER_MIN,
    PEER_Z,
    PEER_Z_MIN_GROUP,
)
from artemis.detect.view import Ctx, Roster, View, telemetry


@dataclass
class RankScores:
    """Per-rank verdicts of one window, aligned with `View.r`."""

    peers: scoring.Scores  # on the judged gap
    cost: scoring.Scores  # on the measured gap (the cost)
    base: F64  # own warm-up baseline
    history: F64  # gap / baseline
    peers_ok: npt.NDArray[np.bool_]
    peer_bad: npt.NDArray[np.bool_]
    hist_bad: npt.NDArray[np.bool_]
    # adaptive mode: the change test on the peer ratio (NaN / False in seed mode)
    change_bad: npt.NDArray[np.bool_]
    shift: F64  # log peer ratio - its confirmed baseline
    noise: F64  # the rank's noise sd (log ratio units)
    cusum: F64
    # recurring stalls: bad by their cost (`stall_test`)
    stall_bad: npt.NDArray[np.bool_]
    # the host's evidence (`host_lost.host_test`): bad by it, and the wait each rank
    # causes its peers in ms (None: no rank lost time to its host this window)
    host_bad: npt.NDArray[np.bool_]
    wait: F64 | None
    # each rank's trimmed mean gap (`trimmed_mean`; None: no summary has one), and for
    # `degraded` its ratio to its own warm-up's (NaN where not judged so)
    trimmed: F64 | None = None
    mean_history: F64 | None = None


class RankRule:
    """The rank rule of one job: judges with its ranks' `RankHistory`, keeps their
    tracks in the job's `Ledger`."""

    def __init__(self, job: str, history: RankHistory, ledger: Ledger, roster: Roster) -> None:
        self.job = job
        self.history = history
        self.ledger = ledger
        self.roster = roster
        # per rank track: the cause its episode last named from a window with an excess
        # to explain, and that window (DETECTOR.md "Diagnosis": one cause an episode)
        self.causes: dict[tuple[str, str], tuple[dict[str, Any], list[str], int]] = {}

    def judge(
        self,
        window: int,
        v: View,
        s: Settings,
        pre: tuple[scoring.Scores, scoring.Scores] | None = None,
        live: float | None = None,
        only: npt.NDArray[np.bool_] | None = None,
    ) -> RankScores:
        """Every rank's verdicts. A late window (score_late) passes its peers' scores
        (`pre`), the live noise of its own time (`live`) and the ranks whose state
        may change (`only`: the late ones; the others are its peers, judged then)."""
        if pre is not None:
            peers, cost = pre
        else:
            peers = scoring.score(v.gap, v.gid)
            cost = peers if v.gap is v.actual else scoring.score(v.actual, v.gid)
        base = self.history.baseline(window, s)[v.r]
        with np.errstate(divide="ignore", invalid="ignore"):
            history = np.where(base > 0, v.gap / base, np.nan)
        judging = window >= 1  # window 0 carries start-up work (compilation, warm caches)
        peers_ok = peers.group_size >= s.min_island_peers
        steps = v.cols.ints("step_hi") - v.cols.ints("step_lo")  # per summary (v.row)
        # `degraded` ranks with group-mates: their history over the mates' (a veto below)
        rel = mates_relative(history, v.gid, peers.group_size, ~peers_ok)
        peer_bad = judging & peers_ok & (peers.ratio >= s.suspect_ratio)
        n = v.r.size
        nan = np.full(n, np.nan)
        change_bad = np.zeros(n, dtype=bool)
        shift, noise, cusum = nan, nan, nan
        live_r: F64 | float | None = None  # the live noise (per rank where windows differ)
        live_mr: F64 | float | None = None  # the stall test's (its own statistic's)
        trimmed = trimmed_mean(v, steps)
        mean_history: F64 | None = None  # `degraded`'s trimmed mean over its warm-up's
        # how much noisier than a whole window each rank's is (1.0: all whole)
        scale = self.history.step_scale(steps, v.row)
        if s.mode == "adaptive":
            with np.errstate(invalid="ignore", divide="ignore"):
                # noise-scaled peer test: a tight group is judged more finely
                peer_bad |= (
                    judging
                    & peers_ok
                    & (peers.group_size >= PEER_Z_MIN_GROUP)
                    & (peers.ratio - 1.0 >= PEER_MIN * (s.suspect_ratio - 1.0) / 0.10)
                    & (peers.z >= PEER_Z)
                )
                lr = np.log(peers.ratio)
                # (no trimmed means, an older agent's job: no stall test to judge)
                lt = None if trimmed is None else np.log(trimmed)
                if only is not None:
                    # a late window feeds no live noise (that is the job's now), but
                    # the rank's last values are this one's, as its windows come in order
                    self.history.live.prev[v.r[only]] = np.log(v.gap[only])
                    if lt is not None:
                        self.history.live_mean.prev[v.r[only]] = lt[only]
                elif window >= 1:
                    self.history.live.observe(v.r, np.log(v.gap), v.gid, peers_ok)
                    if lt is not None:
                        self.history.live_mean.observe(v.r, lt, v.gid, peers_ok)
                # the stall test's own (a late window's: its gap's, kept when judged)
                live_m = self.history.live_mean.now() if live is None else math.nan
                if live is None:
                    live = self.history.live.now()
                # the live noise of a whole window; a shorter one's is larger
                live_r = live * scale
                live_mr = live_m * scale if math.isfinite(live_m) else live_r
                if math.isfinite(live):
                    # slower than its peers, but within what every rank's ratio moves
                    # by from window to window now: noise, whatever the ratio
                    peer_bad &= lr >= NOISE_Z * live_r
                rbase, rsd = self.history.ratio_baseline(window, s)
                shift = lr - rbase[v.r]
                noise = np.fmax(rsd[v.r], live_r) if math.isfinite(live) else rsd[v.r]
                ref = np.fmax(MIN_SHIFT / 2, CHANGE_Z * noise)
                step = (shift - ref) / noise
                ok = judging & peers_ok & np.isfinite(step)
                cusum = np.where(ok, np.clip(self.history.cusum[v.r] + step, 0.0, CUSUM_CAP), 0.0)
                change_bad = ok & (cusum >= CUSUM_H) & (shift >= ref)
            w_ok = ok if only is None else ok & only
            self.history.cusum[v.r[w_ok]] = cusum[w_ok]
            # `degraded` (no peers): the same change test on the rank's own gap against
            # its warm-up median, in the noise of its warm-up gaps. Nothing shared is
            # taken out here (no peers), so that noise includes the job's jitter.
            no_peers = judging & ~peers_ok
            with np.errstate(invalid="ignore", divide="ignore"):
                dsd = nan
                if no_peers.any():
                    # in the larger of its warm-up's noise and the job's live noise now
                    # (a quiet warm-up's 1-2% held a healthy rank's 8% drift as a change)
                    own = self.history.live.own_now() * scale
                    dsd = np.fmax(self.history.gap_noise(window, s)[v.r], own)
                dshift = np.log(history)
                dref = np.fmax(MIN_SHIFT / 2, CHANGE_Z * dsd)
                dstep = (dshift - dref) / dsd
                dok = judging & ~peers_ok & np.isfinite(dstep)
                dc = np.where(dok, np.clip(self.history.dcusum[v.r] + dstep, 0.0, CUSUM_CAP), 0.0)
                hist_bad = dok & (dc >= CUSUM_H) & (dshift >= dref)
                # and the seed's fixed ratio, where it is at least PEER_Z of that noise
                hist_bad |= dok & (history >= s.suspect_ratio) & (dshift >= PEER_Z * dsd)
                # slower than its history, but its mates slowed more, beyond that same
                # reference: it waits for them (a lockstep job), it is not the slow one
                if rel is not None:
                    hist_bad &= ~(np.log(rel) <= -dref)
            w_dok = dok if only is None else dok & only
            self.history.dcusum[v.r[w_dok]] = dc[w_dok]
            shift, noise, cusum = (
                np.where(peers_ok, a, b) for a, b in ((shift, dshift), (noise, dsd), (cusum, dc))
            )
        else:
            hist_bad = judging & ~peers_ok & (history >= s.suspect_ratio)
            if rel is not None:
                hist_bad &= ~(rel * s.suspect_ratio <= 1.0)  # its mates slowed more: it waits
        stall_bad = stall_test(v, s, judging & peers_ok, live_mr, trimmed)
        host_bad, wait = host_test(v, s, judging)
        if trimmed is not None and not peers_ok.all():
            # `degraded`'s: its trimmed mean against its own warm-up's and its mates';
            # not in a window of fewer than half the job's steps (its last: a mean of a
            # few steps tells no stall that recurs)
            whole = np.asarray(scale) <= math.sqrt(2.0)
            mbase = self.history.mean_baseline(window, s)[v.r]
            stalled, mean_history = degraded_stall_test(
                v, s, judging & ~peers_ok & whole, peers.group_size, trimmed, mbase
            )
            hist_bad = hist_bad | stalled
        return RankScores(
            peers=peers,
            cost=cost,
            base=base,
            history=history,
            peers_ok=peers_ok,
            peer_bad=peer_bad,
            hist_bad=hist_bad,
            change_bad=change_bad,
            shift=shift,
            noise=noise,
            cusum=cusum,
            stall_bad=stall_bad,
            host_bad=host_bad,
            wait=wait,
            trimmed=trimmed,
            mean_history=mean_history,
        )

    def findings(
        self,
        v: View,
        sc: RankScores,
        ctx: Ctx,
        s: Settings,
        only: npt.NDArray[np.bool_] | None = None,
    ) -> tuple[list[Finding], npt.NDArray[np.bool_]]:
        """Advance the track of every bad or tracked rank (of `only`, where given);
        (findings, ranks held out of their baseline because they are bad or flagged)."""
        bad = sc.peer_bad | sc.hist_bad | sc.change_bad | sc.stall_bad | sc.host_bad
        if only is not None:
            bad = bad & only
        todo = set(np.flatnonzero(bad).tolist())
        tracked = np.array(
            sorted({int(k[1]) for k in self.ledger.tracks if k[0] in RANK_KINDS}),
            dtype=np.int64,
        )
        if tracked.size:
            pos = np.minimum(np.searchsorted(v.r, tracked), v.r.size - 1)
            hit = pos[v.r[pos] == tracked]
            if only is not None:
                hit = hit[only[hit]]
            todo.update(hit.tolist())
        out: list[Finding] = []
        held = np.zeros(v.r.size, dtype=bool)
        for i in sorted(todo):
            kind = "rank" if sc.peers_ok[i] else "degraded"
            key = (kind, str(int(v.r[i])))
            if key not in self.ledger.tracks and not bad[i]:
                continue
            if kind == "rank":
                excess = max(0.0, float(v.actual[i] - sc.cost.loo_median[i]))
            else:
                excess = max(0.0, float(v.actual[i] - sc.base[i])) if sc.base[i] > 0 else 0.0
                mh = degraded_mean_ratio(sc, i)
                if mh > sc.history[i] and sc.trimmed is not None:
                    # stalls in some steps: its mean over its warm-up's is the cost
                    measured = float(sc.trimmed[i] * v.actual[i] / v.gap[i])
                    excess = max(excess, measured * (1.0 - 1.0 / mh))
            if kind == "rank" and sc.change_bad[i] and not sc.peer_bad[i]:
                # slow against its own baseline but within its peers' spread: the
                # peers' median is not the cost, its own confirmed pace is
                excess = max(0.0, float(v.actual[i] * (1.0 - math.exp(-sc.shift[i]))))
            shape = stall_shape(v, i) if kind == "rank" else {}
            if shape.get("shape") == "stalls" and "peers_gap_mean_ms" in shape:
                # stalls in some of its steps: what the peers wait for them on average
                excess = max(0.0, shape["gap_mean_ms"] - shape["peers_gap_mean_ms"])
            waits = host_wait(sc, i)
            if waits is not None:
                # lost to its host, partly inside the collectives: what its peers wait
                excess = max(excess, waits)
                shape = {**shape, "wait_ms": round(waits, 3)}
            # a bad window must cost something: a rank that reaches the collective
            # before its peers' median, on its median and its mean, makes nobody wait
            # (its change is still held out of its baseline below); the host's
            # evidence measured the wait it causes itself
            is_bad = bool(bad[i]) and (
                waits is not None or not (kind == "rank" and costless(sc, i, shape))
            )
            if key not in self.ledger.tracks and not is_bad:
                held[i] = True
                continue
            track = self.ledger.track(key, s.flag_window)
            if is_bad and shape.get("shape") == "stalls":
                track.stalls = True  # clears as an intermittent fault does (lifecycle.py)
            # the intermittent rule is for ranks (a GPU that comes and goes), not scalars
            # bad by the host's evidence: measured, confirmed sooner (lifecycle.py)
            measured = is_bad and bool(sc.host_bad[i])
            state = self.ledger.advance(
                track,
                ctx.window,
                is_bad,
                excess,
                ctx.hours_per_ms,
                s,
                s.mode == "adaptive",
                measured,
            )
            held[i] = track.active or bool(bad[i])
            if state is not None:
                out.append(
                    self._finding(kind, state, i, v, sc, excess, track, ctx, s, shape, is_bad)
                )
            self.ledger.forget_idle(key, track)
            if state == "cleared" or key not in self.ledger.tracks:
                self.causes.pop(key, None)
        return out, held

    def feed(
        self,
        window: int,
        v: View,
        sc: RankScores,
        held: npt.NDArray[np.bool_],
        s: Settings,
        only: npt.NDArray[np.bool_] | None = None,
    ) -> None:
        # An unconfirmed regression never becomes a baseline: only healthy windows feed.
        healthy = (window >= 1) & ~sc.peer_bad & ~sc.hist_bad & ~sc.change_bad & ~held
        if only is not None:
            healthy &= only
        self.history.feed(v.r, healthy, v.gap, sc.peers.ratio, sc.peers_ok, s, sc.trimmed)

    def _finding(
        self,
        kind: str,
        state: str,
        i: int,
        v: View,
        sc: RankScores,
        excess: float,
        track: Track,
        ctx: Ctx,
        s: Settings,
        shape: dict[str, Any],
        bad: bool = True,
    ) -> Finding:
        rank = int(v.r[i])
        cause: dict[str, Any] | None = None
        missing: list[str] = []
        if state != "cleared":
            # The slowdown the cause must explain: against its peers (whose clocks
            # are the reference), else its own pace; where the change test judged it,
            # the change from its own confirmed pace (a rank always 2% slow for
            # reasons its clock does not show keeps that offset out of it).
            slow = sc.peers.ratio[i] - 1.0 if kind == "rank" else sc.history[i] - 1.0
            if kind == "degraded":
                # its mean's rise where that is the larger: stalls (`degraded_stall_test`)
                slow = max(slow, degraded_mean_ratio(sc, i) - 1.0)
            if kind == "rank" and sc.change_bad[i]:
                slow = math.expm1(sc.shift[i])
            if shape.get("shape") == "stalls" and shape.get("peers_gap_mean_ms", 0.0) > 0:
                # stalls cost their mean (the excess above), and the host's figures are
                # shares of the wall time, means too: the median's ratio (near 1, even
                # below it, while a stopped process makes every peer wait) is not the
                # slowdown they explain, and named no cause in half such windows
                slow = shape["gap_mean_ms"] / shape["peers_gap_mean_ms"] - 1.0
            peers_gap = float(sc.peers.loo_median[i])
            if "wait_ms" in shape and peers_gap > 0:
                # the host's evidence: the wait it causes, over its peers' gap (also
                # where its own history has no baseline yet: NaN, which max keeps)
                waited = shape["wait_ms"] / peers_gap
                if not slow >= waited:
                    slow = waited
            key = (kind, str(rank))
            known = self.causes.get(key)
            # Its episode's cause stands, so the line (and the end summary, the latest
            # line) does not turn `unknown` on noise, where this window has nothing to
            # explain (judged good: a stalled rank's window without its stalls, a job's
            # last few steps) or names nothing from fewer of its figures than that cause
            # was named from (a job's last window, sampled as its processes end: an
            # absence, not a contradiction); `as_of_window` says where it was named.
            keep = known is not None and not (bad and slow > 0)
            if not keep:
                c = self._diagnose(kind, i, v, float(slow) if math.isfinite(slow) else None)
                cause, missing = c.to_json(), list(c.missing)
                keep = (
                    known is not None and c.kind == "unknown" and bool(set(missing) - set(known[1]))
                )
                if not keep and bad and slow > 0:
                    self.causes[key] = (cause, missing, ctx.window)
            if keep and known is not None:
                cause = {**known[0], "evidence": {**known[0]["evidence"], "as_of_window": known[2]}}
                missing = list(known[1])
        evidence: dict[str, Any] = {
            "gpu_hours": track.pending_hours if state == "suspect" else track.hours,
            "gap_ms": float(v.gap[i]),
            "peers": int(sc.peers.group_size[i]) - 1,
        }
        samples = float(v.cols.floats("samples")[v.row[i]])
        if math.isfinite(samples):
            evidence["samples"] = int(samples)
        if kind == "rank":
            evidence["peers_gap_ms"] = finite_or_none(sc.peers.loo_median[i])
        else:
            evidence["baseline_gap_ms"] = finite_or_none(sc.base[i])
        if v.class_of[i] is not None:
            evidence["hw_class"] = v.class_of[i]
        evidence.update(shape)
        basis = "peers"
        if s.mode == "adaptive":
            if kind == "rank":
                pb, cb = bool(sc.peer_bad[i]), bool(sc.change_bad[i])
                basis = "both" if pb and cb else "history" if cb else "peers"
            if math.isfinite(sc.shift[i]):
                # the change test: shift from its own confirmed pace, in its own noise
                evidence["shift"] = round(float(math.expm1(sc.shift[i])), 4)
                evidence["noise"] = round(float(sc.noise[i]), 5)
                evidence["cusum"] = round(float(sc.cusum[i]), 2)
            evidence["intermittent"] = track.intermittent
        common: dict[str, Any] = {
            "job": self.job,
            "state": state,
            "window": ctx.window,
            "steps": ctx.steps,
            "rank": rank,
            "island": str(v.isl_labels[i]),
            "hosts": [] if self.roster.host[rank] is None else [str(self.roster.host[rank])],
            "since": track.since,
            "ratio": finite_or_none(sc.peers.ratio[i]),
            "history": finite_or_none(sc.history[i]),
            "excess_ms": excess,
            "loss_pct": pct(excess, ctx.step_ms),
            "missing": missing,
            "evidence": evidence,
            "cause": cause,
        }
        if kind == "rank":
            return F.rank_finding(z=finite_or_none(sc.peers.z[i]), basis=basis, **common)
        return F.degraded_finding(**common)

    def _diagnose(self, kind: str, i: int, v: View, slowdown: float | None) -> Any:
        """Why rank i is slow: its telemetry against its group's (rank) or island's (degraded)."""
        peers = np.flatnonzero(v.gid == v.gid[i] if kind == "rank" else v.isl_id == v.isl_id[i])
        peers = peers[peers != i]
        if peers.size > DIAG_PEERS:
            peers = peers[np.linspace(0, peers.size - 1, DIAG_PEERS).astype(np.int64)]
        own, *others = telemetry(v.cols, [int(v.row[i]), *v.row[peers].tolist()])
        return diagnose(own, others, slowdown)


def mates_relative(
    history: F64, gid: I64, size: I64, no_peers: npt.NDArray[np.bool_]
) -> F64 | None:
    """For a rank with too few peers to be judged against them but with group-mates (a
    2-rank job, an island of two): its gap over its own baseline (`history`) against
    its mates' (their leave-one-out median); NaN elsewhere and in a group with a rank
    not yet baselined; None where no rank has mates (the usual job: no work a window).
    A lockstep job's healthy rank waits for the slow one: on a 2-rank gloo job under a
    SIGSTOP duty cycle both ranks' gaps rose against their warm-up and both were
    flagged `degraded` (bench/realjobs, world 2); the one whose mates slowed more is
    waiting, not slow (a veto only: the test stays on its own history, and what all of
    them share still counts)."""
    m = no_peers & (size >= 2)
    if not m.any():
        return None
    have = np.isfinite(history) & (history > 0)
    m &= np.bincount(gid, weights=(~have).astype(np.float64))[gid] == 0
    if not m.any():
        return None
    rel = scoring.score(np.where(have, history, 1.0), gid).ratio
    return np.where(m, rel, np.nan)


def host_wait(sc: RankScores, i: int) -> float | None:
    """The wait rank i causes its peers (ms a step) where the host's evidence judged it
    bad this window (`host_lost.host_test`), else None."""
    if sc.wait is None or not sc.host_bad[i]:
        return None
    return float(sc.wait[i])  # (judged bad: at least its margin, above 0)


def degraded_mean_ratio(sc: RankScores, i: int) -> float:
    """Rank i's trimmed mean over its warm-up's (`degraded_stall_test`); -inf where not
    judged so (a rank with peers, no mean, no mean baseline yet)."""
    if sc.mean_history is None or not math.isfinite(sc.mean_history[i]):
        return -math.inf
    return float(sc.mean_history[i])


def costless(sc: RankScores, i: int, shape: dict[str, Any]) -> bool:
    """Whether rank i, judged bad, costs its peers nothing this window: its median gap
    is at most its peers' (its peer ratio), and so is its mean (where its summary
    has one). A lockstep job waits for its last rank; such a rank is not it."""
    if not sc.peers.ratio[i] <= 1.0:
        return False
    mean, peers = shape.get("gap_mean_ms", math.nan), shape.get("peers_gap_mean_ms", math.nan)
    return not mean > peers


def trimmed_mean(v: View, steps: I64) -> F64 | None:
    """Per rank, its mean per-step gap with the window's longest step left out (one
    long step, a GC pause or a page fault, is a one-off, not a stall that recurs);
    per sample under a plan, like the gap. NaN where a summary has no mean (an
    older agent); None where none has. `steps`: each summary's steps in the window."""
    mean = v.cols.floats("gap_mean_ms")
    if not np.isfinite(mean).any():
        # no summary has a mean (an older agent's job): no rank's arrays to build (a
        # 100k-rank window spent 2,400 page faults of fresh temporaries on them)
        return None
    mean = mean[v.row]
    longest = v.cols.floats("gap_max_ms")[v.row]
    spans = steps[v.row].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        # (the steps a window spans: one with lost records overstates it a little)
        trimmed = np.where(spans >= 2, (mean * spans - longest) / (spans - 1), mean)
        if v.gap is not v.actual:
            trimmed = trimmed * (v.gap / v.actual)
    return trimmed


def stall_test(
    v: View,
    s: Settings,
    judged: npt.NDArray[np.bool_],
    live: F64 | float | None,
    trimmed: F64 | None,
) -> npt.NDArray[np.bool_]:
    """Recurring stalls, by their cost (DETECTOR.md "Recurring stalls"): a rank whose
    `trimmed_mean` is at least `suspect_ratio` of its peers'. A group where a summary
    has no mean (an older agent) is not judged so. Adaptive mode: also NOISE_Z of
    the live noise of that statistic (`live`, per rank: scaled to its window's
    steps), as the peer test is of the gap's."""
    if trimmed is None:
        return np.zeros(v.r.size, dtype=bool)
    have = np.isfinite(trimmed)
    if not have.any():
        return have  # no usable summary has a mean
    judged = judged & (np.bincount(v.gid, weights=~have)[v.gid] == 0)
    x = np.where(have, trimmed, v.gap)
    # only the judged ranks that can reach the margin get a ratio (NaN: cannot)
    ratio = scoring.ratio_reaching(x, v.gid, judged, s.suspect_ratio)
    with np.errstate(invalid="ignore", divide="ignore"):
        bad = judged & (ratio >= s.suspect_ratio)
        if live is not None:  # (NaN: not measured yet, no gate)
            bad &= ~(np.log(ratio) < NOISE_Z * live)
    return bad


def degraded_stall_test(
    v: View,
    s: Settings,
    judged: npt.NDArray[np.bool_],
    size: I64,
    trimmed: F64,
    base: F64,
) -> tuple[npt.NDArray[np.bool_], F64]:
    """Recurring stalls of a rank without peers (`degraded`: a 2-rank job, an island of
    two; DETECTOR.md "Recurring stalls"): its `trimmed_mean` at least `suspect_ratio`
    of its own warm-up's (`base`), and that rise at least `suspect_ratio` of its
    group-mates' (each over its own warm-up). The stall test's margin, with the rank's
    warm-up standing in for the peers it lacks; the mates' rise takes out what the job
    shares (a busy host, data-dependent steps: the median test and the island judge
    those), and a mate that rose more is the one it waits for. A rank with no
    group-mate is not judged so. (bad, mean over its warm-up's: NaN where not judged)"""
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(judged, trimmed / base, np.nan)
        rel = mates_relative(ratio, v.gid, size, judged & np.isfinite(ratio))
        if rel is None:
            return np.zeros(v.r.size, dtype=bool), ratio
        bad = judged & (ratio >= s.suspect_ratio) & (rel >= s.suspect_ratio)
    return bad, ratio


def stall_shape(v: View, i: int) -> dict[str, Any]:
    """Rank i's mean per-step gap against its group's (the median of the peers' means)
    and the shape of its slowdown (`shape_of`: its lower quartile and median against
    the peers'), for its finding's evidence; per finding, never per rank. Empty
    where its summary has no quartiles (an older agent)."""
    grp = np.flatnonzero(v.gid == v.gid[i])
    peers = grp[grp != i]
    if not peers.size:
        return {}
    # (an index array, not a Python list of the group: a group can be 50k ranks)
    at = np.concatenate((np.array([i], dtype=np.int64), peers))
    rows = v.row[at]
    scale = v.gap[at] / v.actual[at]
    out: dict[str, Any] = {}
    shifts = []
    for name in ("gap_q1_ms", "gap_q2_ms", "gap_mean_ms"):
        with np.errstate(invalid="ignore", divide="ignore"):
            a = v.cols.floats(name)[rows] * np.where(np.isfinite(scale), scale, 1.0)
        ref = a[1:][np.isfinite(a[1:])]
        if not math.isfinite(a[0]) or not ref.size or not float(np.median(ref)) > 0:
            shifts.append(math.nan)
            continue
        shifts.append(float(a[0]) / float(np.median(ref)) - 1.0)
        if name == "gap_mean_ms":
            # the cost as measured (not per sample): what the peers wait
            actual = v.cols.floats(name)[rows]
            peers_actual = actual[1:][np.isfinite(actual[1:])]
            out["gap_mean_ms"] = float(actual[0])
            out["peers_gap_mean_ms"] = float(np.median(peers_actual))
    if math.isfinite(shifts[0]) and math.isfinite(shifts[1]):
        out["shape"] = shape_of(shifts[0], shifts[1], shifts[2])
    return out


def weighted(values: F64, gid: I64, rep: I64) -> scoring.Scores:
    """Leave-one-out scores where entry i stands for rep[i] ranks (a kept window's
    peers): exact for the entries of weight 1 (the late ranks)."""
    if (rep == 1).all():
        return scoring.score(values, gid)
    big = np.repeat(np.arange(values.size), rep)
    sc = scoring.score(values[big], gid[big])
    first = np.cumsum(rep) - rep
    return scoring.Scores(sc.loo_median[first], sc.ratio[first], sc.z[first], sc.group_size[first])
