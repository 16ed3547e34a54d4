"""Builders shared by the detector-core tests (no tests here)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from artemis.protocol.records import RankWindow, Telemetry

WINDOW_STEPS = 50


def make_window(
    window: int,
    gap: Sequence[float],
    *,
    coll: Sequence[float] | None = None,
    step: Sequence[float] | None = None,
    islands: Sequence[str | None] | None = None,
    classes: Sequence[str | None] | None = None,
    ranks: Sequence[int] | None = None,
    hosts: Sequence[str] | None = None,
    bridge: dict[int, tuple[float, int]] | None = None,
    telemetry: dict[int, Telemetry] | None = None,
    nranks: int | None = None,
    job: str = "job1",
) -> list[RankWindow]:
    """RankWindow records of one window; per-rank arrays are aligned with `ranks`."""
    g = np.asarray(gap, dtype=float)
    n = g.size
    rk = list(range(n)) if ranks is None else [int(x) for x in ranks]
    c = np.full(n, 10.0) if coll is None else np.asarray(coll, dtype=float)
    st = (np.nanmax(g) + c.min()) * np.ones(n) if step is None else np.asarray(step, dtype=float)
    out = []
    for i in range(n):
        b = (bridge or {}).get(rk[i])
        out.append(
            RankWindow(
                job=job,
                comm="00000000000000aa",
                rank=rk[i],
                nranks=nranks if nranks is not None else n,
                host=hosts[i] if hosts is not None else f"node-{rk[i] // 4}",
                window=window,
                step_lo=window * WINDOW_STEPS,
                step_hi=(window + 1) * WINDOW_STEPS,
                coll_lo=0,
                coll_hi=0,
                gap_ms=float(g[i]),
                coll_ms=float(c[i]),
                step_ms=float(st[i]),
                collectives=4 * WINDOW_STEPS,
                bytes=0,
                lost=0,
                clock="device",
                island=islands[i] if islands is not None else None,
                hw_class=classes[i] if classes is not None else None,
                bridge_ms=None if b is None else b[0],
                bridge_peer=None if b is None else b[1],
                telemetry=(telemetry or {}).get(rk[i], Telemetry()),
            )
        )
    return out


def lockstep_windows(
    n: int,
    windows: int,
    steps: int,
    colls: int,
    timing: Callable[[int, int], tuple[Any, float]],
    comm: str = "c0ffee0000000001",
) -> list[tuple[int, list[RankWindow]]]:
    """A lockstep job's ring records, summarised by the agent's own summariser
    (tests/test_stalls.py, tests/test_host_lost.py): `n` ranks, `windows` windows of
    `steps` steps of `colls` 1 MiB collectives. `timing(w, i)` gives collective `i`
    of window `w`: each rank's compute before it (ms, an array) and the time the
    collective takes once the last rank arrives (ms); every rank leaves it together."""
    from artemis.agent.summary import WindowSummarizer
    from artemis.ring.format import KIND_COLL, REC_DEVICE, SLOT_DTYPE, STATE_DONE

    summ = [
        WindowSummarizer("job", comm, r, n, "h0", steps, colls_per_step=colls) for r in range(n)
    ]
    out: dict[int, list[RankWindow]] = {}
    clock = np.zeros(n)
    seq = 0
    for w in range(windows):
        recs = np.zeros((n, steps * colls), dtype=SLOT_DTYPE)
        for i in range(steps * colls):
            comp, coll = timing(w, i)
            arrive = clock + comp
            end = arrive.max() + coll
            for r in range(n):
                rec = recs[r, i]
                rec["kind"], rec["state"], rec["clock"] = KIND_COLL, STATE_DONE, REC_DEVICE
                rec["func"], rec["bytes"], rec["peer"] = 1, 1 << 20, -1
                rec["seq"] = rec["coll_seq"] = seq
                rec["start"] = int(arrive[r] * 1e6) + 1_000_000_000
                rec["end"] = int(end * 1e6) + 1_000_000_000
            clock[:] = end
            seq += 1
        for r, sm in enumerate(summ):
            sm.feed(recs[r])
            for rw in sm.take_windows(final=w == windows - 1):
                out.setdefault(rw.window, []).append(rw)
    return sorted(out.items())
