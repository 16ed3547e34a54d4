"""The detector: a pure state machine fed one assembled window at a time.

`Detector.score_window` takes the RankWindow records of one (job, communicator,
window) and returns every finding report for that window. It holds baselines
and persistence state between windows and nothing else: no clock, no I/O, so
the daemon, the simulator and the in-process detector all drive the same code.
DETECTOR.md describes the rules; the comments here say why the code does what
it does.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from artemis.coordinator import scoring
from artemis.coordinator.diagnosis import diagnose
from artemis.coordinator.findings import KINDS, Finding
from artemis.coordinator.settings import Settings
from artemis.protocol.records import RankWindow, Telemetry

DEFAULT_ISLAND = "default"


@dataclass
class WindowResult:
    job: str
    window: int
    findings: list[Finding]  # every report of this window, all kinds and states
    pace: dict[int, float]  # rank -> pace ratio (peers, else own history)
    islands: dict[int, str]  # rank -> island, for the ranks that reported
    step_ms: float  # median step time of the window (NaN when nobody reported)
    missing: list[int]  # ranks without a usable record in this window
    gpu_hours_lost: float  # job total so far, over every confirmed finding
    steps: list[int] = field(default_factory=list)  # [first step, one past the last]


class _Track:
    """Persistence of one subject (a rank, an island, a link) for one kind.

    Suspect -> flagged after `flag_after` bad windows in the last `flag_window`;
    flagged -> ongoing while it lasts; cleared after `clear_after` good windows
    in a row. A suspicion that never reaches flagged simply fades.
    """

    __slots__ = ("active", "good_run", "hours", "pending_hours", "recent", "since")

    def __init__(self, flag_window: int) -> None:
        self.recent: deque[bool] = deque(maxlen=flag_window)
        self.active = False
        self.since: int | None = None
        self.good_run = 0
        self.pending_hours = 0.0  # cost while suspect; counts once confirmed
        self.hours = 0.0  # confirmed cost of this finding

    def observe(self, window: int, bad: bool, s: Settings) -> str | None:
        if self.active:
            if bad:
                self.good_run = 0
                return "ongoing"
            self.good_run += 1
            if self.good_run >= s.clear_after:
                self.active = False
                self.recent.clear()
                return "cleared"
            return "ongoing"
        if bad:
            if not any(self.recent):
                self.since = window
                self.pending_hours = 0.0
            self.recent.append(True)
            if sum(self.recent) >= s.flag_after:
                self.active = True
                self.good_run = 0
                return "flagged"
            return "suspect"
        self.recent.append(False)
        if not any(self.recent):
            self.since = None
            self.pending_hours = 0.0
        return None

    @property
    def idle(self) -> bool:
        return not self.active and not any(self.recent)

    def resize(self, flag_window: int) -> None:
        self.recent = deque(self.recent, maxlen=flag_window)


class _Baseline:
    """Warm-up baseline of one scalar: median of its first healthy windows after window 0."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: list[float] = []

    def value(self, window: int, s: Settings) -> float | None:
        n = len(self.samples)
        if n and (n >= s.warmup_windows or window > s.warmup_windows):
            return float(np.median(self.samples))
        return None

    def feed(self, window: int, x: float, s: Settings) -> None:
        if window >= 1 and len(self.samples) < s.warmup_windows and math.isfinite(x):
            self.samples.append(x)


