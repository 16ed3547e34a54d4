"""Findings: the record every report takes, its constructors, and the JSONL writer.

The field names and their order are the DESIGN.md contract; `Finding.to_json`
emits exactly those keys, then `job` (the one key added since the seed, so two
jobs on one coordinator can be told apart). Anything else extra (GPU-hours
lost, a hang's dumps) rides inside `evidence`, never as a new top-level key.

Every kind is built by one named constructor below (`rank_finding`,
`degraded_finding`, `scalar_finding` for island/collective/link,
`hang_finding`, `missing_finding`), which names only the fields it sets: the
others take `Finding`'s defaults. A finding is frozen once built. `confidence` says what the
verdict rests on (`peers`, `history`, `baseline`: a scalar's warm-up value,
`progress`); `basis` says what judged it (`peers` for rank, `history` for
degraded and the scalar kinds, `progress` for hang and missing, `baseline` for
change and regression: the stored baseline of the job's workload, across jobs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from artemis.detect.hang import HangVerdict

# `missing` (ranks that stopped reporting: their agent or node is gone) is an
# addition to DESIGN.md's kinds, documented in docs/DESIGN.md; so are `change` and
# `regression` (a whole job slower than the stored baseline of its workload, with or
# without a fingerprint change: detect/baselines.py).
KINDS = (
    "rank",
    "degraded",
    "island",
    "link",
    "collective",
    "hang",
    "missing",
    "change",
    "regression",
)
STATES = ("suspect", "flagged", "ongoing", "cleared")
# A finding that is confirmed and not yet cleared: what incidents, metrics and plans act on.
ACTIVE_STATES = ("flagged", "ongoing")
# The kinds about one rank (against its peers, or its own history where it has none).
RANK_KINDS = ("rank", "degraded")
# `software`: a change finding's cause, the fingerprint components that changed.
CAUSE_KINDS = ("thermal", "power", "clocks", "pcie", "host", "hardware", "software", "unknown")
# Kinds judged against the stored baseline of the job's workload (across jobs).
BASELINE_KINDS = ("change", "regression")
# The shape of a rank's slowdown (`evidence.shape`, `confirmed.shape` of its incident):
# "slower" in most of its steps (its lower quartile moved with its median), or
# "stalls" in a fraction of them (its mean moved, its lower quartile did not).
SHAPES = ("stalls", "slower")

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
# Keys added to the seed's, after them in every line.
ADDED_FIELDS = ("job",)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One report. Frozen: a changed finding is a new one (`dataclasses.replace`).
    Every field but the first three defaults to what a kind that never sets it
    writes (null, an empty list), so a constructor names only what it sets."""

    kind: str
    state: str
    window: int
    steps: list[int] = field(default_factory=list)  # [first step, one past the last]
    island: str | None = None
    rank: int | None = None
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    since: int | None = None
    ratio: float | None = None
    z: float | None = None
    history: float | None = None
    drift: float | None = None
    excess_ms: float | None = None
    loss_pct: float | None = None
    confidence: str = "peers"  # "peers" | "history" | "baseline" | "progress"
    signal: str = "gap"  # "gap" | "coll" | "bridge" | "progress"
    basis: str = "peers"  # "peers" | "history" | "baseline" | "progress"
    missing: list[str] = field(default_factory=list)
    evidence: dict[str, Any] | None = None
    cause: dict[str, Any] | None = None  # {"kind", "text", "evidence"} or None
    job: str = ""  # the job the finding is about (added key)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"finding kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.state not in STATES:
            raise ValueError(f"finding state {self.state!r} is not one of {', '.join(STATES)}")

    @property
    def subject(self) -> str:
        """What the finding is about, as one label (metrics, logs)."""
        if self.kind in RANK_KINDS and self.rank is not None:
            return str(self.rank)
        if self.kind in ("hang", "missing"):
            return ",".join(str(r) for r in self.ranks)
        if self.kind in BASELINE_KINDS:
            # one per hardware class of the job (its baseline's key with the workload)
            return str((self.evidence or {}).get("hw_class") or "")
        return self.island or ""

    def to_json(self) -> dict[str, Any]:
        """The DESIGN.md keys, then the added ones, JSON-safe (non-finite numbers become null)."""
        out = {name: _clean(getattr(self, name)) for name in (*FIELDS, *ADDED_FIELDS)}
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


# --------------------------------------------------------------------------- constructors


