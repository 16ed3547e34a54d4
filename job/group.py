"""What both paths of the ``artemis`` backend share (``artemis.job.backend`` has the whole
picture): the record vocabulary, a ring and its counters (``_Comm``), the inner backends
built as init_process_group builds them, and the group's identity (``ArtemisGroup``)."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import time
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
            # Under plain torchrun no agent reads it: removed at a clean finish then
            # (artemis.ring.lifetime), never while an agent serves the folder.
            remove_unread=True,
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
