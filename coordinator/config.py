"""The coordinator's settings: TOML file (deploy/coordinator.toml documents every key), then flags.

The `[detector]` table holds the detector's tunables (thresholds, hardware
classes, rebalance mode and bounds); they are validated by
`artemis.detect.settings.Settings` and can be changed while running with
`artemis-coordinator set KEY VALUE`. `store` and `report_dir` are not: they
are where the coordinator keeps its incident store and writes reports, fixed
for its life (store/README.md). `[retention]` bounds what the outputs keep
on disk (rotation by size and age, dumps and store rows pruned by age).
`[fleet]` makes the coordinator one of a fleet sharing a PostgreSQL store
(docs/DESIGN.md "The coordinator fleet"; coordinator/fleet.py).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

from artemis.common.bounds import bounds_of, out_of_bounds
from artemis.common.diskio import Retention
from artemis.common.tomlfile import ConfigError
from artemis.protocol.peers import PeerLimits
from artemis.protocol.transport import RdmaConfig, TlsConfig
from artemis.store.base import StoreError
from artemis.store.fleet import check_fleet_url
from artemis.store.sink import check_setting
from msgspec import Meta

# The bounds of the numeric keys, stated on their types (artemis.common.bounds).
Port = Annotated[int, Meta(ge=0, le=65535)]
PositiveSeconds = Annotated[float, Meta(gt=0)]
NoLimit = Annotated[float, Meta(ge=0, description="a number of at least 0 (0 = no limit)")]


@dataclass(frozen=True)
class RetentionConfig:
    """``[retention]``: how much of each output a long-running coordinator keeps, so it
    never fills its disk (docs/RELIABILITY.md "3. Full disks"). 0 = no limit."""

    # The findings, incidents and plans JSONL: rotated (NAME.1, NAME.2, ...) when
    # the live file would pass this size, or when its oldest line is older than
    # max_age_days; keep_files rotated generations are kept per file.
    jsonl_max_mb: NoLimit = 256.0
    keep_files: Annotated[int, Meta(ge=1)] = 5
    # Rotated JSONL files, hang dumps and store rows older than this are deleted.
    max_age_days: NoLimit = 30.0
    # The hang dumps folder: oldest dumps deleted first beyond this total size.
    dumps_max_mb: NoLimit = 512.0
    # How often the age and size limits are applied (the tick checks the clock).
    prune_every_s: PositiveSeconds = 3600.0

    def jsonl(self) -> Retention:
        return Retention(
            max_bytes=int(self.jsonl_max_mb * (1 << 20)),
            max_age_s=self.max_age_days * 86400.0,
            keep_files=self.keep_files,
        )

    def validated(self) -> RetentionConfig:
        bad = out_of_bounds(self, _RETENTION_BOUNDS, "retention.")
        if bad:
            raise ConfigError(bad)
        return self


WILDCARDS = ("", "0.0.0.0", "::", "[::]", "*")


@dataclass(frozen=True)
class FleetConfig:
    """``[fleet]``: this coordinator is one of the fleet that shares its PostgreSQL store.
    Each job has one owner at a time, held as a lease of `lease_s` seconds (judged by
    the database's clock) and renewed every `renew_s`; agents of a job it does not own
    are redirected to `advertise` of the owner. A job's state is written whole every
    `snapshot_every` scored windows, the store's journal being the delta between."""

    enabled: bool = False
    id: str = ""  # this coordinator's fleet id ("" = hostname:port of listen)
    lease_s: PositiveSeconds = 10.0
    renew_s: PositiveSeconds = 1.0
    # HOST:PORT agents are redirected to ("" = listen, unless it is a wildcard)
    advertise: str = ""
    # A job's whole state is written every this many scored windows (and whenever
    # something a replay of the journal cannot redo changed it); in between a commit
    # writes its marker only, the journal being the delta. 1 = every window.
    snapshot_every: Annotated[int, Meta(ge=1, le=10_000)] = 10

    def resolved(self, listen: str, store: str) -> FleetConfig:
        """Checked against `listen` and `store`, with `id` and `advertise` filled in;
        a ConfigError naming the key otherwise."""
        if not self.enabled:
            return self
        try:
            check_fleet_url(store)
        except StoreError as e:
            raise ConfigError(f"[fleet] enabled (--fleet): {e}") from None
        if self.renew_s >= self.lease_s:
            raise ConfigError(
                f"[fleet] renew_s ({self.renew_s:g}) must be less than lease_s ({self.lease_s:g})"
            )
        host, _, port = listen.rpartition(":")
        advertise = self.advertise
        if not advertise:
            if host in WILDCARDS:
                raise ConfigError(
                    f"[fleet] advertise (--advertise HOST:PORT) is required: listen {listen!r}"
                    " is a wildcard address, which agents cannot be redirected to"
                )
            advertise = listen
        a_host, sep, a_port = advertise.rpartition(":")
        if not sep or not a_host or a_host in WILDCARDS or not a_port.isdigit():
            raise ConfigError(f"[fleet] advertise: expected HOST:PORT, got {advertise!r}")
        fid = self.id or f"{socket.gethostname()}:{port}"
        return replace(self, id=fid, advertise=advertise)


@dataclass(frozen=True)
class CoordinatorConfig:
    listen: str = "0.0.0.0:7470"
    metrics_port: Port = 9464  # 0 = no metrics server
    metrics_addr: str = "0.0.0.0"
    jsonl: str = "findings.jsonl"
    plans_jsonl: str = "plans.jsonl"
    # The assembly journal ("" = next to the findings: <findings>.assembly) and the
    # hang dumps folder ("" = <findings dir>/<findings stem>.dumps).
    journal: str = ""
    dumps_dir: str = ""
    secret_file: str = "/etc/artemis/secret"
    control_socket: str = "/run/artemis/coordinator.sock"  # for `artemis-coordinator set`
    transport: str = "tcp"  # tcp | rdma
    assembly_deadline_s: PositiveSeconds = (
        5.0  # a window is scored without the ranks absent this long
    )
    # After (re)start no window counts as complete for this long, so agents that
    # are still reconnecting can announce their ranks; < 0 = the deadline.
    assembly_grace_s: float = -1.0
    tick_s: float = 0.25
    dump_wait_s: float = 5.0  # how long a hang finding waits for the agents' dumps
    # A job whose every rank reported finished keeps its series this long, then ends.
    job_linger_s: float = 300.0
    # Samples per step over all ranks, for jobs that do not report it through
    # artemis.job (0 = learn it from the job; such jobs then get no plans).
    global_batch: int = 0
    log_json: bool = False
    # The incident store: auto = a SQLite file next to the findings (artemis.db),
    # off = none, or a URL: sqlite:///PATH, postgresql://... (store/README.md).
    store: str = "auto"
    # Writes queued in memory while the store is slow or unreachable; more are
    # dropped and counted (straggler_store_writes_dropped_total).
    store_queue_max: Annotated[int, Meta(ge=1)] = 10_000
    # The longest wait between reconnects to a store that went away (back-off).
    store_retry_max_s: PositiveSeconds = 30.0
    # Where the HTML report of each job is written when the job ends ("" = none).
    report_dir: str = ""
    tls: TlsConfig = field(default_factory=TlsConfig)  # cert + key: TLS on the agent listener
    rdma: RdmaConfig = field(default_factory=RdmaConfig)
    # What an unauthenticated or silent peer may cost (docs/DESIGN.md "Hostile peers").
    limits: PeerLimits = field(default_factory=PeerLimits)
    detector: dict[str, Any] = field(default_factory=dict)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)

    @property
    def journal_path(self) -> Path:
        return Path(self.journal) if self.journal else Path(self.jsonl).with_suffix(".assembly")

    def validated(self) -> CoordinatorConfig:
        if self.transport not in ("tcp", "rdma"):
            raise ConfigError(f"transport: expected 'tcp' or 'rdma', got {self.transport!r}")
        if ":" not in self.listen:
            raise ConfigError(f"listen: expected HOST:PORT, got {self.listen!r}")
        bad = out_of_bounds(self, _BOUNDS)
        if bad:
            raise ConfigError(bad)
        try:
            self.limits.validated()
        except ValueError as e:
            raise ConfigError(f"[limits]: {e}") from None
        bad = check_setting(self.store)
        if bad is not None:
            raise ConfigError(bad)
        self.retention.validated()
        bad = out_of_bounds(self.fleet, _FLEET_BOUNDS, "fleet.")
        if bad:
            raise ConfigError(bad)
        return replace(self, fleet=self.fleet.resolved(self.listen, self.store))


_RETENTION_BOUNDS = bounds_of(RetentionConfig)
_BOUNDS = bounds_of(CoordinatorConfig)
_FLEET_BOUNDS = bounds_of(FleetConfig)