def rank_finding(
    *,
    job: str,
    state: str,
    window: int,
    steps: Sequence[int],
    rank: int,
    island: str,
    hosts: Sequence[str],
    since: int | None,
    ratio: float | None,
    z: float | None,
    history: float | None,
    excess_ms: float,
    loss_pct: float | None,
    missing: Sequence[str] = (),
    evidence: dict[str, Any] | None = None,
    cause: dict[str, Any] | None = None,
    basis: str = "peers",
    kind: str = "rank",
) -> Finding:
    """A rank slow against the other ranks of its island (or class), or against its own
    confirmed baseline (`basis` = peers | history | both: what judged it)."""
    if basis not in ("peers", "history", "both"):
        raise ValueError(f"rank finding basis must be peers, history or both, got {basis!r}")
    if kind not in RANK_KINDS:
        raise ValueError(f"rank finding kind must be rank or degraded, got {kind!r}")
    shape = (evidence or {}).get("shape")
    if shape is not None and shape not in SHAPES:
        raise ValueError(f"rank finding evidence.shape must be one of {SHAPES}, got {shape!r}")
    return Finding(
        kind=kind,
        state=state,
        window=window,
        steps=list(steps),
        island=island,
        rank=rank,
        ranks=[rank],
        hosts=list(hosts),
        since=since,
        ratio=ratio,
        z=z,
        history=history,
        excess_ms=excess_ms,
        loss_pct=loss_pct,
        confidence="history" if basis == "history" else "peers",
        basis=basis,
        missing=list(missing),
        evidence=evidence,
        cause=cause,
        job=job,
    )


def degraded_finding(**common: Any) -> Finding:
    """A rank slow against its own warm-up history, where its group is too small for peers:
    `rank_finding`'s arguments but `z` (null) and `basis` (history). `ratio` is the peer
    ratio for information (when a peer exists)."""
    return rank_finding(**common, z=None, basis="history", kind="degraded")


SCALAR_SIGNALS = {"island": "gap", "collective": "coll", "link": "bridge"}


def scalar_finding(
    kind: str,
    *,
    job: str,
    state: str,
    window: int,
    steps: Sequence[int],
    subject: str,
    ranks: Sequence[int],
    hosts: Sequence[str],
    since: int | None,
    excess_ms: float,
    loss_pct: float | None,
    ratio: float | None = None,
    drift: float | None = None,
    evidence: dict[str, Any] | None = None,
) -> Finding:
    """An island, its collectives or a bridge link, slow against its own warm-up value.
    `subject` is the island's name, or the link written "a<->b"."""
    if kind not in SCALAR_SIGNALS:
        raise ValueError(f"scalar finding kind {kind!r} is not one of {', '.join(SCALAR_SIGNALS)}")
    return Finding(
        kind=kind,
        state=state,
        window=window,
        steps=list(steps),
        island=subject,
        ranks=list(ranks),
        hosts=list(hosts),
        since=since,
        ratio=ratio,
        drift=drift,
        excess_ms=excess_ms,
        loss_pct=loss_pct,
        confidence="baseline",
        signal=SCALAR_SIGNALS[kind],
        basis="history",
        evidence=evidence,
        job=job,
    )


def progress_finding(
    kind: str,
    *,
    job: str,
    state: str,
    window: int,
    steps: Sequence[int],
    ranks: Sequence[int],
    hosts: Sequence[str],
    since: int | None,
    island: str | None = None,
    loss_pct: float | None = None,
    missing: Sequence[str] = (),
    evidence: dict[str, Any] | None = None,
) -> Finding:
    """A finding judged from the ranks' progress, not their timings: `hang` or `missing`."""
    if kind not in ("hang", "missing"):
        raise ValueError(f"progress finding kind {kind!r} is not hang or missing")
    ranks = list(ranks)
    return Finding(
        kind=kind,
        state=state,
        window=window,
        steps=list(steps),
        island=island,
        rank=ranks[0] if len(ranks) == 1 else None,
        ranks=ranks,
        hosts=list(hosts),
        since=since,
        loss_pct=loss_pct,
        confidence="progress",
        signal="progress",
        basis="progress",
        missing=list(missing),
        evidence=evidence,
        job=job,
    )


def hang_finding(
    verdict: HangVerdict,
    *,
    job: str,
    window: int,
    dumps: Sequence[str],
    hosts: Mapping[int, str] | None = None,
    islands: Mapping[int, str] | None = None,
    steps: Sequence[int] | None = None,
    state: str = "flagged",
) -> Finding:
    """A hang (detect/hang.py), with the dump paths collected from the agents."""
    ranks = list(verdict.ranks)
    isl = sorted({islands[r] for r in ranks if islands and r in islands})
    return progress_finding(
        "hang",
        job=job,
        state=state,
        window=window,
        steps=list(steps) if steps is not None else [],
        island=isl[0] if len(isl) == 1 else None,
        ranks=ranks,
        hosts=sorted({hosts[r] for r in ranks if hosts and r in hosts}),
        since=window,
        loss_pct=100.0,  # nothing progresses while the job hangs
        evidence={
            "dumps": list(dumps),
            "last_done": {str(r): seq for r, seq in verdict.last_done.items()},
            "waiting_s": round(verdict.waiting_s, 3),
            "bound_s": round(verdict.bound_s, 3),
            "collective": verdict.collective,
            "behind": list(verdict.behind),
        },
    )


