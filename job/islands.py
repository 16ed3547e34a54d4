"""Islands (``ARTEMIS_ISLANDS``, one island name per global rank): how a Python-path group
whose members span several islands composes its CPU all_reduce as a mixed-vendor job must
(reduce in each island, the leaders over a bridge group, broadcast back), writes the
leaders' exchange as bridge records, and keeps its other collectives in call order;
docs/DESIGN.md, "Ring", has the contract."""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from artemis.ring import format as rf
from torch.distributed import distributed_c10d as c10d

from .group import _C10D, _DTYPES, _F, _Comm, _cpu, _mono, _nbytes, dist

_ISLANDS_ENV = "ARTEMIS_ISLANDS"
# Reductions that compose (associative and commutative): island, then bridge, then back.
_COMPOSABLE = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


def island_names(world: int | None = None) -> list[str] | None:
    """``ARTEMIS_ISLANDS`` (one island name per global rank, comma-separated), or None."""
    raw = os.environ.get(_ISLANDS_ENV, "").strip()
    if not raw:
        return None
    names = [x.strip() for x in raw.split(",")]
    if any(not x for x in names):
        raise ValueError(f"{_ISLANDS_ENV}={raw!r}: an empty island name")
    if world is not None and len(names) != world:
        raise ValueError(
            f"{_ISLANDS_ENV} names {len(names)} islands for a world of {world} ranks: "
            "give one island name per global rank"
        )
    return names


