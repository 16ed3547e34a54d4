"""The protocol's schema: every record, its fields, types and bounds, in one place.

These are the payloads: the agent builds them, the protocol carries them (as
msgpack, see protocol/README.md), and the scoring core reads them. They are
frozen dataclasses of plain values so every room can use them without importing
another room's machinery.

This module is the single source of truth for the wire. Each field's
annotation carries its bounds (``msgspec.Meta``); the decoder
(``messages.py``, msgspec validating in C), the columnar batch
(``columns.py``), the journal (``coordinator/journal.py``) and the telemetry
field lists below are all derived from these definitions, so a field added
here flows everywhere.

Absent telemetry is ``None`` and its name is listed in ``missing``; nothing is
ever invented.
"""

from __future__ import annotations

import math
import sys
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Literal

from artemis.ring.format import (
    ENV_MAX_VARS,
    ENV_NAME_MAX,
    ENV_VALUE_MAX,
    filter_env,
    keep_env_name,
)
from msgspec import Meta

# -- field types: the bounds every decoder applies ----------------------------

U63 = (1 << 63) - 1
FLOAT_MAX = sys.float_info.max  # an upper bound refuses +inf; a lower bound refuses NaN
NAME_MAX = 256  # ids, hosts, job names
TEXT_MAX = 8192  # free text (error texts, details)
LIST_MAX = 65536  # entries in any list field

Name = Annotated[str, Meta(min_length=1, max_length=NAME_MAX)]
ShortName = Annotated[str, Meta(min_length=1, max_length=64)]
Count = Annotated[int, Meta(ge=0, le=U63)]
Positive = Annotated[int, Meta(ge=1, le=U63)]
Seconds = Annotated[float, Meta(ge=0.0, le=FLOAT_MAX)]
Millis = Annotated[float, Meta(ge=0.0, le=FLOAT_MAX)]
Nonneg = Annotated[float, Meta(ge=0.0, le=FLOAT_MAX)]
# Per-process CPU % can exceed 100 (one core is 100), up to the host's core count.
Percent = Annotated[float, Meta(ge=0.0, le=100.0 * 4096)]
Celsius = Annotated[float, Meta(ge=-273.15, le=1000.0)]
Clock = Literal["device", "host", "ticks"]
ReasonName = Annotated[str, Meta(max_length=64)]
Throttle = dict[ReasonName, bool]
Missing = Annotated[tuple[Annotated[str, Meta(max_length=64)], ...], Meta(max_length=64)]

# Throttle reason keys the diagnosis understands (NVML clock-event reasons and
# their AMD SMI counterparts are mapped onto these by the sources).
THROTTLE_REASONS = (
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal",
    "sw_thermal",
    "hw_power_brake",
    "sync_boost",
    "apps_clocks",  # clocks set by the application / locked clocks
    "idle",
)


class Tag(str):
    """A marker in a field's ``Annotated`` type (msgspec ignores it): its group or use."""


GPU = Tag("gpu")  # supplied by the GPU sources (NVML, AMD SMI, the simulator)
HOST = Tag("host")  # supplied by the host sources (/proc)
DIAG = Tag("diag")  # read by the diagnosis rules (absent ones are listed in a finding)
IDENT = Tag("ident")  # names the device (for a ticket), not a signal
HW = Tag("hw")  # a GPU hardware error signal (the `hardware` cause)
NIC = Tag("nic")  # a NIC port error counter (`link` / `collective` evidence)


