"""The real plugin driven through the NCCL stand-in (sim/nccl.py) in the test's own
process: a stand-in with one communicator, and where that communicator's ring lies
in the ``shm_dir`` fixture's folder (tests/conftest.py names the job ``testjob``)."""

from __future__ import annotations

from pathlib import Path

from artemis.sim.nccl import NcclStandIn, StandInComm


def ring_path(shm: Path, comm: int, rank: int) -> Path:
    """The ring the plugin writes for rank ``rank`` of communicator ``comm``."""
    return shm / f"testjob.{comm:016x}.r{rank}.ring"


Standin = tuple[NcclStandIn, StandInComm]


def one_comm(lib: Path, version: int, comm: int, rank: int = 0, nranks: int = 2) -> Standin:
    """A stand-in NCCL of profiler ABI ``version`` (plugin ``lib``) that has made one
    communicator, ``comm``, as ``rank`` of ``nranks``."""
    n = NcclStandIn(lib, version)
    return n, n.comm_init(comm, rank, nranks)
