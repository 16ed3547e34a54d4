"""The rebalance policy's whole state as plain data, and back (format version 1).

Kept apart from the rules so the format is read in one place: an applied plan
stays in force and is still verified after a coordinator restart, and a saved
state from an older coordinator restores as long as the version matches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from .events import PlanEvent
from .history import Window
from .settings import PolicySettings
from .state import Plan

if TYPE_CHECKING:
    from .policy import RebalancePolicy

SNAPSHOT_VERSION = 1


class PolicyState(msgspec.Struct, kw_only=True):
    """The saved shape (field order: the saved key order). Reading it names a field of
    the wrong type (msgspec.ValidationError, a ValueError)."""

    version: int
    job: str
    settings: dict[str, Any]
    nranks: int
    global_batch: int | None
    global_batch_learned: bool
    split: list[int] | None
    history: list[dict[str, Any]]  # Window.to_json: arrays as base64 text, or raw bytes
    healthy: list[float]
    plans: list[dict[str, Any]]  # Plan.to_json, with its event (PlanEvent.to_state)
    blocked: dict[str, int]  # rank (as text: JSON keys) -> window
    rollbacks: dict[str, int]
    last_change: int | None
    now: int
    seq: int
    hold: str | None = None  # RebalancePolicy.hold (absent before issue 29: none)


def dump(pol: RebalancePolicy, binary: bool = False) -> dict[str, Any]:
    """``pol``'s state: JSON-able, or with raw ``bytes`` arrays when ``binary`` (msgpack)."""
    st = PolicyState(
        version=SNAPSHOT_VERSION,
        job=pol.job,
        settings=pol.settings.to_json(),
        nranks=pol.nranks,
        global_batch=pol.global_batch,
        global_batch_learned=pol._gb_learned,
        split=pol.split,
        history=[w.to_json(binary) for w in pol._history],
        healthy=list(pol._healthy),
        plans=[{**p.to_json(), "event": p.event.to_state()} for p in pol._plans],
        blocked={str(r): w for r, w in sorted(pol._blocked.items())},
        rollbacks={str(r): n for r, n in sorted(pol._rollbacks.items())},
        last_change=pol._last_change,
        now=pol._now,
        seq=pol._seq,
        hold=pol._hold,
    )
    return msgspec.to_builtins(st, builtin_types=(bytes,), enc_hook=_enc)


def _enc(obj: Any) -> Any:
    # numpy floats (from array sums) were saved as floats: msgpack and json write them so.
    if isinstance(obj, np.floating):
        return float(obj)
    raise TypeError(f"policy state value of type {type(obj).__name__} cannot be saved")


def load(
    cls: type[RebalancePolicy], state: Mapping[str, Any], settings: PolicySettings | None
) -> RebalancePolicy:
    """A policy of class ``cls`` carrying on from ``state``; ``settings`` replace the
    saved knobs but not the saved mode."""
    if state.get("version") != SNAPSHOT_VERSION:
        raise ValueError(
            f"rebalance snapshot version {state.get('version')!r}, expected {SNAPSHOT_VERSION}"
        )
    st = msgspec.convert(state, PolicyState)
    saved = PolicySettings(**st.settings)
    use = saved if settings is None else dataclasses.replace(settings, mode=saved.mode)
    pol = cls(use, st.nranks, st.global_batch, job=st.job)
    pol._gb_learned = st.global_batch_learned
    pol._split = st.split
    pol._history.extend(Window.from_json(w) for w in st.history)
    pol._healthy.extend(st.healthy)
    pol._plans = [Plan.from_json(d, PlanEvent.from_state(d["event"])) for d in st.plans]
    pol._blocked = {int(r): w for r, w in st.blocked.items()}
    pol._rollbacks = {int(r): n for r, n in st.rollbacks.items()}
    pol._last_change = st.last_change
    pol._now = st.now
    pol._seq = st.seq
    pol._hold = st.hold
    return pol