@dataclass(frozen=True, slots=True)
class Telemetry:
    """GPU and host signals for one rank over one window (averages over the window).

    Each field's tags: GPU or HOST says which sources supply it; DIAG marks the
    fields the diagnosis rules read (absent ones are reported as missing in a
    finding). Add a field here, with its tags, and the agent, the wire, the
    columns, the journal and the diagnosis all pick it up.
    """

    vendor: Annotated[ShortName | None, GPU] = None  # "nvidia" | "amd"
    gpu_model: Annotated[Name | None, GPU] = None  # e.g. "NVIDIA H100 80GB HBM3"
    gpu_index: Annotated[Count | None, GPU] = None  # device index on the host
    sm_mhz: Annotated[Nonneg | None, GPU, DIAG] = None  # current SM (graphics) clock
    sm_mhz_max: Annotated[Nonneg | None, GPU] = None  # max SM clock the device supports
    mem_mhz: Annotated[Nonneg | None, GPU] = None  # current memory clock
    temp_c: Annotated[Celsius | None, GPU, DIAG] = None  # GPU temperature
    power_w: Annotated[Nonneg | None, GPU, DIAG] = None  # power draw
    power_limit_w: Annotated[Nonneg | None, GPU, DIAG] = None  # enforced power limit
    # the board's default limit: a limit below it was lowered (restore_power_limit)
    power_limit_default_w: Annotated[Nonneg | None, GPU] = None
    throttle: Annotated[Throttle | None, GPU, DIAG] = (
        None  # reason -> bool, only reasons the source reports
    )
    pcie_gen: Annotated[Count | None, GPU, DIAG] = None  # current PCIe link generation
    pcie_gen_max: Annotated[Count | None, GPU, DIAG] = None
    pcie_width: Annotated[Count | None, GPU, DIAG] = None  # current PCIe link width (lanes)
    pcie_width_max: Annotated[Count | None, GPU, DIAG] = None
    cpu_pct: Annotated[Percent | None, HOST, DIAG] = None  # host CPU busy %, all cores
    steal_pct: Annotated[Percent | None, HOST, DIAG] = None  # host CPU steal %
    iowait_pct: Annotated[Percent | None, HOST] = None  # host iowait %
    psi_cpu_some: Annotated[Percent | None, HOST, DIAG] = None  # /proc/pressure/cpu some avg10 (%)
    load1: Annotated[Nonneg | None, HOST, DIAG] = None  # 1-minute load average
    ncpu: Annotated[Count | None, HOST, DIAG] = None  # online CPUs
    proc_cpu_pct: Annotated[Percent | None, HOST, DIAG] = (
        None  # the rank process's own CPU, % of one core
    )
    # CPU time of the rank's process inside its compute gaps, % of their length
    # (from the ring's CPU slots: artemis backend; low = idle, e.g. an input stall)
    gap_busy_pct: Annotated[Percent | None, HOST, DIAG] = None
    # Time the rank's main thread was runnable but not running (/proc/<pid>/schedstat
    # run delay), % of the window's wall time: it waited for a CPU
    run_delay_pct: Annotated[Percent | None, HOST, DIAG] = None
    # The rank's cgroup CPU quota (cpu.stat): throttled time, % of the window's wall
    # time (summed over CPUs, so it may pass 100), and the periods throttled
    cg_throttled_pct: Annotated[Percent | None, HOST, DIAG] = None
    cg_nr_throttled: Annotated[Count | None, HOST, DIAG] = None
    # Time the rank's process was stopped (state T: SIGSTOP, a scheduler's suspend),
    # % of the window's wall time, sampled every ~10 ms by the agent
    stopped_pct: Annotated[Percent | None, HOST, DIAG] = None
    # GPU identity, for an RMA ticket (agent/telemetry/nvml.py, amd.py)
    gpu_uuid: Annotated[Name | None, GPU, IDENT] = None
    gpu_serial: Annotated[Name | None, GPU, IDENT] = None
    gpu_pci_bus: Annotated[Name | None, GPU, IDENT] = None  # domain:bus:device.function
    # GPU hardware error signals. Counts "in the window" are increases of the
    # device's counters over the window; the others are its state at the end.
    xid_count: Annotated[Count | None, GPU, HW] = None  # XID events in the window (NVIDIA)
    xid_last: Annotated[Count | None, GPU, HW] = None  # the last XID code seen in the window
    ecc_corrected: Annotated[Count | None, GPU, HW] = None  # corrected ECC errors in the window
    ecc_uncorrected: Annotated[Count | None, GPU, HW] = (
        None  # uncorrected (AMD: + deferred) ECC errors in the window
    )
    retired_pages: Annotated[Count | None, GPU, HW] = None  # pages retired (AMD: bad pages)
    remapped_rows: Annotated[Count | None, GPU, HW] = None  # HBM rows remapped (A100 and later)
    remap_pending: Annotated[Count | None, GPU, HW] = None  # 1: a retirement/remap awaits reset
    remap_failed: Annotated[Count | None, GPU, HW] = None  # 1: row remapping failed
    nvlink_errors: Annotated[Count | None, GPU, HW] = None  # NVLink replay/recovery/CRC/ECC
    # InfiniBand/RoCE port counters of the host's NICs, increases in the window
    # summed over ports (/sys/class/infiniband/*/ports/*/counters)
    nic_symbol_errors: Annotated[Count | None, HOST, NIC] = None
    nic_link_downed: Annotated[Count | None, HOST, NIC] = None
    nic_rcv_errors: Annotated[Count | None, HOST, NIC] = None
    nic_xmit_wait: Annotated[Count | None, HOST, NIC] = None  # ticks with data but no credit
    missing: Missing = ()

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class RankWindow:
    """One rank's summary of one window of steps on one communicator.

    Windows are numbered from the communicator's first collective: window w
    covers collectives [w * window_steps * colls_per_step, (w + 1) * ...), so
    every rank of a communicator numbers the same steps the same way without a
    shared clock. Times are milliseconds measured on the rank's own clock.
    ``rank`` is the job-wide rank and ``nranks`` the communicator's size, so a
    rank of a second island's communicator may well be >= nranks: there is no
    order between them to check.
    """

    job: Name
    comm: Name  # communicator hash, 16 hex digits
    rank: Count  # job-wide rank (the ring header's global_rank, else the communicator rank)
    nranks: Positive  # size of the communicator this summary comes from
    host: Name
    window: Count
    step_lo: Count  # first step of the window
    step_hi: Count  # one past the last step (>= step_lo)
    coll_lo: Count  # first collective index (coll_seq) of the window
    coll_hi: Count  # one past the last (>= coll_lo)
    gap_ms: Millis  # median per-step compute gap: sum of (next start - previous end) in a step
    coll_ms: Millis  # median per-step time inside collectives
    step_ms: Millis  # median step time (end of a step's last collective to the next one's)
    collectives: Count
    bytes: Count
    lost: Count  # records lost to overwrite or dropped by the writer in this window
    clock: Clock
    island: ShortName | None = None  # vendor island; None = the coordinator decides
    hw_class: Name | None = None  # GPU class (model) for within-class comparison
    samples: Count | None = None  # samples per step this rank processed (rebalance plans)
    bridge_ms: Millis | None = None  # median per-step time in bridge records, if any
    bridge_peer: Count | None = None  # bridge peer island index
    # Quartiles over the window's whole steps of the per-step compute gap (q2 is
    # gap_ms where every step is whole): an incident is confirmed when the rank's
    # lower quartile is above its peers' median (docs/DESIGN.md "Incidents"), so
    # a few long stalls cannot fake a slowdown. Absent from older agents.
    gap_q1_ms: Millis | None = None
    gap_q2_ms: Millis | None = None
    gap_q3_ms: Millis | None = None
    # Mean over the window's whole steps of the per-step compute gap: what the rank
    # costs its peers on average. A rank that stalls in a fraction of its steps moves
    # its mean but not its median (docs/DESIGN.md "Incidents", recurring stalls).
    # Absent from older agents.
    gap_mean_ms: Millis | None = None
    # The longest of those steps' gaps: the mean without it tells a stall that recurs
    # within the window from one long step (a GC pause, a page fault).
    gap_max_ms: Millis | None = None
    # Device-clock anomalies the agent found in this window's records, per reason
    # (agent/summary.py `device_timeline`; docs/RELIABILITY.md "4. Device-clock
    # anomalies"): end before start (record left out), a forward jump, a counter
    # wrap (corrected), a reset (the gap across it left out). None = none.
    clock_reversed: Count | None = None
    clock_jump: Count | None = None
    clock_wrap: Count | None = None
    clock_reset: Count | None = None
    telemetry: Telemetry = field(default_factory=Telemetry)

    def __post_init__(self) -> None:
        if self.step_hi < self.step_lo:
            raise ValueError(f"step_hi: expected >= step_lo ({self.step_lo}), got {self.step_hi}")
        if self.coll_hi < self.coll_lo:
            raise ValueError(f"coll_hi: expected >= coll_lo ({self.coll_lo}), got {self.coll_hi}")

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.job, self.comm, self.window)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        out["telemetry"] = self.telemetry.to_dict()
        return out


