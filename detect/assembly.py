"""Window assembly: gather every rank's summary of a window, or give up at a deadline.

Pure: the caller passes `now` (a monotonic reading), so the rules are tested
without clocks. Summaries come in as columns (`WindowColumns`, one node's
batch) and leave as columns, one `AssembledWindow` per (job, run, window); the
work is numpy per batch, never Python per rank.

A job's window is complete when every rank the job's agents announced has
reported it; otherwise, `deadline_s` after its first summary arrived, it is
released with the absent ranks listed as missing. Windows of a job leave in
order. Duplicates (an agent resending after a reconnect) are ignored:
assembly is idempotent on (job, comm, rank, window).

**Runs.** A window's identity is (job, run, window). A job id may be reused by
a new run of the training (`ARTEMIS_JOB` set by hand, a requeued scheduler
job), which numbers its windows from 0 again. The run is told by the
communicator hash (`comm`) every summary carries, which every rank of a
communicator shares and which changes each run (NCCL derives it from the
run's unique id). A job's run is the set of communicators seen with it. A
summary from a communicator the run has not seen, for a window the run
already scored, from a rank that already has a primary communicator at least
as large, starts a new run: the old run's pending windows are released first.
Otherwise an unseen communicator joins the run (an island's communicator, a
late agent). Summaries for an older run are dropped, counted per reason
(`dropped`) and listed in `drops` for the caller to log.

**Late summaries.** A window released at its deadline with ranks missing keeps
the list of those ranks for `late_windows` windows (detect/DETECTOR.md
"Late summaries"). A summary of one of them that comes after (a partitioned
node's backlog) is not dropped: it joins a *late part* of that window, which
leaves like a window, in order, as soon as every rank still missing reported
or at its own deadline, with `late = True`; the caller scores it against the
window's own peers (`JobMonitor.on_late`). Every summary that came after its
window was released is counted (`late`); those of ranks the window had (a
resend) or of a window no longer kept are dropped as `late`.

A rank may take part in several communicators (data, tensor, pipeline
parallel). The detector judges each rank on one of them: its largest (ties:
the lowest communicator hash), which in data-parallel training is the one
whose all-reduce ends every step. The agent measures that row's `gap_ms`
across all of the rank's communicators (time inside none of its collectives,
agent/summary.py `feed_nested`), so a rank waiting inside its tensor-parallel
group's collectives for a slow partner shows no extra compute. Rows of a
smaller communicator of ranks already judged on a larger one are ignored
(`secondary`), neither scored nor counted as drops.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from artemis.detect.pending_rows import PendingRows
from artemis.detect.state import AssemblyState, plain, read
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import RankWindow

I64 = npt.NDArray[np.int64]
OBJ = npt.NDArray[np.object_]

DROP_REASONS = ("late", "old_run")


@dataclass
class AssembledWindow:
    job: str
    run: str
    window: int
    columns: WindowColumns  # one row per rank, sorted by rank
    missing: list[int]  # expected ranks that did not report in time
    complete: bool
    late: bool = False  # a late part: ranks missing when the window was released

    @property
    def ranks(self) -> list[RankWindow]:
        """The rows as records (tests and tools; the core reads `columns`)."""
        return self.columns.rows()


@dataclass(frozen=True)
class Drop:
    """Summaries dropped from one batch: what the caller logs."""

    job: str
    run: str
    window: int
    comm: str
    rows: int
    reason: str  # one of DROP_REASONS


@dataclass
class _Pending:
    first_seen: float
    # The parts' rows, copied in as they come (each part's own arrays let go of at once).
    rows: PendingRows = field(default_factory=lambda: PendingRows(0))
    codes: list[int] = field(default_factory=list)  # each part's communicator (_Job.code)
    seen: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # the communicator (code) of each seen rank's row: a row of another one is no duplicate
    seen_code: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    count: int = 0  # ranks with a row
    late: I64 | None = None  # a late part: the ranks the released window still misses


@dataclass
class _Job:
    run: str = ""  # the current run ("" until the first summary)
    run_of: dict[str, str] = field(default_factory=dict)  # comm -> run
    front: int = -1  # the current run's highest released window
    ended: bool = False  # forget_job: the next unseen communicator starts a run
    expected: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=bool))
    n_expected: int = 0
    # Primary communicator per rank of the current run: (-nranks, comm); 0/"" = none yet.
    prim_n: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    prim_comm: OBJ = field(default_factory=lambda: np.empty(0, dtype=object))
    # The same as small integers (code of a comm, 0 = none), so the usual batch (every
    # rank already primary on its communicator) is told by one integer comparison.
    prim_code: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    codes: dict[str, int] = field(default_factory=dict)
    order: list[tuple[str, int]] = field(default_factory=list)  # heap of pending (run, window)
    # released windows, ordered, bounded: the ranks each still misses (recent ones only)
    released: dict[tuple[str, int], I64 | None] = field(default_factory=dict)
    open_late: set[tuple[str, int]] = field(default_factory=set)  # those with a list
    # Restored with its expected ranks (a restart, a fleet takeover): they are known,
    # so the grace for late announcements does not hold its windows back.
    settled: bool = False

    def grow(self, n: int) -> None:
        if n > self.prim_n.size:
            extra = n - self.prim_n.size
            self.prim_n = np.concatenate([self.prim_n, np.zeros(extra, dtype=np.int64)])
            self.prim_comm = np.concatenate([self.prim_comm, np.full(extra, "", dtype=object)])
            self.prim_code = np.concatenate([self.prim_code, np.zeros(extra, dtype=np.int64)])
        if n > self.expected.size:
            self.expected = np.concatenate([self.expected, np.zeros(n - self.expected.size, bool)])

    def code(self, comm: str) -> int:
        c = self.codes.get(comm)
        if c is None:
            c = self.codes[comm] = len(self.codes) + 1
        return c

    def recode(self) -> None:
        """prim_code from prim_comm (after a restore)."""
        self.prim_code = np.fromiter(
            (self.code(c) if c else 0 for c in self.prim_comm.tolist()),
            dtype=np.int64,
            count=self.prim_comm.size,
        )

    def expect(self, ranks: I64, top: int | None = None) -> None:
        if ranks.size:
            self.grow((int(ranks.max()) if top is None else top) + 1)
            new = ranks[~self.expected[ranks]]
            if new.size:
                self.expected[new] = True
                self.n_expected += int(np.unique(new).size)


class WindowAssembler:
    """`grace_s` (default: the deadline) after the first summary arrives, no window
    counts as complete: a coordinator that just (re)started knows only the ranks
    of the agents that reconnected so far, and must not call a window complete
    before the others had a chance to announce theirs. A job whose state was
    restored (`restore`) knows its ranks from it: its windows are complete as soon
    as every one of them is in (the journal's rows and the agents' resends), which
    is what makes a fleet takeover cost the lease and not the lease plus a grace."""

    def __init__(
        self,
        deadline_s: float = 5.0,
        keep_released: int = 4096,
        grace_s: float | None = None,
        late_windows: int = 256,
    ) -> None:
        self.deadline_s = deadline_s
        # how far behind the run's newest released window a late summary is still taken
        # (the detector keeps its peers as long: detector.LATE_WINDOWS)
        self.late_windows = late_windows
        self.grace_s = deadline_s if grace_s is None else grace_s
        self._born: float | None = None
        self._jobs: dict[str, _Job] = {}
        self._pending: dict[tuple[str, str, int], _Pending] = {}
        self._keep = keep_released
        self.dropped: Counter[tuple[str, str]] = Counter()  # (job, reason) -> summaries
        self.drops: list[Drop] = []  # since the caller last took them (take_drops)
        self.duplicates = 0
        self.secondary = 0  # rows of communicators smaller than their ranks' primary
        # summaries that came after their window was released (scored late or dropped)
        self.late_rows: Counter[str] = Counter()

    # -- jobs ---------------------------------------------------------------

    def _job(self, job: str) -> _Job:
        j = self._jobs.get(job)
        if j is None:
            j = self._jobs[job] = _Job()
        return j

    def expect(self, job: str, ranks: Iterable[int]) -> None:
        """Ranks an agent announced for a job; they stay expected for the job's life."""
        self._job(job).expect(np.fromiter(ranks, dtype=np.int64))

    def expected(self, job: str) -> set[int]:
        j = self._jobs.get(job)
        return set(np.flatnonzero(j.expected).tolist()) if j else set()

    def nranks(self, job: str) -> int:
        """One past the highest rank the job is known to have (announced or reported)."""
        j = self._jobs.get(job)
        return int(j.expected.size) if j else 0

    def run(self, job: str) -> str:
        """The job's current run ("" before its first summary)."""
        j = self._jobs.get(job)
        return j.run if j else ""

    def forget_job(self, job: str) -> None:
        """The job ended: drop its pending windows, expected ranks and primaries. Its
        runs and released windows are kept, so a late resend is still known as one."""
        j = self._jobs.get(job)
        if j is None:
            return
        for run, w in j.order:
            self._pending.pop((job, run, w), None)
        j.order = []
        j.ended = True
        j.expected = np.zeros(0, dtype=bool)
        j.n_expected = 0
        j.settled = False
        j.prim_n = np.zeros(0, dtype=np.int64)
        j.prim_comm = np.empty(0, dtype=object)
        j.prim_code = np.zeros(0, dtype=np.int64)

    def drop_job(self, job: str) -> None:
        """Everything of a job, its runs and released windows too: a fleet coordinator
        that stops serving it restores what it knows of it later from the store alone
        (a window it released but never committed must be taken from the journal)."""
        self.forget_job(job)
        self._jobs.pop(job, None)

    def primary_comm(self, job: str, rank: int) -> str | None:
        """The communicator a rank is judged on (None until it reported a window)."""
        j = self._jobs.get(job)
        if j is None or rank >= j.prim_n.size or j.prim_n[rank] == 0:
            return None
        return str(j.prim_comm[rank])

    def oldest_pending(self, job: str) -> int | None:
        """The lowest window of `job` still being assembled (None: none), for the fleet's
        journal in the store (what is below it was scored)."""
        j = self._jobs.get(job)
        return min((w for _run, w in j.order), default=None) if j is not None else None

    def take_drops(self) -> list[Drop]:
        out, self.drops = self.drops, []
        return out

    # -- journal and restart ------------------------------------------------

    def pending_windows(self) -> WindowColumns:
        """Every summary still being assembled (for the journal)."""
        return WindowColumns.concat(p.rows.columns() for p in self._pending.values())

    def released_marks(self) -> list[tuple[str, int, list[str], list[int]]]:
        """(job, window, communicators of its run, ranks it still misses) of the windows
        released most recently (bounded per job), for the journal."""
        out: list[tuple[str, int, list[str], list[int]]] = []
        for job, j in self._jobs.items():
            comms: dict[str, list[str]] = {}
            for c, run in j.run_of.items():
                comms.setdefault(run, []).append(c)
            out.extend(
                (job, w, sorted(comms.get(run, [run])), [] if m is None else m.tolist())
                for (run, w), m in j.released.items()
            )
        return out

    def still_missing(self, job: str, run: str, window: int) -> list[int]:
        """The ranks a released window still misses (a late summary may still come)."""
        j = self._jobs.get(job)
        m = j.released.get((run, window)) if j else None
        return [] if m is None else m.tolist()

    def comms_of(self, job: str, run: str) -> list[str]:
        j = self._jobs.get(job)
        return sorted(c for c, r in j.run_of.items() if r == run) if j else []

    def mark_released(
        self,
        keys: Iterable[tuple[str, str | None, int]],
        missing: Mapping[tuple[str, str | None, int], Sequence[int]] | None = None,
    ) -> None:
        """Windows scored by an earlier life of this coordinator, as (job, comm, window)
        (comm None: unknown, the job's current run): their resends are late. `missing`:
        the ranks such a window still missed when last marked (the journal's latest
        word on it, newer than the saved state); a late summary of one is scored."""
        for job, comm, w in keys:
            j = self._job(job)
            if comm is not None and comm not in j.run_of:
                j.run_of[comm] = j.run or comm
                j.run = j.run or comm
            run = j.run_of.get(comm, j.run) if comm is not None else j.run
            if missing is not None or (run, w) not in j.released:
                # the journal's marks are written before the state is saved: its word
                # on what a window still misses is the newer one
                m = missing.get((job, comm, w)) if missing is not None else None
                self._mark(j, (run, w), np.asarray(m, dtype=np.int64) if m else None)
            if run == j.run:
                j.front = max(j.front, w)

    def _mark(self, j: _Job, key: tuple[str, int], missing: I64 | None = None) -> None:
        if missing is not None and missing.size:
            j.released[key] = missing
            j.open_late.add(key)
        else:
            j.released[key] = None
            j.open_late.discard(key)
        while len(j.released) > self._keep:
            j.open_late.discard(next(iter(j.released)))
            j.released.pop(next(iter(j.released)))

    def snapshot(self, jobs: Iterable[str] | None = None) -> dict[str, Any]:
        """Runs, primaries and released windows of `jobs` (default: every job), as plain
        data (the pending summaries are the journal's). The per-rank arrays are bytes of
        little-endian integers (the primaries as indices into `comms`): saved after
        every window, they cost a copy each, not a Python object per rank."""
        want = self._jobs if jobs is None else {k: self._jobs[k] for k in jobs if k in self._jobs}
        out: dict[str, Any] = {}
        for job, j in want.items():
            comms = ["", *(c for c in j.codes)]  # code -> comm; code 0: none
            out[job] = plain(
                AssemblyState(
                    run=j.run,
                    run_of=dict(j.run_of),
                    front=j.front,
                    ended=j.ended,
                    expected=np.flatnonzero(j.expected).astype("<i8").tobytes(),
                    prim_n=j.prim_n.astype("<i8").tobytes(),
                    prim_code=j.prim_code.astype("<i8").tobytes(),
                    comms=comms,
                    released=[
                        [r, w] if m is None else [r, w, m.astype("<i8").tobytes()]
                        for (r, w), m in j.released.items()
                    ],
                )
            )
        return out

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take back `snapshot()`; raises msgspec.ValidationError (a ValueError) naming a
        field of the wrong type."""
        for job, raw in state.items():
            s = read(raw, AssemblyState)
            j = self._job(job)
            j.run = s.run
            j.run_of.update(s.run_of)
            j.front = s.front
            j.ended = s.ended
            j.prim_n = _ints(s.prim_n)
            if s.prim_code is not None:
                if s.comms is None:
                    raise KeyError("comms")
                codes = _ints(s.prim_code)
                table: OBJ = np.empty(len(s.comms), dtype=object)
                table[:] = s.comms
                j.prim_comm = table[codes]
            else:  # saved by an older coordinator: the comms listed per rank
                if s.prim_comm is None:
                    raise KeyError("prim_comm")
                pc: OBJ = np.empty(len(s.prim_comm), dtype=object)
                pc[:] = s.prim_comm
                j.prim_comm = pc
            j.recode()
            j.expect(_ints(s.expected))
            j.settled = j.n_expected > 0
            for item in s.released:
                m = _ints(item[2]) if len(item) > 2 else None  # (older states: none kept)
                self._mark(j, (str(item[0]), int(item[1])), m)

    # -- adding -------------------------------------------------------------

    def add(
        self, batch: WindowColumns | RankWindow | Iterable[RankWindow], now: float
    ) -> list[AssembledWindow]:
        """Add one batch (records are converted: tests, tools); returns the windows that
        became complete, or that a new run closed."""
        if isinstance(batch, RankWindow):
            batch = [batch]
        cols = (
            batch if isinstance(batch, WindowColumns) else WindowColumns.from_records(list(batch))
        )
        if self._born is None:
            self._born = now
        out: list[AssembledWindow] = []
        groups = _groups(cols)
        if len(groups) > 1:
            # A batch's largest communicators first: a rank's DP row then comes before
            # its TP group's row of the same window, which is never scored instead.
            nr = cols.ints("nranks")
            groups.sort(key=lambda g: -int(nr[g[3]].max()) if g[3] is not None else 0)
        for job, comm, window, idx in groups:
            # Held until the window leaves: without the frame's bytes (`detached`).
            part = cols.detached() if idx is None else cols.take(idx)
            out.extend(self._add_group(job, comm, window, part, now))
        return out

    def _add_group(
        self, job: str, comm: str, window: int, part: WindowColumns, now: float
    ) -> list[AssembledWindow]:
        j = self._job(job)
        r = part.ints("rank")
        n = int(part.ints("nranks").max())
        top = int(r.max())
        j.grow(top + 1)
        out: list[AssembledWindow] = []
        run = j.run_of.get(comm)
        if run is None:
            run = comm
            if j.run and not j.ended and not self._starts_run(j, r, n, window):
                run = j.run  # a communicator of the running job (an island, a late agent)
            elif j.run:
                out.extend(self._close_run(job, j))
            if run == comm:
                j.run, j.front, j.ended = comm, -1, False
                j.prim_n[:] = 0
                j.prim_comm[:] = ""
                j.prim_code[:] = 0
            j.run_of[comm] = run
        if run != j.run:
            return out + self._drop(job, run, window, comm, r.size, "old_run")
        cur = j.prim_n[r]
        if ((cur != 0) & (cur < -n)).all():
            # Every rank is judged on a larger communicator (a tensor-parallel group's
            # own): nothing here is scored; not a drop, whether early or late.
            self.secondary += r.size
            return out
        # Primary communicator per rank: the largest, ties to the lowest hash. Taken
        # from late rows too: a rank judged on its TP group's row for want of its DP
        # row is judged on the DP one from the next window on.
        code = j.code(comm)
        cur_n = j.prim_n[r]
        if not ((j.prim_code[r] == code).all() and (cur_n == -n).all()):
            # (the usual batch, every rank already primary on this communicator, skips this)
            cur_c = j.prim_comm[r]
            better = (cur_n == 0) | (-n < cur_n) | ((-n == cur_n) & (cur_c > comm))
            same = (-n == cur_n) & (cur_c == comm)
            j.prim_n[r[better]] = -n
            j.prim_comm[r[better]] = comm
            j.prim_code[r[better]] = code
            keep = better | same
            if not keep.any():
                return out
            if not keep.all():
                part = part.take(np.flatnonzero(keep))
                r = r[keep]
        key = (job, run, window)
        p = self._pending.get(key)
        if p is None and (run, window) in j.released:
            # Released already: the ranks it still misses form a late part of it;
            # the others (a resend, or a window too old) are dropped.
            self.late_rows[job] += r.size
            left = j.released[(run, window)]
            if left is not None and window <= j.front - self.late_windows:
                self._mark(j, (run, window))  # past the bound: closed
                left = None
            ok = np.isin(r, left) if left is not None else np.zeros(r.size, dtype=bool)
            if not ok.all():
                out += self._drop(job, run, window, comm, int((~ok).sum()), "late")
            if not ok.any():
                return out
            if not ok.all():
                part = part.take(np.flatnonzero(ok))
                r = r[ok]
            p = self._pending[key] = _Pending(
                now, PendingRows(r.size if left is None else left.size), late=left
            )
            heapq.heappush(j.order, (run, window))
        elif p is None:
            # Room for the ranks the agents announced (a window's rows), not for the
            # communicator size a batch claims (anything up to 2**63); more rows grow it.
            p = self._pending[key] = _Pending(now, PendingRows(max(r.size, j.n_expected)))
            heapq.heappush(j.order, (run, window))
        elif p.late is not None:
            self.late_rows[job] += r.size
            ok = np.isin(r, p.late)
            if not ok.all():
                out += self._drop(job, run, window, comm, int((~ok).sum()), "late")
                if not ok.any():
                    return out
                part = part.take(np.flatnonzero(ok))
                r = r[ok]
        if p.seen.size < j.prim_n.size:
            grow = j.prim_n.size - p.seen.size
            p.seen = np.concatenate([p.seen, np.zeros(grow, bool)])
            p.seen_code = np.concatenate([p.seen_code, np.zeros(grow, np.int64)])
        already = p.seen[r]
        seen_before = already.any()
        if seen_before:
            # Seen already: a resend of the same communicator's row is a duplicate; a
            # row of a communicator that became primary since replaces the old one
            # (the old row is filtered out at release, see _release).
            dup = already & (p.seen_code[r] == code)
            self.duplicates += int(dup.sum())
            if dup.all():
                return out
            part = part.take(np.flatnonzero(~dup))
            r = r[~dup]
        p.seen[r] = True
        p.seen_code[r] = code
        if seen_before:
            p.count = int(p.seen.sum())
        elif r.size < 2 or (r[1:] > r[:-1]).all():
            p.count += r.size  # a node's batch: its ranks once each, in order
        else:
            p.count += int(np.unique(r).size)
        p.rows.append(part)
        p.codes.append(code)
        j.expect(r, top)
        # Only the job's oldest pending window can leave now, or a window that just
        # became complete (it then releases the older ones it waited for, if due).
        if j.order[0] == (run, window) or p.count >= self._want(j, p):
            out.extend(self._drain(job, now))
        return out

    @staticmethod
    def _want(j: _Job, p: _Pending) -> int:
        """Ranks that make a pending window complete: the job's, or a late part's."""
        return j.n_expected if p.late is None else int(p.late.size)

    def _starts_run(self, j: _Job, r: I64, n: int, window: int) -> bool:
        """An unseen communicator starts a new run when the run already scored this window
        and its ranks already have a primary communicator of its size: a rerun brings
        the same topology. A larger one is this run's data-parallel communicator whose
        summaries came after those of its ranks' tensor-parallel groups."""
        if window > j.front:
            return False
        cur = j.prim_n[r]
        return bool(((cur != 0) & (-n == cur)).all())

    def _close_run(self, job: str, j: _Job) -> list[AssembledWindow]:
        """A new run began: the old run's windows still pending will get no more rows."""
        return [self._release((job, run, w), complete=False) for run, w in sorted(j.order)]

    def _drop(
        self, job: str, run: str, window: int, comm: str, rows: int, reason: str
    ) -> list[AssembledWindow]:
        self.dropped[(job, reason)] += rows
        self.drops.append(Drop(job, run, window, comm, rows, reason))
        return []

    # -- releasing ----------------------------------------------------------

    def expire(self, now: float) -> list[AssembledWindow]:
        """Release windows whose deadline passed (and the ready ones behind them)."""
        out: list[AssembledWindow] = []
        for job in sorted(self._jobs):
            out.extend(self._drain(job, now))
        return out

    def _drain(self, job: str, now: float) -> list[AssembledWindow]:
        # Windows of a job leave in order: the detector's persistence rules count
        # consecutive windows, so a complete window waits for late earlier ones.
        out: list[AssembledWindow] = []
        j = self._jobs[job]
        settled = j.settled or (self._born is not None and now - self._born >= self.grace_s)
        while j.order:
            run, w = j.order[0]
            p = self._pending[(job, run, w)]
            if (settled or p.late is not None) and p.count >= self._want(j, p):
                out.append(self._release((job, run, w), complete=True))
            elif now - p.first_seen >= self.deadline_s:
                out.append(self._release((job, run, w), complete=False))
            else:
                break
        return out

    def flush(self) -> list[AssembledWindow]:
        """Release everything still pending (shutdown)."""
        return [self._release(k, complete=False) for k in sorted(self._pending)]

    def _release(self, key: tuple[str, str, int], complete: bool) -> AssembledWindow:
        job, run, window = key
        p = self._pending.pop(key)
        j = self._jobs[job]
        j.order.remove((run, window))
        heapq.heapify(j.order)
        if run == j.run:
            j.front = max(j.front, window)
        cols = self._rows(j, run, p)
        if p.late is not None:
            # a late part: what the window still misses is what this part did not bring
            got = np.flatnonzero(p.seen)
            left = np.setdiff1d(p.late, got)
            self._mark(j, (run, window), left)
            return AssembledWindow(job, run, window, cols, left.tolist(), False, late=True)
        seen = np.zeros(j.expected.size, dtype=bool)
        seen[: p.seen.size] = p.seen[: j.expected.size]
        missing_a = np.flatnonzero(j.expected & ~seen)
        # A window of the current run keeps its missing ranks (late summaries) while
        # within late_windows of the front; older windows' lists are let go.
        self._mark(j, (run, window), missing_a if run == j.run else None)
        self._trim_late(j)
        missing = missing_a.tolist()
        return AssembledWindow(job, run, window, cols, missing, complete and not missing)

    def _trim_late(self, j: _Job) -> None:
        """Closes the missing lists of windows more than late_windows behind the front
        (the usual job has none: its windows are complete)."""
        edge = j.front - self.late_windows
        for key in [k for k in j.open_late if k[1] <= edge]:
            self._mark(j, key)

    def _rows(self, j: _Job, run: str, p: _Pending) -> WindowColumns:
        """The window's rows, sorted by rank; in the current run only those of each
        rank's primary communicator (a communicator that lost primacy to a larger one
        after its rows came is left out)."""
        rows, codes = p.rows, p.codes
        # Nodes hold disjoint rank ranges: their parts in order of first rank are
        # usually sorted already, which saves a sort; and they usually came in that
        # order, when the rows as they came are the window's columns (no gather).
        order = sorted(range(len(rows.sizes)), key=rows.firsts.__getitem__)
        arrived = cols = rows.columns(final=True)
        if order != list(range(len(order))):
            st, sz = rows.starts, rows.sizes
            cols = cols.take(np.concatenate([np.arange(st[i], st[i] + sz[i]) for i in order]))
        r = cols.ints("rank")
        if run == j.run and r.size:
            code = np.repeat(
                np.asarray(codes, dtype=np.int64)[order], [rows.sizes[i] for i in order]
            )
            ok = j.prim_code[r] == code
            if not ok.all():
                cols = cols.take(np.flatnonzero(ok))
                r = r[ok]
        if r.size > 1 and not (r[1:] > r[:-1]).all():
            # Overlapping parts: the stable sort of the rows in arrival order.
            cols = arrived
            r = cols.ints("rank")
            if run == j.run and r.size:
                code = np.repeat(np.asarray(codes, dtype=np.int64), rows.sizes)
                ok = j.prim_code[r] == code
                if not ok.all():
                    cols = cols.take(np.flatnonzero(ok))
                    r = r[ok]
            cols = cols.take(np.argsort(r, kind="stable"))
        return cols

    @property
    def pending(self) -> int:
        return len(self._pending)

    def pending_of(self, job: str) -> int:
        j = self._jobs.get(job)
        return len(j.order) if j else 0

    @property
    def late(self) -> int:
        """Summaries that came after their window was released, every job: scored late
        (a rank the window missed, within late_windows) or dropped (`dropped` "late")."""
        return sum(self.late_rows.values())


