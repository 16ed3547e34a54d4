"""Rings never pile up (artemis.ring.lifetime, artemis_ring.h "Lifetime"): a writer no
reader attached to removes its ring at a clean finish; an agent serving the folder or a
reader's mark keeps it; the agent reclaims the ring of a writer that died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from artemis.agent.config import AgentConfig
from artemis.agent.daemon import Agent
from artemis.ring import format as rf
from artemis.ring import lifetime
from artemis.ring.reader import RingReader
from artemis.ring.writer import RingWriter

COMM = 0xFEEDFACE00000042


@pytest.fixture(autouse=True)
def _removal_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(lifetime.KEEP_ENV, raising=False)  # conftest keeps rings


def _writer(d: Path, rank: int = 0, **kw: object) -> RingWriter:
    return RingWriter(d, "lj", COMM, rank, 2, 8, env={"NCCL_X": "1"}, **kw)  # type: ignore[arg-type]


def _agent(d: Path) -> Agent:
    cfg = AgentConfig(shm_dir=str(d), host="h", window_steps=4, telemetry=[])
    return Agent(cfg, [], lambda msg: 1, lambda: 1)


def test_an_unread_ring_is_removed_at_a_clean_finish(tmp_path: Path) -> None:
    w = _writer(tmp_path, remove_unread=True)
    w.record(kind=rf.KIND_COLL, func=1, coll_seq=0, nbytes=4, start=1, end=2)
    with RingReader(w.path) as r:  # a reader that does not mark (a tool, the Detector)
        h = r.header()
        assert h.writer_locked and h.writer_flags & rf.WRITER_ENV
    assert not lifetime.writer_gone(w.path)
    w.close()
    assert list(tmp_path.iterdir()) == []  # the ring and its .env sidecar


def test_a_ring_is_kept_for_its_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = _writer(tmp_path, remove_unread=True)
    assert lifetime.mark_read(w.path)
    w.close()
    with RingReader(w.path) as r:
        assert r.header().finished
    # the writer's lock went with its finish
    assert lifetime.writer_gone(w.path)
    # an agent serving the folder (it has not scanned yet: a short job) keeps it too
    lock = lifetime.FolderLock(tmp_path)
    assert lock.hold() and lifetime.agent_serves(tmp_path)
    w2 = _writer(tmp_path, rank=1, remove_unread=True)
    w2.close()
    assert w2.path.exists()
    lock.release()
    assert not lifetime.agent_serves(tmp_path)
    # ARTEMIS_KEEP_RINGS=1, and a writer not asked to (the default)
    monkeypatch.setenv(lifetime.KEEP_ENV, "1")
    w3 = RingWriter(tmp_path, "lk", COMM, 0, 2, 8, remove_unread=True)
    w3.close()
    monkeypatch.delenv(lifetime.KEEP_ENV)
    w4 = RingWriter(tmp_path, "ld", COMM, 0, 2, 8)
    w4.close()
    assert w3.path.exists() and w4.path.exists()
    assert not RingReader(w4.path).header().writer_locked


def test_the_agent_marks_what_it_reads_and_removes_it_when_finished(tmp_path: Path) -> None:
    w = _writer(tmp_path, remove_unread=True)
    agent = _agent(tmp_path)
    agent.scan()
    assert lifetime.marked(w.path) and lifetime.agent_serves(tmp_path)
    w.close()  # kept: the agent reads it to its end
    assert w.path.exists()
    agent.ship(agent.tick(time.monotonic()))
    agent.cleanup()
    assert agent.removed == 1 and agent.reclaimed == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [lifetime.AGENT_LOCK]
    agent.close()
    assert not lifetime.agent_serves(tmp_path)


_CHILD = """
import sys, time
from artemis.ring.writer import RingWriter
w = RingWriter(sys.argv[1], "killed", 0x42, 0, 2, 8, remove_unread=True)
w.record(kind=1, func=1, coll_seq=0, nbytes=4, start=1, end=0, state=1)
print(w.path, flush=True)
time.sleep(60)
"""


def test_the_agent_reclaims_a_dead_writers_ring_after_the_bound(tmp_path: Path) -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert p.stdout is not None
        ring = Path(p.stdout.readline().strip())
        agent = _agent(tmp_path)
        agent.reclaim_after_s = 0.5
        agent.scan()
        agent.ship(agent.tick(time.monotonic()))
        t0 = time.monotonic()
        agent.cleanup(t0)
        assert ring.exists() and agent.removed == 0  # its writer lives
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    assert lifetime.writer_gone(ring)
    with RingReader(ring) as r:
        assert not r.header().finished  # killed: never finished
    agent.cleanup(t0 + 0.1)  # gone, within the bound
    assert ring.exists()
    agent.cleanup(t0 + 0.7)
    assert not ring.exists() and agent.reclaimed == 1
    assert sorted(q.name for q in tmp_path.iterdir()) == [lifetime.AGENT_LOCK]
    agent.close()


def test_a_plugin_ring_no_reader_marked_goes_at_finalize(
    plugin_lib: Path, shm_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from artemis.sim.nccl import NcclStandIn

    monkeypatch.delenv(lifetime.KEEP_ENV, raising=False)  # the plugin reads it at init
    n = NcclStandIn(plugin_lib, 7)
    unread = n.comm_init(0xA1, rank=0, nranks=2)
    read = n.comm_init(0xA2, rank=0, nranks=2)
    assert unread.init_rc == 0 and read.init_rc == 0
    rings = {c.comm_hash: shm_dir / f"testjob.{c.comm_hash:016x}.r0.ring" for c in (unread, read)}
    unread.collective("AllReduce", 8, "ncclFloat32", 1, kernel_times=[(1, 2)])
    with RingReader(rings[0xA1]) as r:
        assert r.header().writer_locked
    assert not lifetime.writer_gone(rings[0xA1])
    assert lifetime.mark_read(rings[0xA2])  # a reader (the agent) attached to this one
    n.finalize()
    assert not rings[0xA1].exists() and not os.path.exists(rf.env_sidecar_path(rings[0xA1]))
    assert rings[0xA2].exists()
    with RingReader(rings[0xA2]) as r:
        assert r.header().finished
    # the plugin never unmaps a ring (its README "Lifetime"), and the mapping holds the
    # lock's open file: the lock goes with the process, as the agent expects
    assert not lifetime.writer_gone(rings[0xA2])


_TORCH_JOB = """
import os, torch, torch.distributed as dist
import artemis.job  # noqa: F401  (registers the backend)
dist.init_process_group("artemis")
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_twenty_torchrun_jobs_leave_no_ring(tmp_path: Path) -> None:
    """20 runs of a 2-rank job under plain torchrun, each leaving its ring folder empty.
    Two lanes of 10 run side by side, each with its own folder (the runs are mostly
    `import torch`: one lane took 75 s on this 2-core machine)."""
    pytest.importorskip("torch")
    script = tmp_path / "job.py"
    script.write_text(_TORCH_JOB)

    def lane(k: int) -> list[str]:
        shm = tmp_path / f"shm{k}"
        env = {x: v for x, v in os.environ.items() if x != lifetime.KEEP_ENV}
        # (TMPDIR: torchrun makes a log folder, torchelastic_*, there and leaves it)
        tmp = tmp_path / f"tmp{k}"
        tmp.mkdir()
        env.update(ARTEMIS_SHM_DIR=str(shm), OMP_NUM_THREADS="1", TMPDIR=str(tmp))
        env.pop("ARTEMIS_JOB", None)
        problems = []
        for i in range(10):
            p = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node=2",
                    str(script),
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if p.returncode != 0:
                problems.append(f"lane {k} run {i}: exit {p.returncode}: {p.stderr[-3000:]}")
            elif not shm.is_dir() or list(shm.iterdir()):
                left = list(shm.iterdir()) if shm.is_dir() else "no folder"
                problems.append(f"lane {k} run {i}: left {left}")
        return problems

    with ThreadPoolExecutor(2) as ex:
        problems = [msg for found in ex.map(lane, range(2)) for msg in found]
    assert problems == [], problems


