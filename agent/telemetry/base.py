"""The narrow interface every telemetry source implements, and how samples merge.

A source answers ``sample(target)`` with a partial dict of the fields it can
measure (names of ``records.Telemetry``'s fields); a field it
cannot measure is simply absent, never guessed. ``collect`` merges the partial
dicts of all sources into one ``Telemetry`` and lists every expected field that
nobody supplied in ``missing``. A source that raises is logged once and
contributes nothing, so its fields end up missing (unless another source has
them).

The daemon samples a few times per window; ``TelemetryAccumulator`` turns those
samples into the window's values: numeric fields averaged, throttle reasons
ORed (a reason active in any sample was active in the window), PCIe link
gen/width the lowest seen (a link that dropped for part of the window shows),
identity fields (strings, gpu_index, ncpu) and error-counter state
(retired pages, remapped rows, pending / failed remaps, the last XID) the last
seen, and error counts (``COUNT_FIELDS``: XID events, ECC, NVLink and NIC port
errors) turned into the increase over the window.

Error counts: a source reports a running total since the agent started
(monotonic: the source absorbs the device counter's own resets), never a
per-sample increase, because several windows consume one source: a rank in
two communicators has two rings, each with its own accumulator, sampled one
after the other. Each accumulator remembers the last total it saw (across
``reset``), so its window's value is the total's rise since its own previous
sample; a ring's first sample only primes it. The raw ``collect`` result thus
holds totals in these fields; only ``TelemetryAccumulator.result`` turns them
into window values.
"""

from __future__ import annotations

import logging
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from artemis.protocol.records import (
    GPU_FIELDS,
    HOST_FIELDS,
    HW_FIELDS,
    IDENT_FIELDS,
    NIC_FIELDS,
    TELEMETRY_INT_FIELDS,
    THROTTLE_REASONS,
    Telemetry,
)

log = logging.getLogger("artemis.agent.telemetry")

ALL_FIELDS: tuple[str, ...] = GPU_FIELDS + HOST_FIELDS
# Error counts: sources report running totals; a window gets their increase.
COUNT_FIELDS = frozenset(
    {
        "xid_count",
        "ecc_corrected",
        "ecc_uncorrected",
        "nvlink_errors",
        "cg_nr_throttled",
        *NIC_FIELDS,
    }
)
# Error-counter state: the last value seen.
_STATE_FIELDS = frozenset(HW_FIELDS) - COUNT_FIELDS
_INT_FIELDS = TELEMETRY_INT_FIELDS
_STR_FIELDS = frozenset({"vendor", "gpu_model", *IDENT_FIELDS})
_LAST_FIELDS = _STR_FIELDS | _STATE_FIELDS | {"gpu_index", "ncpu"}
_MIN_FIELDS = frozenset({"pcie_gen", "pcie_width"})
_TELEMETRY_FIELDS = frozenset(ALL_FIELDS)


@dataclass(frozen=True, slots=True)
class RankTarget:
    """What a source samples for: one rank's process (and GPU, when known) in a window."""

    rank: int
    pid: int | None = None  # the training process (ring header pid)
    gpu_index: int | None = None  # device index on the host, if already known
    window: int = 0
    job: str = ""  # the job the rank belongs to (sources keyed by job, e.g. the simulator)


@runtime_checkable
class TelemetrySource(Protocol):
    """A source of GPU or host signals for one rank."""

    name: str

    def sample(self, target: RankTarget) -> dict[str, object]:
        """Fields this source measured now; absent keys are fields it cannot measure."""
        ...


def clean(sample: Mapping[str, object]) -> dict[str, Any]:
    """Keep known fields with usable values, in the types ``Telemetry`` declares.

    Unknown keys, None, NaN and values of the wrong kind are dropped (so they
    end up missing rather than wrong). Throttle dicts keep only known reasons.
    """
    out: dict[str, Any] = {}
    for k, v in sample.items():
        if k not in _TELEMETRY_FIELDS or v is None:
            continue
        if k == "throttle":
            if isinstance(v, Mapping):
                out[k] = {r: bool(b) for r, b in v.items() if r in THROTTLE_REASONS}
        elif k in _STR_FIELDS:
            if isinstance(v, str) and v:
                out[k] = v
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        elif k in _INT_FIELDS:
            out[k] = int(v)
        elif math.isfinite(float(v)):
            out[k] = float(v)
    return out


_warned: set[tuple[str, str]] = set()


def _warn_once(source: str, exc: BaseException) -> None:
    key = (source, f"{type(exc).__name__}: {exc}")
    if key not in _warned:
        _warned.add(key)
        log.warning("telemetry source %s failed (%s); its fields are reported missing", *key)


def merge(
    samples: Iterable[Mapping[str, object]], expected: Iterable[str] = ALL_FIELDS
) -> Telemetry:
    """One Telemetry from partial samples; the first sample to supply a field wins."""
    merged: dict[str, Any] = {}
    for s in samples:
        for k, v in clean(s).items():
            merged.setdefault(k, v)
    missing = tuple(f for f in expected if f not in merged)
    return Telemetry(**merged, missing=missing)


def collect(
    sources: Iterable[TelemetrySource],
    target: RankTarget,
    expected: Iterable[str] = ALL_FIELDS,
) -> Telemetry:
    """Sample every source for ``target`` and merge (earlier sources win conflicts)."""
    samples: list[Mapping[str, object]] = []
    for src in sources:
        try:
            samples.append(src.sample(target))
        except Exception as exc:  # a broken source must not stop the others
            _warn_once(getattr(src, "name", type(src).__name__), exc)
    return merge(samples, expected)


