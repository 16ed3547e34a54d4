"""Reading a window: its columns as the usable rows, aligned arrays (`View`).

`Roster` is what the detector knows of the job's ranks between windows (host,
island and hardware class from config or learnt from the summaries) and turns
one window's columns into a `View`: the last usable row of each rank, its
island and scoring group, and its gap as judged (per sample under a plan).
`telemetry` and `nic` turn a finding's few rows back into records, for
diagnosis (per finding, never per rank).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from artemis.detect import scoring
from artemis.detect.arrays import F64, I64, OBJ, all_none, factorize, none_mask, objects
from artemis.detect.diagnosis import nic_evidence
from artemis.detect.settings import Settings
from artemis.detect.tuning import DEFAULT_ISLAND
from artemis.protocol.columns import TELEMETRY_COLUMNS, WindowColumns
from artemis.protocol.records import NIC_FIELDS, Telemetry


@dataclass(frozen=True)
class Ctx:
    """What a window's findings say of it, and what its excess costs."""

    window: int
    steps: list[int]
    step_ms: float
    hours_per_ms: float


@dataclass
class View:
    """The usable rows of one window, as arrays aligned on `r` (sorted ranks)."""

    cols: WindowColumns
    row: I64  # row of each usable rank in `cols`
    r: I64
    gap: F64  # as judged: per sample under a plan (see Roster.view)
    actual: F64  # as measured
    coll: F64
    isl_labels: OBJ  # island name per rank
    isl_names: OBJ  # distinct islands, sorted
    isl_id: I64
    gid: I64  # scoring group: island, or island x class
    class_of: OBJ  # hardware class where classes apply, else None
    bridge: F64  # bridge time (island leaders), NaN elsewhere
    leaders: I64  # indices of the ranks with a usable bridge time