@dataclass(frozen=True, slots=True)
class RankProgress:
    """Where a rank stands right now, for hang detection (sent with heartbeats).

    Durations are measured by the agent on its own monotonic clock, never
    compared across hosts.
    """

    job: Name
    comm: Name
    rank: Count
    host: Name
    last_done: Annotated[int, Meta(ge=-1, le=U63)]  # coll_seq of the last completed one, -1 if none
    inflight: Count | None  # coll_seq of the collective the rank sits in, if any
    inflight_s: Seconds  # seconds the rank has been in `inflight` (0 if none)
    idle_s: Seconds  # seconds since the rank's ring last changed
    finished: bool = False  # the ring is marked finished (job exited)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class RankInfo:
    """One rank an agent watches on its node (sent in Hello).

    ``rank`` is the job-wide rank and ``nranks`` the communicator's size (no
    order between the two, as in RankWindow).
    """

    job: Name
    comm: Name
    rank: Count
    nranks: Positive
    pid: Annotated[int, Meta(ge=1, le=1 << 31)] | None = None
    gpu_index: Count | None = None
    vendor: ShortName | None = None
    gpu_model: Name | None = None


# -- software fingerprint (docs/DESIGN.md "Fingerprints") ----------------------

# The env filter and its bounds are the ring format's (the writers apply them
# first): artemis.ring.format, numpy-only, so the job side shares them.
ENV_MAX = ENV_MAX_VARS
SOFTWARE_COMPONENTS = ("gpu_model", "driver", "cuda", "nccl", "torch", "kernel")


