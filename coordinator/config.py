"""The coordinator's settings: TOML file (deploy/coordinator.toml documents every key), then flags.

The `[detector]` table holds the detector's tunables (thresholds, hardware
classes, rebalance mode and bounds); they are validated by
`artemis.coordinator.settings.Settings` and can be changed while running with
`artemis-coordinator set KEY VALUE`. `store` and `report_dir` are not: they
are where the coordinator keeps its incident store and writes reports, fixed
for its life (store/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from artemis.protocol.server import PeerLimits
from artemis.protocol.tomlfile import ConfigError
from artemis.protocol.transport import RdmaConfig, TlsConfig
from artemis.store.sink import check_setting


@dataclass(frozen=True)
class CoordinatorConfig:
    listen: str = "0.0.0.0:7470"
    metrics_port: int = 9464  # 0 = no metrics server
    metrics_addr: str = "0.0.0.0"
    jsonl: str = "findings.jsonl"
    plans_jsonl: str = "plans.jsonl"
    secret_file: str = "/etc/artemis/secret"
    control_socket: str = "/run/artemis/coordinator.sock"  # for `artemis-coordinator set`
    transport: str = "tcp"  # tcp | rdma
    assembly_deadline_s: float = 5.0  # a window is scored without the ranks absent this long
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
    # off = none, or a URL: sqlite:///PATH (postgresql:// with the next issue).
    store: str = "auto"
    # Where the HTML report of each job is written when the job ends ("" = none).
    report_dir: str = ""
    tls: TlsConfig = field(default_factory=TlsConfig)  # cert + key: TLS on the agent listener
    rdma: RdmaConfig = field(default_factory=RdmaConfig)
    # What an unauthenticated or silent peer may cost (docs/DESIGN.md "Hostile peers").
    limits: PeerLimits = field(default_factory=PeerLimits)
    detector: dict[str, Any] = field(default_factory=dict)

    def validated(self) -> CoordinatorConfig:
        if self.transport not in ("tcp", "rdma"):
            raise ConfigError(f"transport: expected 'tcp' or 'rdma', got {self.transport!r}")
        if ":" not in self.listen:
            raise ConfigError(f"listen: expected HOST:PORT, got {self.listen!r}")
        if not (0 <= self.metrics_port < 65536):
            raise ConfigError(f"metrics_port: expected 0..65535, got {self.metrics_port}")
        if self.assembly_deadline_s <= 0:
            raise ConfigError("assembly_deadline_s must be > 0")
        try:
            self.limits.validated()
        except ValueError as e:
            raise ConfigError(f"[limits]: {e}") from None
        bad = check_setting(self.store)
        if bad is not None:
            raise ConfigError(bad)
        return self