class Roster:
    """Per rank, as object arrays (host, island from config, class from config, last
    island seen), so a window updates them with one fancy assignment."""

    def __init__(
        self,
        islands: Mapping[int, str] | None,
        classes: Mapping[int, str] | None,
        island_order: Sequence[str] | None,
    ) -> None:
        self.host: OBJ = np.empty(0, dtype=object)
        self.hosts_seen: tuple[list[str], I64] | None = None  # (host column, ranks) learnt
        self.cfg_island: OBJ = np.empty(0, dtype=object)
        self.cfg_class: OBJ = np.empty(0, dtype=object)
        self.island_of: OBJ = np.empty(0, dtype=object)
        self._config = (islands or {}, classes or {})
        self.any_cfg_class = any(c is not None for c in (classes or {}).values())
        self.island_order: list[str] | None = list(island_order) if island_order else None

    def grow(self, extra: int) -> None:
        def grow(a: OBJ) -> OBJ:
            return np.concatenate([a, np.full(extra, None, dtype=object)])

        self.host = grow(self.host)
        self.hosts_seen = None
        self.cfg_island = grow(self.cfg_island)
        self.cfg_class = grow(self.cfg_class)
        self.island_of = grow(self.island_of)

    def configure(self, hosts: Mapping[int, str] | None) -> None:
        """The constructor's facts, once grown to the job's ranks."""
        for r, h in (hosts or {}).items():
            self.host[r] = h
        islands, classes = self._config
        for r, lab in islands.items():
            self.cfg_island[r] = lab
        for r, c in classes.items():
            self.cfg_class[r] = c

    def islands(self) -> dict[int, str]:
        known = np.flatnonzero(~none_mask(self.island_of))
        return {int(r): str(self.island_of[r]) for r in known}

    def hosts(self) -> dict[int, str]:
        known = np.flatnonzero(~none_mask(self.host))
        return {int(r): str(self.host[r]) for r in known}

    def view(self, cols: WindowColumns, nranks: int, s: Settings) -> tuple[View | None, I64]:
        """The usable rows (the last row of a rank wins) and the ranks whose last row is not
        usable (a non-finite or negative time: they count as missing)."""
        r_all = cols.ints("rank")
        if r_all.size and (r_all.min() < 0 or r_all.max() >= nranks):
            bad = int(r_all[(r_all < 0) | (r_all >= nranks)][0])
            raise ValueError(f"rank {bad} is outside the job's ranks 0..{nranks - 1}")
        times = np.stack([cols.floats("gap_ms"), cols.floats("coll_ms"), cols.floats("step_ms")])
        with np.errstate(invalid="ignore"):
            ok = (np.isfinite(times) & (times >= 0)).all(axis=0)
        if r_all.size < 2 or (r_all[1:] > r_all[:-1]).all():
            last = np.arange(r_all.size, dtype=np.int64)  # the assembly's order: one row each
        else:
            # Last row per rank: unique over the reversed ranks gives first-in-reverse.
            _, first_rev = np.unique(r_all[::-1], return_index=True)
            last = (r_all.size - 1 - first_rev).astype(np.int64)
        hosts = cols["host"]
        seen = self.hosts_seen
        # the same ranks on the same hosts as last window (the usual): nothing to learn
        if seen is None or not np.array_equal(seen[1], r_all) or hosts != seen[0]:
            host = objects(hosts)
            if host.size:
                named = last[np.not_equal(host[last], "")]
                self.host[r_all[named]] = host[named]
            self.hosts_seen = (hosts, r_all.copy()) if isinstance(hosts, list) else None
        unusable = r_all[last[~ok[last]]]
        row = last[ok[last]]
        if row.size == 0:
            return None, unusable
        r = r_all[row]
        gap = cols.floats("gap_ms")[row]
        isl_labels = self._island_labels(cols, row, r)
        isl_names, isl_id = factorize(isl_labels)
        gid, class_of = self._groups(cols, row, r, isl_id, len(isl_names), s)
        # Under a rebalance plan ranks run different sample counts: judge the
        # compute gap per sample (scaled to the mean split), so a slow rank that a
        # plan compensates stays flagged until it really recovers; the cost stays
        # what the job loses now, from the gaps as they are.
        scale = per_sample_scale(cols.floats("samples")[row])
        bridge = cols.floats("bridge_ms")[row]
        bridge = np.where(np.isfinite(bridge), bridge, np.nan)  # inf is no bridge time
        view = View(
            cols=cols,
            row=row,
            r=r,
            gap=gap if scale is None else gap * scale,
            actual=gap,
            coll=cols.floats("coll_ms")[row],
            isl_labels=isl_labels,
            isl_names=isl_names,
            isl_id=isl_id,
            gid=gid,
            class_of=class_of,
            bridge=bridge,
            leaders=np.flatnonzero(bridge >= 0).astype(np.int64),  # NaN compares False
        )
        return view, unusable

    def _island_labels(self, cols: WindowColumns, row: I64, r: I64) -> OBJ:
        """Island per rank: the summary's, else the telemetry's vendor, else the config,
        else the rank's last known island, else "default"."""
        lab = objects(cols["island"])[row]
        if none_mask(lab).any():
            lab = self._fill_islands(cols, row, r, lab)
        self.island_of[r] = lab
        return lab

    def _fill_islands(self, cols: WindowColumns, row: I64, r: I64, lab: OBJ) -> OBJ:
        for fallback in (
            lambda m: objects(cols["tel_vendor"])[row[m]],
            lambda m: self.cfg_island[r[m]],
            lambda m: self.island_of[r[m]],
        ):
            unknown = none_mask(lab)
            if not unknown.any():
                break
            lab[unknown] = fallback(unknown)
        lab[none_mask(lab)] = DEFAULT_ISLAND
        return lab

    def _groups(
        self, cols: WindowColumns, row: I64, r: I64, isl_id: I64, n_isl: int, s: Settings
    ) -> tuple[I64, OBJ]:
        """Group ids: the island, or island x class where hardware classes apply."""
        mode = s.hardware_classes
        none: OBJ = np.full(r.size, None, dtype=object)
        if mode == "off":
            return isl_id, none
        absent = all_none(cols["hw_class"]) and all_none(cols["tel_gpu_model"])
        if absent and not self.any_cfg_class:
            return isl_id, none  # no class anywhere (the usual one-generation job)
        cls = objects(cols["hw_class"])[row]
        unknown = none_mask(cls)
        for fallback in (
            lambda m: objects(cols["tel_gpu_model"])[row[m]],
            lambda m: self.cfg_class[r[m]],
        ):
            if not unknown.any():
                break
            cls[unknown] = fallback(unknown)
            unknown = none_mask(cls)
        known = ~unknown
        if not known.any():
            return isl_id, none
        if mode == "auto":
            # Only islands whose known classes differ are split: an older
            # generation is slower by design, not faulty.
            split = np.array(
                [len(set(cls[known & (isl_id == k)].tolist())) > 1 for k in range(n_isl)]
            )
            cls = cls.copy()
            cls[~split[isl_id]] = None
            known = ~none_mask(cls)
        if not known.any():
            return isl_id, none
        labels = np.where(known, cls, "").astype(str)
        return scoring.group_ids(isl_id, labels), cls

    def peer_island(self, index: int | None) -> str:
        """Island name of a bridge peer index: config order, else order of lowest rank."""
        order = self.island_order
        if order is None:
            known = np.flatnonzero(~none_mask(self.island_of))
            first: dict[str, int] = {}
            for rk in known.tolist():
                first.setdefault(str(self.island_of[rk]), rk)
            order = sorted(first, key=lambda lab: first[lab])
        if index is not None and 0 <= index < len(order):
            return order[index]
        return f"island#{index}"


