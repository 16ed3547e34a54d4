"""The grid's tables and goals, from the runs' records (pure: records in, lines out)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from bench.realjobs.judge import upper_bound

BANDS = (0.05, 0.10, 0.20, 0.40)  # the slowdowns


def _key(r: dict[str, Any]) -> tuple[str, str, float]:
    c = r["cell"]
    world = c.get("world", 4)  # a job of another size is a cell of its own
    return c["workload"] + ("" if world == 4 else f" x{world}"), c["mechanism"], c["size"]


def _med(v: Sequence[float]) -> str:
    return f"{statistics.median(v):.2f}" if v else "-"


def faulted(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Finished runs with a fault (a measured slowdown)."""
    return [r for r in records if "error" not in r and r.get("slowdown") is not None]


def on_time(r: dict[str, Any], within: int) -> bool:
    w = r.get("windows_to_flag")
    return w is not None and w <= within


def cause_ok(r: dict[str, Any]) -> bool:
    """Right in the flag line and in the end summary."""
    return bool(r.get("cause_right_flag") and r.get("cause_right_summary"))


def cell_rows(records: Sequence[dict[str, Any]]) -> list[str]:
    """One markdown row per cell (workload, mechanism, size)."""
    cells: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    for r in records:
        cells.setdefault(_key(r), []).append(r)
    out = [
        "| workload | mechanism | size | runs | load (1 min) | slowdown % median [min, max] | "
        "flagged | <= 2 windows | <= 3 windows | windows to flag (median) | s to flag (median) | "
        "cause right (flag+summary) | flag causes | false flags |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for (wl, mech, size), rs in sorted(cells.items()):
        ok = [r for r in rs if "error" not in r]
        loads = [x for r in rs for x in r["load"]]
        sd = [100 * r["slowdown"] for r in ok if r.get("slowdown") is not None]
        wtf = [r["windows_to_flag"] for r in ok if r.get("windows_to_flag") is not None]
        stf = [r["seconds_to_flag"] for r in ok if r.get("seconds_to_flag") is not None]
        causes = sorted({str(r.get("flag_cause")) for r in ok if r.get("flag_window") is not None})
        errs = len(rs) - len(ok)
        out.append(
            f"| {wl} | {mech} | {size:g} | {len(ok)}{f' (+{errs} failed)' if errs else ''} | "
            f"{min(loads):.1f}-{max(loads):.1f} | "
            + (f"{statistics.median(sd):+.1f} [{min(sd):+.1f}, {max(sd):+.1f}]" if sd else "-")
            + f" | {len(wtf)}/{len(ok)} | {sum(on_time(r, 2) for r in ok)}/{len(ok)} | "
            f"{sum(on_time(r, 3) for r in ok)}/{len(ok)} | {_med(wtf)} | {_med(stf)} | "
            f"{sum(cause_ok(r) for r in ok)}/{len(ok)} | {', '.join(causes) or '-'} | "
            f"{sum(r.get('false_flags', 0) for r in ok)} |"
        )
    return out


def goal_lines(records: Sequence[dict[str, Any]]) -> list[str]:
    """The issue's goals against the runs, met or missed, with their counts."""
    runs = faulted(records)
    done = [r for r in records if "error" not in r]
    out = []

    def share(rs: list[dict[str, Any]], ok: int, goal: float | None, what: str) -> None:
        if not rs:
            out.append(f"- {what}: no run in this band")
            return
        got = f"- {what}: {ok}/{len(rs)} = {100 * ok / len(rs):.0f}%"
        if goal is None:
            out.append(f"{got} (no goal)")
            return
        met = ok / len(rs) >= goal
        out.append(f"{got} (goal >= {100 * goal:.0f}%): {'met' if met else 'MISSED'}")

    for band in BANDS:
        rs = [r for r in runs if r["slowdown"] >= band]
        share(
            rs,
            sum(on_time(r, 3) for r in rs),
            None if band < 0.1 else 0.9,
            f"slowdown >= {100 * band:.0f}%, flagged within 3 windows",
        )
        if band >= 0.2:
            share(
                rs,
                sum(on_time(r, 2) for r in rs),
                0.9,
                f"slowdown >= {100 * band:.0f}%, flagged within 2 windows",
            )
    flagged = [r for r in runs if r.get("flag_window") is not None]
    share(
        flagged,
        sum(cause_ok(r) for r in flagged),
        0.9,
        "cause right in the flag line and the end summary (flagged runs)",
    )
    aa = sorted(r["aa_slowdown"] for r in done if r.get("aa_slowdown") is not None)
    if aa:
        # what the slowdown's arithmetic reads with no fault: the bands' own blur
        over = sum(1 for x in aa if abs(x) >= 0.1)
        out.append(
            f"- the slowdown measured on the healthy runs (from a fault cell's onset step): "
            f"median {100 * statistics.median(aa):+.1f}% [{100 * aa[0]:+.1f}, "
            f"{100 * aa[-1]:+.1f}] over {len(aa)} runs, {over} at 10% or more either way"
        )
    k = sum(r.get("false_flags", 0) for r in done)
    n = sum(r.get("healthy_rank_windows", 0) for r in done)
    if n:
        ub = 1000 * upper_bound(k, n)
        verdict = "met" if k == 0 and n >= 2000 else ("MISSED" if k else f"0, but {n} < 2000")
        out.append(
            f"- false flags: {k} over {n} healthy rank-windows = {1000 * k / n:.2f} per 1000 "
            f"(95% upper bound {ub:.2f} per 1000) (goal 0 over >= 2000): {verdict}"
        )
    loads = [x for r in records for x in r["load"]]
    if loads:
        high = sum(1 for r in records if max(r["load"]) > 4)
        out.append(
            f"- load average (1 min) over the runs: {min(loads):.1f}-{max(loads):.1f}; "
            f"{high} of {len(records)} runs above 4 (the issue asks for <= 4)"
        )
    return out
