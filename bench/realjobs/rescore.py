"""Score recorded runs again offline, with today's detector (issue 31: fix causes).

Each run of the grid keeps its coordinator's assembly journal (every window's
summaries, as the agents sent them: a job this short is never compacted). This
replays those windows, in order, through a fresh ``JobMonitor`` with the settings
the run's coordinator had, and judges the findings it writes now with the same
arithmetic as the live run (bench/realjobs/judge.py): a changed rule is measured on
real jobs' windows, every fault mechanism and every healthy run at once, in seconds.

What a replay cannot say: seconds to flag (they were timed live), and what the
agent's telemetry would be under a changed agent. The end summary is the replay's
own: the latest line per subject.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import numpy as np
from artemis.detect.monitor import JobMonitor
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowBatch, WindowColumns, from_wire

from bench.realjobs.judge import Expected, healthy_onset_step, judge
from bench.realjobs.runner import ISLAND_SETTINGS


def journal_windows(path: Path) -> dict[int, WindowColumns]:
    """Every window's summaries in a kept journal, by window, ranks in order."""
    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(path.read_bytes())
    parts = [from_wire(msgspec.convert(it[1], WindowBatch)) for it in u if it[0] == "c"]
    if not parts:
        return {}
    cols = WindowColumns.concat(parts)
    ws = cols.ints("window")
    out = {}
    for w in sorted(set(ws.tolist())):
        c = cols.take(np.flatnonzero(ws == w))
        # a resent batch repeats a rank's summary: keep its first
        _, first = np.unique(c.ints("rank"), return_index=True)
        out[w] = c.take(np.sort(first))
    return out


def replay(kept: Path, rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The findings lines today's detector writes for a kept run's windows."""
    wins = journal_windows(kept / "journal.assembly")
    cell = rec["cell"]
    over = ISLAND_SETTINGS if cell["mechanism"] == "bridge" else {}
    m = JobMonitor(rec["tag"], Settings(**over), nranks=int(cell["world"]))
    lines: list[dict[str, Any]] = []
    last = max(wins, default=-1)
    for w, cols in wins.items():
        out = m.on_window(w, cols, final=w == last)
        lines += [f.to_json() for f in out.findings]
    return lines


def rescore(rec: dict[str, Any]) -> dict[str, Any] | None:
    """A recorded run judged on its replayed findings (None: it kept no journal)."""
    kept = Path(rec.get("kept", ""))
    if "error" in rec or not (kept / "journal.assembly").exists():
        return None
    lines = replay(kept, rec)
    exp = (
        Expected(**{**rec["expected"], "ranks": tuple(rec["expected"]["ranks"])})
        if rec.get("expected")
        else None
    )
    onset = json.loads((kept / "onset.json").read_text()) if exp else None
    latest: dict[tuple[Any, Any], dict[str, Any]] = {}
    for f in lines:
        latest[(f.get("kind"), f.get("rank", f.get("island")))] = f
    summary = {
        "windows_scored": rec.get("windows_scored"),
        "ranks": rec.get("ranks"),
        "findings": list(latest.values()),
    }
    got = judge(
        json.loads((kept / "trace0.json").read_text()),
        rec["cell"]["window_steps"],
        onset,
        lines,
        summary,
        exp,
        healthy_from=healthy_onset_step(rec["cell"]),
    )
    return rec | got | {"seconds_to_flag": None}


def rescore_all(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in (rescore(x) for x in records) if r is not None]
