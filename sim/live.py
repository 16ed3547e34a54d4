"""The demo's live terminal view (rich): pace per rank by island, findings as they come.

It reads only what an operator could read: the coordinator's Prometheus
endpoint and the findings JSONL file.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artemis.detect.findings import ACTIVE_STATES
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError):
        return []
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            out.append((m.group(1), labels, float(m.group(3))))
        except ValueError:
            continue
    return out


@dataclass
class LiveState:
    metrics_url: str
    findings_path: Path
    plans_path: Path | None
    title: str
    findings: list[dict[str, Any]] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)
    _fpos: int = 0
    _ppos: int = 0
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)
    first_seen: dict[tuple[str, str], float] = field(default_factory=dict)

    def refresh(self, elapsed_s: float) -> None:
        samples = scrape(self.metrics_url)
        if samples:  # after the run the coordinator is gone: keep its last view
            self.samples = samples
        self._fpos = _tail(self.findings_path, self._fpos, self.findings)
        if self.plans_path is not None:
            self._ppos = _tail(self.plans_path, self._ppos, self.plans)
        for f in self.findings:
            key = (f.get("kind", ""), _subject(f))
            if f.get("state") == "flagged" and key not in self.first_seen:
                self.first_seen[key] = elapsed_s

    def metric(self, name: str) -> float | None:
        for n, _, v in self.samples:
            if n == name:
                return v
        return None

    def render(self) -> Group:
        pace = [(lab, v) for n, lab, v in self.samples if n == "straggler_rank_pace_ratio"]
        by_island: dict[str, list[tuple[int, float]]] = {}
        for lab, v in pace:
            by_island.setdefault(lab.get("island", "?"), []).append((int(lab.get("rank", -1)), v))
        t = Table(title="rank pace (compute gap / median of its island's other ranks)", expand=True)
        t.add_column("island")
        t.add_column("rank", justify="right")
        t.add_column("pace", justify="right")
        t.add_column("", ratio=1)
        for island in sorted(by_island):
            for rank, v in sorted(by_island[island]):
                bar_len = max(0, min(40, int((v - 0.9) * 200)))
                style = "red" if v >= 1.10 else "yellow" if v >= 1.05 else "green"
                t.add_row(island, str(rank), f"{v:.3f}", Text("█" * bar_len, style=style))
        lw = self.metric("straggler_last_window")
        step = self.metric("straggler_step_ms")
        lost = self.metric("straggler_gpu_hours_lost_total")
        missing = self.metric("straggler_missing_ranks")
        head = Text.assemble(
            (f"{self.title}  ", "bold"),
            f"window {int(lw) if lw is not None else '-'}  ",
            f"step {step:.1f} ms  " if step else "",
            f"GPU-hours lost {lost:.3f}  " if lost is not None else "",
            (f"missing ranks {int(missing)}" if missing else "", "red"),
        )
        ft = Table(title="findings (latest state of each)", expand=True)
        for c in ("kind", "subject", "state", "since", "flagged at", "cause", "cost"):
            ft.add_column(c)
        latest: dict[tuple[str, str], dict[str, Any]] = {}
        flagged_at: dict[tuple[str, str], int] = {}
        for f in self.findings:
            key = (f.get("kind", ""), _subject(f))
            latest[key] = f
            if f.get("state") == "flagged":
                flagged_at[key] = int(f.get("window", -1))
        for key, f in list(latest.items())[-12:]:
            cause = (f.get("cause") or {}).get("kind", "") if f.get("cause") else ""
            cost = (
                f"{f['loss_pct']:.1f}% ({f.get('excess_ms') or 0:.1f} ms/step)"
                if f.get("loss_pct") is not None
                else ""
            )
            state = str(f.get("state", ""))
            style = "bold red" if state in ACTIVE_STATES else ""
            ft.add_row(
                key[0],
                key[1],
                Text(state, style=style),
                str(f.get("since", "")),
                str(flagged_at.get(key, "")),
                cause,
                cost,
            )
        parts: list[Any] = [Panel(head), t, ft]
        if self.plans:
            pt = Table(title="rebalance plans", expand=True)
            for c in ("window", "id", "status", "rank", "after", "throughput", "reason"):
                pt.add_column(c)
            for p in self.plans[-6:]:
                thr = ""
                if p.get("throughput_before") and p.get("throughput_after"):
                    thr = f"{p['throughput_before']:.0f} -> {p['throughput_after']:.0f} samples/s"
                pt.add_row(
                    str(p.get("window")),
                    str(p.get("id")),
                    str(p.get("status")),
                    str(p.get("rank")),
                    str(p.get("after")),
                    thr,
                    str(p.get("reason") or ""),
                )
            parts.append(pt)
        return Group(*parts)


def _subject(f: dict[str, Any]) -> str:
    if f.get("rank") is not None:
        return f"rank {f['rank']}"
    if f.get("ranks"):
        return "ranks " + ",".join(str(r) for r in f["ranks"])
    return str(f.get("island") or "")


def _tail(path: Path, pos: int, into: list[dict[str, Any]]) -> int:
    try:
        with open(path, "rb") as fh:
            fh.seek(pos)
            data = fh.read()
    except FileNotFoundError:
        return pos
    end = data.rfind(b"\n")
    if end < 0:
        return pos
    for line in data[: end + 1].splitlines():
        try:
            into.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return pos + end + 1


def summary_lines(findings: list[dict[str, Any]], plans: list[dict[str, Any]]) -> list[str]:
    """The end-of-demo summary: what was found, when, and what it cost."""
    out = []
    flagged = [f for f in findings if f.get("state") == "flagged"]
    if not flagged:
        out.append("No straggler was flagged.")
    for f in flagged:
        cause = f.get("cause") or {}
        same = [
            g for g in findings if g.get("kind") == f.get("kind") and _subject(g) == _subject(f)
        ]
        last = same[-1]
        ev = last.get("evidence") if isinstance(last.get("evidence"), dict) else {}
        gh = ev.get("gpu_hours") if ev else None
        where = ", ".join(x for x in (f.get("island") or "", ",".join(f.get("hosts") or [])) if x)
        since = f.get("since")
        lag = int(f["window"]) - int(since if since is not None else f["window"])
        out.append(
            f"{f['kind']} finding, {_subject(f)}"
            + (f" ({where})" if where else "")
            + f": slow since window {f.get('since')}, flagged at window {f['window']} "
            f"({lag} windows later)"
            + (
                f"; costs {f['loss_pct']:.1f}% of each step ({f.get('excess_ms') or 0:.1f} ms)"
                if f.get("loss_pct") is not None
                else ""
            )
            + (f"; {gh:.4f} GPU-hours lost by window {last['window']}" if gh else "")
            + (f"; cause {cause.get('kind')}: {cause.get('text')}" if cause else "")
        )
    for p in plans:
        if p.get("status") in ("verified", "rolled_back"):
            out.append(
                f"plan {p['id']} {p['status']} at window {p['window']}: throughput "
                f"{p.get('throughput_before') or 0:.0f} -> {p.get('throughput_after') or 0:.0f} "
                f"samples/s ({p.get('reason') or ''})"
            )
    return out
