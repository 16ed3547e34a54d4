"""Wiring of the agent process: config, telemetry sources, transport, signals."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any

import structlog
from artemis.agent.config import AgentConfig
from artemis.agent.daemon import run_agent
from artemis.agent.telemetry.base import TelemetrySource
from artemis.protocol.auth import load_secret
from artemis.protocol.tomlfile import ConfigError

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


def make_transport(cfg: AgentConfig) -> Any:
    from artemis.protocol.tcp import TcpTransport, client_ssl_context

    ssl_ctx = None
    if cfg.tls.ca or cfg.tls.cert:
        ssl_ctx = client_ssl_context(cfg.tls.ca or None, cfg.tls.cert or None, cfg.tls.key or None)
    if cfg.transport == "rdma":
        from artemis.protocol.rdma.transport import make_transport as rdma_transport

        return rdma_transport(
            {
                "transport": "rdma",
                "device": cfg.rdma.device or None,
                "port": cfg.rdma.port,
                "gid_index": cfg.rdma.gid_index,
                "secret_file": cfg.secret_file,
                "fallback_tcp": cfg.rdma.fallback_tcp,
            }
        )
    return TcpTransport(client_ssl=ssl_ctx)


async def main(cfg: AgentConfig) -> None:
    try:
        secret = load_secret(cfg.secret_file)
    except (OSError, ValueError) as e:
        raise ConfigError(str(e)) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "agent starting",
        host=cfg.hostname,
        coordinator=cfg.coordinator,
        shm_dir=cfg.shm_dir,
        transport=cfg.transport,
    )
    await run_agent(cfg, make_transport(cfg), secret, make_sources(cfg), stop)
    log.info("agent stopped")
