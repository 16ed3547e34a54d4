from __future__ import annotations

import dataclasses
import os
import queue
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import structlog
from artemis.agent.config import AgentConfig
from artemis.agent.summary import WindowSummarizer
from artemis.agent.telemetry.base import (
    RankTarget,
    TelemetryAccumulator,
    TelemetrySource,
    collect,
    merge,
)
from artemis.agent.telemetry.host import HostSource
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.messages import ProtocolError, Windows
from artemis.protocol.records import RankWindow
from artemis.ring.reader import RingReader

log = structlog.get_logger("artemis.job")

_STORE_KEY = "artemis/detector/address"
RUN = "inproc"  # the in-process job's one run: its summaries' communicator
# Host samples between windows at the agent's cadence, so a window's host evidence is
# the same average of 1-s samples on both paths (issue 31 item 3); one more is taken
# as a batch of windows goes out, so the samples' deltas cover the window to its end.
SAMPLE_S = AgentConfig.telemetry_interval_s


class PrometheusExporter:
    """The ``straggler_*`` metrics of the in-process detector, served by rank 0 on ``port``."""

    def __init__(self, port: int, addr: str = "0.0.0.0") -> None:
        self.port, self.addr = port, addr
        self.metrics: Any = None
        self._server: Any = None

    def start(self) -> Any:
        from artemis.coordinator.metrics import Metrics

        self.metrics = Metrics()
        self._server = self.metrics.serve(self.port, self.addr)
        self.metrics.set_active(True)
        return self.metrics

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


