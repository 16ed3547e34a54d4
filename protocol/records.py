"""Plain records shared by the agent, the wire and the coordinator core.

These are the payloads: the agent builds them, the protocol carries them (as
msgpack maps, see protocol/README.md), and the scoring core reads them. They are
frozen dataclasses of plain values so every room can use them without importing
another room's machinery.

Absent telemetry is ``None`` and its name is listed in ``missing``; nothing is
ever invented.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

# Telemetry field names, in one place so the agent, the simulator and the
# diagnosis rules agree on them.
GPU_FIELDS = (
    "vendor",  # "nvidia" | "amd"
    "gpu_model",  # e.g. "NVIDIA H100 80GB HBM3"
    "gpu_index",  # device index on the host
    "sm_mhz",  # current SM (graphics) clock
    "sm_mhz_max",  # max SM clock the device supports
    "mem_mhz",  # current memory clock
    "temp_c",  # GPU temperature
    "power_w",  # power draw
    "power_limit_w",  # enforced power limit
    "throttle",  # dict reason -> bool, only reasons the source can report
    "pcie_gen",  # current PCIe link generation
    "pcie_gen_max",
    "pcie_width",  # current PCIe link width (lanes)
    "pcie_width_max",
)
HOST_FIELDS = (
    "cpu_pct",  # host CPU busy %, all cores
    "steal_pct",  # host CPU steal %
    "iowait_pct",  # host iowait %
    "psi_cpu_some",  # /proc/pressure/cpu some avg10 (%)
    "load1",  # 1-minute load average
    "ncpu",  # online CPUs
    "proc_cpu_pct",  # the rank process's own CPU use, % of one core
)

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


@dataclass(frozen=True, slots=True)
class Telemetry:
    """GPU and host signals for one rank over one window (averages over the window)."""

    vendor: str | None = None
    gpu_model: str | None = None
    gpu_index: int | None = None
    sm_mhz: float | None = None
    sm_mhz_max: float | None = None
    mem_mhz: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle: dict[str, bool] | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    cpu_pct: float | None = None
    steal_pct: float | None = None
    iowait_pct: float | None = None
    psi_cpu_some: float | None = None
    load1: float | None = None
    ncpu: int | None = None
    proc_cpu_pct: float | None = None
    # GPU identity, for an RMA ticket (agent/telemetry/nvml.py, amd.py)
    gpu_uuid: str | None = None
    gpu_serial: str | None = None
    gpu_pci_bus: str | None = None  # PCI bus id, domain:bus:device.function
    # GPU hardware error signals. Counts "in the window" are increases of the
    # device's counters over the window; the others are its state at the end.
    xid_count: int | None = None  # XID events in the window (NVIDIA)
    xid_last: int | None = None  # the last XID code seen in the window
    ecc_corrected: int | None = None  # corrected ECC errors in the window
    ecc_uncorrected: int | None = None  # uncorrected (AMD: + deferred) ECC errors in the window
    retired_pages: int | None = None  # memory pages retired (AMD: bad pages)
    remapped_rows: int | None = None  # HBM rows remapped (NVIDIA A100 and later)
    remap_pending: int | None = None  # 1: a page retirement / row remap waits for a GPU reset
    remap_failed: int | None = None  # 1: row remapping failed (NVIDIA: the GPU needs service)
    nvlink_errors: int | None = None  # NVLink replay/recovery/CRC/ECC errors in the window
    # InfiniBand/RoCE port counters of the host's NICs, increases in the window
    # summed over ports (/sys/class/infiniband/*/ports/*/counters)
    nic_symbol_errors: int | None = None
    nic_link_downed: int | None = None
    nic_rcv_errors: int | None = None
    nic_xmit_wait: int | None = None  # ticks a port had data to send but no credit
    missing: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class RankWindow:
    """One rank's summary of one window of steps on one communicator.

    Windows are numbered from the communicator's first collective: window w
    covers collectives [w * window_steps * colls_per_step, (w + 1) * ...), so
    every rank of a communicator numbers the same steps the same way without a
    shared clock. Times are milliseconds measured on the rank's own clock.
    """

    job: str
    comm: str  # communicator hash, 16 hex digits
    rank: int  # job-wide rank (the ring header's global_rank, else the communicator rank)
    nranks: int  # size of the communicator this summary comes from
    host: str
    window: int
    step_lo: int  # first step of the window
    step_hi: int  # one past the last step
    coll_lo: int  # first collective index (coll_seq) of the window
    coll_hi: int  # one past the last
    gap_ms: float  # median per-step compute gap: sum of (next start - previous end) within a step
    coll_ms: float  # median per-step time inside collectives
    step_ms: float  # median step time (end of a step's last collective to the next one's)
    collectives: int
    bytes: int
    lost: int  # records lost to overwrite or dropped by the writer in this window
    clock: str  # "device" | "host" | "ticks"
    island: str | None = None  # vendor island; None = the coordinator decides
    hw_class: str | None = None  # GPU class (model) for within-class comparison
    samples: int | None = None  # samples per step this rank processed (rebalance plans)
    bridge_ms: float | None = None  # median per-step time in bridge records, if any
    bridge_peer: int | None = None  # bridge peer island index
    telemetry: Telemetry = field(default_factory=Telemetry)

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

    job: str
    comm: str
    rank: int
    host: str
    last_done: int  # coll_seq of the last completed collective, -1 if none
    inflight: int | None  # coll_seq of the collective the rank sits in, if any
    inflight_s: float  # seconds the rank has been in `inflight` (0 if none)
    idle_s: float  # seconds since the rank's ring last changed
    finished: bool = False  # the ring is marked finished (job exited)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, Telemetry):
        return v.to_dict()
    return v
