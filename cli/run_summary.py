"""What `artemis run` says about a job at its end: what was watched, the findings, the
incidents, why nothing was seen, and the same as one JSON object (``--summary-json``).

Everything here reads finished files (the job's rings, the findings and incidents
JSONL, the coordinator's metrics text) and returns lines or dicts; cli/run.py prints
and writes them.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artemis.agent.summary import LONG_STEPS, MAX_PERIOD
from artemis.detect.node_kind import unit_hours
from artemis.detect.scalars import EVIDENCE_KEYS
from artemis.ring.reader import RingError, RingReader


def who(f: dict[str, Any]) -> str:
    """The subject of a finding, as the lines name it (``rank 2``, ``link rank 1``, ``island a``)."""
    if f.get("rank") is not None:
        return f"rank {f['rank']}" if f["kind"] == "rank" else f"{f['kind']} rank {f['rank']}"
    return f"{f['kind']} {f.get('island') or ''}".strip()


# The scalar kinds carry no `cause` (DESIGN "Findings"): their kind is what they say.
# Per kind: what slowed, and the name of its figure (its evidence keys:
# detect/scalars.py EVIDENCE_KEYS).
_SCALAR_WORDS = {
    "collective": (
        "the island's collectives slowed, every rank alike (the network or the collective library)",
        "transfer",
    ),
    "link": ("the bridge between islands slowed", "bridge"),
    "island": ("every rank of the island slower than at warm-up", "median gap"),
}


def scalar_words(f: dict[str, Any]) -> str | None:
    """What a scalar kind's line says slowed, with its figure against its warm-up
    (None for the rank kinds, whose `cause` says it)."""
    kind = str(f.get("kind"))
    if kind not in _SCALAR_WORDS:
        return None
    text, name = _SCALAR_WORDS[kind]
    key, base_key = EVIDENCE_KEYS[kind]
    e = f.get("evidence") or {}
    if e.get(key) is not None and e.get(base_key) is not None:
        text += f": {name} {e[key]:.1f} ms vs {e[base_key]:.1f} ms at warm-up"
    return text


def one_line(f: dict[str, Any]) -> str:
    """The live line of a flagged or cleared finding."""
    cost = f" loss {f['loss_pct']:.1f}%" if f.get("loss_pct") is not None else ""
    cause = f.get("cause") or {}
    why = f" cause {cause.get('kind')}: {cause.get('text')}" if cause else ""
    if not cause and f.get("state") != "cleared" and (said := scalar_words(f)):
        why = f": {said}"
    return f"[artemis] {f['state']} {who(f)} window {f['window']}{cost}{why}"


# -- what was watched ---------------------------------------------------------------


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


@dataclass
class RingCensus:
    """The job's rings as its writers left them (read before the private folder goes)."""

    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    records: int = 0  # the most records any one ring took (a ring holds one rank's collectives)
    done: bool = True  # every ring finished, or its writer is gone (a crashed rank)
    nccl: bool = False  # a ring came from the NCCL profiler plugin, not the backend
    rings: int = 0

    @property
    def collectives_seen(self) -> bool:
        return self.records > 0


def census(shm: Path, job: str) -> RingCensus:
    c = RingCensus()
    for path in sorted(shm.glob(f"{job}.*.ring")):
        try:
            with RingReader(path) as r:
                h = r.header()
        except (OSError, RingError, ValueError):
            continue  # being created or torn down: not a rank we can speak of
        c.rings += 1
        c.ranks.add(h.global_rank if h.global_rank >= 0 else h.rank)
        if h.host:
            c.hosts.add(h.host)
        c.records = max(c.records, h.write_index)
        c.done = c.done and (h.finished or not _alive(h.pid))
        c.nccl = c.nccl or not h.backend
    return c


def full_window_possible(c: RingCensus, window_steps: int, colls_per_step: int) -> bool:
    """Whether any ring holds a whole window (with colls_per_step 0 the agent learns it;
    one collective per step is the fewest it can learn, so the most steps)."""
    return c.records >= window_steps * max(colls_per_step, 1)


def short_job_line(c: RingCensus, window_steps: int, colls_per_step: int) -> str:
    steps = c.records // max(colls_per_step, 1)
    return (
        f"[artemis] the job ended before its first full window: {steps} of {window_steps} "
        f"steps (--window-steps sets the window)"
    )


def no_window_line(c: RingCensus, window_steps: int) -> str:
    """Why a job whose rings hold a window's worth of collectives had none scored."""
    return (
        f"[artemis] no window was scored although a ring holds {c.records} collectives: "
        f"the agent found no repeating step in them (at most {LONG_STEPS * MAX_PERIOD} "
        f"collectives a step), or a "
        f"step holds more than {c.records // window_steps} of them; --colls-per-step "
        f"sets the collectives a step"
    )


def no_collective_lines(c: RingCensus, plugin: bool) -> list[str]:
    """Why nothing was seen: the job ran no collective Artemis could observe."""
    out = ["[artemis] no collective seen from the job: nothing below is about it. Likely why:"]
    out.append(
        "  - gloo: torch's gloo has no hook; use dist.init_process_group('artemis') "
        "(the artemis backend wraps gloo)"
    )
    if plugin:
        out.append(
            "  - NCCL: the profiler plugin was not loaded (NCCL_PROFILER_PLUGIN was set; "
            "NCCL logs why with NCCL_DEBUG=INFO), or the NCCL is older than the "
            "profiler API (2.27 or later is needed)"
        )
    else:
        out.append(
            "  - NCCL: no profiler plugin is built here (make plugin), so NCCL jobs are not seen"
        )
    if c.rings:
        out.append(f"  ({c.rings} ring(s) were made, but no collective completed in them)")
    return out


