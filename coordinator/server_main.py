"""The coordinator process: ``CoordinatorServer`` (outputs, metrics, transport, control socket,
ticks) and its shell ``main`` (signals)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

import structlog
from artemis.coordinator.cli import prepare_socket_path
from artemis.coordinator.config import CoordinatorConfig
from artemis.coordinator.findings import FindingsWriter
from artemis.coordinator.journal import AssemblyJournal
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.service import Coordinator
from artemis.coordinator.settings import Settings, SettingsError
from artemis.protocol.auth import load_secret
from artemis.protocol.lifecycle import Lifecycle, capture_signals
from artemis.protocol.messages import REASONS
from artemis.protocol.rdma.transport import RdmaUnavailable
from artemis.protocol.server import ProtocolServer
from artemis.protocol.tomlfile import ConfigError
from artemis.protocol.transport import Transport, build_transport
from artemis.rebalance.outputs import PlansWriter
from artemis.store.sink import StoreSink

REFUSAL_REASONS = ("auth", "protocol", "timeout", "version")

log = structlog.get_logger("artemis.coordinator")


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
                    "Rank-window summaries that came after their window was released: "
                    "scored late (straggler_windows_late_scored) or dropped (reason late)",
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


class CoordinatorServer(Lifecycle):
    """The coordinator process: ``serve()`` = ``startup()``, ``main_loop()``, ``shutdown()``.

    startup validates the detector settings and the secret (``ConfigError``
    before anything is bound), creates the outputs, restores the assembly
    journal, then serves metrics, the agent listener and the control socket;
    the main loop runs ``Coordinator.tick`` every ``tick_s`` (a failing tick is
    logged, not fatal); shutdown closes the listener, flushes every output and
    removes the control socket. Signals belong to the shell (``main``).
    ``transport`` replaces the one ``build_transport`` makes from the config.
    """

    def __init__(self, cfg: CoordinatorConfig, *, transport: Transport | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self._transport = transport
        self.metrics: Metrics | None = None
        self.coord: Coordinator | None = None
        self.server: ProtocolServer | None = None
        self.address: str | None = None  # where agents connect, once started
        self.started = asyncio.Event()
        self._ctl: asyncio.base_events.Server | None = None
        self._mserver: Any = None

    async def serve(self) -> None:
        try:
            await self.startup()
            await self.main_loop()
        finally:
            await self.shutdown()

    async def startup(self) -> None:
        cfg = self.cfg
        try:
            settings = Settings.from_mapping(cfg.detector)
        except SettingsError as e:
            raise ConfigError(f"[detector]: {e}") from None
        try:
            secret = load_secret(cfg.secret_file)
            transport = self._transport or build_transport(cfg, "coordinator")
        except (OSError, ValueError, RdmaUnavailable) as e:
            raise ConfigError(str(e)) from None
        for out in (cfg.jsonl, cfg.plans_jsonl):
            # The outputs exist from the start, empty while nothing was found.
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).touch()
        metrics = self.metrics = Metrics()
        metrics.report_dir = cfg.report_dir
        coord = self.coord = Coordinator(
            settings,
            FindingsWriter(cfg.jsonl),
            PlansWriter(cfg.plans_jsonl),
            metrics,
            deadline_s=cfg.assembly_deadline_s,
            dump_wait_s=cfg.dump_wait_s,
            global_batch=cfg.global_batch or None,
            grace_s=None if cfg.assembly_grace_s < 0 else cfg.assembly_grace_s,
            job_linger_s=cfg.job_linger_s,
            # A store that cannot be opened is logged and left off: never fatal.
            store=StoreSink.open(cfg.store, cfg.jsonl),
            report_dir=cfg.report_dir,
        )
        server = ProtocolServer(transport, cfg.listen, secret, coord, settings=settings.to_dict())
        coord.server = server
        # Summaries taken but not scored by an earlier life of this coordinator.
        coord.restore(AssemblyJournal(Path(cfg.jsonl).with_suffix(".assembly")))
        register_protocol_metrics(metrics.registry, server, coord)
        metrics.set_active(False)
        if cfg.metrics_port:
            self._mserver = metrics.serve(cfg.metrics_port, cfg.metrics_addr)
        self.address = await server.start()
        self.server = server
        metrics.set_active(True)
        self._ctl = await _control_server(cfg.control_socket, coord)
        log.info(
            "coordinator serving",
            listen=self.address,
            transport=transport.name,
            metrics_port=cfg.metrics_port,
            findings=cfg.jsonl,
            plans=cfg.plans_jsonl,
            store=coord.store.url if coord.store.on else None,
            control_socket=cfg.control_socket,
        )
        self.started.set()

    async def main_loop(self) -> None:
        while not self.should_exit:
            await self.on_tick()
            await self.wait_tick(self.cfg.tick_s)

    async def on_tick(self) -> None:
        assert self.coord is not None
        try:
            await self.coord.tick()
        except Exception:  # one bad tick must not stop the coordinator
            log.exception("tick failed")

    async def shutdown(self) -> None:
        if self.coord is None:
            return  # startup refused the config: nothing was opened
        log.info("coordinator stopping: flushing outputs")
        if self.server is not None:
            await self.server.close()
        self.coord.flush()
        if self.metrics is not None:
            self.metrics.set_active(False)
        if self._ctl is not None:
            self._ctl.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.cfg.control_socket)
            self._ctl = None
        if self._mserver is not None:
            self._mserver.stop()
            self._mserver = None
        self.coord = None
        log.info("coordinator stopped")


async def main(cfg: CoordinatorConfig) -> None:
    """The shell: signals around ``CoordinatorServer.serve``."""
    server = CoordinatorServer(cfg)
    with capture_signals(server):
        await server.serve()


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
