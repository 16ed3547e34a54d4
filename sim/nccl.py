"""A stand-in for NCCL's side of the profiler-plugin ABI (ctypes).

Loads the compiled plugin and calls it the way NCCL 2.28+ does (and 2.27 for
the v4 shape), so the simulator and the tests drive the real plugin through
its real entry points. The ABI's declarations are in sim/nccl_abi.py, the
logger's formatting in sim/nccl_log.py. The ABI and the order of events are
described in profiler_plugin/README.md ("Recording an operation", "Which
NCCL/RCCL version emits which events").

Event order for one collective (v5+):

    GroupApi start, state 23 (NULL args)        user thread, ncclAllReduce()
      CollApi start / stop                      (parent = GroupApi)
    GroupApi state 24 (NULL args)               ncclGroupEnd entry
    Group start                                 (parent NULL, rank 0)
      Coll start / stop                         (parent = CollApi, parentGroup = Group)
    Group stop, GroupApi stop
    KernelCh start (pTimer = start),            per channel, later, proxy thread
      state 22 (kernelCh.pTimer = stop), stop   (parent = Coll)

v4: no API events, ``type`` is a uint8 and Coll's parent is the Group handle.
Which events are sent follows NCCL's rule: an event is generated when its own
bit or a descendant's bit is in the activation mask the plugin set at init.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from ctypes import c_char_p, c_int, c_uint64, c_void_p
from pathlib import Path
from typing import Any

from artemis.ring.format import DTYPE_SIZE_BY_NAME
from artemis.sim.nccl_abi import (
    CE_BATCH,
    CE_COLL,
    CE_SYNC,
    COLL,
    COLL_API,
    DESCRIPTORS,
    GROUP,
    GROUP_API,
    KERNEL_CH,
    KERNEL_LAUNCH,
    LOGFN,
    NET_PLUGIN,
    P2P,
    P2P_API,
    PLUGIN_TABLES,
    PROXY_OP,
    PROXY_STEP,
    STATE_GROUP_END_API_START,
    STATE_GROUP_START_API_STOP,
    STATE_KERNEL_CH_STOP,
    StateArgs,
)
from artemis.sim.nccl_log import format_c

# -- NCCL's rule for which events it sends -----------------------------------

_CE = CE_COLL | CE_SYNC | CE_BATCH
_BELOW_TASK = PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN
# NCCL starts an event when its bit or a descendant's is set (profiler_plugin/README.md).
_NEEDS_GROUP_API = (
    GROUP_API | P2P_API | COLL_API | KERNEL_LAUNCH | GROUP | COLL | P2P | _BELOW_TASK | _CE
)
_NEEDS_COLL_API = COLL_API | COLL | _BELOW_TASK | _CE
_NEEDS_P2P_API = P2P_API | P2P | _BELOW_TASK
_NEEDS_GROUP = COLL | P2P | _BELOW_TASK
_NEEDS_COLL = COLL | _BELOW_TASK
_NEEDS_P2P = P2P | _BELOW_TASK

# Callbacks and strings handed to the plugin must outlive every call it may
# make; the library is never unloaded, so keep them for the process lifetime.
_KEEP: list[Any] = []
_STRINGS: dict[str, bytes] = {}


def _cstr(s: str) -> bytes:
    b = _STRINGS.get(s)
    if b is None:
        b = _STRINGS[s] = s.encode()
    return b


# -- NCCL's p2p channel count -----------------------------------------------

# What addP2pToPlan (src/enqueue.cc, 2.27-2.30) computes per direction, with
# the defaults of one NVLink node: p2pChunkSize 512 KiB (NCCL_P2P_NVL_CHUNKSIZE),
# p2pnChannelsPerPeer 2 and p2pnChannels 32 (both are tuned per topology).
P2P_CHUNK = 1 << 19
P2P_NCHANNELS_PER_PEER = 2
P2P_NCHANNELS = 32


def p2p_nchannels(nbytes: int, nranks: int, nnodes: int = 1) -> int:
    """nChannels NCCL reports on a P2p event of ``nbytes`` (1 for 0 bytes, never 0)."""
    nmax = P2P_NCHANNELS_PER_PEER
    nmin = nmax
    while nmin * nranks > P2P_NCHANNELS and nmin > 1:
        nmin //= 2
    if nbytes == 0:
        return 1
    min_part = P2P_CHUNK // 2 if nnodes > 1 else P2P_CHUNK // 8
    max_part = P2P_CHUNK if nnodes > 1 else P2P_CHUNK * 32
    nch = min(nmin, -(-nbytes // min_part))
    part = max(min_part, -(-nbytes // nch))
    while part > max_part and nch <= nmax // 2:
        nch *= 2
        part = -(-nbytes // nch)
    return nch


# -- the stand-in ------------------------------------------------------------

# Stand-in runtime libraries, built next to the plugin (profiler_plugin/tests/
# standin_runtime.c): NCCL 2.30.3, and RCCL (NCCL code 2.28.3) with its HIP.
RUNTIMES = {"nccl": "libnccl.so.2", "rccl": "librccl.so"}


class NcclStandIn:
    """One loaded plugin, as one NCCL library in one process sees it.

    ``mask`` is the process-wide activation mask (one int shared by every
    communicator, as in NCCL); ``log_lines`` collects what the plugin logged.
    """

    def __init__(self, lib_path: str | Path, version: int = 7, runtime: str | None = None) -> None:
        if version not in DESCRIPTORS:
            raise ValueError(f"profiler ABI version {version} is not one of 4, 5, 6, 7")
        if runtime not in (None, *RUNTIMES):
            raise ValueError(f"runtime {runtime!r} is not one of {sorted(RUNTIMES)} or None")
        self.version = version
        self.lib_path = Path(lib_path)
        self.lib = ctypes.CDLL(str(self.lib_path), mode=ctypes.RTLD_LOCAL)
        sym = f"ncclProfiler_v{version}"
        table_type = PLUGIN_TABLES[version]
        try:
            self._table = table_type.in_dll(self.lib, sym)
        except ValueError as e:
            raise OSError(f"{self.lib_path}: does not export {sym}") from e
        self.name = (self._table.name or b"").decode()
        self._init = self._table.init
        self.start_event = self._table.startEvent
        self.stop_event = self._table.stopEvent
        self.record_event_state = self._table.recordEventState
        self.finalize_fn = self._table.finalize
        self.mask = c_int(0)
        self.log_lines: list[str] = []
        self.log_levels: list[int] = []
        self._logfn = LOGFN(self._log)
        _KEEP.append(self._logfn)
        self.comms: list[StandInComm] = []
        # With a runtime, init is called from inside a stand-in NCCL or RCCL
        # library (loaded RTLD_LOCAL, as Python loads extension libraries), so
        # the plugin sees what it would see in a real process: the caller's
        # ncclGetVersion, RCCL's own symbols, HIP's wall-clock rate.
        self.runtime = runtime
        self._via: Any = None
        if runtime is not None:
            rt_path = self.lib_path.parent / "standin" / RUNTIMES[runtime]
            rt = ctypes.CDLL(str(rt_path), mode=ctypes.RTLD_LOCAL)
            _KEEP.append(rt)
            via = rt.artemis_standin_init
            via.restype = c_int
            via.argtypes = [c_void_p, c_int, c_void_p, c_uint64, c_void_p, c_char_p]
            via.argtypes += [c_int, c_int, c_int, c_void_p]
            self._via = via
            self._init_addr = ctypes.cast(self._init, c_void_p).value
            self._log_addr = ctypes.cast(self._logfn, c_void_p).value

    def _log(
        self, level: int, flags: int, file: bytes | None, line: int, fmt: bytes | None, *a: int
    ) -> None:
        text = format_c((fmt or b"").decode("utf-8", "replace"), a)
        self.log_levels.append(level)
        self.log_lines.append(text)

    def comm_init(
        self, comm_hash: int, rank: int, nranks: int, nnodes: int = 1, name: str | None = None
    ) -> StandInComm:
        """ncclCommInitRank: calls the plugin's init for a new communicator."""
        ctx = c_void_p(None)
        cname = _cstr(name) if name is not None else None
        if self._via is not None:
            rc = self._via(
                self._init_addr,
                self.version,
                ctypes.addressof(ctx),
                comm_hash,
                ctypes.addressof(self.mask),
                cname,
                nnodes,
                nranks,
                rank,
                self._log_addr,
            )
        elif self.version == 4:
            rc = self._init(
                ctypes.addressof(ctx),
                ctypes.addressof(self.mask),
                cname,
                comm_hash,
                nnodes,
                nranks,
                rank,
                self._logfn,
            )
        else:
            rc = self._init(
                ctypes.addressof(ctx),
                comm_hash,
                ctypes.addressof(self.mask),
                cname,
                nnodes,
                nranks,
                rank,
                self._logfn,
            )
        comm = StandInComm(self, ctx.value, comm_hash, rank, nranks, rc)
        self.comms.append(comm)
        return comm

    def finalize(self) -> None:
        """Destroy every communicator (finalize each context once)."""
        for c in self.comms:
            c.finalize()


