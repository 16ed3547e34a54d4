"""The saved shape of a job's state (the coordinator's `.state` files), as msgspec Structs.

Each class that is saved builds its Struct (`state()`), and `snapshot()` is that Struct
as plain data (`plain`): the same keys, in the same order, and the same values as the
hand-built dicts before these Structs, so a state file's bytes do not change. Reading
is `read(data, TheStruct)`: a state of the wrong shape (corrupt, foreign) is refused
with an error that names the field (msgspec.ValidationError, a ValueError). A field
added after the format was first saved has a default: an older state still restores.

The rebalance policy's state has its own Struct (rebalance/snapshot.py).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
import numpy as np

S = TypeVar("S", bound=msgspec.Struct)


def _enc(obj: Any) -> Any:
    # numpy floats (sums of array values) were saved as floats: msgpack packs them so.
    if isinstance(obj, np.floating):
        return float(obj)
    raise TypeError(f"state value of type {type(obj).__name__} cannot be saved")


def _builtins(state: Any) -> Any:
    return msgspec.to_builtins(state, builtin_types=(bytes, bytearray), enc_hook=_enc)


def plain(state: msgspec.Struct) -> Any:
    """`state` as plain data (dicts, lists, raw bytes kept as bytes): what is saved.

    The rank-long containers (`_AS_IS`) are handed over, not converted: converting
    them would copy every item on every window's save (at 100k ranks about 1 ms for
    the detector's two lists, bench/README.md "Detector scoring", the snapshot
    column; as much again for the monitor's hosts). The structs on the way to them
    (`_INNER`) are converted the same way; the rest goes through msgspec."""
    kind = type(state)
    as_is = {n: getattr(state, n) for n in _AS_IS.get(kind, ())}
    inner = {n: getattr(state, n) for n in _INNER.get(kind, ())}
    inner = {n: v for n, v in inner.items() if isinstance(v, msgspec.Struct)}
    if not as_is and not inner:
        return _builtins(state)
    # Placeholders in their places (None converts for free), so the keys keep the
    # fields' order and a state file's bytes do not change.
    light = msgspec.structs.replace(state, **dict.fromkeys([*as_is, *inner]))
    out = _builtins(light)
    for n, v in as_is.items():
        # the detector's lists are fresh (`.tolist()`); the monitor's hosts is its own
        out[n] = dict(v) if isinstance(v, dict) else v
    for n, v in inner.items():
        out[n] = plain(v)
    return out


def read(data: Any, kind: type[S]) -> S:
    """Saved plain data as `kind`; raises msgspec.ValidationError (a ValueError) naming
    the field that does not fit."""
    if isinstance(data, kind):
        return data
    return msgspec.convert(data, kind)


class TrackState(msgspec.Struct, kw_only=True):
    """One finding track (detect/lifecycle.py Track)."""

    recent: list[bool]
    long: list[bool] | None = None  # (older states: none; the recent windows stand in)
    intermittent: bool = False
    stalls: bool = False  # (older states: False)
    measured: int = 0  # windows in a row bad by a measurement (older states: 0)
    active: bool
    since: int | None
    good_run: int
    pending_hours: float
    hours: float


# One late-scored window kept (detect/late.py LateRef): window, steps, step_ms,
# hours_per_ms, live, rows (msgpack), weight, pending (raw little-endian arrays).
LateEntry = tuple[int, list[int], float, float, float, bytes, bytes, bytes]


class DetectorState(msgspec.Struct, kw_only=True):
    """The scoring state (detect/detector.py Detector); arrays as raw little-endian bytes.
    The keys from `rank_samples` to `mean_samples` are the rank history's (rank_history.py);
    states from before a rule lack its keys, and that rule starts afresh."""

    nranks: int
    rank_samples: bytes
    rank_count: bytes
    ratio_samples: bytes | None = None
    cusum: bytes | None = None
    prev_lr: bytes | None = None
    live_noise: list[bytes] = []
    # `degraded`'s: the peerless ranks' own (older states: measured afresh)
    live_noise_own: list[bytes] = []
    # the stall test's own live noise (older states: measured afresh)
    prev_lm: bytes | None = None
    live_noise_mean: list[bytes] = []
    dcusum: bytes | None = None
    # `degraded`'s stall test: warm-up trimmed means (older states: no mean baseline
    # until the job's next run)
    mean_samples: bytes | None = None
    window_steps: int = 0  # (older states: learnt again from the next window)
    host: list[Any]
    island_of: list[Any]
    # [kind, subject, samples, recent, tail] (older states: no recent nor tail)
    baselines: list[list[Any]]
    tracks: list[tuple[str, str, TrackState]]
    gpu_hours: float
    last_window: int = -1  # (older states: no late scoring, no late window kept)
    late: list[LateEntry] = []
    # [kind, subject, cause, missing, window]: the cause each open rank episode last
    # named (rank_rule.RankRule.causes; older states: none, each names its next)
    causes: list[list[Any]] = []


class VerdictState(msgspec.Struct, kw_only=True):
    """detect/hang.py HangVerdict."""

    ranks: list[int]
    behind: list[int]
    collective: int
    last_done: dict[int, int]
    waiting_s: float
    bound_s: float


class HangState(msgspec.Struct, kw_only=True):
    """A hang from its verdict on. States without `expected`/`reported` held only
    reported hangs (every rank of the verdict expected)."""

    verdict: VerdictState
    window: int
    dumps: dict[int, str]
    expected: list[int] | None = None
    reported: bool = True


class FingerprintsState(msgspec.Struct, kw_only=True):
    """The ranks' fingerprints, each distinct software dict once: [rank, index, workload]."""

    software: list[dict[str, Any]]
    ranks: list[tuple[int, int, str | None]]


