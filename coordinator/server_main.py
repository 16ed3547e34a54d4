"""The coordinator process: ``CoordinatorServer`` (outputs, metrics, transport, control socket,
ticks) and its shell ``main`` (signals)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import resource
import socket
import stat
import struct
from pathlib import Path
from typing import Any

import structlog
from artemis.common.lifecycle import Daemon, capture_signals
from artemis.common.ports import cannot_listen
from artemis.common.tomlfile import ConfigError
from artemis.coordinator.cli import prepare_socket_path
from artemis.coordinator.config import CoordinatorConfig
from artemis.coordinator.journal import AssemblyJournal
from artemis.coordinator.metrics import (
    Metrics,
    register_protocol_metrics,
    register_store_metrics,
)
from artemis.coordinator.service import Coordinator
from artemis.coordinator.sinks import FindingsWriter, IncidentsWriter, incidents_path
from artemis.detect.settings import Settings, SettingsError
from artemis.protocol.auth import load_secret
from artemis.protocol.heap import keep_heap_compact, release_free
from artemis.protocol.rdma.transport import RdmaUnavailable
from artemis.protocol.server import ProtocolServer
from artemis.protocol.transport import Transport, build_transport
from artemis.rebalance.outputs import PlansWriter
from artemis.store.sink import StoreSink

log = structlog.get_logger("artemis.coordinator")

CORRECTION_COMMANDS = ("pending", "approve", "deny", "correct")


class CoordinatorServer(Daemon):
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
        fleet = _open_fleet(cfg)
        coord = self.coord = (Coordinator if fleet is None else _fleet_coordinator(fleet))(
            settings,
            FindingsWriter(cfg.jsonl, cfg.retention.jsonl()),
            PlansWriter(cfg.plans_jsonl, cfg.retention.jsonl()),
            metrics,
            deadline_s=cfg.assembly_deadline_s,
            dump_wait_s=cfg.dump_wait_s,
            global_batch=cfg.global_batch or None,
            grace_s=None if cfg.assembly_grace_s < 0 else cfg.assembly_grace_s,
            job_linger_s=cfg.job_linger_s,
            # A store that cannot be opened is logged and left off: never fatal.
            store=StoreSink.open(
                cfg.store,
                cfg.jsonl,
                queue_max=cfg.store_queue_max,
                retry_max_s=cfg.store_retry_max_s,
            ),
            report_dir=cfg.report_dir,
            dumps_dir=cfg.dumps_dir or None,
            incidents=IncidentsWriter(incidents_path(cfg.jsonl), cfg.retention.jsonl()),
            retention=cfg.retention,
        )
        raise_open_files_limit()
        keep_heap_compact()  # freed frames and window arrays go back to the kernel
        server = ProtocolServer(
            transport,
            cfg.listen,
            secret,
            coord,
            settings=settings.to_dict(),
            limits=cfg.limits,
            # In a fleet the welcome names the coordinator by its fleet id, as a redirect
            # does: an agent tells its links to different coordinators apart by it.
            coordinator_id=cfg.fleet.id if fleet is not None else "coordinator",
        )
        coord.server = server
        if fleet is None:
            # Summaries taken but not scored by an earlier life of this coordinator.
            coord.restore(AssemblyJournal(cfg.journal_path))
        else:
            # A fleet's jobs are restored from the store as their leases are taken.
            fleet.start()
        register_protocol_metrics(metrics.registry, server, coord)
        register_store_metrics(
            metrics.registry, coord.store, None if fleet is None else fleet.reached
        )
        metrics.set_active(False)
        # A port another process holds is the operator's to fix: one line naming it,
        # not a traceback (`artemis run` reads it to pick other ports).
        if cfg.metrics_port:
            try:
                self._mserver = metrics.serve(cfg.metrics_port, cfg.metrics_addr)
            except OSError as e:
                where = f"{cfg.metrics_addr}:{cfg.metrics_port}"
                raise ConfigError(cannot_listen("metrics_port", where, e)) from None
        try:
            self.address = await server.start()
        except OSError as e:
            raise ConfigError(cannot_listen("listen", cfg.listen, e)) from None
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
            fleet=cfg.fleet.id if cfg.fleet.enabled else None,
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
        release_free()  # protocol/heap.py: a window's freed memory back to the kernel

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


def _open_fleet(cfg: CoordinatorConfig) -> Any:
    """The fleet's leases ([fleet] enabled), or None. Its store unreachable at start is a
    ConfigError naming it: a fleet coordinator cannot serve without its leases."""
    if not cfg.fleet.enabled:
        return None
    from artemis.coordinator.fleet import Fleet
    from artemis.store.base import StoreError

    try:
        return Fleet(cfg.fleet, cfg.store)
    except StoreError as e:
        raise ConfigError(f"[fleet]: {e}") from None


def _fleet_coordinator(fleet: Any) -> Any:
    import functools

    from artemis.coordinator.fleet import FleetCoordinator

    return functools.partial(FleetCoordinator, fleet=fleet)


async def main(cfg: CoordinatorConfig, fleet: dict[str, Any] | None = None) -> None:
    """The shell: signals around ``CoordinatorServer.serve``. `fleet`: the `[fleet]` keys
    given as flags (None: not given), over the file's table (ConfigError if they do not fit)."""
    given = {k: v for k, v in (fleet or {}).items() if v is not None}
    if given:
        cfg = dataclasses.replace(cfg, fleet=dataclasses.replace(cfg.fleet, **given)).validated()
    server = CoordinatorServer(cfg)
    with capture_signals(server):
        await server.serve()


