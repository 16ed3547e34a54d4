"""Window assembly: gather every rank's summary of a window, or give up at a deadline.

Pure: the caller passes `now` (a monotonic reading), so the rules are tested
without clocks. A job's window is complete when every rank the job's agents
announced has reported it; otherwise, `deadline_s` after its first summary
arrived, it is released with the absent ranks listed as missing. Summaries that
arrive after their window was released are counted as late and dropped, so a
window is scored exactly once. Duplicates (an agent resending after a
reconnect) are ignored: assembly is idempotent on (job, rank, window).

A rank may take part in several communicators (data, tensor, pipeline
parallel). The detector judges each rank on one of them: its largest (ties:
the lowest communicator hash), which in data-parallel training is the one
whose all-reduce ends every step.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from artemis.protocol.records import RankWindow


@dataclass
class AssembledWindow:
    job: str
    window: int
    ranks: list[RankWindow]  # sorted by rank
    missing: list[int]  # expected ranks that did not report in time
    complete: bool


@dataclass
class _Pending:
    first_seen: float
    by_rank: dict[int, RankWindow] = field(default_factory=dict)


class WindowAssembler:
    """`grace_s` (default: the deadline) after the first summary arrives, no window
    counts as complete: a coordinator that just (re)started knows only the ranks
    of the agents that reconnected so far, and must not call a window complete
    before the others had a chance to announce theirs."""

    def __init__(
        self, deadline_s: float = 5.0, keep_released: int = 4096, grace_s: float | None = None
    ) -> None:
        self.deadline_s = deadline_s
        self.grace_s = deadline_s if grace_s is None else grace_s
        self._born: float | None = None
        self._expected: dict[str, set[int]] = {}
        self._primary: dict[tuple[str, int], tuple[int, str]] = {}  # (job, rank) -> (-n, comm)
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._order: dict[str, list[int]] = {}  # per job: heap of its pending windows
        self._released: dict[tuple[str, int], None] = {}  # ordered set, bounded
        self._keep = keep_released
        self.late = 0
        self.duplicates = 0

    def expect(self, job: str, ranks: Iterable[int]) -> None:
        """Ranks an agent announced for a job; they stay expected for the job's life."""
        self._expected.setdefault(job, set()).update(ranks)

    def expected(self, job: str) -> set[int]:
        return set(self._expected.get(job, ()))

    def forget_job(self, job: str) -> None:
        self._expected.pop(job, None)
        for w in self._order.pop(job, []):
            self._pending.pop((job, w), None)

    def _is_primary(self, w: RankWindow) -> bool:
        key = (w.job, w.rank)
        cand = (-w.nranks, w.comm)
        cur = self._primary.get(key)
        if cur is None or cand < cur:
            self._primary[key] = cand
            return True
        return cand == cur

    def pending_windows(self) -> list[RankWindow]:
        """Every summary still being assembled (for the journal)."""
        return [w for p in self._pending.values() for w in p.by_rank.values()]

    def released_keys(self) -> list[tuple[str, int]]:
        """The (job, window) keys released most recently (bounded)."""
        return list(self._released)

    def mark_released(self, keys: Iterable[tuple[str, int]]) -> None:
        """Windows scored by an earlier life of this coordinator: resends are late."""
        for k in keys:
            self._released[k] = None
        while len(self._released) > self._keep:
            self._released.pop(next(iter(self._released)))

    def primary_comm(self, job: str, rank: int) -> str | None:
        """The communicator a rank is judged on (None until it reported a window)."""
        cur = self._primary.get((job, rank))
        return None if cur is None else cur[1]

    def add(self, w: RankWindow, now: float) -> list[AssembledWindow]:
        """Add one summary; returns windows that became complete because of it."""
        if self._born is None:
            self._born = now
        if not self._is_primary(w):
            return []
        key = (w.job, w.window)
        if key in self._released:
            self.late += 1
            return []
        expected = self._expected.setdefault(w.job, set())
        expected.add(w.rank)
        p = self._pending.get(key)
        if p is None:
            p = self._pending[key] = _Pending(first_seen=now)
            heapq.heappush(self._order.setdefault(w.job, []), w.window)
        old = p.by_rank.get(w.rank)
        if old is not None and old.comm == w.comm:
            self.duplicates += 1
            return []
        p.by_rank[w.rank] = w
        # Only the job's oldest pending window can leave now, or a window that just
        # became complete (it then releases the older ones it waited for, if due).
        # by_rank only holds expected ranks, so counting them tells completeness.
        if w.window == self._order[w.job][0] or len(p.by_rank) >= len(expected):
            return self._drain(w.job, now)
        return []

    def expire(self, now: float) -> list[AssembledWindow]:
        """Release windows whose deadline passed (and the ready ones behind them)."""
        out: list[AssembledWindow] = []
        for job in sorted(self._order):
            out.extend(self._drain(job, now))
        return out

    def _drain(self, job: str, now: float) -> list[AssembledWindow]:
        # Windows of a job leave in order: the detector's persistence rules count
        # consecutive windows, so a complete window waits for late earlier ones.
        out: list[AssembledWindow] = []
        settled = self._born is not None and now - self._born >= self.grace_s
        n_expected = len(self._expected.get(job, ()))
        heap = self._order.get(job, [])
        while heap:
            key = (job, heap[0])
            p = self._pending[key]
            if settled and len(p.by_rank) >= n_expected:
                out.append(self._release(key, complete=True))
            elif now - p.first_seen >= self.deadline_s:
                out.append(self._release(key, complete=False))
            else:
                break
        return out

    def flush(self) -> list[AssembledWindow]:
        """Release everything still pending (shutdown)."""
        keys = sorted(self._pending, key=lambda k: (k[0], k[1]))
        return [self._release(k, complete=False) for k in keys]

    def _release(self, key: tuple[str, int], complete: bool) -> AssembledWindow:
        p = self._pending.pop(key)
        heap = self._order[key[0]]
        if heap and heap[0] == key[1]:
            heapq.heappop(heap)
        else:  # flush releases out of heap order: rebuild
            heap.remove(key[1])
            heapq.heapify(heap)
        if not heap:
            del self._order[key[0]]
        self._released[key] = None
        while len(self._released) > self._keep:
            self._released.pop(next(iter(self._released)))
        job, window = key
        missing = sorted(self._expected.get(job, set()) - set(p.by_rank))
        ranks = [p.by_rank[r] for r in sorted(p.by_rank)]
        return AssembledWindow(job, window, ranks, missing, complete and not missing)

    @property
    def pending(self) -> int:
        return len(self._pending)
