"""What a window scored with ranks missing keeps for their late summaries.

DETECTOR.md "Late summaries": a window judged while ranks were missing (a
partitioned node) keeps, for LATE_WINDOWS windows, its context and a bounded
sample of its peers (`order_sample`), so a missing rank whose summary comes
later is judged against its own window's peers and not today's.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
from artemis.detect.arrays import F64, I64, pack, unpack
from artemis.detect.state import LateEntry
from artemis.detect.tuning import LATE_PEERS
from artemis.detect.view import Ctx
from artemis.protocol.columns import WindowBatch, WindowColumns, from_wire, to_wire


@dataclass
class LateRef:
    """What a window scored with ranks missing keeps for their late summaries."""

    ctx: Ctx
    live: float  # the job's live noise when the window was judged (NaN: none yet)
    rows: WindowColumns  # the peers: a sample of its usable rows, then the late ones scored
    weight: I64  # per row of `rows`: how many of the window's ranks it stands for
    pending: I64  # sorted ranks still missing from the window (a late one may come)
    wire: bytes | None = None  # `rows` encoded for snapshots (saved after every window)

    def rows_wire(self) -> bytes:
        if self.wire is None:
            self.wire = msgspec.msgpack.encode(to_wire(self.rows))
        return self.wire

    def snapshot(self, window: int) -> LateEntry:
        """One entry of the detector snapshot's `late` list."""
        return (
            window,
            self.ctx.steps,
            self.ctx.step_ms,
            self.ctx.hours_per_ms,
            self.live,
            self.rows_wire(),
            pack(self.weight),
            pack(self.pending),
        )

    @classmethod
    def restore(cls, entry: LateEntry) -> tuple[int, LateRef]:
        """An entry of `DetectorState.late` (already read: typed)."""
        w, steps, step_ms, hpm, live, rows, weight, pending = entry
        return w, cls(
            ctx=Ctx(w, steps, step_ms, hpm),
            live=live,
            rows=from_wire(msgspec.msgpack.decode(rows, type=WindowBatch)),
            weight=unpack(weight, np.int64),
            pending=unpack(pending, np.int64),
            wire=bytes(rows),
        )


def order_sample(values: F64, gid: I64, weight: I64) -> tuple[I64, I64]:
    """A bounded sample of each group's order statistics: (indices, weights). A group
    of at most LATE_PEERS entries is kept whole; a larger one is cut, in order of
    value, into LATE_PEERS runs of about equal weight, and the middle entry of each
    run stands for the run (its weight: the run's)."""
    order = np.lexsort((values, gid))
    g = gid[order]
    w = weight[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    ends = np.r_[starts[1:], g.size]
    pick: list[I64] = []
    out_w: list[I64] = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if b - a <= LATE_PEERS:
            pick.append(order[a:b])
            out_w.append(w[a:b])
            continue
        cum = np.cumsum(w[a:b])
        total = int(cum[-1])
        # the run of each entry: by the cumulative weight reached at its middle
        run = np.minimum(
            ((cum - w[a:b] / 2) * LATE_PEERS // total).astype(np.int64), LATE_PEERS - 1
        )
        edges = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
        stop = np.r_[edges[1:], run.size]
        sums = np.add.reduceat(w[a:b], edges)
        mid = edges + (stop - edges - 1) // 2
        pick.append(order[a:b][mid])
        out_w.append(sums.astype(np.int64))
    return np.concatenate(pick), np.concatenate(out_w)