EnvName = Annotated[str, Meta(min_length=1, max_length=ENV_NAME_MAX - 1)]
EnvValue = Annotated[str, Meta(max_length=ENV_VALUE_MAX)]
Version = Annotated[str, Meta(min_length=1, max_length=128)]


@dataclass(frozen=True, slots=True)
class Software:
    """One rank's software fingerprint (docs/DESIGN.md "Fingerprints").

    Every component is a non-empty string or absent (None: unknown, never "").
    ``cuda`` is the CUDA version, or the ROCm version as ``rocm-X.Y``; ``nccl``
    the NCCL/RCCL version as ``2.21.5``; ``env`` the kept variables
    (``keep_env_name``): a name that is not is refused on decode.
    """

    gpu_model: Version | None = None
    driver: Version | None = None
    cuda: Version | None = None
    nccl: Version | None = None
    torch: Version | None = None
    kernel: Version | None = None
    env: Annotated[dict[EnvName, EnvValue], Meta(max_length=ENV_MAX)] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = sorted(k for k in self.env if not keep_env_name(k))
        if bad:
            raise ValueError(f"env: {bad[0]!r} is not a kept variable name")

    def to_dict(self) -> dict[str, Any]:
        """The contract's form: present components as strings, ``env`` a dict."""
        d: dict[str, Any] = {
            c: getattr(self, c) for c in SOFTWARE_COMPONENTS if getattr(self, c) is not None
        }
        d["env"] = dict(self.env)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> Software:
        """From the contract's form (unknown keys and empty values dropped, env filtered)."""
        comps = {c: str(d[c]) for c in SOFTWARE_COMPONENTS if d.get(c) not in (None, "")}
        return cls(**comps, env=filter_env(d.get("env") or {}))


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, Telemetry):
        return v.to_dict()
    return v


