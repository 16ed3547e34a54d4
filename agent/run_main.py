"""The agent process's shell: config, telemetry sources, transport, signals around ``AgentDaemon``."""

from __future__ import annotations

import structlog
from artemis.agent.config import AgentConfig
from artemis.agent.daemon import AgentDaemon
from artemis.agent.telemetry.base import TelemetrySource
from artemis.common.lifecycle import capture_signals
from artemis.common.tomlfile import ConfigError
from artemis.protocol.auth import load_secret
from artemis.protocol.rdma.transport import RdmaUnavailable
from artemis.protocol.transport import build_transport

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

            out.append(HostSource(cfg.proc_root))
        elif name == "nvml":
            from artemis.agent.telemetry.nvml import NvmlSource

            nv = NvmlSource(cfg.proc_root)
            ok, why = nv.available()
            if ok:
                out.append(nv)
            else:
                log.info("NVML telemetry unavailable", reason=why)
        elif name == "amdsmi":
            from artemis.agent.telemetry.amd import AmdSmiSource

            amd = AmdSmiSource(cfg.proc_root)
            ok, why = amd.available()
            if ok:
                out.append(amd)
            else:
                log.info("AMD SMI telemetry unavailable", reason=why)
    return out


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
