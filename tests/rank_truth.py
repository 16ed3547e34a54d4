"""What each rank of a test job measured of itself, to judge the detector's flags by.

Four ranks share this machine's two cores with whatever else runs, so the scheduler
does slow a healthy rank for a few windows now and then: it keeps the rank's main
thread runnable but off a core (run delay), and that time lands in the gap between
its collectives as surely as a slower device's would. A flag on such a rank is the
detector seeing what happened, not a false flag; a flag on a rank whose gaps were
not longer is one. The detector cannot be asked which it was (that is what is being
tested), so the job measures it on its own (tests/ddp_job.py ``--truth``): its DDP
all-reduce goes through a comm hook (``StepTruth.hook``) that takes, on the rank's
own clock, the time each collective starts and completes and its threads' CPU time
and run delay at both (``/proc/self/task/*/schedstat``, the kernel's own
accounting). The gap before collective i, from the end of i-1 to the start of i,
then holds what the rank's threads ran and waited to run; a gap the machine made
longer holds more of it.

``flag_deadline`` gives a fault's first flag a window more for each window in which
the machine slowed another rank about as much as the fault (that window's noise).
``unexplained`` holds every flag of a rank nothing was injected into to that record
(and a job's `island` line, where nothing was injected, to its ranks' records
against their own gaps before the drift began, as the detector judges it against
its warm-up):
in the flagged window, the rank's median gap (its length, or its threads' time on a
core or waiting for one in it, whichever is longer; the detector's statistic is a
median over steps too) over its peers' median has to account for at least half of
the excess the finding reports (the share a cause
must explain, detect/hostfit.py). Nothing is loosened: a flag the rank's own record
does not bear out fails the test as before.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXPLAINED_SHARE = 0.5  # of the finding's excess, as a host cause must explain


class StepTruth:
    """Inside a rank: a DDP comm hook that times each all-reduce and reads the main
    thread's schedstat at its start and completion; ``write`` saves
    DIR/truth-r<rank>.json at the end."""

    def __init__(self, rank: int, folder: str, world: int) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.rank, self.world = rank, world
        self.path = Path(folder) / f"truth-r{rank}.json"
        # per collective: coll_seq, then (ns, CPU ns, run-delay ns) at start and at end
        self.rows: dict[int, list[int]] = {}

    def _now(self) -> list[int]:
        """The time, and the CPU time and run delay summed over the process's threads:
        the main thread's compute, the backend's worker threads' start of a collective
        and the in-process detector's thread all make up a gap (read from the
        completion callback's thread too)."""
        t = time.monotonic_ns()
        cpu = delay = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as fh:
                    c, d, _slices = fh.read().split()
            except OSError:  # the thread just left
                continue
            cpu, delay = cpu + int(c), delay + int(d)
        return [t, cpu, delay]

    def hook(self, bucket: Any) -> Any:
        """DDP's all-reduce (the mean of the bucket), timed; DDP passes the instance as
        the hook's state, so this is the hook itself (``install``)."""
        import torch.distributed as dist

        seq = dist.group.WORLD.next_coll_seq()
        self.rows[seq] = self._now()
        buf = bucket.buffer()
        buf.div_(self.world)
        fut = dist.all_reduce(buf, async_op=True).get_future()

        def done(f: Any) -> Any:
            self.rows[seq] += self._now()
            return f.value()[0]

        return fut.then(done)

    def install(self, ddp_model: Any) -> None:
        import torch
        import torch.distributed as dist

        # DDP compares the hook's annotations with its own classes, and here they
        # are strings (postponed): give it the classes
        StepTruth.hook.__annotations__.update(
            bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]}
        )
        ddp_model.register_comm_hook(self, StepTruth.hook)

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"rank": self.rank, "rows": self.rows}))
        tmp.replace(self.path)