class Detector:
    """Per-rank summariser and, on rank 0, the scorer. Use as a context manager or ``close()``."""

    def __init__(
        self,
        jsonl: str | os.PathLike[str] | None = None,
        exporter: PrometheusExporter | None = None,
        window_steps: int = 50,
        colls_per_step: int | None = None,
        *,
        group: Any = None,
        poll_interval_s: float = 0.5,
        deadline_s: float = 10.0,
        incident_store: str = "auto",
        telemetry: Sequence[TelemetrySource] = (),
        **settings: Any,
    ) -> None:
        import torch.distributed as dist

        from .backend import ArtemisGroup

        pg: Any = group if group is not None else dist.group.WORLD
        if not isinstance(pg, ArtemisGroup):
            raise TypeError(
                "artemis.job.Detector needs the artemis backend: "
                "dist.init_process_group(backend='artemis')"
            )
        self.rank, self.world = pg.rank(), pg.size()
        self._ring_path = pg.ring_path("cpu")
        # islands (ARTEMIS_ISLANDS): a leader's bridge records, and the rank's island as
        # its vendor (an emulated island has no GPU to report one: docs/DESIGN.md "Ring")
        self._bridge_path = pg.bridge_ring_path()
        self._island = _island(pg.global_rank)
        self._sources = list(telemetry)  # sampled per window (the simulator's, injected)
        self._stop = threading.Event()
        # Every 0.5 s by default; windows go out within half a second of their end. A
        # poll with nothing to cut costs a ring read (0.2 ms of CPU under load) and,
        # once a second, a host sample (0.1 ms idle, 0.4 ms under load); each window,
        # its summary and send. On the benchmark's job (20-step windows, a few a second)
        # that is 0.35% of a core on a rank that summarises and sends, 1.3% on rank 0,
        # three quarters of it scoring (bench/README.md, "The in-process detector's CPU").
        self._poll_s = poll_interval_s
        self._hostname = socket.gethostname()
        self._sum = WindowSummarizer(
            pg.job,
            RUN,
            pg.global_rank,
            self.world,
            self._hostname,
            window_steps=window_steps,
            colls_per_step=colls_per_step,
            clock_kind="host",
        )
        self._host = HostSource()
        self._acc = TelemetryAccumulator()
        self._pid = os.getpid()
        self._target = RankTarget(rank=self.rank, pid=self._pid)
        self._sampled_at = -float("inf")  # monotonic time of the last host sample
        # numpy 2's first np.median imports numpy.ma (7 ms of CPU idle, ~20 under load):
        # done now, not by the detector's thread in the middle of the job, holding the GIL
        import numpy.ma  # noqa: F401

        self._seq = 0  # windows messages sent (their protocol sequence numbers)
        self.findings: list[Any] = []
        self.incidents: list[dict[str, Any]] = []
        store = dist.distributed_c10d._get_default_store()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        if self.rank == 0:
            self._shell = _open_shell(
                pg.job, self.world, jsonl, exporter, incident_store, deadline_s, settings
            )
            # the in-memory lists are the shell's (coordinator/sinks.py MemorySink)
            assert self._shell.sinks.memory is not None
            self.findings = self._shell.sinks.memory.findings
            self.incidents = self._shell.sinks.memory.incidents
            self._exporter = exporter
            srv = socket.create_server(("0.0.0.0", 0), backlog=self.world)
            self._srv = srv
            host = os.environ.get("MASTER_ADDR") or self._hostname
            store.set(_STORE_KEY, f"{host}:{srv.getsockname()[1]}")
            self._spawn(self._accept)
            self._spawn(self._score_loop)
        else:
            host, port = store.get(_STORE_KEY).decode().rsplit(":", 1)
            self._sock = socket.create_connection((host, int(port)), timeout=30)
        self._spawn(self._summarise_loop)

    def _spawn(self, fn: Any) -> None:
        t = threading.Thread(target=fn, name=f"artemis-detector-{fn.__name__}", daemon=True)
        t.start()
        self._threads.append(t)

    # -- every rank: summarise own ring -------------------------------------------

    def _ship(self, windows: list[RankWindow]) -> None:
        """Sample the host when a second passed or windows go out, then send them."""
        now = time.monotonic()
        if windows or now - self._sampled_at >= SAMPLE_S:
            # (a poll apart at least, so their deltas span no less; but the last one,
            # taken when the detector closes)
            self._acc.add(self._host.sample(self._target))
            self._sampled_at = now
        if windows:
            self._emit(windows)

    def _emit(self, windows: list[RankWindow]) -> None:
        # the host samples since the last batch, the last one taken just now (a first
        # batch comes at once, when the step period is found: its windows share them)
        live = self._acc.result().to_dict()
        live.pop("missing", None)
        self._acc.reset()
        island = {"vendor": self._island} if self._island else {}
        out = []
        for w in windows:
            own = {k: v for k, v in w.telemetry.to_dict().items() if v is not None}
            own.pop("missing", None)
            parts: list[Any] = [own, island]
            if self._sources:
                target = RankTarget(rank=w.rank, pid=self._pid, window=w.window)
                sampled = collect(self._sources, target).to_dict()
                sampled.pop("missing", None)
                parts.append({k: v for k, v in sampled.items() if v is not None})
            out.append(dataclasses.replace(w, telemetry=merge([*parts, live])))
        if self._sock is not None:
            self._seq += 1
            self._sock.sendall(encode(Windows(host=self._hostname, windows=out), seq=self._seq))
        else:
            self._inbox.put(out)

    def _summarise_loop(self) -> None:
        reader: RingReader | None = None
        bridge = RingReader(self._bridge_path) if self._bridge_path is not None else None
        while True:
            stopping = self._stop.is_set()
            if reader is None and Path(self._ring_path).exists():
                reader = RingReader(self._ring_path)
            if reader is not None:
                if bridge is not None:  # before the windows are cut, as the agent does
                    bb = bridge.poll()
                    self._sum.feed(bb.done)
                b = reader.poll()
                self._sum.add_lost(b.lost)
                self._sum.feed(b.done)
                # stopping: every window left, the partial last one too, in one batch
                self._ship(self._sum.flush() if stopping else self._sum.take_windows())
            if stopping:
                break
            self._stop.wait(self._poll_s)
        if reader is not None:
            reader.close()
        if bridge is not None:
            bridge.close()
        if self._sock is not None:
            self._sock.close()  # the end of this rank's stream: rank 0 reads EOF
        else:
            self._inbox.put(None)

    # -- rank 0: collect and score -----------------------------------------------

    def _accept(self) -> None:
        for _ in range(self.world - 1):
            conn, _ = self._srv.accept()
            self._spawn_reader(conn)

    def _spawn_reader(self, conn: socket.socket) -> None:
        def read() -> None:
            dec = FrameDecoder()
            with conn:
                while True:
                    data = conn.recv(1 << 16)
                    if not data:
                        break
                    for msg in dec.feed(data):
                        if isinstance(msg, Windows):
                            self._inbox.put(msg.columns)
                        elif isinstance(msg, ProtocolError):
                            # a bad frame loses its windows only (they are scored missing)
                            log.warning("rank summaries refused", reason=msg.reason, error=msg.text)
                            if msg.fatal:
                                break
                    if dec.poisoned:
                        break
            self._inbox.put(None)

        t = threading.Thread(target=read, name="artemis-detector-peer", daemon=True)
        t.start()
        self._threads.append(t)

    def _score_loop(self) -> None:
        # Deadlines (seconds: deadline_s) are checked once a poll and after each run of
        # batches, not ten times a second.
        ended = 0
        while ended < self.world:
            try:
                batch = self._inbox.get(timeout=self._poll_s)
                while True:  # every batch queued, then one deadline check
                    if batch is None:
                        ended += 1
                    else:
                        self._shell.add(batch, time.monotonic())
                    batch = self._inbox.get_nowait()
            except queue.Empty:
                pass
            self._shell.expire(time.monotonic())

    # -- lifetime -------------------------------------------------------------

    def close(self, timeout: float = 60.0) -> None:
        """Flush this rank's last windows; on rank 0 wait for every rank's, score, write."""
        if self._stop.is_set():
            return
        self._stop.set()
        end = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, end - time.monotonic()))
        if self.rank == 0:
            self._srv.close()
            # the job's end: what is pending scored, its open incidents closed with
            # their verdicts, the outputs closed
            self._shell.close()
            if self._exporter is not None:
                self._exporter.close()

    def __enter__(self) -> Detector:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _island(global_rank: int) -> str | None:
    """This rank's island (``ARTEMIS_ISLANDS``), the name the backend composes by."""
    from .backend import island_names

    try:
        names = island_names()
    except ValueError:
        return None  # the backend refused it already
    return names[global_rank] if names is not None and global_rank < len(names) else None