def missing_finding(
    *,
    job: str,
    state: str,
    window: int,
    steps: Sequence[int],
    ranks: Sequence[int],
    hosts: Sequence[str],
    since: int,
) -> Finding:
    """Ranks that stopped reporting (their agent or node is gone), or, cleared, are back."""
    gone = state != "cleared"
    return progress_finding(
        "missing",
        job=job,
        state=state,
        window=window,
        steps=steps,
        ranks=ranks if gone else [],
        hosts=hosts if gone else [],
        since=since,
        missing=[f"rank {r}" for r in ranks] if gone else [],
        evidence={"reason": "no window summary within the assembly deadline"} if gone else None,
    )


def baseline_finding(
    kind: str,
    *,
    job: str,
    state: str,
    window: int,
    steps: Sequence[int],
    ranks: Sequence[int],
    hosts: Sequence[str],
    since: int | None,
    ratio: float | None,
    drift: float | None,
    excess_ms: float | None,
    loss_pct: float | None,
    evidence: dict[str, Any],
) -> Finding:
    """A whole hardware class of the job slower than the stored baseline of its workload
    (`ratio`: the class's median compute gap over the baseline's; `drift`: the job's
    step time over the baseline's), `change` where its software fingerprint changed
    since, `regression` where nothing in it did. The cause is the kind's (none once
    cleared)."""
    if kind not in _BASELINE_CAUSES:
        raise ValueError(f"baseline finding kind {kind!r} is not change or regression")
    return Finding(
        kind=kind,
        state=state,
        window=window,
        steps=list(steps),
        ranks=list(ranks),
        hosts=list(hosts),
        since=since,
        ratio=ratio,
        drift=drift,
        excess_ms=excess_ms,
        loss_pct=loss_pct,
        confidence="baseline",
        basis="baseline",
        evidence=evidence,
        cause=None if state == "cleared" else _BASELINE_CAUSES[kind](evidence),
        job=job,
    )


def change_finding(**common: Any) -> Finding:
    """`baseline_finding` of kind `change`: `evidence.changed` maps each component that
    differs to [old, new]; the cause (`software`) names them."""
    changed = common["evidence"].get("changed")
    if common["state"] != "cleared" and not changed:
        raise ValueError("a change finding names what changed (evidence.changed)")
    return baseline_finding("change", **common)


def regression_finding(**common: Any) -> Finding:
    """`baseline_finding` of kind `regression`: nothing in the fingerprint changed, so
    the cause is `unknown`, its evidence what was checked (the components compared, equal)."""
    return baseline_finding("regression", **common)


def _change_cause(evidence: Mapping[str, Any]) -> dict[str, Any]:
    changed = evidence.get("changed") or {}
    text = "; ".join(f"{k} {_v(v[0])} -> {_v(v[1])}" for k, v in sorted(changed.items()))
    return {"kind": "software", "text": f"since {text}", "evidence": {"changed": changed}}


def _regression_cause(evidence: Mapping[str, Any]) -> dict[str, Any]:
    checked = evidence.get("checked") or []
    return {
        "kind": "unknown",
        "text": "slower than the baseline of this workload with the same fingerprint "
        f"({', '.join(checked) or 'no component known'}): not a fingerprinted change",
        "evidence": {"checked": list(checked), "workload": evidence.get("workload")},
    }


_BASELINE_CAUSES = {"change": _change_cause, "regression": _regression_cause}


def _v(v: Any) -> str:
    if v is None:
        return "(none)"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(str(x) for x in v) + "]"
    return str(v)


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
        "change": f"class {f.subject} slower than its workload's baseline after a change",
        "regression": f"class {f.subject} slower than its workload's baseline",
    }[f.kind]
    parts = [f"straggler {f.kind}: {who}"]
    if f.hosts:
        parts.append(f"on {','.join(f.hosts)}")
    parts.append(f"window {f.window} (since {f.since})")
    if f.ratio is not None and math.isfinite(f.ratio):
        parts.append(f"ratio {f.ratio:.3f} vs {f.basis}")
    if f.drift is not None and math.isfinite(f.drift):
        parts.append(f"drift {f.drift:.3f}")
    if f.kind in BASELINE_KINDS and (f.evidence or {}).get("slower_pct") is not None:
        parts.append(f"{(f.evidence or {})['slower_pct']:.1f}% slower per step")
    if f.loss_pct is not None and math.isfinite(f.loss_pct):
        parts.append(f"costs {f.loss_pct:.1f}% of each step")
    if f.cause:
        parts.append(f"cause {f.cause['kind']}: {f.cause['text']}")
    return "; ".join(parts)


assert tuple(f.name for f in fields(Finding)) == FIELDS + ADDED_FIELDS  # checked at import
