"""The ``artemis`` backend's Python path (``ArtemisProcessGroup``): a ProcessGroup that
forwards every call to the inner backend unchanged and records it around the call; the
path for islands and for CUDA tensors without the NCCL plugin (``artemis.job.backend``
says when it is taken). Its collectives are generated from one table (``_COLLECTIVES``).
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from artemis.ring import format as rf
from torch.distributed import distributed_c10d as c10d

from .group import (
    _C10D,
    _DTYPES,
    _F,
    CLOSE_WAIT_S,
    ArtemisGroup,
    _Comm,
    _cpu,
    _flat,
    _forced_inner,
    _inner_backends,
    _key_hash,
    _mono,
    _nbytes,
    dist,
)
from .islands import _ISLANDS_ENV, _Islands, _publish_island, island_names


class _CudaTimer:
    """Resolves CUDA events of finished collectives in a thread (never on the hot path).

    Device times are anchored to the host clock once: an event recorded with its
    host time at start; each later event is that host time plus ``elapsed_time``.
    """

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._anchor = torch.cuda.Event(enable_timing=True)
        self._anchor.record()
        self._anchor.synchronize()
        self._anchor_ns = _mono()
        threading.Thread(target=self._run, name="artemis-cuda-events", daemon=True).start()

    def submit(self, comm: _Comm, ticket: int, start_ev: Any, end_ev: Any, cpu0: int) -> None:
        self._q.put((comm, ticket, start_ev, end_ev, cpu0))

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            comm, ticket, start_ev, end_ev, _ = item
            end_ev.synchronize()  # this thread waits; the training thread never does
            s = self._anchor_ns + int(self._anchor.elapsed_time(start_ev) * 1e6)
            e = self._anchor_ns + int(self._anchor.elapsed_time(end_ev) * 1e6)
            comm.complete_owed(ticket, end=e, cpu_end_ns=_cpu(), start=s)


class ArtemisProcessGroup(ArtemisGroup, dist.ProcessGroup):
    """The Python path: a ProcessGroup that forwards every call to the inner backend and
    records it (islands, and CUDA events without the plugin, need it)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: timedelta,
        group_id: str = "",
        global_ranks: list[int] | None = None,
        *,
        inner: Any = None,
    ) -> None:
        """``inner``: an existing ProcessGroup to wrap (its device types as given) instead of
        building gloo/nccl from ``store``; the benchmark wraps a do-nothing one this way."""
        super().__init__(rank, size)
        forced = _forced_inner()
        # The inner backends sit in a plain c10d ProcessGroup, built as
        # init_process_group builds one, so every call below is forwarded by name
        # and c10d's own dispatch (coalesced ops included) does the rest.
        self._inner: dict[str, Any] = {}
        if inner is not None:
            self._inner["cpu"] = inner
            self._pg = inner
        else:
            self._build_inner(store, rank, size, timeout, forced)
        self._finish_init(rank, size, group_id, global_ranks)
        self._isl: _Islands | None = None
        if inner is None and "cpu" in self._inner and forced != "nccl":
            self._setup_islands(store, timeout)

    def _build_inner(
        self, store: Any, rank: int, size: int, timeout: timedelta, forced: str
    ) -> None:
        self._inner = _inner_backends(store, rank, size, timeout, forced)
        pg = dist.ProcessGroup(store, rank, size)
        if "cpu" in self._inner and self._inner["cpu"] is not self._inner.get("cuda"):
            pg._register_backend(
                torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._inner["cpu"]
            )
        if "cuda" in self._inner:
            pg._register_backend(
                torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, self._inner["cuda"]
            )
        pg._set_default_backend(
            dist.ProcessGroup.BackendType.GLOO
            if "cpu" in self._inner and self._inner["cpu"] is not self._inner.get("cuda")
            else dist.ProcessGroup.BackendType.NCCL
        )
        self._pg = pg

    def _finish_init(
        self, rank: int, size: int, group_id: str, global_ranks: list[int] | None
    ) -> None:
        super()._finish_init(rank, size, group_id, global_ranks)
        self._comms: dict[str, _Comm | None] = {}
        self._cuda_timer: _CudaTimer | None = None

    def _setup_islands(self, store: Any, timeout: timedelta) -> None:
        """Compose this group's CPU collectives by island when ``ARTEMIS_ISLANDS`` says
        its members span two or more islands."""
        names = island_names(None if c10d.is_initialized() else self._size)
        if names is None:
            return
        if max(self._ranks) >= len(names):
            raise ValueError(
                f"{_ISLANDS_ENV} names {len(names)} islands; rank {max(self._ranks)} has none"
            )
        _publish_island(self._shm, self._job, self.global_rank, names[self.global_rank])
        if len({names[g] for g in self._ranks}) < 2:
            return  # a group inside one island: nothing crosses a bridge
        self._isl = isl = _Islands(store, timeout, self._rank, self._ranks, names)
        if isl.leader:
            from artemis.ring.writer import BridgeRingWriter

            isl.bridge_ring = BridgeRingWriter(
                self._shm,
                self._job,
                _key_hash(f"bridge:{self._group_id}:{self.global_rank}"),
                self._rank,
                self._size,
                clock_kind="host",
                host=socket.gethostname(),
                global_rank=self.global_rank,
            )

    @property
    def island(self) -> str | None:
        """This rank's island when this group composes by island, else None."""
        return self._isl.name if self._isl is not None else None

    def bridge_ring_path(self) -> Path | None:
        """The ring of this rank's bridge records (island leaders only), else None."""
        isl = self._isl
        return isl.bridge_ring.path if isl is not None and isl.bridge_ring is not None else None

    # -- plumbing -------------------------------------------------------------

    # A Python ProcessGroup has no backend to keep its name in; keep it here.
    @property
    def group_name(self) -> str:
        return self._group_id

    def _set_group_name(self, name: str) -> None:
        self._group_id = name
        self._pg._set_group_name(name)

    @property
    def group_desc(self) -> str:
        return getattr(self, "_group_desc", "")

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    def ring_path(self, device: str = "cpu") -> Path:
        """This rank's ring for collectives on ``device`` (made now if need be)."""
        comm = self._comm(device)
        if comm is None:
            raise RuntimeError(f"{device} collectives are recorded by the NCCL plugin here")
        return comm.ring.path

    def next_coll_seq(self, device: str = "cpu") -> int:
        """The coll_seq the next collective on ``device`` will get (0 before the first)."""
        comm = self._comms.get(device)
        return comm.coll_seq if comm is not None else 0

    @property
    def inner(self) -> dict[str, Any]:
        """The wrapped backends by device type ("cpu", "cuda")."""
        return dict(self._inner)

    def _comm(self, dev: str) -> _Comm | None:
        """The ring for collectives on ``dev``; None when the plugin records those."""
        if dev in self._comms:
            return self._comms[dev]
        # the cpu inner is nccl only when ARTEMIS_INNER_BACKEND=nccl put it there
        inner_name = "nccl" if self._inner.get(dev) is self._inner.get("cuda") else "gloo"
        if dev == "cuda" and self._plugin:
            comm = None  # NCCL's collectives are the plugin's (one source per collective)
        elif dev == "cpu" and self._isl is not None:
            # Composed by island: the rank's ring is its island's communicator, as a
            # job with one communicator per vendor island has (the simulator's too).
            isl = self._isl
            key = f"{inner_name}:{self._group_id}:island:{isl.name}:{','.join(map(str, isl.ranks))}"
            comm = _Comm(
                self._shm,
                self._job,
                key,
                isl.island_rank,
                len(isl.ranks),
                self.global_rank,
                False,
            )
        else:
            comm = _Comm(
                self._shm,
                self._job,
                self._ring_key(inner_name),
                self._rank,
                self._size,
                self._ranks[self._rank],
                dev == "cuda",
            )
        self._comms[dev] = comm
        return comm

    def _run(
        self, func: str, tensors: list[Any], call: Callable[[Any], Any], peer: int = -1
    ) -> Any:
        # The hot path (docs/DESIGN.md, "Ring"; bench/README.md has its cost): one
        # IN_FLIGHT record at the call, DONE when the inner Work's future completes.
        cuda = bool(tensors) and tensors[0].is_cuda
        dev = "cuda" if cuda else "cpu"
        if dev not in self._inner:
            raise RuntimeError(f"the artemis backend has no inner backend for {dev} tensors")
        comms = self._comms
        comm = comms[dev] if dev in comms else self._comm(dev)
        inner = self._pg
        if comm is None:
            return call(inner)
        p2p = func == "Send" or func == "Recv"
        isl = self._isl
        if isl is not None and not cuda and not p2p:
            call = isl.deferred(call)
        dtype = _DTYPES.get(tensors[0].dtype, 0) if tensors else 0
        nbytes = _nbytes(tensors)
        enq = _mono()
        cpu0 = _cpu()
        if cuda:
            start_ev = torch.cuda.Event(enable_timing=True)
            start_ev.record()
        work = call(inner)
        start = enq if cuda else _mono()
        ring, lock = comm.ring, comm.lock
        # The future first (gloo's send/recv Works have none: their wait is timed), so
        # a record is owed to a callback (_Comm.close) only when there is one to run.
        fut: Any = None
        try:
            fut = work.get_future()
        except RuntimeError:
            if cuda:
                raise
        with lock:
            if comm.closing:
                return work  # the group is being destroyed: nothing more is recorded
            if p2p:
                seq = comm.p2p_seq
                comm.p2p_seq = seq + 1
            else:
                seq = comm.coll_seq
                comm.coll_seq = seq + 1
            ticket = ring.record(
                kind=rf.KIND_P2P if p2p else rf.KIND_COLL,
                func=_F[func],
                dtype=dtype,
                coll_seq=seq,
                nbytes=nbytes,
                start=start,
                state=rf.STATE_IN_FLIGHT,
                clock=rf.REC_DEVICE if cuda else rf.REC_HOST,
                peer=peer,
                enqueue_ns=enq,
                cpu_start_ns=cpu0,
            )
            if fut is not None:
                comm.owed += 1
        if cuda:
            end_ev = torch.cuda.Event(enable_timing=True)

            def cuda_done(f: Any) -> None:
                # runs once the collective's stream work is enqueued behind NCCL's;
                # the CUDA timer's thread completes the record
                end_ev.record()
                if self._cuda_timer is None:
                    self._cuda_timer = _CudaTimer()
                self._cuda_timer.submit(comm, ticket, start_ev, end_ev, cpu0)

            fut.then(cuda_done)
            return work
        if fut is None:  # a Work without a future (gloo send/recv): time its wait
            return _TimedWork(work, comm, ticket)
        complete = comm.complete_owed

        def done(f: Any) -> None:
            # The end is when the inner backend completes the Work (its thread, or
            # this one when it is already done): the host end time of the record.
            complete(ticket, end=_mono(), cpu_end_ns=_cpu())

        fut.add_done_callback(done)
        return work

    def close_rings(self, wait_s: float = 0.0) -> bool:
        """Mark this group's rings finished (the agent then ships their last windows),
        waiting up to ``wait_s`` in all for completions still owed; True when every ring
        is finished on return."""
        deadline = _mono() + int(wait_s * 1e9)
        done = True
        for comm in self._comms.values():
            if comm is not None:
                done = comm.close(max(0.0, (deadline - _mono()) / 1e9)) and done
        isl = self._isl
        if isl is not None and isl.bridge_ring is not None:
            isl.bridge_ring.close()
        return done

    def shutdown(self) -> None:
        """``destroy_process_group`` calls this: shut the inner backends, finish the rings."""
        if self._isl is not None:
            self._isl.stop()
        self._pg.shutdown()
        self.close_rings(CLOSE_WAIT_S)

    def abort(self) -> None:
        if self._isl is not None:
            self._isl.stop(wait=False)
        self._pg.abort()
        self.close_rings()

    # -- collectives: each forwards to the inner backend unchanged -----------------
    # The all_reduces (islands compose them), barrier and point-to-point calls are
    # written out; the rest are made from _COLLECTIVES below the class.

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        ts = _flat(tensors)
        if opts is None:
            opts = dist.AllreduceOptions()
        if self._isl is not None and self._isl.composes(ts, opts.reduceOp):
            return self._composed_allreduce(ts, opts.reduceOp)
        return self._run("AllReduce", ts, lambda b: b.allreduce(tensors, opts))

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.AllreduceCoalescedOptions()
        if self._isl is not None and self._isl.composes(_flat(tensors), opts.reduceOp):
            return self._composed_allreduce(_flat(tensors), opts.reduceOp)
        return self._run(
            "AllReduce", _flat(tensors), lambda b: b.allreduce_coalesced(tensors, opts)
        )

    def _composed_allreduce(self, tensors: list[Any], op: Any) -> Any:
        isl, comm = self._isl, self._comm("cpu")
        assert isl is not None and comm is not None
        return isl.allreduce(comm, tensors, op, lambda: self.bridge_delay_s)

    def barrier(self, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.BarrierOptions()
        dev = "cuda" if "cpu" not in self._inner else "cpu"
        probe = [torch.empty(0, device=dev)]
        return self._run("Unknown", probe, lambda b: b.barrier(opts))

    def send(self, tensors: Any, dst: int, tag: int = 0) -> Any:
        return self._run("Send", _flat(tensors), lambda b: b.send(tensors, dst, tag), peer=dst)

    def recv(self, tensors: Any, src: int, tag: int = 0) -> Any:
        return self._run("Recv", _flat(tensors), lambda b: b.recv(tensors, src, tag), peer=src)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Any:
        return self._run("Recv", _flat(tensors), lambda b: b.recv_anysource(tensors, tag))


# The forwarded collectives: (method, the record's func, its options class in c10d, the
# tensors it records). Records: "in" the input's tensors, "out" the output's, "one" the
# single input tensor. The arguments are c10d's: (tensors, opts) for the "tensors"
# rows, (output, input, opts) for the others, with the split sizes before opts for
# the all-to-all-single rows. torch >= 2.13 adds the *_single names (the collectives
# behind dist.all_gather_into_tensor and its kin).
_COLLECTIVES: tuple[tuple[str, str, str, str], ...] = (
    ("broadcast", "Broadcast", "BroadcastOptions", "tensors"),
    ("reduce", "Reduce", "ReduceOptions", "tensors"),
    ("allgather", "AllGather", "AllgatherOptions", "in"),
    ("_allgather_base", "AllGather", "AllgatherOptions", "one"),
    ("allgather_coalesced", "AllGather", "AllgatherOptions", "in"),
    ("allgather_into_tensor_coalesced", "AllGather", "AllgatherOptions", "in"),
    ("all_gather_single", "AllGather", "AllgatherOptions", "one"),
    ("all_gather_single_coalesced", "AllGather", "AllgatherOptions", "in"),
    ("gather", "Gather", "GatherOptions", "in"),
    ("scatter", "Scatter", "ScatterOptions", "out"),
    ("reduce_scatter", "ReduceScatter", "ReduceScatterOptions", "in"),
    ("_reduce_scatter_base", "ReduceScatter", "ReduceScatterOptions", "one"),
    ("reduce_scatter_tensor_coalesced", "ReduceScatter", "ReduceScatterOptions", "in"),
    ("reduce_scatter_single", "ReduceScatter", "ReduceScatterOptions", "one"),
    ("reduce_scatter_single_coalesced", "ReduceScatter", "ReduceScatterOptions", "in"),
    ("alltoall", "AlltoAll", "AllToAllOptions", "in"),
    ("alltoall_base", "AlltoAll", "AllToAllOptions", "one+splits"),
    ("all_to_all_single", "AlltoAll", "AllToAllOptions", "one+splits"),
)


def _forwarder(name: str, func: str, options: str, records: str) -> Callable[..., Any]:
    """One collective of ``_COLLECTIVES``: fill in default options as c10d does, record
    the tensors the row names, and call the inner group's method of the same name."""
    make_opts = getattr(_C10D, options)

    if records == "tensors":

        def collective(self: ArtemisProcessGroup, tensors: Any, opts: Any = None) -> Any:
            if opts is None:
                opts = make_opts()
            return self._run(func, _flat(tensors), lambda b: getattr(b, name)(tensors, opts))

    elif records == "one+splits":

        def collective(  # type: ignore[misc]
            self: ArtemisProcessGroup,
            output: Any,
            input: Any,
            out_split: Any,
            in_split: Any,
            opts: Any = None,
        ) -> Any:
            if opts is None:
                opts = make_opts()
            return self._run(
                func, [input], lambda b: getattr(b, name)(output, input, out_split, in_split, opts)
            )

    else:
        pick: Callable[[Any, Any], list[Any]] = {
            "in": lambda output, input: _flat(input),
            "out": lambda output, input: _flat(output),
            "one": lambda output, input: [input],
        }[records]

        def collective(  # type: ignore[misc]
            self: ArtemisProcessGroup, output: Any, input: Any, opts: Any = None
        ) -> Any:
            if opts is None:
                opts = make_opts()
            return self._run(
                func, pick(output, input), lambda b: getattr(b, name)(output, input, opts)
            )

    collective.__name__ = name
    collective.__qualname__ = f"ArtemisProcessGroup.{name}"
    return collective


for _row in _COLLECTIVES:
    setattr(ArtemisProcessGroup, _row[0], _forwarder(*_row))
del _row


class _TimedWork(dist._Work):
    """Wraps an inner Work that has no future: the record completes when it is waited on."""

    def __init__(self, inner: Any, comm: _Comm, ticket: int) -> None:
        super().__init__()
        self._w, self._comm, self._ticket, self._done = inner, comm, ticket, False

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            end, cpu1 = _mono(), _cpu()
            with self._comm.lock:
                self._comm.ring.complete(self._ticket, end=end, cpu_end_ns=cpu1)

    def wait(self, timeout: Any = None) -> bool:
        ok = self._w.wait() if timeout is None else self._w.wait(timeout)
        self._finish()
        return bool(ok) if ok is not None else True

    def is_completed(self) -> bool:
        c = bool(self._w.is_completed())
        if c:
            self._finish()
        return c

    def is_success(self) -> bool:
        return bool(self._w.is_success())

    def exception(self) -> Any:
        return self._w.exception()

    def source_rank(self) -> int:
        return int(self._w.source_rank())

    def result(self) -> Any:
        return self._w.result()
