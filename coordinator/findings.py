"""Findings: the record every report takes, and the JSONL writer (the only I/O here).

The field names and their order are the DESIGN.md contract; `Finding.to_json`
emits exactly those keys. Anything extra (GPU-hours lost, a hang's dumps)
rides inside `evidence`, never as a new top-level key.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any

# `missing` (ranks that stopped reporting: their agent or node is gone) is an
# addition to DESIGN.md's kinds, documented in docs/DESIGN.md.
KINDS = ("rank", "degraded", "island", "link", "collective", "hang", "missing")
STATES = ("suspect", "flagged", "ongoing", "cleared")
CAUSE_KINDS = ("thermal", "power", "clocks", "pcie", "host", "hardware", "unknown")

# The JSON keys, in the DESIGN.md order.
FIELDS = (
    "kind",
    "state",
    "window",
    "steps",
    "island",
    "rank",
    "ranks",
    "hosts",
    "since",
    "ratio",
    "z",
    "history",
    "drift",
    "excess_ms",
    "loss_pct",
    "confidence",
    "signal",
    "basis",
    "missing",
    "evidence",
    "cause",
)

logger = logging.getLogger("straggler")


@dataclass
class Finding:
    kind: str
    state: str
    window: int
    steps: list[int]  # [first step, one past the last] of the window
    island: str | None
    rank: int | None
    ranks: list[int]
    hosts: list[str]
    since: int | None
    ratio: float | None
    z: float | None
    history: float | None
    drift: float | None
    excess_ms: float | None
    loss_pct: float | None
    confidence: str  # "peers" | "history" | "baseline" | "progress"
    signal: str  # "gap" | "coll" | "bridge" | "progress"
    basis: str  # "peers" | "history" | "baseline" | "progress"
    missing: list[str] = field(default_factory=list)
    evidence: dict[str, Any] | None = None
    cause: dict[str, Any] | None = None  # {"kind", "text", "evidence"} or None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"finding kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.state not in STATES:
            raise ValueError(f"finding state {self.state!r} is not one of {', '.join(STATES)}")

    @property
    def subject(self) -> str:
        """What the finding is about, as one label (metrics, logs)."""
        if self.kind in ("rank", "degraded") and self.rank is not None:
            return str(self.rank)
        if self.kind in ("hang", "missing"):
            return ",".join(str(r) for r in self.ranks)
        return self.island or ""

    def to_json(self) -> dict[str, Any]:
        """Exactly the DESIGN.md keys, JSON-safe (non-finite numbers become null)."""
        out = {name: _clean(getattr(self, name)) for name in FIELDS}
        for name, digits in _ROUND.items():
            if isinstance(out[name], float):
                out[name] = round(out[name], digits)
        return out


_ROUND = {"ratio": 4, "z": 2, "history": 4, "drift": 4, "excess_ms": 3, "loss_pct": 3}


def _clean(v: Any) -> Any:
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, int):
        return int(v)
    if hasattr(v, "item") and callable(v.item):  # numpy scalar
        return _clean(v.item())
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    raise TypeError(f"finding value of type {type(v).__name__} is not JSON-serialisable")


def flag_message(f: Finding) -> str:
    """One readable line for a new flag."""
    who = {
        "rank": f"rank {f.rank}",
        "degraded": f"rank {f.rank}",
        "island": f"island {f.island}",
        "collective": f"collectives of island {f.island}",
        "link": f"link {f.island}",
        "hang": f"hang: ranks {f.subject} behind",
        "missing": f"ranks {f.subject} stopped reporting",
    }[f.kind]
    parts = [f"straggler {f.kind}: {who}"]
    if f.hosts:
        parts.append(f"on {','.join(f.hosts)}")
    parts.append(f"window {f.window} (since {f.since})")
    if f.ratio is not None and math.isfinite(f.ratio):
        parts.append(f"ratio {f.ratio:.3f} vs {f.basis}")
    if f.drift is not None and math.isfinite(f.drift):
        parts.append(f"drift {f.drift:.3f}")
    if f.loss_pct is not None and math.isfinite(f.loss_pct):
        parts.append(f"costs {f.loss_pct:.1f}% of each step")
    if f.cause:
        parts.append(f"cause {f.cause['kind']}: {f.cause['text']}")
    return "; ".join(parts)


def log_flags(findings: Iterable[Finding]) -> int:
    """Log new flags to the `straggler` logger at WARNING; returns how many."""
    n = 0
    for f in findings:
        if f.state == "flagged":
            logger.warning(flag_message(f))
            n += 1
    return n


class FindingsWriter:
    """Appends one JSON object per finding to `path`, flushing once per window."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[str] | None = None

    def write(self, findings: Iterable[Finding]) -> int:
        """Write one window's findings; returns the number of lines written."""
        batch = list(findings)
        if not batch:
            return 0
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        for f in batch:
            self._fh.write(json.dumps(f.to_json(), allow_nan=False, separators=(", ", ": ")))
            self._fh.write("\n")
        self._fh.flush()
        log_flags(batch)
        return len(batch)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> FindingsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


assert tuple(f.name for f in fields(Finding)) == FIELDS  # the contract, checked at import