class PendingOp:
    """A collective or p2p op that NCCL enqueued and whose kernel has not finished."""

    __slots__ = ("_comm", "handle", "nchannels")

    def __init__(self, comm: StandInComm, handle: int | None, nchannels: int) -> None:
        self._comm = comm
        self.handle = handle
        self.nchannels = nchannels

    def complete(self, kernel_times: Sequence[tuple[int, int]] | None = None) -> None:
        """The kernel ran: per channel KernelCh start / state 22 / stop (if the mask asks)."""
        self._comm._kernel_channels(self.handle, self.nchannels, kernel_times)


class StandInComm:
    """One communicator of one rank: drives the plugin's events for its ops."""

    def __init__(
        self,
        nccl: NcclStandIn,
        context: int | None,
        comm_hash: int,
        rank: int,
        nranks: int,
        rc: int,
    ) -> None:
        self.nccl = nccl
        self.context = context
        self.comm_hash = comm_hash
        self.rank = rank
        self.nranks = nranks
        self.init_rc = rc
        self.finalized = False
        self._seq: dict[str, int] = {}
        d = DESCRIPTORS[nccl.version]
        # One prebuilt descriptor per event kind, reused for every call: NCCL
        # passes a stack object, so the plugin must copy what it keeps anyway.
        self._d_group_api = d()
        self._d_coll_api = d()
        self._d_p2p_api = d()
        self._d_group = d()
        self._d_coll = d()
        self._d_p2p = d()
        self._d_kch = d()
        self._args = StateArgs()
        self._h = c_void_p(None)
        self._a_h = ctypes.addressof(self._h)
        self._a_args = ctypes.addressof(self._args)
        v = nccl.version
        self._d_group_api.type = GROUP_API
        if v != 4:
            self._d_group_api.groupApi.groupDepth = 1
        self._d_coll_api.type = COLL_API
        self._d_p2p_api.type = P2P_API
        self._d_group.type = GROUP
        self._d_coll.type = COLL
        self._d_coll.rank = rank
        self._d_coll.coll.nWarps = 16
        self._d_p2p.type = P2P
        self._d_p2p.rank = rank
        self._d_kch.type = KERNEL_CH
        if v == 7:
            self._d_coll.coll.kernelVariant = _cstr("Default")
        self._desc = {
            k: (getattr(self, f"_d_{k}"), ctypes.addressof(getattr(self, f"_d_{k}")))
            for k in ("group_api", "coll_api", "p2p_api", "group", "coll", "p2p", "kch")
        }
        self._coll_key: tuple[str, int, str, int, str, str, int] | None = None
        self._v4 = v == 4
        self._start_fn = nccl.start_event
        self._stop_fn = nccl.stop_event
        self._record_fn = nccl.record_event_state

    # -- raw calls ----------------------------------------------------------

    def _start(self, which: str, parent: int | None) -> int | None:
        """startEvent with the prebuilt descriptor ``which``; returns the handle."""
        d, addr = self._desc[which]
        if d.parentObj != parent:
            d.parentObj = parent
        self._h.value = None
        self._start_fn(self.context, self._a_h, addr)
        return self._h.value

    def _stop(self, handle: int | None) -> None:
        # NCCL never calls stop/record on a NULL handle (profiler_plugin/README.md).
        if handle:
            self._stop_fn(handle)

    def _record(self, handle: int | None, state: int, args: int | None) -> None:
        if handle:
            self._record_fn(handle, state, args)

    def _set_coll(self, key: tuple[str, int, str, int, str, str, int]) -> None:
        """Fill the Coll descriptor (string fields only when they change)."""
        func, count, dtype, nchannels, algo, proto, root = key
        c = self._d_coll.coll
        # AllGather and Broadcast reach the Coll event as bytes of ncclInt8
        # (NCCL converts the task in collTaskAppend).
        if func in ("AllGather", "Broadcast"):
            c.count = count * DTYPE_SIZE_BY_NAME.get(dtype, 1)
            c.datatype = _cstr("ncclInt8")
        else:
            c.count = count
            c.datatype = _cstr(dtype)
        c.func = _cstr(func)
        c.root = root
        c.nChannels = nchannels
        c.algo = _cstr(algo)
        c.proto = _cstr(proto)
        if not self._v4:  # v4 has no API events
            ca = self._d_coll_api.collApi
            ca.func = _cstr(func)
            ca.count = count
            ca.datatype = _cstr(dtype)
            ca.root = root
        self._coll_key = key

    # -- operations -----------------------------------------------------------

    def begin_collective(
        self,
        func: str,
        count: int,
        dtype: str,
        *,
        nchannels: int = 2,
        algo: str = "RING",
        proto: str = "SIMPLE",
        root: int = 0,
    ) -> PendingOp:
        """Everything NCCL does on the host for one collective, up to Group/GroupApi stop."""
        mask = self.nccl.mask.value
        v4 = self._v4
        key = (func, count, dtype, nchannels, algo, proto, root)
        if key != self._coll_key:
            self._set_coll(key)
        gapi = capi = group = coll = None
        if not v4 and mask & _NEEDS_GROUP_API:
            gapi = self._start("group_api", None)
            self._record(gapi, STATE_GROUP_START_API_STOP, None)
        if not v4 and mask & _NEEDS_COLL_API:
            capi = self._start("coll_api", gapi)
            self._stop(capi)
        if not v4:
            self._record(gapi, STATE_GROUP_END_API_START, None)
        if mask & _NEEDS_GROUP:
            group = self._start("group", None)
        if mask & _NEEDS_COLL:
            seq = self._seq.get(func, 0)
            self._seq[func] = seq + 1
            c = self._d_coll.coll
            c.seqNumber = seq
            if not v4:
                c.parentGroup = group
            coll = self._start("coll", group if v4 else capi)
            self._stop(coll)
        self._stop(group)
        if not v4:
            self._stop(gapi)
        return PendingOp(self, coll, nchannels)

    def collective(
        self,
        func: str,
        count: int,
        dtype: str,
        nchannels: int = 2,
        algo: str = "RING",
        proto: str = "SIMPLE",
        kernel_times: Sequence[tuple[int, int]] | None = None,
        root: int = 0,
    ) -> None:
        """One whole collective: host events, then its kernel's channel events."""
        op = self.begin_collective(
            func, count, dtype, nchannels=nchannels, algo=algo, proto=proto, root=root
        )
        op.complete(kernel_times)

    def begin_p2p(
        self, func: str, count: int, dtype: str, peer: int, *, nchannels: int = 1
    ) -> PendingOp:
        """ncclSend / ncclRecv on the host, up to Group/GroupApi stop."""
        return self._p2p_group([(func, count, dtype, peer)], nchannels=nchannels)[0]

    def p2p(
        self,
        func: str,
        count: int,
        dtype: str,
        peer: int,
        nchannels: int = 1,
        kernel_times: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        op = self.begin_p2p(func, count, dtype, peer, nchannels=nchannels)
        op.complete(kernel_times)

    def group_p2p(
        self, ops: Sequence[tuple[str, int, str, int]], *, nnodes: int = 1
    ) -> list[PendingOp]:
        """ncclGroupStart; ncclSend/ncclRecv per ``(func, count, dtype, peer)``; ncclGroupEnd.

        As NCCL 2.27-2.30 does it (``ncclProfilerStartTaskEvents`` /
        ``ncclProfilerStopTaskEvents`` around the launch): one GroupApi, a P2pApi
        per call, then every P2p start of the plan, then every P2p stop. Each P2p
        reports the channel count ``addP2pToPlan`` gives it (at least 1 for a
        self Send/Recv too), but a self Send/Recv gets no proxy op (``selfSend ?
        0 : 2``), so its PendingOp.complete() sends no KernelCh event. An
        in-place self pair (same buffer) is dropped before the plan: no P2p.
        """
        return self._p2p_group(ops, nnodes=nnodes)

    def _p2p_group(
        self,
        ops: Sequence[tuple[str, int, str, int]],
        *,
        nnodes: int = 1,
        nchannels: int | None = None,
    ) -> list[PendingOp]:
        """The events of group_p2p; with ``nchannels`` (begin_p2p: a group of one),
        every P2p reports that many channels and a self one gets its KernelCh too."""
        for func, _, _, _ in ops:
            if func not in ("Send", "Recv"):
                raise ValueError(f"p2p func must be 'Send' or 'Recv', not {func!r}")
        mask = self.nccl.mask.value
        v4 = self._v4
        gapi = group = None
        if not v4 and mask & _NEEDS_GROUP_API:
            gapi = self._start("group_api", None)
            self._record(gapi, STATE_GROUP_START_API_STOP, None)
        apis: list[int | None] = []
        for func, count, dtype, _ in ops:
            papi = None
            if not v4 and mask & _NEEDS_P2P_API:
                pa = self._d_p2p_api.p2pApi
                pa.func = _cstr(func)
                pa.count = count
                pa.datatype = _cstr(dtype)
                papi = self._start("p2p_api", gapi)
                self._stop(papi)
            apis.append(papi)
        if not v4:
            self._record(gapi, STATE_GROUP_END_API_START, None)
        if mask & _NEEDS_GROUP:
            group = self._start("group", None)
        pending: list[PendingOp] = []
        p = self._d_p2p.p2p
        for (func, count, dtype, peer), papi in zip(ops, apis, strict=True):
            if nchannels is None:
                nbytes = count * DTYPE_SIZE_BY_NAME.get(dtype, 1)
                nch = p2p_nchannels(nbytes, self.nranks, nnodes)
                # Self: no proxy op, so no KernelCh ever follows (0 channels to emit).
                emit = 0 if peer == self.rank else nch
            else:
                nch = emit = nchannels
            h = None
            if mask & _NEEDS_P2P:
                p.func = _cstr(func)
                p.datatype = _cstr(dtype)
                p.count = count
                p.peer = peer
                p.nChannels = nch
                if not v4:
                    p.parentGroup = group
                h = self._start("p2p", group if v4 else papi)
            pending.append(PendingOp(self, h, emit))
        for op in pending:
            self._stop(op.handle)
        self._stop(group)
        if not v4:
            self._stop(gapi)
        return pending

    def send_recv_self(self, count: int, dtype: str) -> None:
        """The self pair every all-to-all has: Send and Recv to this rank, no KernelCh."""
        for op in self.group_p2p(
            [("Send", count, dtype, self.rank), ("Recv", count, dtype, self.rank)]
        ):
            op.complete()

    def _kernel_channels(
        self, parent: int | None, nchannels: int, kernel_times: Sequence[tuple[int, int]] | None
    ) -> None:
        if not self.nccl.mask.value & KERNEL_CH or nchannels == 0:
            return
        if kernel_times is None:
            # No times given: stamp "now" as a %globaltimer-like epoch-ns clock.
            now = time.time_ns()
            kernel_times = [(now, now + 1)] * nchannels
        elif len(kernel_times) != nchannels:
            raise ValueError(f"{len(kernel_times)} kernel times for {nchannels} channels")
        kc = self._d_kch.kernelCh
        handles = []
        # The proxy thread sees every channel start before the stops.
        for ch, (start, _) in enumerate(kernel_times):
            kc.channelId = ch
            kc.pTimer = start
            handles.append(self._start("kch", parent))
        for h, (_, stop) in zip(handles, kernel_times, strict=True):
            self._args.kernelCh.pTimer = stop
            self._record(h, STATE_KERNEL_CH_STOP, self._a_args)
            self._stop(h)

    def finalize(self) -> None:
        """ncclCommDestroy: finalize is called once, only for a non-NULL context."""
        if self.finalized:
            return
        self.finalized = True
        if self.context:
            self.nccl.finalize_fn(self.context)
