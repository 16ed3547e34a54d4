"""`LocalShell`: the shell without a daemon, for one job scored in the caller's process.

The same job table (detect/jobs.py) and sinks (coordinator/sinks.py) the
coordinator daemon drives, fed directly: no agents, no journal, no saved state,
so no intents and nothing to replay. `artemis.job.Detector` runs one on its
rank 0 (the ranks' summaries come over its side channel), the simulator's
in-process path (sim/inproc.py) one per scenario; the caller passes
`now` (monotonic) and the shell reads the wall time for the incident records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from artemis.coordinator.sinks import Sinks
from artemis.detect.assembly import AssembledWindow, WindowAssembler
from artemis.detect.detector import LATE_WINDOWS, Detector
from artemis.detect.jobs import JobTable
from artemis.detect.monitor import MonitorOutput
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import RankWindow


class LocalShell:
    """One job of `nranks` ranks (0..nranks-1, all known from the start), scored as its
    windows come in, written through `sinks`."""

    def __init__(
        self,
        job: str,
        run: str,
        nranks: int,
        settings: Settings,
        sinks: Sinks,
        *,
        deadline_s: float = 10.0,
        wall: Callable[[], float] = time.time,
        detector: type[Detector] = Detector,
    ) -> None:
        self.job = job
        # Every rank is known from the start: no grace for late announcements.
        self.assembler = WindowAssembler(
            deadline_s=deadline_s, grace_s=0.0, late_windows=LATE_WINDOWS
        )
        self.jobs = JobTable(settings, self.assembler, detector=detector)
        self.sinks = sinks
        self.wall = wall
        self.monitor = self.jobs.monitor(job, run)
        self.monitor.expect(range(nranks))
        self.assembler.expect(job, range(nranks))
        self.sinks.write_job(job, {"run": run, "ranks": nranks, "ended": None})

    def add(self, windows: WindowColumns | Iterable[RankWindow], now: float) -> list[MonitorOutput]:
        """Summaries in: the outputs of every window they completed (or released)."""
        return self._score_all(self.assembler.add(windows, now))

    def expire(self, now: float) -> list[MonitorOutput]:
        """Windows whose deadline passed are scored with their absent ranks missing."""
        return self._score_all(self.assembler.expire(now))

    def close(self) -> MonitorOutput:
        """The job's end: what is still pending scored (partial by nature: an absent
        rank there is not evidence it went missing), its incidents closed, the sinks
        closed. Returns the end's own outputs."""
        self._score_all(self.assembler.flush(), final=True)
        m = self.monitor
        end = m.finish(self.wall())
        self.sinks.write(self.job, end)
        self.sinks.write_job(self.job, self.jobs.job_row(self.job, time.time(), ended=True))
        self.sinks.commit(self.job, None)
        self.sinks.close()
        return end

    @property
    def last_window(self) -> int:
        return self.monitor.last_window

    def _score_all(self, released: list[AssembledWindow], final: bool = False) -> list[Any]:
        out = [self._score(aw, final) for aw in released]
        self.assembler.take_drops()  # counted in the assembler; nobody scrapes them here
        return [o for o in out if o is not None]

    def _score(self, aw: AssembledWindow, final: bool) -> MonitorOutput | None:
        if self.jobs.run_of(aw) != "current":
            return None  # one run in-process: another communicator is not this job's
        m = self.monitor
        m.resize(self.assembler.nranks(aw.job))
        if aw.late:
            out, _late = m.on_late(aw.window, aw.columns, wall=self.wall())
            self.sinks.write(aw.job, out)
        else:
            t0 = time.perf_counter()
            out = m.on_window(aw.window, aw.columns, aw.missing, final=final, wall=self.wall())
            if out.result is None:
                return None  # scored already
            dt = time.perf_counter() - t0
            self.sinks.write_job(aw.job, self.jobs.job_row(aw.job, time.time()))
            self.sinks.write(aw.job, out, scored_s=dt)
        self.sinks.commit(aw.job, None)  # nothing saved in-process: the group ends here
        return out
