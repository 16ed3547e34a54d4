"""What the policy remembers of each window, and the per-rank array helpers it reads them with.

A window is kept as per-rank float64 arrays (NaN: not measured), so a 100k-rank
job costs no per-rank Python work; ``pack``/``unpack`` turn an array into plain
data for snapshots. ``flagged_ranks`` reads which ranks a window's findings flag.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .settings import PolicySettings

TRIGGER_KINDS = frozenset({"rank", "degraded"})
TRIGGER_STATES = frozenset({"flagged", "ongoing"})


@dataclass(slots=True)
class Window:
    """What the policy keeps of one window: its steps, per-rank arrays and flagged ranks."""

    window: int
    step_lo: int
    step_hi: int
    gap_ms: np.ndarray  # per rank, float64, NaN where not measured
    samples: np.ndarray  # per rank, float64 (whole numbers), NaN where not reported
    throughput: float | None  # samples/s for the whole job
    flagged: frozenset[int]  # ranks with a rank/degraded finding flagged or ongoing

    def to_json(self, binary: bool = False) -> dict[str, Any]:
        return {
            "window": self.window,
            "step_lo": self.step_lo,
            "step_hi": self.step_hi,
            "gap_ms": pack(self.gap_ms, binary),
            "samples": pack(self.samples, binary),
            "throughput": self.throughput,
            "flagged": sorted(self.flagged),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Window:
        return cls(
            window=int(d["window"]),
            step_lo=int(d["step_lo"]),
            step_hi=int(d["step_hi"]),
            gap_ms=unpack(d["gap_ms"]),
            samples=unpack(d["samples"]),
            throughput=d["throughput"],
            flagged=frozenset(int(r) for r in d["flagged"]),
        )

    def padded(self, nranks: int) -> Window:
        extra = nranks - self.gap_ms.size
        pad = np.full(extra, np.nan)
        return dataclasses.replace(
            self,
            gap_ms=np.concatenate([self.gap_ms, pad]),
            samples=np.concatenate([self.samples, pad]),
        )


def per_rank(
    values: Mapping[int, Any] | np.ndarray | Sequence[float | None], nranks: int
) -> np.ndarray:
    """A float64 array of ``nranks`` from a mapping rank -> value or a sequence (NaN: absent)."""
    if isinstance(values, Mapping):
        out = np.full(nranks, np.nan)
        for r, v in values.items():
            if v is not None and 0 <= int(r) < nranks:
                out[int(r)] = float(v)
        return out
    if isinstance(values, np.ndarray):
        arr = values.astype(np.float64, copy=True)  # the caller's columns stay untouched
    else:
        arr = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    if arr.shape != (nranks,):
        raise ValueError(f"{arr.size} values for {nranks} ranks")
    return arr


def nanmedian0(v: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Median over axis 0 ignoring NaN, every column having ``count`` >= 1 numbers: the
    middle one, or the mean of the middle two (as ``statistics.median``). np.nanmedian
    does the same through masked arrays, several times slower for a 100k-rank job."""
    srt = np.sort(v, axis=0)  # NaN sort last
    lo = np.take_along_axis(srt, ((count - 1) // 2)[None, :], axis=0)[0]
    hi = np.take_along_axis(srt, (count // 2)[None, :], axis=0)[0]
    return np.asarray((lo + hi) / 2.0, dtype=np.float64)


def pack(a: np.ndarray, binary: bool = False) -> dict[str, Any]:
    """A per-rank float64 array as plain data: little-endian bytes, in base64 for JSON
    (exact, NaN included, and no per-rank Python work), or raw for msgpack."""
    raw = a.astype("<f8").tobytes()
    if binary:
        return {"dtype": "<f8", "bytes": raw}
    return {"dtype": "<f8", "b64": base64.b64encode(raw).decode("ascii")}


def unpack(d: Mapping[str, Any]) -> np.ndarray:
    if d.get("dtype") != "<f8":
        raise ValueError(f"snapshot array of dtype {d.get('dtype')!r}, expected '<f8'")
    raw = d["bytes"] if "bytes" in d else base64.b64decode(d["b64"])
    return np.frombuffer(raw, dtype="<f8").astype(np.float64)


def flagged_ranks(findings: Iterable[Any]) -> dict[int, dict[str, Any]]:
    """Ranks with a rank/degraded finding flagged or ongoing, with that finding as a dict."""
    out: dict[int, dict[str, Any]] = {}
    for f in findings:
        if isinstance(f, Mapping):
            kind, state, rank = f.get("kind"), f.get("state"), f.get("rank")
            d: dict[str, Any] = dict(f)
        elif isinstance(f, tuple):
            kind, state, rank = f[0], f[1], f[2]
            d = {"kind": kind, "state": state, "rank": rank}
        else:
            kind, state, rank = (
                getattr(f, "kind", None),
                getattr(f, "state", None),
                getattr(f, "rank", None),
            )
            # The detector's Finding has to_json (exactly the DESIGN keys, JSON-safe).
            if hasattr(f, "to_json"):
                d = dict(f.to_json())
            elif hasattr(f, "to_dict"):
                d = dict(f.to_dict())
            elif dataclasses.is_dataclass(f) and not isinstance(f, type):
                d = dataclasses.asdict(f)
            else:
                d = {"kind": kind, "state": state, "rank": rank}
        if kind in TRIGGER_KINDS and state in TRIGGER_STATES and rank is not None:
            out.setdefault(int(rank), d)
    return out


def per_sample_speeds(windows: Sequence[Window], split: Sequence[int] | None) -> np.ndarray | None:
    """Per-sample compute speed per rank (samples/s): median over windows of samples / gap,
    a rank that reported no samples counted at ``split`` (the split the policy believes in).

    The median, not a pooled ratio, so one window from before a change (the
    trigger needs 3 slow windows, the speed looks at 4) does not dilute it.
    """
    if not windows:
        return None
    gap = np.stack([w.gap_ms for w in windows])
    n = np.stack([w.samples for w in windows])
    if split is not None:
        n = np.where(np.isnan(n), np.asarray(split, dtype=np.float64), n)
    valid = np.isfinite(gap) & np.isfinite(n) & (n > 0)
    if not bool(valid.any(axis=0).all()):
        return None  # a rank without data cannot be planned around
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(valid, 1000.0 * n / gap, np.nan)
    return nanmedian0(v, valid.sum(axis=0))


def median_throughput(windows: Iterable[Window]) -> float | None:
    """The median of the windows' job throughputs (samples/s), None if none was measured."""
    vals = [w.throughput for w in windows if w.throughput is not None]
    return float(np.median(vals)) if vals else None


def history_len(s: PolicySettings) -> int:
    """Windows of history the rules read: the trigger and speed runs, and the windows
    from a plan's step through its ack timeout and its verification (README "Life of a
    plan"). Bounded so the policy's memory per rank does not grow with the run."""
    return max(s.trigger_windows, s.speed_windows, s.verify_windows + s.ack_timeout_windows + 2)


def stalls(finding: Mapping[str, Any] | None) -> bool:
    """The finding's slowdown is shaped as stalls in some of its steps (its
    ``evidence.shape``, detect/findings.py `SHAPES`), not a slower rank."""
    return ((finding or {}).get("evidence") or {}).get("shape") == "stalls"