def context(window: int, v: View, s: Settings, nranks: int) -> Ctx:
    """The window's step range, median step time and what one ms of excess costs."""
    lo = v.cols.ints("step_lo")[v.row]
    hi = v.cols.ints("step_hi")[v.row]
    step_ms = float(np.median(v.cols.floats("step_ms")[v.row]))
    gpus = s.gpu_count or nranks
    # GPU-hours per ms of excess per step: every GPU waits that long each step.
    hours_per_ms = int(np.median(hi - lo)) * gpus / 3600.0 / 1000.0
    return Ctx(window, [int(lo.min()), int(hi.max())], step_ms, hours_per_ms)


def nic(v: View, members: npt.NDArray[np.bool_] | I64) -> dict[str, Any]:
    """NIC port error counters of a link or collective finding's ranks (per finding,
    never per rank): the evidence that points at a port (diagnosis.nic_evidence)."""
    rows = v.row[members]
    cols = {n: v.cols.floats(f"tel_{n}")[rows] for n in NIC_FIELDS}
    have = np.zeros(rows.size, dtype=bool)
    for a in cols.values():
        have |= np.isfinite(a)
    if not have.any():
        return {}
    hosts = v.cols["host"]
    members_tel = [
        (
            str(hosts[int(rows[i])]),
            Telemetry(**{n: int(a[i]) for n, a in cols.items() if a[i] == a[i]}),
        )
        for i in np.flatnonzero(have).tolist()
    ]
    return nic_evidence(members_tel)


def telemetry(cols: WindowColumns, rows: Sequence[int]) -> list[Telemetry]:
    """The telemetry of some rows as records, for diagnosis (per finding, never per
    rank): one fancy index per column, then one record per row."""
    idx = np.asarray(rows, dtype=np.intp)
    il = idx.tolist()
    fields: list[list[Any]] = []
    for name, kind in TELEMETRY_COLUMNS.items():
        col = cols[f"tel_{name}"]
        if kind in ("of", "oi"):
            fields.append(_numbers(col[idx], kind == "oi"))
        elif kind == "m":
            fields.append([tuple(col[i]) for i in il])
        else:
            fields.append([col[i] for i in il])
    # Positional: the columns are in Telemetry's field order (protocol/columns.py)
    return [Telemetry(*vals) for vals in zip(*fields, strict=True)]


def _numbers(v: F64, ints: bool) -> list[Any]:
    """An optional number column's values as Python numbers, None where NaN (absent).
    Whole columns at a time where they can be: many are absent on every row (a
    source the node lacks), most others present on every row."""
    absent = np.isnan(v)
    if absent.all():
        return [None] * v.size
    if not absent.any():
        return list(map(int, v.tolist())) if ints else v.tolist()
    conv = int if ints else float
    return [None if x != x else conv(x) for x in v.tolist()]


def per_sample_scale(samples: F64) -> F64 | None:
    """mean(samples) / samples per rank when every rank reported its samples and
    they differ (a rebalance plan is in force); None otherwise."""
    if samples.size == 0 or not (samples > 0).all() or samples.min() == samples.max():
        return None
    return np.asarray(samples.mean() / samples, dtype=np.float64)