# -- views derived from the schema --------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One scalar field as the columnar form and the range checks see it.

    ``kind``: "i" int, "f" float, "s" str, "b" bool, "t" throttle map, "m"
    ``missing`` names, "r" a nested record; ``optional``: None allowed;
    ``lo``/``hi``: numeric bounds (inclusive); ``choices``: allowed strings;
    ``min_len``/``max_len``: length bounds of a string, map or list; ``tags``:
    the field's Tags.
    """

    name: str
    kind: str
    optional: bool
    lo: float = -math.inf
    hi: float = math.inf
    choices: tuple[str, ...] = ()
    tags: frozenset[str] = frozenset()
    min_len: int = 0
    max_len: int | None = None


def _lengths(extras: tuple[Any, ...]) -> tuple[int, int | None]:
    lo, hi = 0, None
    for m in extras:
        if isinstance(m, Meta):
            lo = m.min_length if m.min_length is not None else lo
            hi = m.max_length if m.max_length is not None else hi
    return lo, hi


def _bounds(extras: tuple[Any, ...]) -> tuple[float, float]:
    # Kept as given (an int bound stays an exact int: U63 is not a float).
    lo: float = -math.inf
    hi: float = math.inf
    for m in extras:
        if isinstance(m, Meta):
            if m.ge is not None:
                lo = m.ge
            if m.le is not None:
                hi = m.le
    return lo, hi


def _peel(tp: Any) -> tuple[Any, bool, tuple[Any, ...]]:
    """(base type, optional, Annotated extras) of a field annotation, at any nesting."""
    optional = False
    extras: tuple[Any, ...] = ()
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp, *rest = typing.get_args(tp)
            extras += tuple(rest)
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(tp))
            (tp,) = args
        else:
            return tp, optional, extras


def _spec(name: str, tp: Any) -> FieldSpec:
    tp, optional, extras = _peel(tp)
    lo, hi = _bounds(extras)
    tags = frozenset(x for x in extras if isinstance(x, Tag))
    origin = typing.get_origin(tp)
    kind = "r"
    choices: tuple[str, ...] = ()
    if tp is bool:
        kind = "b"
    elif tp is int:
        kind = "i"
    elif tp is float:
        kind = "f"
    elif tp is str:
        kind = "s"
    elif origin is Literal:
        kind, choices = "s", typing.get_args(tp)
    elif origin is dict:
        kind = "t"
    elif origin is tuple:
        kind = "m"
    min_len, max_len = _lengths(extras)
    return FieldSpec(name, kind, optional, lo, hi, choices, tags, min_len, max_len)


def field_specs(cls: type) -> tuple[FieldSpec, ...]:
    """Every field of a record, as FieldSpecs derived from its annotations."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(_spec(f.name, hints[f.name]) for f in fields(cls))


TELEMETRY_SPECS: tuple[FieldSpec, ...] = field_specs(Telemetry)

# Telemetry field names by group, in declaration order (the agent's sources,
# the simulator and the diagnosis agree on them through these).
GPU_FIELDS: tuple[str, ...] = tuple(s.name for s in TELEMETRY_SPECS if GPU in s.tags)
HOST_FIELDS: tuple[str, ...] = tuple(s.name for s in TELEMETRY_SPECS if HOST in s.tags)
# Integer-valued telemetry (averages of these are rounded).
TELEMETRY_INT_FIELDS: frozenset[str] = frozenset(s.name for s in TELEMETRY_SPECS if s.kind == "i")
# Telemetry the diagnosis rules read.
DIAG_FIELDS: tuple[str, ...] = tuple(s.name for s in TELEMETRY_SPECS if DIAG in s.tags)
IDENT_FIELDS: tuple[str, ...] = tuple(s.name for s in TELEMETRY_SPECS if IDENT in s.tags)
HW_FIELDS: tuple[str, ...] = tuple(s.name for s in TELEMETRY_SPECS if HW in s.tags)
NIC_FIELDS: tuple[str, ...] = tuple(s.name for s in TELEMETRY_SPECS if NIC in s.tags)