def _ints(v: Any) -> I64:
    """A saved integer array: bytes of little-endian int64, or a list (older states)."""
    if isinstance(v, bytes | bytearray | memoryview):
        return np.frombuffer(v, "<i8").astype(np.int64)
    return np.array(v, dtype=np.int64)


def _groups(cols: WindowColumns) -> list[tuple[str, str, int, I64 | None]]:
    """(job, comm, window, row indices or None for all rows) of a batch."""
    if cols.n == 0:
        return []
    jobs, comms, win = cols["job"], cols["comm"], cols.ints("window")
    if jobs.count(jobs[0]) == cols.n and comms.count(comms[0]) == cols.n and (win == win[0]).all():
        return [(jobs[0], comms[0], int(win[0]), None)]
    jo: OBJ = np.empty(cols.n, dtype=object)
    jo[:] = jobs
    co: OBJ = np.empty(cols.n, dtype=object)
    co[:] = comms
    ju, jc = np.unique(jo, return_inverse=True)
    cu, cc = np.unique(co, return_inverse=True)
    keys = np.stack([jc.ravel(), cc.ravel(), win])
    uniq, inv = np.unique(keys, axis=1, return_inverse=True)
    inv = inv.ravel()
    return [
        (str(ju[uniq[0, g]]), str(cu[uniq[1, g]]), int(uniq[2, g]), np.flatnonzero(inv == g))
        for g in range(uniq.shape[1])
    ]
