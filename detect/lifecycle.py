"""The life of one finding: its phases, the one transition table, and its cost.

A subject (a rank, an island, a link) of one kind is judged bad or good each
window; its `Track` remembers the verdicts and moves through three phases. The
table says, for each phase and what this window made of it, the next phase and
the state the window reports (DESIGN.md's finding states; None: no report):

    QUIET ──bad──> SUSPECT ──(flag_after of flag_window bad)──> ACTIVE ──> QUIET
      │              │  └──(good, bad ones still remembered)        (cleared after
      │              └──(good, none left: it fades)──> QUIET         clear_after good)
      └──(flag_after = 1)──────────────────────────────> ACTIVE

A rank bad by a measurement (the host's evidence) in MEASURED_FLAG_AFTER windows in
a row confirms as flag_after of flag_window do (`measured`: tuning.py says why).

A suspicion that never reaches flagged simply fades. The intermittent rule (a
GPU that comes and goes) confirms on flag_window bad of the last 2 x flag_window
and then needs twice as many good windows to clear, as does an episode of recurring
stalls (`stalls`, set by the rank rule). The phase is read from the
track's memory (never stored), so the saved snapshot keeps its old form.

`Ledger` holds every track of a job and the GPU-hours they cost: a suspect's
cost counts once (and from its first window) when it is confirmed.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from artemis.detect.settings import Settings
from artemis.detect.state import TrackState, plain, read
from artemis.detect.tuning import MEASURED_FLAG_AFTER


class Phase(str, enum.Enum):
    QUIET = "quiet"  # nothing bad remembered
    SUSPECT = "suspect"  # bad windows remembered, not (yet) confirmed
    ACTIVE = "active"  # confirmed: flagged, then ongoing until it clears


class Event(str, enum.Enum):
    """What one window's verdict makes of a track (from its phase and its memory)."""

    BAD = "bad"  # a bad window that confirms nothing (yet), or one while active
    CONFIRMED = "confirmed"  # flag_after bad in the last flag_window
    INTERMITTENT = "intermittent"  # flag_window bad in the last 2 x flag_window
    GOOD = "good"  # a good window with bad ones still remembered, or while active
    FADED = "faded"  # a good window that leaves nothing bad remembered
    RECOVERED = "recovered"  # clear_after good windows in a row (twice, intermittent)


# (phase, event) -> (next phase, the state reported). A pair not listed cannot happen.
TRANSITIONS: dict[tuple[Phase, Event], tuple[Phase, str | None]] = {
    (Phase.QUIET, Event.BAD): (Phase.SUSPECT, "suspect"),
    (Phase.QUIET, Event.CONFIRMED): (Phase.ACTIVE, "flagged"),
    (Phase.QUIET, Event.INTERMITTENT): (Phase.ACTIVE, "flagged"),
    (Phase.QUIET, Event.FADED): (Phase.QUIET, None),
    (Phase.SUSPECT, Event.BAD): (Phase.SUSPECT, "suspect"),
    (Phase.SUSPECT, Event.CONFIRMED): (Phase.ACTIVE, "flagged"),
    (Phase.SUSPECT, Event.INTERMITTENT): (Phase.ACTIVE, "flagged"),
    (Phase.SUSPECT, Event.GOOD): (Phase.SUSPECT, None),
    (Phase.SUSPECT, Event.FADED): (Phase.QUIET, None),
    (Phase.ACTIVE, Event.BAD): (Phase.ACTIVE, "ongoing"),
    (Phase.ACTIVE, Event.GOOD): (Phase.ACTIVE, "ongoing"),
    (Phase.ACTIVE, Event.RECOVERED): (Phase.QUIET, "cleared"),
}

# A bad window out of QUIET starts a new streak: `since` and the pending cost restart.
_STARTS = frozenset({Event.BAD, Event.CONFIRMED, Event.INTERMITTENT})