@dataclass(frozen=True)
class Truth:
    """Every rank's record of a run: per rank, coll_seq -> its six numbers."""

    rows: dict[int, dict[int, list[int]]]

    @classmethod
    def load(cls, folder: Path, ranks: int) -> Truth:
        got = {}
        for r in range(ranks):
            path = folder / f"truth-r{r}.json"
            assert path.is_file(), f"rank {r} wrote no record of itself ({path})"
            rows = json.loads(path.read_text())["rows"]
            got[r] = {int(k): v for k, v in rows.items() if len(v) == 6}
        return cls(got)

    def gap_ms(self, rank: int, lo: int, hi: int, wall: bool) -> float | None:
        """Median, over the collectives in [lo, hi) whose predecessor the rank recorded
        too, of the gap before the collective in ms: its length on the rank's clock
        (``wall``), or the time the rank's threads spent in it on a core or waiting for
        one; None when there is none."""
        rows = self.rows[rank]
        gaps = [
            (
                (rows[i][0] - rows[i - 1][3])
                if wall
                else (rows[i][1] - rows[i - 1][4]) + (rows[i][2] - rows[i - 1][5])
            )
            / 1e6
            for i in range(lo, hi)
            if i in rows and i - 1 in rows
        ]
        return statistics.median(gaps) if gaps else None

    def extra_ms(self, rank: int, lo: int, hi: int) -> float | None:
        """How much longer the rank's gaps were than its peers' median in [lo, hi), by
        the larger of its two measures: the gap's length (the main thread's view: a
        page fault or a disk wait is idle time, yet the machine's), or its threads'
        time in it (the backend's worker starting a collective late is inside the
        detector's gap, outside the hook's)."""
        best = None
        for wall in (True, False):
            own = self.gap_ms(rank, lo, hi, wall)
            peers = [self.gap_ms(p, lo, hi, wall) for p in self.rows if p != rank]
            known = [x for x in peers if x is not None]
            if own is not None and known:
                x = own - statistics.median(known)
                best = x if best is None else max(best, x)
        return best

    def drift_ms(
        self, ranks: list[int], now: tuple[int, int], before: tuple[int, int]
    ) -> float | None:
        """How much longer the median of `ranks`' gaps was in collectives `now` than in
        `before`, by the larger of the two measures (as `extra_ms`)."""
        best = None
        for wall in (True, False):
            a = [x for r in ranks if (x := self.gap_ms(r, *now, wall)) is not None]
            b = [x for r in ranks if (x := self.gap_ms(r, *before, wall)) is not None]
            if a and b:
                x = statistics.median(a) - statistics.median(b)
                best = x if best is None else max(best, x)
        return best


def flag_deadline(
    truth: Truth, onset: int, within: int, colls_per_window: int, rank: int, size_ms: float
) -> int:
    """The last window a fault on ``rank`` that adds ``size_ms`` to its gap from window
    ``onset`` may be first flagged in: ``onset + within``, one window later for each
    window up to there in which the machine slowed another rank by at least half
    that much (its own record, as in ``unexplained``). In such a window the fault is
    not the only large gap: another rank's starvation sits beside it in the same
    window and raises the window's noise, which the detector is built to weigh (a
    peer 22 ms slower in the onset window of a 40 ms stall left it unflagged there,
    at a load of 15-20). The fault's own size is the measure, not the detector's."""
    last = onset + within
    w = onset
    while w <= last:
        lo, hi = w * colls_per_window, (w + 1) * colls_per_window
        others = [truth.extra_ms(r, lo, hi) for r in truth.rows if r != rank]
        if any(x is not None and x >= EXPLAINED_SHARE * size_ms for x in others):
            last += 1
        w += 1
    return last


def unexplained(
    flags: list[dict[str, Any]], truth: Truth, colls_per_step: int, injected: set[int]
) -> list[dict[str, Any]]:
    """The flags of ranks nothing was injected into that their own record does not
    bear out: less extra busy time in the flagged window than EXPLAINED_SHARE of the
    finding's excess (or no excess, or no record of that window)."""
    bad = []
    for f in flags:
        if f["kind"] == "rank" and f["rank"] in injected:
            continue
        if f["kind"] == "island" and not injected:
            # the whole job's gap over its own before: borne out when its ranks' own
            # gaps were longer than before the drift began by that share of the excess
            lo, hi = (s * colls_per_step for s in f["steps"])
            before = (hi - lo, (hi - lo) * f["since"])  # windows 1 to the drift's onset
            extra = truth.drift_ms(f["ranks"], (lo, hi), before)
            excess = f.get("excess_ms")
            if extra is None or excess is None or extra < EXPLAINED_SHARE * excess:
                bad.append({**f, "truth_extra_ms": extra})
            continue
        if f["kind"] != "rank" or f["rank"] is None:
            bad.append(f)  # not a slower rank: nothing here explains it
            continue
        lo, hi = (s * colls_per_step for s in f["steps"])
        extra = truth.extra_ms(f["rank"], lo, hi)
        excess = f.get("excess_ms")
        if extra is None or excess is None or extra < EXPLAINED_SHARE * excess:
            bad.append({**f, "truth_extra_ms": extra})
    return bad


def describe(flags: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Short rows for an assertion message."""
    return [
        (f["kind"], f["rank"], f["window"], f.get("excess_ms"), f.get("truth_extra_ms"))
        for f in flags
    ]