def _killed_writer(d: Path, job: str) -> Path:
    """The ring of a writer SIGKILLed after its first record."""
    p = subprocess.Popen(
        [sys.executable, "-c", _CHILD.replace('"killed"', repr(job)), str(d)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        return Path(p.stdout.readline().strip())
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)


def test_the_next_writer_reclaims_dead_rings_where_no_agent_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead, kept = _killed_writer(tmp_path, "dead"), _killed_writer(tmp_path, "kept")
    assert lifetime.mark_read(kept)  # a reader will read it: not the writer's to remove
    live = _writer(tmp_path, rank=1, remove_unread=True)
    assert lifetime.reclaim_dead(tmp_path) == []  # younger than the bound
    lock = lifetime.FolderLock(tmp_path)
    assert lock.hold()
    assert lifetime.reclaim_dead(tmp_path, min_age_s=0) == []  # an agent serves: its job
    lock.release()
    monkeypatch.setattr(lifetime, "RECLAIM_AFTER_S", 0.0)
    nxt = RingWriter(tmp_path, "next", COMM, 0, 2, 8, remove_unread=True)
    assert not dead.exists() and kept.exists() and live.path.exists() and nxt.path.exists()
    live.close()
    nxt.close()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [lifetime.AGENT_LOCK, kept.name, kept.name + ".reader"]