class Detector:
    """Scores windows of one job's communicator; see DETECTOR.md for the rules."""

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
        self.nranks = nranks
        self._hosts: dict[int, str] = dict(hosts or {})
        # Job facts from config: used only when a record's telemetry lacks them.
        self._cfg_islands: dict[int, str] = dict(islands or {})
        self._cfg_classes: dict[int, str] = dict(classes or {})
        self._island_order: list[str] | None = list(island_order) if island_order else None
        self._island_of: dict[int, str] = {}
        # Rank warm-up samples, vectorised: (nranks, warmup) with a fill count.
        self._rank_samples = np.full((nranks, settings.warmup_windows), np.nan)
        self._rank_count = np.zeros(nranks, dtype=np.int64)
        self._samples_version = 0
        self._base_cache: tuple[tuple[int, bool], npt.NDArray[np.float64]] | None = None
        self._baselines: dict[tuple[str, str], _Baseline] = {}
        self._tracks: dict[tuple[str, str], _Track] = {}
        self._gpu_hours = 0.0

    # -- settings -----------------------------------------------------------

    def update_settings(self, settings: Settings) -> None:
        """New settings take effect from the next window; state is kept."""
        if settings.warmup_windows != self._rank_samples.shape[1]:
            w = settings.warmup_windows
            grown = np.full((self.nranks, w), np.nan)
            keep = min(w, self._rank_samples.shape[1])
            grown[:, :keep] = self._rank_samples[:, :keep]
            self._rank_samples = grown
            self._rank_count = np.minimum(self._rank_count, w)
            self._samples_version += 1
            for b in self._baselines.values():
                del b.samples[w:]
        if settings.flag_window != self.settings.flag_window:
            for t in self._tracks.values():
                t.resize(settings.flag_window)
        self.settings = settings

    @property
    def gpu_hours_lost(self) -> float:
        return self._gpu_hours

    def active(self) -> list[tuple[str, str]]:
        """(kind, subject) of every finding currently flagged (not yet cleared)."""
        return sorted(k for k, t in self._tracks.items() if t.active)

    # -- one window ---------------------------------------------------------

    def score_window(
        self, window: int, ranks: Sequence[RankWindow], missing: Sequence[int] = ()
    ) -> WindowResult:
        s = self.settings
        recs, unusable = self._usable(ranks)
        missing_out = sorted(set(missing) | unusable)
        if not recs:
            return WindowResult(
                self.job, window, [], {}, {}, float("nan"), missing_out, self._gpu_hours
            )

        r = np.fromiter((x.rank for x in recs), dtype=np.int64, count=len(recs))
        gap = np.fromiter((x.gap_ms for x in recs), dtype=np.float64, count=len(recs))
        coll = np.fromiter((x.coll_ms for x in recs), dtype=np.float64, count=len(recs))
        step = np.fromiter((x.step_ms for x in recs), dtype=np.float64, count=len(recs))
        nsteps = np.fromiter((x.step_hi - x.step_lo for x in recs), dtype=np.int64, count=len(recs))
        isl_labels = [self._island(x) for x in recs]
        isl_names, isl_id = np.unique(np.array(isl_labels, dtype=object), return_inverse=True)
        isl_id = isl_id.ravel().astype(np.int64)
        gid, class_of = self._groups(recs, isl_id, len(isl_names))

        # Under a rebalance plan ranks run different sample counts: judge the
        # compute gap per sample (scaled to the mean split), so a slow rank that a
        # plan compensates stays flagged until it really recovers; the cost stays
        # what the job loses now, from the gaps as they are.
        actual = gap
        per_sample = _per_sample_scale(recs)
        if per_sample is not None:
            gap = gap * per_sample
        sc = scoring.score(gap, gid)
        sc_cost = sc if per_sample is None else scoring.score(actual, gid)
        step_ms = float(np.median(step))
        steps_in_window = int(np.median(nsteps))
        steps = [min(x.step_lo for x in recs), max(x.step_hi for x in recs)]
        gpus = s.gpu_count or self.nranks
        # GPU-hours per ms of excess per step: every GPU waits that long each step.
        hours_per_ms = steps_in_window * gpus / 3600.0 / 1000.0
        ctx = _Ctx(window, steps, step_ms, hours_per_ms)

        base = self._rank_baseline(window)[r]
        with np.errstate(divide="ignore", invalid="ignore"):
            history = np.where(base > 0, gap / base, np.nan)
        judging = window >= 1  # window 0 carries start-up work (compilation, warm caches)
        peers_ok = sc.group_size >= s.min_island_peers
        peer_bad = judging & peers_ok & (sc.ratio >= s.suspect_ratio)
        hist_bad = judging & ~peers_ok & (history >= s.suspect_ratio)

        findings: list[Finding] = []
        tracked = {int(k[1]) for k in self._tracks if k[0] in ("rank", "degraded")}
        idx_of = {int(rank): i for i, rank in enumerate(r)} if tracked else {}
        todo = set(np.flatnonzero(peer_bad | hist_bad).tolist())
        todo.update(idx_of[t] for t in tracked if t in idx_of)
        active_rank = np.zeros(len(recs), dtype=bool)
        for i in sorted(todo):
            kind = "rank" if peers_ok[i] else "degraded"
            bad = bool(peer_bad[i] or hist_bad[i])
            key = (kind, str(int(r[i])))
            if key not in self._tracks and not bad:
                continue
            track = self._tracks.setdefault(key, _Track(s.flag_window))
            if kind == "rank":
                excess = max(0.0, float(actual[i] - sc_cost.loo_median[i]))
            else:
                excess = max(0.0, float(actual[i] - base[i])) if base[i] > 0 else 0.0
            state = self._advance(track, window, bad, excess, ctx)
            if track.active or bad:
                active_rank[i] = True
            if state is not None:
                findings.append(
                    self._rank_finding(
                        kind,
                        state,
                        i,
                        recs,
                        r,
                        gap,
                        sc,
                        history,
                        base,
                        isl_labels,
                        gid,
                        class_of,
                        excess,
                        track,
                        ctx,
                    )
                )
            if track.idle:
                del self._tracks[key]

        # An unconfirmed regression never becomes a baseline: only healthy windows feed.
        feed = judging & ~peer_bad & ~hist_bad & ~active_rank
        feed &= self._rank_count[r] < s.warmup_windows
        fr = r[feed]
        if fr.size:
            self._rank_samples[fr, self._rank_count[fr]] = gap[feed]
            self._rank_count[fr] += 1
            self._samples_version += 1

        findings += self._island_findings(ctx, r, actual, coll, isl_id, isl_names, recs)
        findings += self._link_findings(ctx, recs, isl_labels)
        findings.sort(key=lambda f: (KINDS.index(f.kind), f.subject))

        pace = np.where(peers_ok | np.isnan(history), sc.ratio, history)
        pace_out = {int(k): float(v) for k, v in zip(r, pace, strict=True) if math.isfinite(v)}
        return WindowResult(
            job=self.job,
            window=window,
            findings=findings,
            pace=pace_out,
            islands={int(k): lab for k, lab in zip(r, isl_labels, strict=True)},
            step_ms=step_ms,
            missing=missing_out,
            gpu_hours_lost=self._gpu_hours,
            steps=steps,
        )

    # -- helpers ------------------------------------------------------------

    def _usable(self, ranks: Sequence[RankWindow]) -> tuple[list[RankWindow], set[int]]:
        """One record per rank (the last wins); unusable numbers count as missing."""
        by_rank: dict[int, RankWindow] = {}
        bad: set[int] = set()
        for x in ranks:
            if not 0 <= x.rank < self.nranks:
                raise ValueError(f"rank {x.rank} is outside the job's ranks 0..{self.nranks - 1}")
            times = (x.gap_ms, x.coll_ms, x.step_ms)
            if all(math.isfinite(v) and v >= 0 for v in times):
                by_rank[x.rank] = x
                bad.discard(x.rank)
            else:
                bad.add(x.rank)
            if x.host:
                self._hosts[x.rank] = x.host
        return [by_rank[k] for k in sorted(by_rank)], bad

    def _island(self, x: RankWindow) -> str:
        label = x.island or x.telemetry.vendor or self._cfg_islands.get(x.rank)
        if label is None:
            label = self._island_of.get(x.rank, DEFAULT_ISLAND)
        self._island_of[x.rank] = label
        return label

    def _groups(
        self, recs: list[RankWindow], isl_id: npt.NDArray[np.int64], n_isl: int
    ) -> tuple[npt.NDArray[np.int64], list[str | None]]:
        """Group ids: the island, or island x class where hardware classes apply."""
        mode = self.settings.hardware_classes
        if mode == "off":
            return isl_id, [None] * len(recs)
        classes: list[str | None] = [
            x.hw_class or x.telemetry.gpu_model or self._cfg_classes.get(x.rank) for x in recs
        ]
        if mode == "auto":
            # Only islands whose known classes differ are split: an older
            # generation is slower by design, not faulty.
            seen: list[set[str]] = [set() for _ in range(n_isl)]
            for i, c in zip(isl_id.tolist(), classes, strict=True):
                if c is not None:
                    seen[i].add(c)
            split = [len(x) > 1 for x in seen]
            classes = [
                c if split[i] else None for i, c in zip(isl_id.tolist(), classes, strict=True)
            ]
        if all(c is None for c in classes):
            return isl_id, classes
        cls_labels = np.array(["" if c is None else c for c in classes], dtype=object)
        return scoring.group_ids(isl_id, cls_labels), classes

    def _rank_baseline(self, window: int) -> npt.NDArray[np.float64]:
        s = self.settings
        # Baselines change only while warm-up samples are fed: reuse the medians
        # (a nanmedian over every rank was a third of a window's scoring).
        key = (self._samples_version, window > s.warmup_windows)
        if self._base_cache is not None and self._base_cache[0] == key:
            return self._base_cache[1]
        cnt = self._rank_count
        ready = (cnt > 0) & ((cnt >= s.warmup_windows) | (window > s.warmup_windows))
        out = np.full(self.nranks, np.nan)
        if ready.any():
            with np.errstate(all="ignore"):
                med = np.nanmedian(self._rank_samples[ready], axis=1)
            out[ready] = med
        self._base_cache = (key, out)
        return out

    def _advance(
        self, track: _Track, window: int, bad: bool, excess: float, ctx: _Ctx
    ) -> str | None:
        state = track.observe(window, bad, self.settings)
        hours = excess * ctx.hours_per_ms
        if state == "suspect":
            track.pending_hours += hours
        elif state == "flagged":
            # The streak's cost since `since` becomes real once confirmed.
            track.hours += track.pending_hours + hours
            self._gpu_hours += track.pending_hours + hours
            track.pending_hours = 0.0
        elif state == "ongoing":
            track.hours += hours
            self._gpu_hours += hours
        return state

    def _rank_finding(
        self,
        kind: str,
        state: str,
        i: int,
        recs: list[RankWindow],
        r: npt.NDArray[np.int64],
        gap: npt.NDArray[np.float64],
        sc: scoring.Scores,
        history: npt.NDArray[np.float64],
        base: npt.NDArray[np.float64],
        isl_labels: list[str],
        gid: npt.NDArray[np.int64],
        class_of: list[str | None],
        excess: float,
        track: _Track,
        ctx: _Ctx,
    ) -> Finding:
        rank = int(r[i])
        cause: dict[str, Any] | None = None
        missing: list[str] = []
        if state != "cleared":
            if kind == "rank":
                peer_idx = np.flatnonzero(gid == gid[i])
            else:
                peer_idx = np.flatnonzero([lab == isl_labels[i] for lab in isl_labels])
            peers: list[Telemetry] = [recs[j].telemetry for j in peer_idx.tolist() if j != i]
            c = diagnose(recs[i].telemetry, peers)
            cause, missing = c.to_json(), list(c.missing)
        hours = track.pending_hours if state == "suspect" else track.hours
        evidence: dict[str, Any] = {
            "gpu_hours": hours,
            "gap_ms": float(gap[i]),
            "peers": int(sc.group_size[i]) - 1,
        }
        if recs[i].samples is not None:
            evidence["samples"] = recs[i].samples
        if kind == "rank":
            evidence["peers_gap_ms"] = _f(sc.loo_median[i])
        else:
            evidence["baseline_gap_ms"] = _f(base[i])
        if class_of[i] is not None:
            evidence["hw_class"] = class_of[i]
        return Finding(
            kind=kind,
            state=state,
            window=ctx.window,
            steps=list(ctx.steps),
            island=isl_labels[i],
            rank=rank,
            ranks=[rank],
            hosts=[self._hosts[rank]] if rank in self._hosts else [],
            since=track.since,
            ratio=_f(sc.ratio[i]),
            z=_f(sc.z[i]) if kind == "rank" else None,
            history=_f(history[i]),
            drift=None,
            excess_ms=excess,
            loss_pct=_pct(excess, ctx.step_ms),
            confidence="peers" if kind == "rank" else "history",
            signal="gap",
            basis="peers" if kind == "rank" else "history",
            missing=missing,
            evidence=evidence,
            cause=cause,
        )

    def _subject_step(
        self, kind: str, subject: str, value: float, ratio_limit: float, ctx: _Ctx
    ) -> tuple[str | None, float | None, float, _Track | None]:
        """Judge a scalar against its warm-up baseline: (state, ratio, excess, track)."""
        s = self.settings
        b = self._baselines.setdefault((kind, subject), _Baseline())
        ref = b.value(ctx.window, s)
        key = (kind, subject)
        if ref is None or not ref > 0:
            b.feed(ctx.window, value, s)
            return None, None, 0.0, None
        ratio = value / ref
        bad = ratio >= ratio_limit
        track = self._tracks.get(key)
        if track is None and not bad:
            b.feed(ctx.window, value, s)
            return None, ratio, 0.0, None
        track = self._tracks.setdefault(key, _Track(s.flag_window))
        excess = max(0.0, value - ref)
        state = self._advance(track, ctx.window, bad, excess, ctx)
        if not bad and not track.active:
            b.feed(ctx.window, value, s)
        if track.idle:
            del self._tracks[key]
        return state, ratio, excess, track

    def _island_findings(
        self,
        ctx: _Ctx,
        r: npt.NDArray[np.int64],
        gap: npt.NDArray[np.float64],
        coll: npt.NDArray[np.float64],
        isl_id: npt.NDArray[np.int64],
        isl_names: npt.NDArray[Any],
        recs: list[RankWindow],
    ) -> list[Finding]:
        s = self.settings
        out: list[Finding] = []
        n_isl = len(isl_names)
        medians = np.array([np.median(gap[isl_id == k]) for k in range(n_isl)])
        maxgap = np.array([gap[isl_id == k].max() for k in range(n_isl)])
        drifts: dict[int, float] = {}
        # Islands on separate communicators meet at a bridge between their leaders;
        # an island that arrives first waits there for the others, inside a
        # collective. Its leader's bridge time over the quickest leader's is that
        # wait, and is taken off the island's transfer time as well.
        bridge_of: dict[int, float] = {}
        for x, k in zip(recs, isl_id.tolist(), strict=True):
            if x.bridge_ms is not None and math.isfinite(x.bridge_ms) and x.bridge_ms >= 0:
                bridge_of[k] = min(bridge_of.get(k, math.inf), float(x.bridge_ms))
        bridge_min = min(bridge_of.values()) if len(bridge_of) > 1 else None
        for k in range(n_isl):
            name = str(isl_names[k])
            members = isl_id == k
            ranks_k = [int(x) for x in r[members]]
            hosts_k = sorted({self._hosts[x] for x in ranks_k if x in self._hosts})

            state, drift, excess, track = self._subject_step(
                "island", name, float(medians[k]), s.drift_ratio, ctx
            )
            if drift is not None:
                drifts[k] = drift
            if state is not None and track is not None:
                ref = self._baselines[("island", name)].value(ctx.window, s)
                out.append(
                    self._scalar_finding(
                        "island",
                        state,
                        name,
                        ranks_k,
                        hosts_k,
                        track,
                        ctx,
                        ratio=None,
                        drift=drift,
                        excess=excess,
                        signal="gap",
                        evidence={"median_gap_ms": float(medians[k]), "baseline_gap_ms": ref},
                    )
                )

            # Transfer time of the island: the last rank to arrive waits least, so
            # its time in collectives is the transfer itself. Where other islands
            # share the communicator, a rank also waits for their slowest rank by
            # (their max gap - its gap); that wait is taken off first.
            others = np.delete(maxgap, k)
            wait = np.maximum(0.0, others.max() - gap[members]) if others.size else 0.0
            transfer = float(np.min(np.maximum(0.0, coll[members] - wait)))
            if bridge_min is not None and k in bridge_of:
                transfer = max(0.0, transfer - (bridge_of[k] - bridge_min))
            state, cratio, excess, track = self._subject_step(
                "collective", name, transfer, s.collective_ratio, ctx
            )
            if state is not None and track is not None:
                ref = self._baselines[("collective", name)].value(ctx.window, s)
                out.append(
                    self._scalar_finding(
                        "collective",
                        state,
                        name,
                        ranks_k,
                        hosts_k,
                        track,
                        ctx,
                        ratio=cratio,
                        drift=None,
                        excess=excess,
                        signal="coll",
                        evidence={"transfer_ms": transfer, "baseline_transfer_ms": ref},
                    )
                )
        # An island's drift against the others' drift, when there are others.
        for f in out:
            if f.kind == "island":
                k = int(np.flatnonzero(isl_names == f.island)[0])
                rest = [d for j, d in drifts.items() if j != k]
                if rest and f.drift is not None:
                    f.ratio = f.drift / float(np.median(rest))
        return out

    def _link_findings(
        self, ctx: _Ctx, recs: list[RankWindow], isl_labels: list[str]
    ) -> list[Finding]:
        s = self.settings
        links: dict[str, list[tuple[int, float]]] = {}
        for x, own in zip(recs, isl_labels, strict=True):
            if x.bridge_ms is None or not math.isfinite(x.bridge_ms) or x.bridge_ms < 0:
                continue
            peer = self._peer_island(x.bridge_peer)
            a, b = sorted((own, peer))
            links.setdefault(f"{a}<->{b}", []).append((x.rank, x.bridge_ms))
        out: list[Finding] = []
        for name in sorted(links):
            members = links[name]
            # Like the collective signal: the leader that arrives last waits least.
            value = min(v for _, v in members)
            state, ratio, excess, track = self._subject_step("link", name, value, s.link_ratio, ctx)
            if state is not None and track is not None:
                ranks_k = sorted(rk for rk, _ in members)
                hosts_k = sorted({self._hosts[x] for x in ranks_k if x in self._hosts})
                ref = self._baselines[("link", name)].value(ctx.window, s)
                out.append(
                    self._scalar_finding(
                        "link",
                        state,
                        name,
                        ranks_k,
                        hosts_k,
                        track,
                        ctx,
                        ratio=ratio,
                        drift=None,
                        excess=excess,
                        signal="bridge",
                        evidence={"bridge_ms": value, "baseline_bridge_ms": ref},
                    )
                )
        return out

    def _peer_island(self, index: int | None) -> str:
        """Island name of a bridge peer index: config order, else order of lowest rank."""
        order = self._island_order
        if order is None:
            first: dict[str, int] = {}
            for rk, lab in self._island_of.items():
                first[lab] = min(rk, first.get(lab, rk))
            order = sorted(first, key=lambda lab: first[lab])
        if index is not None and 0 <= index < len(order):
            return order[index]
        return f"island#{index}"

    def _scalar_finding(
        self,
        kind: str,
        state: str,
        subject: str,
        ranks: list[int],
        hosts: list[str],
        track: _Track,
        ctx: _Ctx,
        *,
        ratio: float | None,
        drift: float | None,
        excess: float,
        signal: str,
        evidence: dict[str, Any],
    ) -> Finding:
        ev = {"gpu_hours": track.pending_hours if state == "suspect" else track.hours}
        ev.update(evidence)
        return Finding(
            kind=kind,
            state=state,
            window=ctx.window,
            steps=list(ctx.steps),
            island=subject,
            rank=None,
            ranks=ranks,
            hosts=hosts,
            since=track.since,
            ratio=ratio,
            z=None,
            history=None,
            drift=drift,
            excess_ms=excess,
            loss_pct=_pct(excess, ctx.step_ms),
            confidence="baseline",
            signal=signal,
            basis="baseline",
            missing=[],
            evidence=ev,
            cause=None,
        )


@dataclass(frozen=True)
class _Ctx:
    window: int
    steps: list[int]
    step_ms: float
    hours_per_ms: float


def _f(v: Any) -> float | None:
    x = float(v)
    return x if math.isfinite(x) else None


def _pct(excess: float, step_ms: float) -> float | None:
    return 100.0 * excess / step_ms if step_ms > 0 else None


def _per_sample_scale(recs: Sequence[RankWindow]) -> npt.NDArray[np.float64] | None:
    """mean(samples) / samples per rank when every rank reported its samples and
    they differ (a rebalance plan is in force); None otherwise."""
    samples = [x.samples for x in recs]
    if any(n is None or n <= 0 for n in samples) or len(set(samples)) < 2:
        return None
    arr = np.array(samples, dtype=np.float64)
    return np.asarray(arr.mean() / arr, dtype=np.float64)