def raise_open_files_limit() -> int:
    """Raise the soft limit on open files to the hard one: every agent (and every
    peer still in its handshake, up to ``[limits] max_unauthenticated``) holds one.
    Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, 1 << 20)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-files limit", soft=soft, hard=hard, error=str(e))
    return soft


def control_peer_refusal(path: str, sock: socket.socket | None) -> str | None:
    """Why a control-socket peer may not use it (None = allowed): only the socket
    file's owner and its group may (SO_PEERCRED: the connecting process's uid,
    gid and, from /proc, its supplementary groups)."""
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return "cannot identify the connecting process (no SO_PEERCRED here)"
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    try:
        st = os.stat(path)
    except OSError as e:
        return f"control socket {path} is gone: {e.strerror}"
    if uid == st.st_uid or gid == st.st_gid or st.st_gid in _groups_of(pid):
        return None
    return (
        f"uid {uid} (gid {gid}) may not change the coordinator's settings: the control socket"
        f" {path} is for its owner (uid {st.st_uid}) and group (gid {st.st_gid}) only"
    )


def _groups_of(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


async def _control_server(path: str, coord: Coordinator) -> asyncio.base_events.Server | None:
    """`artemis-coordinator set KEY VALUE` talks to this unix socket (mode 0660:
    its owner and group; every connection's credentials are checked too)."""
    if not path:
        return None

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            # The request is read first so the client gets the answer, not a broken pipe.
            line = await reader.readline()
            refusal = control_peer_refusal(path, writer.get_extra_info("socket"))
            if refusal is not None:
                log.warning("control socket peer refused", reason=refusal)
                writer.write(json.dumps({"ok": False, "error": refusal}).encode() + b"\n")
                await writer.drain()
                return
            try:
                req = json.loads(line or b"{}")
                if req.get("cmd") == "set":
                    s = coord.set_setting(str(req["key"]), str(req["value"]))
                    reply: dict[str, Any] = {"ok": True, "settings": s.to_dict()}
                elif req.get("cmd") == "get":
                    reply = {"ok": True, "settings": coord.settings.to_dict()}
                elif req.get("cmd") in CORRECTION_COMMANDS:
                    reply = coord.correction_command(req)
                    await coord._flush_controls()  # an approved or forced one goes out now
                else:
                    reply = {"ok": False, "error": f"unknown command {req.get('cmd')!r}"}
            except KeyError as e:
                reply = {"ok": False, "error": f"missing argument {e}"}
            except (SettingsError, ValueError, TypeError) as e:  # CorrectionError too
                reply = {"ok": False, "error": str(e)}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()

    try:
        prepare_socket_path(path)
        srv = await asyncio.start_unix_server(handle, path=path)
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IWGRP)
    except OSError as e:
        log.warning("control socket unavailable: `set` will not work", path=path, error=str(e))
        return None
    return srv