class Track:
    """Persistence of one subject (a rank, an island, a link) for one kind."""

    __slots__ = (
        "active",
        "good_run",
        "hours",
        "intermittent",
        "long",
        "measured",
        "pending_hours",
        "recent",
        "since",
        "stalls",
    )

    def __init__(self, flag_window: int) -> None:
        self.recent: deque[bool] = deque(maxlen=flag_window)
        # Twice as long: an intermittent fault (slow in half of its windows) rarely
        # makes flag_after of flag_window, but does make flag_window of these.
        self.long: deque[bool] = deque(maxlen=2 * flag_window)
        self.intermittent = False
        # an episode whose slowness came as stalls in some steps (rank_rule.stall_shape):
        # how many stall in a window is luck, so it clears as an intermittent one does
        self.stalls = False
        # windows in a row bad by a measurement (the host's evidence) while not active
        self.measured = 0
        self.active = False
        self.since: int | None = None
        self.good_run = 0
        self.pending_hours = 0.0  # cost while suspect; counts once confirmed
        self.hours = 0.0  # confirmed cost of this finding

    def phase(self, intermittent_rule: bool) -> Phase:
        if self.active:
            return Phase.ACTIVE
        # the streak (and `since`) lasts while the intermittent rule still remembers it
        if any(self.recent) or (intermittent_rule and any(self.long)):
            return Phase.SUSPECT
        return Phase.QUIET

    def observe(
        self,
        window: int,
        bad: bool,
        s: Settings,
        intermittent_rule: bool = False,
        measured: bool = False,
    ) -> str | None:
        """Take one window's verdict (``measured``: bad by a measurement, not by timing);
        the state it reports (None: nothing to report)."""
        phase = self.phase(intermittent_rule)
        self.long.append(bad)
        if self.active:
            self.good_run = 0 if bad else self.good_run + 1
        else:
            self.recent.append(bad)
            self.measured = self.measured + 1 if bad and measured else 0
        event = self._event(bad, s, intermittent_rule)
        nxt, state = TRANSITIONS[(phase, event)]
        if phase is Phase.QUIET and event in _STARTS:
            self.since = window
            self.pending_hours = 0.0
        if nxt is Phase.ACTIVE and phase is not Phase.ACTIVE:
            self.active = True
            self.good_run = 0
            if event is Event.INTERMITTENT:
                self.intermittent = True
        elif event is Event.RECOVERED:
            self.active = False
            self.intermittent = False
            self.stalls = False
            self.measured = 0
            self.recent.clear()
            self.long.clear()
        elif event is Event.FADED:
            self.stalls = False
            self.since = None
            self.pending_hours = 0.0
        return state

    def _event(self, bad: bool, s: Settings, intermittent_rule: bool) -> Event:
        """This window's event, from the memory it was just added to."""
        if self.active:
            if bad:
                return Event.BAD
            # An intermittent fault, or recurring stalls, has good runs by nature: it
            # clears only after twice as many good windows.
            if self.good_run >= s.clear_after * (2 if self.intermittent or self.stalls else 1):
                return Event.RECOVERED
            return Event.GOOD
        if bad:
            if sum(self.recent) >= s.flag_after or self.measured >= min(
                MEASURED_FLAG_AFTER, s.flag_after
            ):
                return Event.CONFIRMED
            if intermittent_rule and sum(self.long) >= s.flag_window:
                return Event.INTERMITTENT
            return Event.BAD
        if not any(self.recent) and not (intermittent_rule and any(self.long)):
            return Event.FADED
        return Event.GOOD

    @property
    def idle(self) -> bool:
        return not self.active and not any(self.recent) and not any(self.long)

    def resize(self, flag_window: int) -> None:
        self.recent = deque(self.recent, maxlen=flag_window)
        self.long = deque(self.long, maxlen=2 * flag_window)

    def state(self) -> TrackState:
        return TrackState(
            recent=list(self.recent),
            long=list(self.long),
            intermittent=self.intermittent,
            stalls=self.stalls,
            measured=self.measured,
            active=self.active,
            since=self.since,
            good_run=self.good_run,
            pending_hours=self.pending_hours,
            hours=self.hours,
        )

    def snapshot(self) -> dict[str, Any]:
        return plain(self.state())

    @classmethod
    def restore(cls, state: Mapping[str, Any] | TrackState, flag_window: int) -> Track:
        s = read(state, TrackState)
        t = cls(flag_window)
        t.recent.extend(s.recent)
        t.long.extend(s.recent if s.long is None else s.long)
        t.intermittent = s.intermittent
        t.stalls = s.stalls
        t.measured = s.measured
        t.active = s.active
        t.since = s.since
        t.good_run = s.good_run
        t.pending_hours = s.pending_hours
        t.hours = s.hours
        return t


class Ledger:
    """Every track of one job, by (kind, subject), and the GPU-hours they cost."""

    def __init__(self) -> None:
        self.tracks: dict[tuple[str, str], Track] = {}
        self.gpu_hours = 0.0

    def track(self, key: tuple[str, str], flag_window: int) -> Track:
        return self.tracks.setdefault(key, Track(flag_window))

    def forget_idle(self, key: tuple[str, str], track: Track) -> None:
        if track.idle:
            del self.tracks[key]

    def advance(
        self,
        track: Track,
        window: int,
        bad: bool,
        excess: float,
        hours_per_ms: float,
        s: Settings,
        intermittent_rule: bool = False,
        measured: bool = False,
    ) -> str | None:
        """One window's verdict on a track (``measured``: bad by a measurement), and
        what it cost (excess ms per step)."""
        state = track.observe(window, bad, s, intermittent_rule, measured)
        hours = excess * hours_per_ms
        if state == "suspect":
            track.pending_hours += hours
        elif state == "flagged":
            # The streak's cost since `since` becomes real once confirmed.
            track.hours += track.pending_hours + hours
            self.gpu_hours += track.pending_hours + hours
            track.pending_hours = 0.0
        elif state == "ongoing":
            track.hours += hours
            self.gpu_hours += hours
        return state

    def active(self) -> list[tuple[str, str]]:
        return sorted(k for k, t in self.tracks.items() if t.active)

    def resize(self, flag_window: int) -> None:
        for t in self.tracks.values():
            t.resize(flag_window)

    def state(self) -> list[tuple[str, str, TrackState]]:
        return [(k, s, t.state()) for (k, s), t in self.tracks.items()]

    def snapshot(self) -> list[list[Any]]:
        return [[k, s, t.snapshot()] for (k, s), t in self.tracks.items()]

    def restore(
        self, tracks: Sequence[tuple[str, str, TrackState]], gpu_hours: float, flag_window: int
    ) -> None:
        self.tracks = {(k, s): Track.restore(t, flag_window) for k, s, t in tracks}
        self.gpu_hours = float(gpu_hours)
