"""A group destroyed while its last collective's completion is still to run finishes
its ring only once that completion is in (both paths of the ``artemis`` backend).

The inner backend wakes a future's waiters before it runs the future's callbacks,
and the record's completion is such a callback. So the training thread can return
from its last collective and reach ``destroy_process_group`` before the completion
ran: under load it did (tests/test_artemis_run.py, a clean 4-rank DDP run, ended with
rank 2's last record IN_FLIGHT in a finished ring; the agent never drains such a
ring, so the rank's last window was never sent and the coordinator called the rank
missing). Here that order is forced, with no timing: two gloo ranks in two threads of
one process, rank 0's all_reduce is in flight (rank 1 has not joined), rank 0's ring
is closed, then rank 1 joins.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
from artemis.job import backend  # noqa: E402
from artemis.ring.reader import RingReader  # noqa: E402


def _pair(path: str) -> list[Any]:
    """Rank 0 and rank 1 of a 2-rank group on ``path`` (gloo inside), made together."""
    store = dist.HashStore()
    make = backend.ArtemisProcessGroup if path == "python" else backend.ArtemisCppGroup
    groups: list[Any] = [None, None]
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            groups[rank] = make(store, rank, 2, timedelta(seconds=30), group_id=path)
        except BaseException as e:  # surfaced below
            errors.append(e)

    ts = [threading.Thread(target=one, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    return groups


@pytest.mark.parametrize("path", ["python", "cpp"])
def test_a_ring_closed_before_its_last_completion_finishes_once_it_completes(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if path == "cpp" and backend.load_ext() is None:
        pytest.skip("the C++ path is not built here: make backend-ext")
    monkeypatch.setenv("ARTEMIS_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("ARTEMIS_JOB", "closejob")
    g0, g1 = _pair(path)
    ar = dist.AllreduceOptions()
    t0, t1 = torch.ones(4), torch.ones(4)
    w0 = g0.allreduce([t0], ar)  # in flight: rank 1 has not joined
    ring = g0.ring_path()
    g0.close_rings()  # what destroy_process_group does (shutdown)
    with RingReader(ring) as rd:
        assert not rd.header().finished  # a completion is owed: not finished yet
        assert len(rd.poll().in_flight) == 1
    # a collective while the ring is closing runs, unrecorded
    x0, x1 = torch.ones(1), torch.ones(1)
    v0 = g0.allreduce([x0], ar)
    w1 = g1.allreduce([t1], ar)
    v1 = g1.allreduce([x1], ar)
    # a callback added now runs after the record's own (a future runs them in order)
    after = w0.get_future().then(lambda f: None)
    after.wait()
    for w in (w1, v0, v1):
        w.wait()
    assert t0.tolist() == [2.0] * 4 and x0.tolist() == [2.0]
    with RingReader(ring) as rd:
        h, b = rd.header(), rd.poll()
        assert h.finished  # the last owed completion finished the ring
        assert len(b.in_flight) == 0 and len(b.done) == 1
        assert int(b.done["end"][0]) >= int(b.done["start"][0]) > 0
    # a ring closed with nothing owed finishes at once
    g1.close_rings()
    with RingReader(g1.ring_path()) as rd:
        assert rd.header().finished and len(rd.poll().done) == 2


@pytest.mark.parametrize("path", ["python", "cpp"])
def test_destroying_a_group_waits_for_its_owed_completion(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``shutdown`` (destroy_process_group) returns with the ring finished once the
    last completion comes within CLOSE_WAIT_S, so a job may leave right after it (with
    ``os._exit``, say: tests/torch_exit.py); a wait that cannot end is bounded."""
    if path == "cpp" and backend.load_ext() is None:
        pytest.skip("the C++ path is not built here: make backend-ext")
    monkeypatch.setenv("ARTEMIS_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("ARTEMIS_JOB", "closejob")
    g0, g1 = _pair(path)
    if path == "cpp":
        assert g0._tb.close_wait_s == backend.CLOSE_WAIT_S  # one wait on both paths
    ar = dist.AllreduceOptions()
    w0 = g0.allreduce([torch.ones(4)], ar)  # in flight: rank 1 has not joined
    assert g0.close_rings(0.05) is False  # bounded: nothing can complete it yet
    with RingReader(g0.ring_path()) as rd:
        assert not rd.header().finished

    def join() -> None:
        # Later than the shutdown starts, unless this machine stalls the main thread:
        # then the completion is in before the shutdown, which passes trivially (never
        # falsely fails). Gloo's own shutdown does not wait for it (it returned in
        # 15 us with the record still in flight when the wait was 0).
        time.sleep(0.3)
        g1.allreduce([torch.ones(4)], ar).wait()

    t = threading.Thread(target=join)
    t.start()
    g0.shutdown()
    with RingReader(g0.ring_path()) as rd:
        assert rd.header().finished
        b = rd.poll()
        assert len(b.in_flight) == 0 and len(b.done) == 1
    t.join(30)
    w0.wait()
    g1.shutdown()


# The groups are dropped while rank 0's gloo worker is inside a Python callback
# (Future.then). The last reference takes the inner gloo backend with it, whose
# destructor joins that worker, and the worker needs the GIL to leave the callback:
# dropped with the GIL held, that join never returns (it hung `make test` in CI).
# The callback sleeps (GIL released) so that the drop starts while it is inside.
_DROP = """
import gc, sys, threading, time
from datetime import timedelta
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[2])
from test_job_ring_close import _pair
g0, g1 = _pair(sys.argv[1])
inside = threading.Event()
def cb(f):
    inside.set()
    time.sleep(0.5)
ar = dist.AllreduceOptions()
w0 = g0.allreduce([torch.ones(4)], ar)
after = w0.get_future().then(cb)
w1 = g1.allreduce([torch.ones(4)], ar)
w1.wait()
assert inside.wait(30)
del g0, g1, w0, w1, after
gc.collect()
print("dropped", flush=True)
"""


@pytest.mark.parametrize("path", ["python", "cpp"])
def test_groups_dropped_while_a_worker_runs_a_python_callback_do_not_deadlock(
    path: str, tmp_path: Path
) -> None:
    if path == "cpp" and backend.load_ext() is None:
        pytest.skip("the C++ path is not built here: make backend-ext")
    env = {**os.environ, "ARTEMIS_SHM_DIR": str(tmp_path), "ARTEMIS_JOB": "dropjob"}
    try:
        p = subprocess.run(
            [sys.executable, "-c", _DROP, path, str(Path(__file__).parent)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{path} path: dropping the groups deadlocked (no exit in 60 s)")
    assert p.returncode == 0 and "dropped" in p.stdout, p.stdout + p.stderr
