"""The agent process's shell: config, telemetry sources, transport, signals around ``AgentDaemon``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import structlog
from artemis.agent.config import AgentConfig
from artemis.agent.daemon import AgentDaemon
from artemis.agent.telemetry.base import TelemetrySource
from artemis.common.lifecycle import capture_signals
from artemis.common.tomlfile import ConfigError
from artemis.protocol.auth import load_secret
from artemis.protocol.rdma.transport import RdmaUnavailable
from artemis.protocol.transport import build_transport

if TYPE_CHECKING:
    from artemis.agent.telemetry.amd import AmdSmiSource
    from artemis.agent.telemetry.nvml import NvmlSource

log = structlog.get_logger("artemis.agent")


def make_sources(cfg: AgentConfig) -> list[TelemetrySource]:
    """The configured telemetry sources; a hardware source whose library or device is
    absent says so once and is left out (its fields are then reported missing)."""
    out: list[TelemetrySource] = []
    for name in cfg.telemetry:
        if name == "simulated":
            from artemis.agent.telemetry.simulated import SimulatedSource

            out.append(SimulatedSource(cfg.shm_dir))
        elif name == "host":
            from artemis.agent.telemetry.host import HostSource
            from artemis.agent.telemetry.procstate import StateSampler

            out.append(HostSource(cfg.proc_root, states=StateSampler(cfg.proc_root)))
        elif name in ("nvml", "amdsmi"):
            gpu, label = _gpu_source(name, cfg.proc_root)
            ok, why = gpu.available()
            if ok:
                out.append(gpu)
            else:
                log.info(f"{label} telemetry unavailable", reason=why)
    return out


def _gpu_source(name: str, proc_root: str) -> tuple[NvmlSource | AmdSmiSource, str]:
    """A GPU vendor's telemetry source and its name in the logs, its library imported
    only when configured."""
    if name == "nvml":
        from artemis.agent.telemetry.nvml import NvmlSource

        return NvmlSource(proc_root), "NVML"
    from artemis.agent.telemetry.amd import AmdSmiSource

    return AmdSmiSource(proc_root), "AMD SMI"


async def main(cfg: AgentConfig) -> None:
    """The shell: secret, transport and telemetry from the config, signals, then serve."""
    try:
        secret = load_secret(cfg.secret_file)
        transport = build_transport(cfg, "agent")
    except (OSError, ValueError, RdmaUnavailable) as e:
        raise ConfigError(str(e)) from None
    daemon = AgentDaemon(cfg, transport, secret, make_sources(cfg))
    log.info(
        "agent starting",
        host=cfg.hostname,
        coordinator=cfg.coordinator,
        shm_dir=cfg.shm_dir,
        transport=transport.name,
    )
    with capture_signals(daemon):
        await daemon.serve()
    log.info("agent stopped")