class IncidentBookState(msgspec.Struct, kw_only=True):
    """The open incidents of one job (detect/incidents.py IncidentBook). Every key but
    `job` was added after the first states were saved: each has the default they read as."""

    job: str
    run: str = ""
    flag_window: int | None = None  # (the caller's flag window wins when it gives one)
    gpus: int = 1
    last: tuple[int, float | None] | None = None  # latest (window, time) seen
    ignored: list[tuple[str, str]] = []
    pre: list[tuple[str, str, list[tuple[int, bool]]]] = []  # kind, subject, [window, ok]
    open: list[dict[str, Any]] = []  # detect/incident_state.py incident_state


# One window of one hardware class (detect/baselines.py WindowStats): window, step_ms,
# gap_q1_ms, gap_q2_ms, gap_p10_ms, gap_p90_ms.
StatsRow = tuple[int, float | None, float, float, float, float]


class BaselineClassState(msgspec.Struct, kw_only=True):
    """One hardware class of a job's baseline book; each key read as its default when
    absent (older states)."""

    settled: bool = False
    baseline: dict[str, Any] | None = None  # Baseline.to_record
    own: dict[str, Any] | None = None
    changed: dict[str, list[Any]] = {}
    recent: list[bool] = []
    streak: list[StatsRow] = []
    state: str | None = None
    since: int | None = None
    healthy_run: int = 0
    pending: list[tuple[StatsRow, bool]] = []  # (stats, judged)
    committed: list[StatsRow] = []


class BaselineBookState(msgspec.Struct, kw_only=True):
    """A job's baseline book (detect/baselines.py BaselineBook)."""

    job: str
    run: str = ""
    workload: str | None = None
    software: dict[str, Any] | None = None
    classes: dict[str, BaselineClassState] | None = None


class MonitorState(msgspec.Struct, kw_only=True):
    """One job's monitor (detect/monitor.py JobMonitor), format `version`."""

    version: int
    job: str
    run: str
    global_batch: int | None
    window_steps: int
    last_window: int
    step_ms: float | None
    missing_since: int | None
    colls_per_step: int | None
    hosts: dict[int, str]
    detector: DetectorState
    # Added within version 1 (an older state restores with none): the open incidents,
    # the baseline state (read again), the fingerprints.
    incidents: IncidentBookState | None = None
    baselines: BaselineBookState | None = None
    policy: dict[str, Any] | None
    fingerprints: FingerprintsState | None = None
    hang: HangState | None


class AssemblyState(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One job's assembly (detect/assembly.py WindowAssembler): runs, primaries and
    released windows. Integer arrays are bytes of little-endian int64 (older states:
    lists). The primaries: codes into `comms`, or (older states) `prim_comm`, the comm
    of each rank: never written now (omitted, as its default)."""

    run: str
    run_of: dict[str, str]
    front: int
    ended: bool
    expected: bytes | list[int]
    prim_n: bytes | list[int]
    prim_code: bytes | list[int] | None = None
    comms: list[str] | None = None
    prim_comm: list[Any] | None = None
    released: list[list[Any]]  # [run, window] or [run, window, ranks still missing]


class JobState(msgspec.Struct, kw_only=True):
    """One job's `.state` file (detect/jobs.py JobTable.state)."""

    job: str
    # A MonitorState when saved; read by JobMonitor.restore (its version first) after the
    # assembly is taken back, as before the Structs: a job whose monitor is refused
    # keeps its assembly state (a resent window stays late, not scored again).
    monitor: Any  # MonitorState | None
    assembly: dict[str, Any]  # AssemblyState, read by WindowAssembler.restore
    out_seq: int = 0
    plan_control: dict[str, Any] | None = None
    stopped: bool = False
    # The job's corrections (rebalance/corrections.py CorrectionBookState), written and
    # read by the coordinator's shell (coordinator/corrections.py); absent: none.
    corrections: dict[str, Any] | None = None


# plain(): the fields handed over as they are, and the structs that lead to them.
_AS_IS: dict[type, tuple[str, ...]] = {
    DetectorState: ("host", "island_of"),
    MonitorState: ("hosts",),
}
_INNER: dict[type, tuple[str, ...]] = {JobState: ("monitor",), MonitorState: ("detector",)}
