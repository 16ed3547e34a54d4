"""The node agent's settings: TOML file (deploy/agent.toml documents every key), then flags."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from artemis.common.tomlfile import ConfigError
from artemis.protocol.transport import RdmaConfig, TlsConfig

TELEMETRY_SOURCES = ("nvml", "amdsmi", "host", "simulated")


@dataclass(frozen=True)
class PolicyConfig:
    """What this node lets the coordinator do (control messages)."""

    allow_dumps: bool = True
    allow_plans: bool = True
    allow_settings: bool = True


@dataclass(frozen=True)
class AgentConfig:
    coordinator: str = "127.0.0.1:7470"
    shm_dir: str = "/dev/shm/artemis"
    secret_file: str = "/etc/artemis/secret"
    host: str = ""  # "" = this machine's hostname
    transport: str = "tcp"  # tcp | rdma
    poll_interval_s: float = 0.2
    heartbeat_s: float = 2.0
    scan_interval_s: float = 1.0
    telemetry_interval_s: float = 1.0  # live GPU/host samples, averaged per window
    window_steps: int = 50
    colls_per_step: int = 0  # 0 = infer from the collective pattern
    telemetry: list[str] = field(default_factory=lambda: ["nvml", "amdsmi", "host"])
    island: str = ""  # "" = from telemetry (GPU vendor)
    proc_root: str = "/"  # root of /proc and /sys (tests use fixture trees)
    buffer_max: int = 20000  # messages kept until acknowledged
    uplink_stall_s: float = 15.0  # data unacknowledged this long: reconnect (0 = never)
    reconnect_max_s: float = 30.0  # the reconnect back-off's cap
    metrics_port: int = 0  # the agent's Prometheus endpoint (0 = none)
    metrics_addr: str = "127.0.0.1"
    remove_finished: bool = True  # remove a finished job's rings once shipped and acked
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
        if self.window_steps < 2:
            raise ConfigError(f"window_steps: expected an integer >= 2, got {self.window_steps}")
        if self.poll_interval_s <= 0 or self.heartbeat_s <= 0:
            raise ConfigError("poll_interval_s and heartbeat_s must be > 0")
        if self.uplink_stall_s < 0 or self.reconnect_max_s <= 0:
            raise ConfigError("uplink_stall_s must be >= 0 and reconnect_max_s > 0")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port: expected 0..65535, got {self.metrics_port}")
        if ":" not in self.coordinator:
            raise ConfigError(f"coordinator: expected HOST:PORT, got {self.coordinator!r}")
        return self

    @property
    def hostname(self) -> str:
        return self.host or socket.gethostname()