class CounterDeltas:
    """Turns cumulative counters into increases since the previous read.

    Keyed by (device, counter). The first read of a key only primes it (None:
    the increase is not known yet). A counter that went down was reset (driver
    reload, GPU reset, ``perfquery -R``): the increase is its new value, the
    count since the reset.
    """

    def __init__(self) -> None:
        self._prev: dict[tuple[object, str], int] = {}

    def delta(self, device: object, name: str, value: int | None) -> int | None:
        if value is None:
            return None
        key = (device, name)
        prev = self._prev.get(key)
        self._prev[key] = value
        if prev is None:
            return None
        return value - prev if value >= prev else value


class RunningTotals:
    """Monotonic totals built from device counters that may reset: what sources report.

    ``add(device, name, raw)`` folds the raw counter's increase since its
    previous read (``CounterDeltas``) into the total for ``name`` summed over
    devices, and returns that total; None until some device of ``name`` has
    been read once (a total starts at 0 on the first read).
    """

    def __init__(self) -> None:
        self._deltas = CounterDeltas()
        self._totals: dict[object, int] = {}

    def add(self, device: object, name: str, raw: int | None, scope: object = None) -> int | None:
        """Fold in one raw read; ``scope`` separates totals (e.g. one per GPU)."""
        key = (scope, name)
        if raw is None:
            return self._totals.get(key)
        d = self._deltas.delta(device, name, raw)
        self._totals[key] = self._totals.get(key, 0) + (d or 0)
        return self._totals[key]

    def get(self, name: str, scope: object = None) -> int | None:
        return self._totals.get((scope, name))


class GpuLibrarySource(ABC):
    """What the vendor-library GPU sources (NVML, AMD SMI) share: the library is opened
    once, on first use, and each rank's GPU is looked up once per pid. A subclass gives
    ``_init`` (open the library: (True, "") or (False, why)) and ``_find_gpu``."""

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = root
        self._state: tuple[bool, str] | None = None
        self._pid_gpu: dict[int, int] = {}
        self._ident: dict[int, dict[str, object]] = {}
        self._totals = RunningTotals()  # error counts since the agent started, per GPU

    def available(self) -> tuple[bool, str]:
        """(True, "") when the library works and sees a GPU, else (False, why)."""
        if self._state is None:
            self._state = self._init()
        return self._state

    @abstractmethod
    def _init(self) -> tuple[bool, str]:
        """Open the library: (True, "") when it works and sees a GPU, else (False, why)."""

    @abstractmethod
    def _find_gpu(self, pid: int) -> int | None:
        """The index of the GPU the process ``pid`` uses, None when not found."""

    def gpu_index(self, target: RankTarget) -> int | None:
        """The rank's GPU index: the one it gave, else the one its pid is found on."""
        if target.gpu_index is not None:
            return target.gpu_index
        if target.pid is None or not self.available()[0]:
            return None
        pid = target.pid
        if pid not in self._pid_gpu:
            found = self._find_gpu(pid)
            if found is None:
                return None  # not cached: the process may not have opened its GPU yet
            self._pid_gpu[pid] = found
        return self._pid_gpu[pid]


class TelemetryAccumulator:
    """Averages the samples the daemon takes during one window into its Telemetry."""

    def __init__(self, expected: Iterable[str] = ALL_FIELDS) -> None:
        self.expected = tuple(expected)
        self._totals = CounterDeltas()  # kept across windows: the last total seen
        self.last_at: float | None = None  # when the last sample was added (any window)
        self.reset()

    def sampled_within(self, now: float, span: float) -> bool:
        """Whether a sample was added less than `span` s before `now`. The rates a
        sample holds (run delay, stopped, throttled, CPU shares) cover the time since
        the one before it: a sample due soon after the one taken at a window's close
        would cover a sliver, and be its next window's only one (the real-job grid:
        a 0.1 s run delay of 189%, and no stopped figure at all, under the process
        state sampler's 10 samples, in about one window in seven)."""
        return self.last_at is not None and now - self.last_at < span

    def reset(self) -> None:
        self.count = 0
        self._sums: dict[str, float] = {}
        self._n: dict[str, int] = {}
        self._last: dict[str, Any] = {}
        self._min: dict[str, int] = {}
        self._count: dict[str, int] = {}
        self._throttle: dict[str, bool] | None = None

    def add(self, sample: Telemetry | Mapping[str, object], at: float | None = None) -> None:
        d = sample.to_dict() if isinstance(sample, Telemetry) else sample
        self.count += 1
        if at is not None:
            self.last_at = at
        for k, v in clean(d).items():
            if k == "throttle":
                acc = self._throttle if self._throttle is not None else {}
                for r, b in v.items():
                    acc[r] = acc.get(r, False) or b
                self._throttle = acc
            elif k in _LAST_FIELDS:
                self._last[k] = v
            elif k in _MIN_FIELDS:
                self._min[k] = min(self._min.get(k, v), v)
            elif k in COUNT_FIELDS:
                inc = self._totals.delta(None, k, v)
                if inc is not None:
                    self._count[k] = self._count.get(k, 0) + inc
            else:
                self._sums[k] = self._sums.get(k, 0.0) + float(v)
                self._n[k] = self._n.get(k, 0) + 1

    def result(self) -> Telemetry:
        """The window's Telemetry; fields no sample had are missing."""
        out: dict[str, Any] = dict(self._last)
        out.update(self._min)
        out.update(self._count)
        for k, total in self._sums.items():
            avg = total / self._n[k]
            out[k] = round(avg) if k in _INT_FIELDS else avg
        if self._throttle is not None:
            out["throttle"] = dict(self._throttle)
        return merge([out], self.expected)


def call_or_none(fn: Callable[..., Any] | None, *args: Any) -> Any:
    """A hardware library call whose failure means "this field is absent" (not
    supported, no permission): its result, or None. Used by the NVML and AMD SMI
    sources so one failing query never costs the others."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:
        return None
