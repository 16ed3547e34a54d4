"""``artemis.job.Detector``: the detector inside the job, with no agent and no coordinator.

Created on every rank after ``init_process_group(backend="artemis")``. Each rank
runs a thread that reads its own ring (the one the ``artemis`` backend writes),
summarises its windows with the agent's summariser (``WindowSummarizer``) and
attaches host telemetry of its own process (``HostSource``; GPU telemetry where
pynvml or amdsmi exist). The summaries go to rank 0 over a TCP side channel whose
address rank 0 publishes in the job's c10d store (never a collective: it cannot
block or reorder a training step). Rank 0 scores each window, once every rank's
summary is in (or ``deadline_s`` after the first), with the coordinator's
``JobMonitor`` and writes what it returns like the coordinator does: the findings
JSONL, ``incidents.jsonl`` next to it (closed at ``close()``: the job's end), the
incident store next to it (``incident_store``, by default ``artemis.db``: store/README.md), the
``straggler`` logger, and the ``straggler_*`` metrics of an optional
``PrometheusExporter`` (served from its own thread).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import socket
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from artemis.agent.summary import WindowSummarizer
from artemis.agent.telemetry.base import RankTarget, TelemetryAccumulator, merge
from artemis.agent.telemetry.host import HostSource
from artemis.agent.telemetry.simulated import SimulatedSource
from artemis.protocol.records import RankWindow, Telemetry
from artemis.ring.reader import RingReader

_STORE_KEY = "artemis/detector/address"


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


def _to_wire(w: RankWindow) -> bytes:
    return (json.dumps(dataclasses.asdict(w), separators=(",", ":")) + "\n").encode()


def _from_wire(line: bytes) -> RankWindow:
    d = json.loads(line)
    d["telemetry"] = Telemetry(**d.get("telemetry") or {})
    return RankWindow(**d)


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
        # islands (ARTEMIS_ISLANDS): a leader's bridge records, and the island as the
        # agent learns it (the per-rank telemetry file's vendor, docs/DESIGN.md "Ring")
        self._bridge_path = pg.bridge_ring_path()
        self._sim = SimulatedSource(pg.shm_dir, pg.job)
        self._stop = threading.Event()
        # Every 0.5 s by default: each poll (ring read, summariser, host sample) costs
        # about 1 ms of CPU; at 0.1 s the detector's threads took 6-8% of a rank's CPU
        # on the benchmark's job, at 0.5 s 2.5-4% (bench/README.md, "The artemis
        # backend"). Windows still go out within half a second of their end.
        self._poll_s = poll_interval_s
        self._sum = WindowSummarizer(
            pg.job,
            "",
            pg.global_rank,
            self.world,
            socket.gethostname(),
            window_steps=window_steps,
            colls_per_step=colls_per_step,
            clock_kind="host",
        )
        self._host = HostSource()
        self._acc = TelemetryAccumulator()
        self._pid = os.getpid()
        self.findings: list[Any] = []
        store = dist.distributed_c10d._get_default_store()
        self._inbox: queue.SimpleQueue[RankWindow | None] = queue.SimpleQueue()
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        if self.rank == 0:
            from artemis.coordinator.writers import (
                FindingsWriter,
                IncidentsWriter,
                incidents_path,
            )
            from artemis.detect.monitor import JobMonitor
            from artemis.detect.settings import Settings

            base = Settings()
            self._monitor = JobMonitor(
                pg.job, dataclasses.replace(base, **settings), run="inproc", nranks=self.world
            )
            # No agent sends fingerprints in-process: no baselines across jobs here.
            self._monitor.baselines.enabled = False
            self._writer = FindingsWriter(jsonl) if jsonl is not None else None
            self._incidents = IncidentsWriter(incidents_path(jsonl)) if jsonl is not None else None
            from artemis.store.sink import StoreSink

            # The incident store next to the findings, as the coordinator keeps one
            # (auto | off | sqlite:///PATH; a broken one is logged, then off).
            self._store = (
                StoreSink.open(incident_store, jsonl) if jsonl is not None else StoreSink(None)
            )
            self._store.write_job(pg.job, {"run": "inproc", "ranks": self.world, "ended": None})
            self.incidents: list[dict[str, Any]] = []
            self._exporter = exporter
            self._metrics = exporter.start() if exporter is not None else None
            self._deadline_s = deadline_s
            srv = socket.create_server(("0.0.0.0", 0), backlog=self.world)
            self._srv = srv
            host = os.environ.get("MASTER_ADDR") or socket.gethostname()
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

    def _emit(self, windows: list[RankWindow]) -> None:
        if not windows:
            return
        # the host samples since the last batch (a first batch comes at once, when
        # the step period is found: its windows share them)
        live = self._acc.result().to_dict()
        live.pop("missing", None)
        self._acc.reset()
        for w in windows:
            own = {k: v for k, v in w.telemetry.to_dict().items() if v is not None}
            own.pop("missing", None)
            sim = self._sim.sample(RankTarget(rank=w.rank, pid=self._pid, window=w.window))
            w = dataclasses.replace(w, telemetry=merge([own, sim, live]))
            if self._sock is not None:
                self._sock.sendall(_to_wire(w))
            else:
                self._inbox.put(w)

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
                self._acc.add(self._host.sample(RankTarget(rank=self.rank, pid=self._pid)))
                self._emit(self._sum.take_windows())
            if stopping:
                self._emit(self._sum.flush())
                break
            self._stop.wait(self._poll_s)
        if reader is not None:
            reader.close()
        if bridge is not None:
            bridge.close()
        if self._sock is not None:
            self._sock.sendall(b"done\n")
            self._sock.close()
        else:
            self._inbox.put(None)

    # -- rank 0: collect and score -----------------------------------------------

    def _accept(self) -> None:
        for _ in range(self.world - 1):
            conn, _ = self._srv.accept()
            self._spawn_reader(conn)

    def _spawn_reader(self, conn: socket.socket) -> None:
        def read() -> None:
            with conn, conn.makefile("rb") as fh:
                for line in fh:
                    if line.strip() == b"done":
                        break
                    self._inbox.put(_from_wire(line))
            self._inbox.put(None)

        t = threading.Thread(target=read, name="artemis-detector-peer", daemon=True)
        t.start()
        self._threads.append(t)

    def _score(self, window: int, rows: list[RankWindow]) -> None:
        t0 = time.perf_counter()
        present = {r.rank for r in rows}
        missing = [r for r in range(self.world) if r not in present]
        out = self._monitor.on_window(window, rows, missing, wall=time.time())
        if self._writer is not None:
            self._writer.write(out.findings)
        self.findings += out.findings
        if self._metrics is not None and out.result is not None:
            self._metrics.observe_window(out.result, time.perf_counter() - t0)
        self._write_incidents(out)

    def _write_incidents(self, out: Any) -> None:
        self.incidents += out.incidents
        if self._incidents is not None:
            self._incidents.write(out.incidents)
        self._store.write_incidents(out.incidents)
        self._store.write_monitor_rows(out.incident_rows)
        if self._metrics is not None:
            self._metrics.observe_incidents(out.incidents)
            self._metrics.observe_incident_rows(out.incident_rows)

    def _score_loop(self) -> None:
        pending: dict[int, list[RankWindow]] = {}
        first_seen: dict[int, float] = {}
        ended = 0
        while ended < self.world:
            try:
                w = self._inbox.get(timeout=0.1)
                if w is None:
                    ended += 1
                else:
                    pending.setdefault(w.window, []).append(w)
                    first_seen.setdefault(w.window, time.monotonic())
            except queue.Empty:
                pass
            now = time.monotonic()
            for win in sorted(pending):
                rows = pending[win]
                if len(rows) >= self.world or now - first_seen[win] > self._deadline_s:
                    self._score(win, pending.pop(win))
                else:
                    break  # windows are scored in order
        for win in sorted(pending):
            self._score(win, pending.pop(win))

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
            # the job's end: its open incidents close with their verdicts
            end = self._monitor.finish(time.time())
            if self._writer is not None:
                self._writer.write(end.findings)
            self._write_incidents(end)
            if self._writer is not None:
                self._writer.close()
            if self._incidents is not None:
                self._incidents.close()
            last = self._monitor.last_window
            self._store.write_job(self._monitor.job, {"last_window": last, "ended": time.time()})
            self._store.close()
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
