"""A scenario's windows as the agents summarise them, without daemons: the simulator's
lockstep model writes ring records as the plugin does (sim/inproc.py `RecordMaker`),
one agent `WindowSummarizer` per rank takes them (as sim/inproc.py does)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from artemis.agent.summary import WindowSummarizer
from artemis.protocol.records import RankWindow
from artemis.sim.inproc import RecordMaker
from artemis.sim.model import LockstepModel
from artemis.sim.scenario import Scenario


def summarised(sc: Scenario, summ: Sequence[WindowSummarizer]) -> Iterator[tuple[int, RankWindow]]:
    """(rank, summary) for every window each rank's summariser `summ[rank]` emits, in the
    order it emits them (one island); the last window flushes them."""
    model = LockstepModel(sc)
    maker = RecordMaker(model)
    for w in range(sc.windows):
        wt = model.window(w)
        recs = maker.window(wt.arrive, wt.end, wt.steps.start)
        for r, s in enumerate(summ):
            s.feed(recs[r])
            for rw in s.take_windows(final=w == sc.windows - 1):
                yield r, rw
