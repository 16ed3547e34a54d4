"""Job fingerprints: what ran, on what, with which software (pure; docs/DESIGN.md "Fingerprints").

A rank's SOFTWARE fingerprint is a dict of strings under the components
``gpu_model driver cuda nccl torch kernel`` plus ``env`` (name -> value of the
kept variables, protocol.records.keep_env_name); an unknown component is absent.
Its WORKLOAD signature is a hex hash of its per-step collective signature,
computed by its agent from the rings (agent/fingerprint.py).

The job's fingerprint combines them: per component the value every rank that
knows it agrees on, or the sorted list of the values when ranks differ; the
workload hash of the sorted multiset of rank signatures, the rank count and the
islands' hardware classes (``workload_hash``); and those classes. ``diff``
names what changed between two fingerprints (a rank's or a job's), the env
flattened as ``env.NAME``: the evidence of a ``change`` finding.

No sockets, files or clocks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from artemis.protocol.records import SOFTWARE_COMPONENTS

__all__ = [
    "COMPONENTS",
    "JobFingerprint",
    "combine",
    "diff",
    "flatten",
    "hardware_classes",
    "workload_hash",
]

COMPONENTS = SOFTWARE_COMPONENTS
# A value as a job fingerprint holds it: agreed (str) or differing (sorted list).
Value = str | list[str]


def flatten(software: Mapping[str, Any]) -> dict[str, Any]:
    """Components as they are, ``env`` spread into ``env.NAME`` keys; absent ones left out."""
    out: dict[str, Any] = {}
    for c in COMPONENTS:
        v = software.get(c)
        if v is not None and v != "" and v != []:
            out[c] = v
    for name, v in (software.get("env") or {}).items():
        out[f"env.{name}"] = v
    return out


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, list[Any]]:
    """Every component (and ``env.NAME``) whose value differs: key -> [old, new], with
    None for a side where it is absent; sorted by key. Works on a rank's software dict
    and on a job's (``JobFingerprint.software``) alike."""
    a, b = flatten(old), flatten(new)
    return {k: [a.get(k), b.get(k)] for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def _agree(values: Iterable[str]) -> Value | None:
    distinct = sorted(set(values))
    if not distinct:
        return None
    return distinct[0] if len(distinct) == 1 else distinct


def combine(per_rank: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The job's software: per component (and env variable) the value the ranks that
    know it agree on, else the sorted list of their values."""
    ranks = list(per_rank)
    out: dict[str, Any] = {}
    for c in COMPONENTS:
        v = _agree(str(s[c]) for s in ranks if s.get(c) not in (None, ""))
        if v is not None:
            out[c] = v
    names = sorted({n for s in ranks for n in (s.get("env") or {})})
    env: dict[str, Value] = {}
    for n in names:
        v = _agree(str(s["env"][n]) for s in ranks if n in (s.get("env") or {}))
        if v is not None:
            env[n] = v
    out["env"] = env
    return out


def hardware_classes(gpu_models: Iterable[str | None]) -> list[str]:
    """The islands' hardware classes: the distinct GPU models of the ranks, sorted (an
    island is one class of hardware; the class is known from every rank's fingerprint
    at once, where the detector learns islands only from windows, so the hash is the
    same from the job's first fingerprints on)."""
    return sorted({m for m in gpu_models if m})


def workload_hash(rank_signatures: Iterable[str], nranks: int, hardware: Iterable[str] = ()) -> str:
    """The job's workload fingerprint: sha256 (32 hex digits) of the sorted multiset of
    its ranks' workload signatures, its rank count and its sorted hardware classes. The
    same model on the same kind of cluster gives the same hash in every run; no user
    input is involved."""
    doc = {
        "ranks": sorted(rank_signatures),
        "nranks": int(nranks),
        "hardware": sorted(set(hardware)),
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class JobFingerprint:
    """A job's fingerprint once every rank has sent its own.

    ``software``: ``combine`` of the ranks' software; ``workload``: ``workload_hash``,
    None while a rank's signature is unknown (its steps not found yet); ``hardware``:
    ``hardware_classes``.
    """

    software: dict[str, Any]
    workload: str | None
    hardware: list[str] = field(default_factory=list)
    nranks: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "software": self.software,
            "workload": self.workload,
            "hardware": list(self.hardware),
            "nranks": self.nranks,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobFingerprint:
        return cls(
            software=dict(d.get("software") or {}),
            workload=d.get("workload"),
            hardware=[str(h) for h in d.get("hardware") or ()],
            nranks=int(d.get("nranks") or 0),
        )

    @classmethod
    def of(
        cls,
        software: Mapping[int, Mapping[str, Any]],
        workloads: Mapping[int, str | None],
        nranks: int,
    ) -> JobFingerprint:
        """From every rank's software and workload signature (rank -> value)."""
        ranks = sorted(software)
        hw = hardware_classes(software[r].get("gpu_model") for r in ranks)
        sigs = [workloads.get(r) for r in ranks]
        known = [s for s in sigs if s is not None]
        work = workload_hash(known, nranks, hw) if known and len(known) == len(sigs) else None
        return cls(
            software=combine(software[r] for r in ranks), workload=work, hardware=hw, nranks=nranks
        )
