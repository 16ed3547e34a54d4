"""The node agent's settings: TOML file (deploy/agent.toml documents every key), then flags."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Annotated

from artemis.common.bounds import bounds_of, out_of_bounds
from artemis.common.tomlfile import ConfigError
from artemis.protocol.addresses import AddressListError, parse_address_list
from artemis.protocol.transport import RdmaConfig, TlsConfig
from msgspec import Meta

# The bounds of the numeric keys, stated on their types (artemis.common.bounds).
Port = Annotated[int, Meta(ge=0, le=65535)]
PositiveSeconds = Annotated[float, Meta(gt=0)]

TELEMETRY_SOURCES = ("nvml", "amdsmi", "host", "simulated")


@dataclass(frozen=True)
class PolicyConfig:
    """What this node lets the coordinator do (control messages)."""

    allow_dumps: bool = True
    allow_plans: bool = True
    allow_settings: bool = True
    # Corrections change GPU settings (reset locked clocks, restore the power limit):
    # off unless the operator turns them on here (docs/OPERATING.md "Corrections").
    allow_corrections: bool = False


@dataclass(frozen=True)
class AgentConfig:
    # HOST:PORT, or a fleet's list "H1:P1,H2:P2" (or a name resolving to several):
    # the agent starts on the first that answers and follows its redirects.
    coordinator: str = "127.0.0.1:7470"
    shm_dir: str = "/dev/shm/artemis"
    secret_file: str = "/etc/artemis/secret"
    host: str = ""  # "" = this machine's hostname
    transport: str = "tcp"  # tcp | rdma
    poll_interval_s: PositiveSeconds = 0.2
    heartbeat_s: PositiveSeconds = 2.0
    scan_interval_s: float = 1.0
    telemetry_interval_s: float = 1.0  # live GPU/host samples, averaged per window
    window_steps: Annotated[int, Meta(ge=2)] = 50
    colls_per_step: int = 0  # 0 = infer from the collective pattern
    telemetry: list[str] = field(default_factory=lambda: ["nvml", "amdsmi", "host"])
    island: str = ""  # "" = from telemetry (GPU vendor)
    proc_root: str = "/"  # root of /proc and /sys (tests use fixture trees)
    buffer_max: int = 20000  # messages kept until acknowledged
    uplink_stall_s: Annotated[float, Meta(ge=0)] = (
        15.0  # data unacknowledged this long: reconnect (0 = never)
    )
    reconnect_max_s: PositiveSeconds = 30.0  # the reconnect back-off's cap
    metrics_port: Port = 0  # the agent's Prometheus endpoint (0 = none)
    metrics_addr: str = "127.0.0.1"
    remove_finished: bool = True  # remove a finished job's rings once shipped and acked
    # The agent's own state (the correction journal): only written with corrections on.
    state_dir: str = "/var/lib/artemis-agent"
    log_json: bool = False
    tls: TlsConfig = field(default_factory=TlsConfig)  # ca verifies the coordinator
    rdma: RdmaConfig = field(default_factory=RdmaConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)

    def validated(self) -> AgentConfig:
        if self.transport not in ("tcp", "rdma"):
            raise ConfigError(f"transport: expected 'tcp' or 'rdma', got {self.transport!r}")
        bad = [s for s in self.telemetry if s not in TELEMETRY_SOURCES]
        if bad:
            raise ConfigError(
                f"telemetry: unknown source {bad[0]!r}; allowed: {', '.join(TELEMETRY_SOURCES)}"
            )
        bad = out_of_bounds(self, _BOUNDS)
        if bad:
            raise ConfigError(bad)
        try:
            parse_address_list(self.coordinator)
        except AddressListError as e:
            raise ConfigError(str(e)) from None
        return self

    @property
    def coordinators(self) -> tuple[str, ...]:
        """The ``coordinator`` list (one address, or a fleet's: "H1:P1,H2:P2")."""
        return parse_address_list(self.coordinator)

    @property
    def hostname(self) -> str:
        return self.host or socket.gethostname()


_BOUNDS = bounds_of(AgentConfig)
