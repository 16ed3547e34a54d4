"""The ``artemis`` torch.distributed backend: a ProcessGroup that times every collective.

``import artemis.job`` calls ``register()`` when torch is importable; then
``dist.init_process_group(backend="artemis")`` (and every ``new_group`` of that
job) builds a group on one of two paths (docs/DESIGN.md, "The artemis backend:
two paths"): the C++ path (``ArtemisCppGroup``: c10d dispatches each call into
``job/csrc/timed_backend.cpp``, which writes the record; built by
``make backend-ext``), by default; or the Python path (``ArtemisProcessGroup``),
for islands, for CUDA tensors without the NCCL plugin, when the extension is not
built, or with ``ARTEMIS_BACKEND_IMPL=python``. Either wraps the real backend
(gloo for CPU tensors, nccl for CUDA tensors; ``ARTEMIS_INNER_BACKEND=gloo|nccl``
forces one) and hands each call to it unchanged, so results are the inner
backend's, bit for bit; both write the same records. What follows describes the
Python path; the C++ one does the same in C++. Around each call it writes one ring record (docs/DESIGN.md, "Ring format")
into ``$ARTEMIS_SHM_DIR/<job>.<comm>.r<rank>.ring``: in flight at the call
(enqueue and start from CLOCK_MONOTONIC, process CPU time at the start), done
when the inner Work's future completes (end, CPU time at the end). The rings
carry ``WRITER_BACKEND`` and 128-byte CPU slots; the node agent reads them like
the plugin's.

One source per collective: when the Artemis NCCL profiler plugin is loaded in
this process (``NCCL_PROFILER_PLUGIN`` names it, as ``artemis run`` exports, or
it is mapped), NCCL's collectives are left to the plugin, which sees them on the
device; only what the plugin cannot see (the gloo ones) is recorded here.

CUDA tensors without the plugin: CUDA events are recorded on the current stream
around the call and resolved off the hot path by a resolver thread (no sync in
the collective call); device times land as ``device_ns`` records.

Islands (``ARTEMIS_ISLANDS``, one island name per global rank): a group whose
members span several islands composes its CPU all_reduce as a mixed-vendor job
must (reduce in each island, the leaders over a bridge group, broadcast back),
writes the leaders' exchange as bridge records (``BridgeRingWriter``, as the
simulator does) and passes its other collectives through to the job-wide gloo
group; docs/DESIGN.md, "Ring", has the contract.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as _torch_dist
from artemis.rebalance.files import DEFAULT_SHM_DIR
from artemis.ring import format as rf
from artemis.ring.writer import RingWriter
from torch.distributed import distributed_c10d as c10d

# torch's stubs type ProcessGroup's methods with overloads a forwarding wrapper
# cannot restate one by one; the wrapper takes whatever c10d passes on.
dist: Any = _torch_dist
_C10D: Any = torch._C._distributed_c10d

BACKEND_NAME = "artemis"
# How long destroy_process_group waits for the completions its rings are still owed
# (docs/DESIGN.md, "Closing"); an abort does not wait.
CLOSE_WAIT_S = 2.0
log = logging.getLogger("artemis.job")
_JOB_ENV = ("ARTEMIS_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")

_DTYPES: dict[Any, int] = {
    torch.int8: rf.DTYPE_CODES["ncclInt8"],
    torch.uint8: rf.DTYPE_CODES["ncclUint8"],
    torch.int32: rf.DTYPE_CODES["ncclInt32"],
    torch.int64: rf.DTYPE_CODES["ncclInt64"],
    torch.float16: rf.DTYPE_CODES["ncclFloat16"],
    torch.float32: rf.DTYPE_CODES["ncclFloat32"],
    torch.float64: rf.DTYPE_CODES["ncclFloat64"],
    torch.bfloat16: rf.DTYPE_CODES["ncclBfloat16"],
}
_F = rf.FUNC_CODES
_mono = time.monotonic_ns
_cpu = time.process_time_ns  # CLOCK_PROCESS_CPUTIME_ID: every thread of the process


def job_name() -> str:
    """The job id the rings are filed under (``ARTEMIS_JOB``, else the scheduler's, else "job")."""
    return next((os.environ[k] for k in _JOB_ENV if os.environ.get(k)), "job")


def plugin_loaded() -> bool:
    """True when the Artemis NCCL profiler plugin is (or will be) loaded by NCCL here."""
    env = os.environ.get("NCCL_PROFILER_PLUGIN", "")
    if "artemis" in os.path.basename(env):
        return True
    try:
        return "nccl-profiler-artemis" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def _key_hash(key: str) -> int:
    """A ring's 64-bit communicator hash from its key (group, inner backend, ranks)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def _flat(tensors: Any) -> list[Any]:
    """Tensors of a (nested) tensor list."""
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    out: list[Any] = []
    for t in tensors:  # a flat list (the common case) needs no recursion
        if isinstance(t, torch.Tensor):
            out.append(t)
        else:
            out.extend(_flat(t))
    return out


def _nbytes(tensors: list[Any]) -> int:
    if len(tensors) == 1:
        return int(tensors[0].nbytes)
    return sum(t.nbytes for t in tensors)


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


def _nccl_code() -> int:
    """torch's NCCL version as ncclGetVersion's code (0 when torch has none): recent
    torch gives a (major, minor, patch) tuple, older ones the code itself."""
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # a CPU build, or no NCCL in it
        return 0
    if isinstance(v, tuple) and len(v) >= 3:
        major, minor, patch = (int(x) for x in v[:3])
        return (
            major * 10000 + minor * 100 + patch
            if (major, minor) >= (2, 9)
            else (major * 1000 + minor * 100 + patch)
        )
    return int(v) if isinstance(v, int) else 0


class _Comm:
    """One ring (one communicator of one inner backend) and its sequence counters."""

    def __init__(
        self, shm_dir: Path, job: str, key: str, rank: int, size: int, global_rank: int, cuda: bool
    ) -> None:
        comm_hash = _key_hash(key)
        self.ring = RingWriter(
            shm_dir,
            job,
            comm_hash,
            rank,
            size,
            clock_kind="device_ns" if cuda else "host",
            comm_name=key[: rf.NAME_LEN - 1],
            host=socket.gethostname(),
            global_rank=global_rank,
            cpu_times=True,
            writer_flags=rf.WRITER_BACKEND,
            # The software fingerprint (docs/DESIGN.md "Fingerprints"): torch's NCCL
            # when this is CUDA, its env and version in the ring's env sidecar.
            nccl_version=_nccl_code() if cuda else 0,
            env=os.environ,
            torch=torch.__version__,
        )
        self.coll_seq = 0
        self.p2p_seq = 0
        self.lock = threading.Lock()  # completions come from the inner backend's threads
        self._settled = threading.Condition(self.lock)  # the last owed completion ran
        self.owed = 0  # records a future's callback will complete (complete_owed)
        self.closing = False

    def complete_owed(self, ticket: int, **times: int) -> None:
        """Complete a record made owed (under no lock); the last one owed to a closing
        ring closes it (see ``close``)."""
        with self.lock:
            self.ring.complete(ticket, **times)
            self.owed -= 1
            if self.closing and self.owed == 0:
                self.ring.close()
                self._settled.notify_all()

    def close(self, wait_s: float = 0.0) -> bool:
        """Mark the ring finished, once no future's callback still owes it a completion;
        waits up to ``wait_s`` for that. True when the ring is finished on return.

        The inner backend wakes a future's waiters before it runs its callbacks, so the
        training thread can reach destroy_process_group while the last collective's
        completion is still to run (it did under load): finished at once, the ring would
        keep that record IN_FLIGHT for good, which the agent never drains (the rank's
        last window would never be sent). The last owed completion closes it instead.
        """
        with self.lock:
            self.closing = True
            if self.owed == 0:
                self.ring.close()
                return True
            return wait_s > 0 and self._settled.wait_for(lambda: self.owed == 0, wait_s)


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


def _forced_inner() -> str:
    """``ARTEMIS_INNER_BACKEND`` (gloo, nccl), or "" for the default by device."""
    forced = os.environ.get("ARTEMIS_INNER_BACKEND", "").strip().lower()
    if forced and forced not in ("gloo", "nccl"):
        raise ValueError(f"ARTEMIS_INNER_BACKEND={forced!r}: expected gloo or nccl")
    return forced


def _wants_nccl(forced: str) -> bool:
    return forced == "nccl" or (
        not forced and torch.cuda.is_available() and c10d.is_nccl_available()
    )


def _inner_backends(
    store: Any, rank: int, size: int, timeout: timedelta, forced: str
) -> dict[str, Any]:
    """The inner c10d backends by device type, built as init_process_group builds them
    (gloo for "cpu", nccl for "cuda"; ARTEMIS_INNER_BACKEND=nccl puts nccl on both)."""
    inner: dict[str, Any] = {}
    if forced in ("", "gloo"):
        gloo = c10d.ProcessGroupGloo(c10d.PrefixStore("cpu/", store), rank, size, timeout)
        gloo._set_sequence_number_for_group()
        inner["cpu"] = gloo
    if _wants_nccl(forced):
        opts = c10d.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        nccl = c10d.ProcessGroupNCCL(c10d.PrefixStore("cuda/", store), rank, size, opts)
        nccl._set_sequence_number_for_group()
        inner["cuda"] = nccl
        if forced == "nccl":
            inner["cpu"] = nccl
    return inner


class ArtemisGroup:
    """What both paths of the ``artemis`` backend share (a mixin of both group classes):
    the group's identity, its ring's name and the attributes ``artemis.job.Detector``
    and the tests read."""

    if TYPE_CHECKING:
        # ProcessGroup's, which both group classes also are
        def rank(self) -> int: ...

        def size(self) -> int: ...

        # Each path's own (ArtemisProcessGroup, ArtemisCppGroup)
        def ring_path(self, device: str = "cpu") -> Path:
            """This rank's ring for collectives on ``device``."""

        def next_coll_seq(self, device: str = "cpu") -> int:
            """The coll_seq the next collective on ``device`` will get (0 before the first)."""

        @property
        def inner(self) -> dict[str, Any]:
            """The wrapped backends by device type ("cpu", "cuda")."""

        def close_rings(self, wait_s: float = 0.0) -> bool:
            """Mark this group's rings finished (the agent then ships their last windows),
            waiting up to ``wait_s`` for owed completions; True when all are finished."""

    def _finish_init(
        self, rank: int, size: int, group_id: str, global_ranks: list[int] | None
    ) -> None:
        self._rank, self._size = rank, size
        self._ranks = list(global_ranks) if global_ranks else list(range(size))
        self._group_id = group_id or "default"
        self._shm = Path(os.environ.get("ARTEMIS_SHM_DIR") or DEFAULT_SHM_DIR)
        self._job = job_name()
        self._plugin = plugin_loaded()
        # Fault injection for tests and demos: extra seconds inside each of this
        # rank's bridge transfers (a slow link between islands). Leaders only.
        self.bridge_delay_s = 0.0

    def _ring_key(self, inner_name: str) -> str:
        """The ring's communicator key (its hash names the ring file)."""
        return f"{inner_name}:{self._group_id}:{','.join(map(str, self._ranks))}"

    def getBackendName(self) -> str:
        return BACKEND_NAME

    @property
    def job(self) -> str:
        return self._job

    @property
    def shm_dir(self) -> Path:
        return self._shm

    @property
    def global_rank(self) -> int:
        return self._ranks[self._rank]

    @property
    def island(self) -> str | None:
        """This rank's island when this group composes by island, else None."""
        return None

    def bridge_ring_path(self) -> Path | None:
        """The ring of this rank's bridge records (island leaders only), else None."""
        return None


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
        if self._isl is not None and not cuda and not p2p:
            call = self._isl_deferred(call)
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

    # -- islands ----------------------------------------------------------------

    def _isl_deferred(self, call: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """A passed-through collective, run on the job-wide inner group by the islands
        worker (so it keeps its place among the composed ones)."""
        isl = self._isl
        assert isl is not None

        def deferred(inner: Any) -> Any:
            def job() -> Any:
                work = call(inner)
                try:
                    return work.get_future().wait()
                except RuntimeError:  # a Work without a future
                    work.wait()
                    return []

            return isl.submit(job)

        return deferred

    def _composable(self, tensors: list[Any], op: Any) -> bool:
        return (
            self._isl is not None
            and bool(tensors)
            and all(not t.is_cuda and t.layout == torch.strided for t in tensors)
            and len({t.dtype for t in tensors}) == 1
            and any(op == getattr(dist.ReduceOp, n) for n in _COMPOSABLE)
        )

    def _composed_allreduce(self, tensors: list[Any], op: Any) -> Any:
        """all_reduce by island: reduce to each island's leader, exchange between the
        leaders over the bridge (a bridge record), broadcast back inside each island.

        The island's ring gets two records: a Reduce, then a Broadcast that every
        rank of the island waits in while its leader is on the bridge, so waiting
        for another island is time inside a collective, never compute gap (as the
        simulator models it, sim/model.py).
        """
        isl = self._isl
        assert isl is not None
        comm = self._comm("cpu")
        assert comm is not None
        dtype = _DTYPES.get(tensors[0].dtype, 0)
        nbytes = _nbytes(tensors)
        enq, cpu0 = _mono(), _cpu()
        with comm.lock:
            seq = comm.coll_seq
            comm.coll_seq += 2
            t1 = comm.ring.record(
                kind=rf.KIND_COLL,
                func=_F["Reduce"],
                dtype=dtype,
                coll_seq=seq,
                nbytes=nbytes,
                start=enq,
                state=rf.STATE_IN_FLIGHT,
                clock=rf.REC_HOST,
                enqueue_ns=enq,
                cpu_start_ns=cpu0,
            )

        def job() -> list[Any]:
            one = len(tensors) == 1 and tensors[0].is_contiguous()
            buf = tensors[0] if one else torch.cat([t.reshape(-1) for t in tensors])
            ro = dist.ReduceOptions()
            ro.reduceOp, ro.rootRank, ro.rootTensor = op, 0, 0
            isl.pg.reduce([buf], ro).wait()
            e1, c1 = _mono(), _cpu()
            with comm.lock:
                comm.ring.complete(t1, end=e1, cpu_end_ns=c1)
                t2 = comm.ring.record(
                    kind=rf.KIND_COLL,
                    func=_F["Broadcast"],
                    dtype=dtype,
                    coll_seq=seq + 1,
                    nbytes=nbytes,
                    start=e1,
                    state=rf.STATE_IN_FLIGHT,
                    clock=rf.REC_HOST,
                    enqueue_ns=e1,
                    cpu_start_ns=c1,
                )
            if isl.leader:
                self._bridge_exchange(buf, op, seq + 1, nbytes)
            bo = dist.BroadcastOptions()
            bo.rootRank, bo.rootTensor = 0, 0
            isl.pg.broadcast([buf], bo).wait()
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

        return isl.submit(job)

    def _bridge_exchange(self, buf: Any, op: Any, seq: int, nbytes: int) -> None:
        """The leaders' all_reduce over the bridge group, written as a bridge record
        whose coll_seq is the island Broadcast's it sits in (the agent counts it in
        that collective's step)."""
        isl = self._isl
        assert isl is not None and isl.bridge is not None and isl.bridge_ring is not None
        start = _mono()
        if self.bridge_delay_s > 0:
            time.sleep(self.bridge_delay_s)  # a slow link: extra time in the transfer
        ao = dist.AllreduceOptions()
        ao.reduceOp = op
        isl.bridge.allreduce([buf], ao).wait()
        isl.bridge_ring.append(
            peer=isl.peer,
            nbytes=nbytes,
            start=start,
            end=_mono(),
            coll_seq=seq,
            clock=rf.REC_HOST,
            enqueue_ns=start,
        )

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

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        ts = _flat(tensors)
        if opts is None:
            opts = dist.AllreduceOptions()
        if self._isl is not None and self._composable(ts, opts.reduceOp):
            return self._composed_allreduce(ts, opts.reduceOp)
        return self._run("AllReduce", ts, lambda b: b.allreduce(tensors, opts))

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.AllreduceCoalescedOptions()
        if self._isl is not None and self._composable(_flat(tensors), opts.reduceOp):
            return self._composed_allreduce(_flat(tensors), opts.reduceOp)
        return self._run(
            "AllReduce", _flat(tensors), lambda b: b.allreduce_coalesced(tensors, opts)
        )

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.BroadcastOptions()
        return self._run("Broadcast", _flat(tensors), lambda b: b.broadcast(tensors, opts))

    def reduce(self, tensors: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.ReduceOptions()
        return self._run("Reduce", _flat(tensors), lambda b: b.reduce(tensors, opts))

    def allgather(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = _C10D.AllgatherOptions()
        return self._run("AllGather", _flat(input), lambda b: b.allgather(output, input, opts))

    def _allgather_base(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = _C10D.AllgatherOptions()
        return self._run("AllGather", [input], lambda b: b._allgather_base(output, input, opts))

    def allgather_coalesced(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = _C10D.AllgatherOptions()
        return self._run(
            "AllGather", _flat(input), lambda b: b.allgather_coalesced(output, input, opts)
        )

    def allgather_into_tensor_coalesced(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = _C10D.AllgatherOptions()
        return self._run(
            "AllGather",
            _flat(input),
            lambda b: b.allgather_into_tensor_coalesced(output, input, opts),
        )

    def gather(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.GatherOptions()
        return self._run("Gather", _flat(input), lambda b: b.gather(output, input, opts))

    def scatter(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.ScatterOptions()
        return self._run("Scatter", _flat(output), lambda b: b.scatter(output, input, opts))

    def reduce_scatter(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.ReduceScatterOptions()
        return self._run(
            "ReduceScatter", _flat(input), lambda b: b.reduce_scatter(output, input, opts)
        )

    def _reduce_scatter_base(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.ReduceScatterOptions()
        return self._run(
            "ReduceScatter", [input], lambda b: b._reduce_scatter_base(output, input, opts)
        )

    def reduce_scatter_tensor_coalesced(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.ReduceScatterOptions()
        return self._run(
            "ReduceScatter",
            _flat(input),
            lambda b: b.reduce_scatter_tensor_coalesced(output, input, opts),
        )

    def alltoall(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.AllToAllOptions()
        return self._run("AlltoAll", _flat(input), lambda b: b.alltoall(output, input, opts))

    def alltoall_base(
        self, output: Any, input: Any, out_split: Any, in_split: Any, opts: Any = None
    ) -> Any:
        if opts is None:
            opts = dist.AllToAllOptions()
        return self._run(
            "AlltoAll",
            [input],
            lambda b: b.alltoall_base(output, input, out_split, in_split, opts),
        )

    # torch >= 2.13 names of the single-tensor collectives (dist.all_gather_into_tensor etc.)
    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = _C10D.AllgatherOptions()
        return self._run("AllGather", [input], lambda b: b.all_gather_single(output, input, opts))

    def all_gather_single_coalesced(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = _C10D.AllgatherOptions()
        return self._run(
            "AllGather", _flat(input), lambda b: b.all_gather_single_coalesced(output, input, opts)
        )

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.ReduceScatterOptions()
        return self._run(
            "ReduceScatter", [input], lambda b: b.reduce_scatter_single(output, input, opts)
        )

    def reduce_scatter_single_coalesced(self, output: Any, input: Any, opts: Any = None) -> Any:
        if opts is None:
            opts = dist.ReduceScatterOptions()
        return self._run(
            "ReduceScatter",
            _flat(input),
            lambda b: b.reduce_scatter_single_coalesced(output, input, opts),
        )

    def all_to_all_single(
        self, output: Any, input: Any, out_split: Any, in_split: Any, opts: Any = None
    ) -> Any:
        if opts is None:
            opts = dist.AllToAllOptions()
        return self._run(
            "AlltoAll",
            [input],
            lambda b: b.all_to_all_single(output, input, out_split, in_split, opts),
        )

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


# -- the C++ path --------------------------------------------------------------------

_EXT_NAME = "artemis_timed_backend"
_EXT_DIR = Path(__file__).resolve().parent / "_ext"  # where `make backend-ext` puts it
_IMPL_ENV = "ARTEMIS_BACKEND_IMPL"  # auto (default) | cpp | python
_BUILD_HINT = "build it with `make backend-ext` (or `python job/csrc/build.py`)"
_ext_cache: dict[Path, Any] = {}


def load_ext(ext_dir: Path | None = None) -> Any:
    """The C++ backend module (job/csrc/timed_backend.cpp) when built for this torch,
    else None, said once in a log line with how to build it."""
    d = _EXT_DIR if ext_dir is None else ext_dir
    if d in _ext_cache:
        return _ext_cache[d]
    mod: Any = None
    so, tag = d / f"{_EXT_NAME}.so", d / f"{_EXT_NAME}.torch"
    why = ""
    if not so.is_file():
        why = f"{so} is not built"
    elif not tag.is_file() or tag.read_text().strip() != torch.__version__:
        why = f"{so} was built for another torch than {torch.__version__}"
    else:
        try:
            spec = importlib.util.spec_from_file_location(_EXT_NAME, so)
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except (ImportError, OSError) as e:
            why, mod = f"{so} does not load ({e})", None
    if mod is None:
        log.warning(
            "artemis backend: the C++ path is not available (%s); collectives take the "
            "Python path (about 13 us of CPU each, bench/README.md); %s",
            why,
            _BUILD_HINT,
        )
    _ext_cache[d] = mod
    return mod


def _python_path_reason(forced: str) -> str:
    """Why a group must take the Python path ("" when the C++ path can take it)."""
    impl = os.environ.get(_IMPL_ENV, "auto").strip().lower() or "auto"
    if impl not in ("auto", "cpp", "python"):
        raise ValueError(f"{_IMPL_ENV}={impl!r}: expected auto, cpp or python")
    if impl == "python":
        return f"{_IMPL_ENV}=python"
    why = ""
    if island_names() is not None:
        why = f"{_ISLANDS_ENV} is set (islands compose their collectives in Python)"
    elif _wants_nccl(forced) and not plugin_loaded():
        why = "CUDA tensors without the NCCL plugin (CUDA events are recorded in Python)"
    elif load_ext() is None:
        why = "the C++ path is not built"
    if why and impl == "cpp":
        raise RuntimeError(
            f"{_IMPL_ENV}=cpp, but {why}" + (f": {_BUILD_HINT}" if "built" in why else "")
        )
    return why


class _CppGroupAttrs(ArtemisGroup):
    """The C++ path: a plain c10d ProcessGroup whose backend for CPU (and CUDA) tensors
    is the C++ ``TimedBackend`` (job/csrc/timed_backend.cpp) around the inner backend.

    No Python runs per collective: c10d dispatches straight into the C++ backend,
    which writes the ring records. This object only holds the group's attributes
    (ring path, comm key, counters) for the detector, the tests and ``artemis run``.
    NCCL's collectives are left to the plugin (this path is taken with NCCL only when
    the plugin is loaded), so only CPU tensors are recorded.
    """

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
        """``inner``: an existing c10d Backend to wrap for CPU tensors instead of building
        gloo/nccl from ``store``; the benchmark wraps torch's do-nothing one this way."""
        ext = load_ext()
        if ext is None:
            raise RuntimeError(f"the artemis backend's C++ path is not built: {_BUILD_HINT}")
        ext.ProcessGroupBase.__init__(self, store, rank, size)
        forced = _forced_inner()
        self._inner: dict[str, Any] = (
            {"cpu": inner}
            if inner is not None
            else _inner_backends(store, rank, size, timeout, forced)
        )
        self._finish_init(rank, size, group_id, global_ranks)
        cpu, cuda = self._inner.get("cpu"), self._inner.get("cuda")
        self._ring: Path | None = None
        if cpu is not None:
            # The Python RingWriter makes the ring (header, env sidecar, rename into
            # place), as on the Python path; the C++ backend maps it and is its writer.
            comm = _Comm(
                self._shm,
                self._job,
                self._ring_key("nccl" if cpu is cuda else "gloo"),
                rank,
                size,
                self.global_rank,
                False,
            )
            self._ring = comm.ring.path
            comm.ring.close(finish=False)
        self._tb: Any = ext.TimedBackend(
            cpu, cuda, str(self._ring or ""), rank, size, close_wait_s=CLOSE_WAIT_S
        )
        kind = dist.ProcessGroup.BackendType.CUSTOM
        pg: Any = self  # a ProcessGroupBase, which mypy cannot see through the extension
        for dev in ("cpu", "cuda"):
            if dev in self._inner:
                pg._register_backend(torch.device(dev), kind, self._tb)
        pg._set_default_backend(kind)

    @property
    def timed_backend(self) -> Any:
        """The C++ backend (a c10d Backend) this group dispatches to."""
        return self._tb

    def ring_path(self, device: str = "cpu") -> Path:
        if device != "cpu" or self._ring is None:
            raise RuntimeError(f"{device} collectives are recorded by the NCCL plugin here")
        return self._ring

    def next_coll_seq(self, device: str = "cpu") -> int:
        return int(self._tb.next_coll_seq()) if device == "cpu" else 0

    @property
    def inner(self) -> dict[str, Any]:
        return dict(self._inner)

    def close_rings(self, wait_s: float = 0.0) -> bool:
        return bool(self._tb.close_ring(wait_s))


_cpp_group_cls: list[type] = []


def cpp_group_class() -> type:
    """``ArtemisCppGroup``: the C++ path's group class (``_CppGroupAttrs`` on the C++
    ``ProcessGroupBase``); made once the extension loads (``load_ext``)."""
    if not _cpp_group_cls:
        ext = load_ext()
        if ext is None:
            raise RuntimeError(f"the artemis backend's C++ path is not built: {_BUILD_HINT}")
        _cpp_group_cls.append(
            type(
                "ArtemisCppGroup", (_CppGroupAttrs, ext.ProcessGroupBase), {"__module__": __name__}
            )
        )
    return _cpp_group_cls[0]


def ArtemisCppGroup(*args: Any, **kwargs: Any) -> Any:  # a class to its callers
    """A C++-path group (see ``_CppGroupAttrs``); the arguments are ArtemisProcessGroup's."""
    return cpp_group_class()(*args, **kwargs)


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


def _create(opts: Any, pg_options: Any) -> Any:
    """The backend's creator: the C++ path when it is built and the group needs neither
    islands nor CUDA events, else the Python path (a debug line says which)."""
    why = _python_path_reason(_forced_inner())
    cls: Any = ArtemisProcessGroup if why else cpp_group_class()
    log.debug(
        "artemis backend: group %s takes the %s path%s",
        opts.group_id,
        "Python" if why else "C++",
        f" ({why})" if why else "",
    )
    return cls(
        opts.store,
        opts.group_rank,
        opts.group_size,
        opts.timeout,
        group_id=str(opts.group_id),
        global_ranks=list(opts.global_ranks_in_group),
    )


def register() -> None:
    """Register the ``artemis`` backend with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


__all__ = [
    "BACKEND_NAME",
    "ArtemisCppGroup",
    "ArtemisGroup",
    "ArtemisProcessGroup",
    "island_names",
    "job_name",
    "load_ext",
    "plugin_loaded",
    "register",
]