_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})?\s+(\S+)")


def metric_value(text: str, name: str, job: str | None = None) -> float | None:
    """One job's sample of a Prometheus family in exposition text, or (``job`` None) its
    one unlabelled sample; None: no such sample."""
    want = None if job is None else f'job="{job}"'
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m.group(1) != name:
            continue
        labels = m.group(2).split(",") if m.group(2) else []
        if (want in labels) if want is not None else not labels:
            try:
                return float(m.group(3))
            except ValueError:
                return None
    return None


def watched_line(c: RingCensus, windows: int) -> str:
    hosts = len(c.hosts)
    return (
        f"[artemis] watched {len(c.ranks)} rank{'s' if len(c.ranks) != 1 else ''} on "
        f"{hosts} host{'s' if hosts != 1 else ''}, {windows} window"
        f"{'s' if windows != 1 else ''} scored"
    )


# -- findings and incidents ---------------------------------------------------------


def summary_lines(findings: list[dict[str, Any]]) -> list[str]:
    """One line per subject ever flagged: when, its worst cost, its last state, and the
    cause its live flag line gave (a later line's other cause is named after it)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for f in findings:
        by.setdefault(who(f), []).append(f)
    flagged = {w: fs for w, fs in by.items() if any(f["state"] == "flagged" for f in fs)}
    if not flagged:
        return ["[artemis] summary: nothing flagged"]
    out = [f"[artemis] summary: {len(flagged)} flagged"]
    for subject, fs in flagged.items():
        first = next(f for f in fs if f["state"] == "flagged")
        last = fs[-1]
        costs = [f["loss_pct"] for f in fs if f.get("loss_pct") is not None]
        cost = f"up to {max(costs):.1f}% of the step time" if costs else "n/a"
        # the live lines print flagged and cleared findings: the latest flag line's cause
        # is the one the user saw
        live = next(
            (f["cause"] for f in reversed(fs) if f["state"] == "flagged" and f.get("cause")), None
        )
        latest = next((f["cause"] for f in reversed(fs) if f.get("cause")), None)
        cause = live or latest or {}
        later = (
            f" (later lines: {latest.get('kind')})"
            if live and latest and latest.get("kind") != live.get("kind")
            else ""
        )
        why = f"cause {cause.get('kind', 'none')}" + (
            f": {cause.get('text')}" if cause.get("text") else ""
        )
        if not cause:
            why = scalar_words(first) or why
        out.append(
            f"  {subject}: flagged in window {first['window']}, {last['state']} in window "
            f"{last['window']}; cost {cost}; {why}{later}"
        )
    gaps = missing_line(findings)
    return out + ([gaps] if gaps else [])


def missing_line(findings: Iterable[dict[str, Any]]) -> str | None:
    """The telemetry the job's ranks did not report, named once for the job (every
    finding line keeps its own `missing`; the lines' cause texts do not repeat it).
    A field missing from only some lines is named apart, with how many: a rank moved
    into a CPU-quota cgroup misses `cg_throttled_pct` for the one window its two
    readings straddle the move, and the cause of every later line is that figure."""
    # the diagnosed lines: a cleared line or a scalar kind's names no cause, so its
    # empty `missing` says nothing (and a `missing` finding's list names ranks)
    lines = [f for f in findings if f.get("cause") and f.get("kind") != "missing"]
    counts = Counter(str(m) for f in lines for m in set(f.get("missing") or []))
    if not counts:
        return None
    always = sorted(m for m, n in counts.items() if n == len(lines))
    some = sorted(m for m, n in counts.items() if n < len(lines))
    parts = []
    if always:
        parts.append(f"telemetry not reported by this job's ranks: {', '.join(always)}")
    if some:
        said = ", ".join(f"{m} ({counts[m]} of {len(lines)})" for m in some)
        parts.append(f"{'and ' if always else 'telemetry '}missing from some lines only: {said}")
    return "[artemis] " + "; ".join(parts)


def latest_incidents(path: Path, job: str) -> dict[str, dict[str, Any]]:
    """``incidents.jsonl``'s last record of each incident of ``job``."""
    last: dict[str, dict[str, Any]] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    if rec.get("job") == job:
                        last[rec["id"]] = rec
    except FileNotFoundError:
        return {}
    return last


def incident_lines(path: Path, job: str) -> list[str]:
    """One line per incident of ``job`` in ``incidents.jsonl`` (its last record): the
    verdict, why, and the recommended check."""
    out = []
    for rec in latest_incidents(path, job).values():
        cost = rec.get("cost") or {}
        hours = cost.get("gpu_hours")
        out.append(
            f"  incident {rec['id']}: {rec.get('verdict') or rec.get('status')}"
            + (f" ({rec['reason']})" if rec.get("reason") else "")
            + (f"; cost {hours:.3g} {unit_hours(cost.get('unit'))}" if hours is not None else "")
        )
        esc = rec.get("escalation") or {}
        if esc.get("check"):
            out.append(f"    check: {esc['check']}")
    return out


def latest_findings(findings: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The latest JSONL object per subject, in the order subjects first appeared."""
    last: dict[str, dict[str, Any]] = {}
    for f in findings:
        last[who(f)] = f
    return list(last.values())


def summary_json(
    job: str,
    c: RingCensus,
    windows: int,
    exit_code: int,
    findings: list[dict[str, Any]],
    incidents: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """``--summary-json``'s object (docs/DESIGN.md, "Command line")."""
    return {
        "job": job,
        "ranks": len(c.ranks),
        "hosts": sorted(c.hosts),
        "windows_scored": windows,
        "collectives_seen": c.collectives_seen,
        "exit_code": exit_code,
        "findings": latest_findings(findings),
        "incidents": list(incidents.values()),
    }