def _open_shell(
    job: str,
    world: int,
    jsonl: str | os.PathLike[str] | None,
    exporter: PrometheusExporter | None,
    incident_store: str,
    deadline_s: float,
    settings: dict[str, Any],
) -> Any:
    """Rank 0's shell: the coordinator's job table and sinks, without its daemon."""
    from artemis.coordinator.local import LocalShell
    from artemis.coordinator.sinks import (
        FindingsWriter,
        IncidentsWriter,
        MemorySink,
        Sinks,
        incidents_path,
    )
    from artemis.detect.settings import Settings
    from artemis.store.sink import StoreSink

    path = None if jsonl is None else Path(jsonl)
    sinks = Sinks(
        findings=None if path is None else FindingsWriter(path),
        incidents=None if path is None else IncidentsWriter(incidents_path(path)),
        metrics=exporter.start() if exporter is not None else None,
        # The incident store next to the findings, as the coordinator keeps one
        # (auto | off | sqlite:///PATH; a broken one is logged, then off).
        store=StoreSink.open(incident_store, path) if path is not None else StoreSink(None),
        memory=MemorySink(),
    )
    return LocalShell(
        job,
        RUN,
        world,
        dataclasses.replace(Settings(), **settings),
        sinks,
        deadline_s=deadline_s,
    )
