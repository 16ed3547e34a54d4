"""Wiring of the coordinator process: outputs, metrics, transport, control socket, ticks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import structlog
from artemis.coordinator.cli import install_signal_handlers, prepare_socket_path
from artemis.coordinator.config import CoordinatorConfig
from artemis.coordinator.findings import FindingsWriter
from artemis.coordinator.journal import AssemblyJournal
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.plans import PlansWriter
from artemis.coordinator.service import Coordinator
from artemis.coordinator.settings import Settings, SettingsError
from artemis.protocol.auth import load_secret
from artemis.protocol.messages import REASONS
from artemis.protocol.server import ProtocolServer
from artemis.protocol.tomlfile import ConfigError

REFUSAL_REASONS = ("auth", "protocol", "timeout", "version")

log = structlog.get_logger("artemis.coordinator")


def make_transport(cfg: CoordinatorConfig) -> Any:
    from artemis.protocol.tcp import TcpTransport, server_ssl_context

    ssl_ctx = None
    if cfg.tls.cert:
        ssl_ctx = server_ssl_context(cfg.tls.cert, cfg.tls.key, cfg.tls.ca or None)
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
    return TcpTransport(server_ssl=ssl_ctx)


def register_protocol_metrics(
    registry: Any, server: ProtocolServer, coord: Coordinator | None = None
) -> None:
    """Expose the server's plain counters through a collector read at scrape time."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self) -> Any:
            st = server.stats.snapshot()
            c = CounterMetricFamily("straggler_protocol_frames", "Frames received", labels=[])
            c.add_metric([], st["frames_total"])
            yield c
            # Every known reason is exported from the start (at 0), so rates and
            # alerts have a series before the first bad frame arrives.
            b = CounterMetricFamily(
                "straggler_protocol_bad_frames", "Bad frames by reason", labels=["reason"]
            )
            bad = {**dict.fromkeys(REASONS, 0), **st["bad_frames_total"]}
            for k, v in sorted(bad.items()):
                b.add_metric([k], v)
            yield b
            r = CounterMetricFamily(
                "straggler_protocol_refused_peers", "Refused peers by reason", labels=["reason"]
            )
            refused = {**dict.fromkeys(REFUSAL_REASONS, 0), **st["refused_peers_total"]}
            for k, v in sorted(refused.items()):
                r.add_metric([k], v)
            yield r
            g = GaugeMetricFamily("straggler_agents_connected", "Authenticated agents connected")
            g.add_metric([], st["established"])
            yield g
            d = CounterMetricFamily(
                "straggler_protocol_duplicates", "Resent data messages already delivered"
            )
            d.add_metric([], st["duplicates_total"])
            yield d
            if coord is not None:
                a = coord.assembler
                late = CounterMetricFamily(
                    "straggler_windows_late",
                    "Rank-window summaries that came after their window was scored (dropped)",
                )
                late.add_metric([], a.late)
                yield late
                dup = CounterMetricFamily(
                    "straggler_windows_duplicate",
                    "Rank-window summaries received twice (an agent resending; ignored)",
                )
                dup.add_metric([], a.duplicates)
                yield dup

        def describe(self) -> Any:
            return []

    registry.register(_Collector())


async def run_coordinator(cfg: CoordinatorConfig) -> None:
    try:
        settings = Settings.from_mapping(cfg.detector)
    except SettingsError as e:
        raise ConfigError(f"[detector]: {e}") from None
    try:
        secret = load_secret(cfg.secret_file)
    except (OSError, ValueError) as e:
        raise ConfigError(str(e)) from None
    for out in (cfg.jsonl, cfg.plans_jsonl):
        # The outputs exist from the start, empty while nothing was found.
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).touch()
    metrics = Metrics()
    coord = Coordinator(
        settings,
        FindingsWriter(cfg.jsonl),
        PlansWriter(cfg.plans_jsonl),
        metrics,
        deadline_s=cfg.assembly_deadline_s,
        dump_wait_s=cfg.dump_wait_s,
        global_batch=cfg.global_batch or None,
        grace_s=None if cfg.assembly_grace_s < 0 else cfg.assembly_grace_s,
        job_linger_s=cfg.job_linger_s,
    )
    server = ProtocolServer(
        make_transport(cfg), cfg.listen, secret, coord, settings=settings.to_dict()
    )
    coord.server = server
    # Summaries taken but not scored by an earlier life of this coordinator.
    coord.restore(AssemblyJournal(Path(cfg.jsonl).with_suffix(".assembly")))
    register_protocol_metrics(metrics.registry, server, coord)
    metrics.set_active(False)
    mserver = metrics.serve(cfg.metrics_port, cfg.metrics_addr) if cfg.metrics_port else None
    stop = asyncio.Event()
    install_signal_handlers(stop)
    address = await server.start()
    metrics.set_active(True)
    ctl = await _control_server(cfg.control_socket, coord)
    log.info(
        "coordinator serving",
        listen=address,
        metrics_port=cfg.metrics_port,
        findings=cfg.jsonl,
        plans=cfg.plans_jsonl,
        control_socket=cfg.control_socket,
    )

    async def ticker() -> None:
        while not stop.is_set():
            try:
                await coord.tick()
            except Exception:  # one bad tick must not stop the coordinator
                log.exception("tick failed")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), cfg.tick_s)

    tick_task = asyncio.create_task(ticker())
    try:
        await stop.wait()
    finally:
        log.info("coordinator stopping: flushing outputs")
        tick_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await tick_task
        await server.close()
        coord.flush()
        metrics.set_active(False)
        if ctl is not None:
            ctl.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(cfg.control_socket)
        if mserver is not None:
            mserver.stop()
        log.info("coordinator stopped")


async def _control_server(path: str, coord: Coordinator) -> asyncio.base_events.Server | None:
    """`artemis-coordinator set KEY VALUE` talks to this unix socket (owner-only)."""
    if not path:
        return None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            try:
                req = json.loads(line or b"{}")
                if req.get("cmd") == "set":
                    s = coord.set_setting(str(req["key"]), str(req["value"]))
                    reply: dict[str, Any] = {"ok": True, "settings": s.to_dict()}
                elif req.get("cmd") == "get":
                    reply = {"ok": True, "settings": coord.settings.to_dict()}
                else:
                    reply = {"ok": False, "error": f"unknown command {req.get('cmd')!r}"}
            except (SettingsError, KeyError, ValueError, TypeError) as e:
                reply = {"ok": False, "error": str(e)}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()

    try:
        prepare_socket_path(path)
        srv = await asyncio.start_unix_server(handle, path=path)
        os.chmod(path, 0o600)
    except OSError as e:
        log.warning("control socket unavailable: `set` will not work", path=path, error=str(e))
        return None
    return srv