class _Islands:
    """How one group composes its collectives by island (docs/DESIGN.md, "Ring":
    "Islands in a real job").

    Each rank is in its island's group (gloo over the island's members) and each
    island's first rank, its leader, in the bridge group (gloo over the leaders).
    Everything the group runs on CPU tensors goes through one worker thread in
    call order, so the composed collectives and the passed-through ones keep the
    order of the calls (as the inner backend's own queue would).
    """

    def __init__(
        self,
        store: Any,
        timeout: timedelta,
        rank: int,
        members: list[int],
        islands: list[str],
    ) -> None:
        labels = [islands[g] for g in members]  # per group rank
        self.names = list(dict.fromkeys(labels))  # islands in order of first appearance
        self.name = labels[rank]
        self.index = self.names.index(self.name)
        mine = [r for r, lab in enumerate(labels) if lab == self.name]
        self.ranks = [members[r] for r in mine]  # global ranks of my island
        self.island_rank = mine.index(rank)
        self.leader = self.island_rank == 0
        self.peer = (self.index + 1) % len(self.names)  # as the simulator names bridge peers
        self.pg: Any = c10d.ProcessGroupGloo(
            c10d.PrefixStore(f"island/{self.index}/", store), self.island_rank, len(mine), timeout
        )
        self.bridge: Any = None
        if self.leader:
            self.bridge = c10d.ProcessGroupGloo(
                c10d.PrefixStore("bridge/", store), self.index, len(self.names), timeout
            )
        self.bridge_ring: Any = None  # the leader's BridgeRingWriter (set by the group)
        self._q: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="artemis-islands", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (job := self._q.get()) is not None:
            job()

    def submit(self, job: Callable[[], Any]) -> Any:
        """Run ``job`` (returns the op's result tensors) in call order; a Work for it."""
        fut: Any = torch.futures.Future()

        def run() -> None:
            try:
                fut.set_result(job())
            except Exception as e:  # the caller's wait() raises it
                fut.set_exception(e)

        self._q.put(run)
        return _C10D._create_work_from_future(fut)

    def stop(self, wait: bool = True) -> None:
        """No more jobs; with ``wait``, let the queued ones finish first (an abort
        does not wait: a job may sit in a collective whose peer is gone)."""
        self._q.put(None)
        if wait:
            self._thread.join(timeout=30)

    # -- composition (the group hands its CPU collectives here) -----------------

    def deferred(self, call: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """A passed-through collective, run on the job-wide inner group by the islands
        worker (so it keeps its place among the composed ones)."""

        def deferred(inner: Any) -> Any:
            def job() -> Any:
                work = call(inner)
                try:
                    return work.get_future().wait()
                except RuntimeError:  # a Work without a future
                    work.wait()
                    return []

            return self.submit(job)

        return deferred

    def composes(self, tensors: list[Any], op: Any) -> bool:
        """Whether an all_reduce of ``tensors`` with ``op`` is composed by island."""
        return (
            bool(tensors)
            and all(not t.is_cuda and t.layout == torch.strided for t in tensors)
            and len({t.dtype for t in tensors}) == 1
            and any(op == getattr(dist.ReduceOp, n) for n in _COMPOSABLE)
        )

    def allreduce(
        self, comm: _Comm, tensors: list[Any], op: Any, delay_s: Callable[[], float]
    ) -> Any:
        """all_reduce by island: reduce to each island's leader, exchange between the
        leaders over the bridge (a bridge record), broadcast back inside each island.

        The island's ring (``comm``) gets two records: a Reduce, then a Broadcast that
        every rank of the island waits in while its leader is on the bridge, so waiting
        for another island is time inside a collective, never compute gap (as the
        simulator models it, sim/model.py). ``delay_s``: the group's injected bridge
        delay, read when the exchange runs.
        """
        dtype = _DTYPES.get(tensors[0].dtype, 0)
        nbytes = _nbytes(tensors)

        def opened(func: str, seq: int, t: int, cpu: int) -> int:
            """One of the island's two records, in flight from ``t`` (under comm.lock)."""
            return comm.ring.record(
                kind=rf.KIND_COLL,
                func=_F[func],
                dtype=dtype,
                coll_seq=seq,
                nbytes=nbytes,
                start=t,
                state=rf.STATE_IN_FLIGHT,
                clock=rf.REC_HOST,
                enqueue_ns=t,
                cpu_start_ns=cpu,
            )

        enq, cpu0 = _mono(), _cpu()
        with comm.lock:
            seq = comm.coll_seq
            comm.coll_seq += 2
            t1 = opened("Reduce", seq, enq, cpu0)

        def job() -> list[Any]:
            one = len(tensors) == 1 and tensors[0].is_contiguous()
            buf = tensors[0] if one else torch.cat([t.reshape(-1) for t in tensors])
            ro = dist.ReduceOptions()
            ro.reduceOp, ro.rootRank, ro.rootTensor = op, 0, 0
            self.pg.reduce([buf], ro).wait()
            e1, c1 = _mono(), _cpu()
            with comm.lock:
                comm.ring.complete(t1, end=e1, cpu_end_ns=c1)
                t2 = opened("Broadcast", seq + 1, e1, c1)
            if self.leader:
                self._bridge_exchange(buf, op, seq + 1, nbytes, delay_s())
            bo = dist.BroadcastOptions()
            bo.rootRank, bo.rootTensor = 0, 0
            self.pg.broadcast([buf], bo).wait()
            if not one:
                off = 0
                for t in tensors:
                    n = t.numel()
                    t.copy_(buf[off : off + n].view_as(t))
                    off += n
            e2, c2 = _mono(), _cpu()
            with comm.lock:
                comm.ring.complete(t2, end=e2, cpu_end_ns=c2)
            return tensors

        return self.submit(job)

    def _bridge_exchange(self, buf: Any, op: Any, seq: int, nbytes: int, delay_s: float) -> None:
        """The leaders' all_reduce over the bridge group, written as a bridge record
        whose coll_seq is the island Broadcast's it sits in (the agent counts it in
        that collective's step)."""
        assert self.bridge is not None and self.bridge_ring is not None
        start = _mono()
        if delay_s > 0:
            time.sleep(delay_s)  # a slow link: extra time in the transfer
        ao = dist.AllreduceOptions()
        ao.reduceOp = op
        self.bridge.allreduce([buf], ao).wait()
        self.bridge_ring.append(
            peer=self.peer,
            nbytes=nbytes,
            start=start,
            end=_mono(),
            coll_seq=seq,
            clock=rf.REC_HOST,
            enqueue_ns=start,
        )


_published: set[tuple[str, str, int]] = set()


def _publish_island(shm: Path, job: str, global_rank: int, island: str) -> None:
    """Tell the detector this rank's island the way the simulator tells it: as the rank's
    vendor in the per-rank telemetry file (agent/telemetry/simulated.py), which the
    agent's ``simulated`` source and ``artemis.job.Detector`` read. An emulated island
    has no GPU to report a vendor; this file is its one source."""
    key = (str(shm), job, global_rank)
    if key in _published:
        return
    from artemis.agent.telemetry.simulated import sim_telemetry_path

    path = sim_telemetry_path(shm, job, global_rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"base": {"vendor": island}}))
    os.replace(tmp, path)
    _published.add(key)
