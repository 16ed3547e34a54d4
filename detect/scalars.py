"""The scalar kinds: an island's drift, its collectives' transfer time, a bridge link.

Each is one number per window (a median gap, a transfer time, a bridge time)
judged against its own warm-up value (`ScalarBaseline`); in adaptive mode the
limit also rises above the scalar's own recent noise, and a scalar that has
shown a tail needs a second window in a row (DETECTOR.md, SCALAR_HISTORY).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from artemis.detect import findings as F
from artemis.detect import scoring
from artemis.detect.arrays import F64, I64, pct
from artemis.detect.findings import Finding
from artemis.detect.lifecycle import Ledger, Track
from artemis.detect.settings import Settings
from artemis.detect.tuning import (
    SCALAR_HISTORY,
    SCALAR_LINEAR,
    SCALAR_SD_FLOOR,
    SCALAR_SMALL,
    SCALAR_Z,
)
from artemis.detect.view import Ctx, Roster, View, nic


class ScalarBaseline:
    """Warm-up baseline of one scalar: median of its first healthy windows after window 0;
    `recent` holds its last SCALAR_HISTORY healthy values, for its noise (adaptive)."""

    __slots__ = ("last_above", "needs_two", "recent", "run_start", "samples")

    def __init__(
        self,
        samples: Sequence[float] = (),
        recent: Sequence[float] | None = None,
        tail: Sequence[int] = (-(10**9), -(10**9), 0),
    ) -> None:
        self.samples: list[float] = [float(x) for x in samples]
        self.recent: list[float] = [float(x) for x in (self.samples if recent is None else recent)]
        # the tail rule (adaptive): last window over the limit, start of the current
        # run of such windows, and whether that run needs a second window to be bad
        self.last_above, self.run_start, self.needs_two = (int(x) for x in tail)

    def tail(self) -> list[int]:
        return [self.last_above, self.run_start, self.needs_two]

    def excursion(self, window: int, above: bool) -> bool:
        """Whether an over-limit window is bad under the tail rule (see SCALAR_HISTORY)."""
        if not above:
            return False
        if self.last_above != window - 1:  # a new run: was there one recently?
            self.needs_two = int(window - self.last_above <= SCALAR_HISTORY)
            self.run_start = window
        self.last_above = window
        return not self.needs_two or window > self.run_start

    def sd(self, ref: float, linear: bool = False) -> float | None:
        """Robust sd of log(value / ref) (`linear`: of value / ref - 1) over the recent
        healthy values, widened for their number (None with fewer than 3)."""
        n = len(self.recent)
        if n < 3:
            return None
        x = np.asarray(self.recent) / ref if ref > 0 else np.ones(n)
        d = x - 1.0 if linear else np.log(x)
        sd = scoring.MAD_SCALE * float(np.median(np.abs(d - np.median(d))))
        return max(SCALAR_SD_FLOOR, sd) * (1.0 + SCALAR_SMALL / math.sqrt(n))

    def value(self, window: int, s: Settings) -> float | None:
        n = len(self.samples)
        if n and (n >= s.warmup_windows or window > s.warmup_windows):
            return float(np.median(self.samples))
        return None

    def feed(self, window: int, x: float, s: Settings) -> None:
        if window >= 1 and math.isfinite(x):
            if len(self.samples) < s.warmup_windows:
                self.samples.append(x)
            if x > 0:
                self.recent.append(x)
                del self.recent[:-SCALAR_HISTORY]


# Per kind: the evidence keys of its value this window and of its baseline.
EVIDENCE_KEYS = {
    "island": ("median_gap_ms", "baseline_gap_ms"),
    "collective": ("transfer_ms", "baseline_transfer_ms"),
    "link": ("bridge_ms", "baseline_bridge_ms"),
}


class Step(NamedTuple):
    """One scalar judged in one window."""

    kind: str
    subject: str
    value: float
    state: str | None  # the state it reports (None: nothing to report)
    ratio: float | None  # value / its baseline (None: no baseline yet)
    excess: float  # ms over its baseline
    track: Track | None


class ScalarRule:
    """The scalar kinds of one job: their baselines, judged window by window; their
    tracks live in the job's `Ledger`, beside the ranks'."""

    def __init__(self, job: str, ledger: Ledger, roster: Roster) -> None:
        self.job = job
        self.ledger = ledger
        self.roster = roster
        self.baselines: dict[tuple[str, str], ScalarBaseline] = {}

    def step(
        self,
        kind: str,
        subject: str,
        value: float,
        ratio_limit: float,
        ctx: Ctx,
        s: Settings,
        hidden_ms: float | None = None,
    ) -> Step:
        """Judge a scalar against its warm-up baseline. `hidden_ms`: how much of its
        excess costs nothing now (an island's own ranks' wait for its held ones): an
        excess within it is not bad, and no healthy sample either."""
        b = self.baselines.setdefault((kind, subject), ScalarBaseline())
        ref = b.value(ctx.window, s)
        key = (kind, subject)
        if ref is None or not ref > 0:
            b.feed(ctx.window, value, s)
            return Step(kind, subject, value, None, None, 0.0, None)
        hidden = hidden_ms is not None and value - ref <= hidden_ms
        ratio = value / ref
        linear = kind in SCALAR_LINEAR
        sd = b.sd(ref, linear) if s.mode == "adaptive" else None
        if sd is not None:
            # A scalar that is noisy by nature (the transfer time of short windows:
            # a minimum of per-rank medians) gets a limit above its own spread; the
            # seed's ratio stays the floor, so this never flags more. (A bridge's
            # noise adds milliseconds: judged on its linear scale, tuning.SCALAR_LINEAR.)
            spread = 1.0 + SCALAR_Z * sd if linear else math.exp(SCALAR_Z * sd)
            ratio_limit = max(ratio_limit, spread)
        above = ratio >= ratio_limit and not hidden
        bad = b.excursion(ctx.window, above) if s.mode == "adaptive" else above
        track = self.ledger.tracks.get(key)
        if track is None and not bad:
            # (an excursion the tail rule let pass is no healthy sample)
            if not above and not hidden:
                b.feed(ctx.window, value, s)
            return Step(kind, subject, value, None, ratio, 0.0, None)
        track = self.ledger.track(key, s.flag_window)
        excess = max(0.0, value - ref)
        state = self.ledger.advance(track, ctx.window, bad, excess, ctx.hours_per_ms, s)
        if not above and not hidden and not track.active:
            b.feed(ctx.window, value, s)
        self.ledger.forget_idle(key, track)
        return Step(kind, subject, value, state, ratio, excess, track)

    def _report(
        self,
        st: Step,
        members: npt.NDArray[np.bool_] | I64,
        v: View,
        ctx: Ctx,
        s: Settings,
        ratio: float | None,
    ) -> list[Finding]:
        """The finding of a judged scalar, if its window reports one (else none)."""
        if st.state is None or st.track is None:
            return []
        track, excess = st.track, st.excess
        ranks = sorted(int(x) for x in v.r[members])
        hosts = sorted({str(h) for h in self.roster.host[ranks] if h is not None}) if ranks else []
        value_key, ref_key = EVIDENCE_KEYS[st.kind]
        ev = {
            "gpu_hours": track.pending_hours if st.state == "suspect" else track.hours,
            value_key: st.value,
            ref_key: self.baselines[(st.kind, st.subject)].value(ctx.window, s),
        }
        if st.kind != "island":  # port errors point at a link or an island's network
            ev.update(nic(v, members))
        return [
            F.scalar_finding(
                st.kind,
                job=self.job,
                state=st.state,
                window=ctx.window,
                steps=ctx.steps,
                subject=st.subject,
                ranks=ranks,
                hosts=hosts,
                since=track.since,
                excess_ms=excess,
                loss_pct=pct(excess, ctx.step_ms),
                ratio=ratio,
                drift=st.ratio if st.kind == "island" else None,
                evidence=ev,
            )
        ]

    def island_findings(
        self,
        ctx: Ctx,
        v: View,
        s: Settings,
        judge_transfer: bool = True,
        held: npt.NDArray[np.bool_] | None = None,
    ) -> list[Finding]:
        """Island drift, and (`judge_transfer`) the island's transfer time (collective).
        `held`: the ranks the rank rule holds out (bad or flagged in this window)."""
        out: list[Finding] = []
        n_isl = len(v.isl_names)
        gap, coll = v.actual, v.coll
        # The drift is the island's own: its ranks that the rank rule judged slow against
        # their peers are already their own findings, and are left out of its median
        # (all of them where every rank is held). Its median is robust to one straggler,
        # not to two of four (a CPU hog on a core two ranks share: the quiet real-job
        # grid's `island` false flag) nor to any share a rule already named.
        maxgap = np.array([gap[v.isl_id == k].max() for k in range(n_isl)])
        # Islands on separate communicators meet at a bridge between their leaders;
        # every rank of an island waits inside a collective while its leader is on
        # the bridge (waiting for the other islands, then the transfer). That time
        # is the link's signal, not the island's transfer: it is taken off, so a
        # slow link is a `link` finding and not a `collective` one as well.
        bridge_of: dict[int, float] = {}
        bridge = v.bridge
        for i in v.leaders.tolist():
            k = int(v.isl_id[i])
            bridge_of[k] = min(bridge_of.get(k, math.inf), float(bridge[i]))
        bridged = len(bridge_of) > 1
        drifts: list[Step] = []
        for k in range(n_isl):
            name = str(v.isl_names[k])
            members = v.isl_id == k
            own = _own(members, held)
            drift = float(np.median(gap[own]))
            hidden = _hidden(members, own, coll)
            drifts.append(self.step("island", name, drift, s.drift_ratio, ctx, s, hidden))
            if not judge_transfer:
                continue
            # Transfer time of the island: the last rank to arrive waits least, so
            # its time in collectives is the transfer itself. Where other islands
            # share the communicator, a rank also waits for their slowest rank by
            # (their max gap - its gap); that wait is taken off first.
            others = np.delete(maxgap, k)
            wait = np.maximum(0.0, others.max() - gap[members]) if others.size else 0.0
            transfer = float(np.min(np.maximum(0.0, coll[members] - wait)))
            if bridged and k in bridge_of:
                transfer = max(0.0, transfer - bridge_of[k])
            st = self.step("collective", name, transfer, s.collective_ratio, ctx, s)
            out += self._report(st, members, v, ctx, s, st.ratio)
        # An island's ratio is its drift against the others' drift, when there are others.
        for k, st in enumerate(drifts):
            rest = [d.ratio for j, d in enumerate(drifts) if j != k and d.ratio is not None]
            ratio = st.ratio / float(np.median(rest)) if rest and st.ratio is not None else None
            out += self._report(st, v.isl_id == k, v, ctx, s, ratio)
        return out

    def link_findings(self, ctx: Ctx, v: View, s: Settings) -> list[Finding]:
        rows = v.leaders
        if rows.size == 0:
            return []
        bridge = v.bridge
        peer = v.cols.floats("bridge_peer")[v.row]
        links: dict[str, list[int]] = {}
        for i in rows.tolist():
            p = peer[i]
            other = self.roster.peer_island(None if math.isnan(p) else int(p))
            a, b = sorted((str(v.isl_labels[i]), other))
            links.setdefault(f"{a}<->{b}", []).append(i)
        out: list[Finding] = []
        for name in sorted(links):
            members = np.array(links[name], dtype=np.int64)
            # Like the collective signal: the leader that arrives last waits least.
            value = float(bridge[members].min())
            st = self.step("link", name, value, s.link_ratio, ctx, s)
            out += self._report(st, members, v, ctx, s, st.ratio)
        return out


def _hidden(members: npt.NDArray[np.bool_], own: npt.NDArray[np.bool_], coll: F64) -> float | None:
    """How long an island's own ranks (`_own`: less the held ones) wait a step for the
    rest: their median time in collectives over the last arrival's (the transfer).
    While its held ranks are slower, the island's drift is hidden inside that wait
    and costs the job nothing (None: no rank of it held, or all of them)."""
    if own is members or np.array_equal(own, members):
        return None
    return float(np.median(coll[own]) - coll[members].min())


def _own(
    members: npt.NDArray[np.bool_], held: npt.NDArray[np.bool_] | None
) -> npt.NDArray[np.bool_]:
    """An island's members less the held ones (all of them where none would be left)."""
    if held is None:
        return members
    rest = members & ~held
    return rest if rest.any() else members
