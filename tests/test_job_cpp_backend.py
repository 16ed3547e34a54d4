"""The ``artemis`` backend's C++ path (job/csrc/timed_backend.cpp), in one process on
torch's do-nothing ``fake`` backend: it writes the very records the Python path
writes, and without the built extension the backend says how to build it.

The real multi-process checks (every collective against plain gloo on both paths,
DDP and FSDP bit for bit) are tests/test_job_backend.py's.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from artemis.job import backend  # noqa: E402
from artemis.ring import format as rf  # noqa: E402
from artemis.ring.reader import RingReader  # noqa: E402

# Record fields that must agree between the paths (times are checked for sanity).
SAME = ("kind", "func", "dtype", "state", "clock", "peer", "seq", "coll_seq", "bytes")


def test_without_the_extension_the_backend_says_how_to_build_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="artemis.job"):
        assert backend.load_ext(tmp_path) is None
    assert "make backend-ext" in caplog.text and "Python path" in caplog.text
    # a module built for another torch is not loaded either
    (tmp_path / "artemis_timed_backend.so").write_bytes(b"")
    (tmp_path / "artemis_timed_backend.torch").write_text("0.0.0\n")
    backend._ext_cache.pop(tmp_path)
    assert backend.load_ext(tmp_path) is None
    assert "another torch" in caplog.text


def _calls(dist: Any, pg: Any) -> None:
    """The same calls on either path (fake completes every Work at once)."""
    ar = dist.AllreduceOptions()
    pg.allreduce([torch.ones(4)], ar)
    pg.allreduce([torch.ones(3, dtype=torch.float64), torch.ones(2, dtype=torch.float64)], ar)
    pg.broadcast([torch.zeros(5, dtype=torch.int64)], dist.BroadcastOptions())
    pg._allgather_base(torch.zeros(8, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16))
    pg._reduce_scatter_base(torch.zeros(2), torch.zeros(4), dist.ReduceScatterOptions())
    pg.send([torch.ones(6, dtype=torch.int32)], 1, 0).wait()
    pg.recv([torch.ones(7, dtype=torch.uint8)], 1, 0).wait()
    pg.barrier(dist.BarrierOptions()).wait()
    w = pg.allreduce([torch.ones(2)], ar)
    w.get_future().wait()  # the inner Work's future, returned as is
    assert w.get_future().done()


def test_the_cpp_path_writes_the_python_paths_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend.load_ext() is None:
        pytest.skip("the C++ path is not built here: make backend-ext")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    monkeypatch.setenv("ARTEMIS_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("ARTEMIS_JOB", "cppjob")
    store = FakeStore()
    dist.init_process_group("fake", store=store, rank=0, world_size=2)
    try:
        fake: Any = dist.group.WORLD
        to = timedelta(seconds=30)
        py = backend.ArtemisProcessGroup(store, 0, 2, to, group_id="py", inner=fake)
        cpp = backend.ArtemisCppGroup(
            store, 0, 2, to, group_id="cpp", inner=fake._get_backend(torch.device("cpu"))
        )
        assert isinstance(cpp, backend.ArtemisGroup) and type(cpp).__name__ == "ArtemisCppGroup"
        assert cpp.getBackendName() == "artemis" and cpp.inner["cpu"] is not None
        assert cpp.next_coll_seq() == 0
        for pg in (py, cpp):
            _calls(dist, pg)
        assert cpp.next_coll_seq() == py.next_coll_seq() == 7  # the p2p ops are not counted
        paths = {name: pg.ring_path() for name, pg in (("py", py), ("cpp", cpp))}
        for pg in (py, cpp):
            pg.close_rings()
        cpp.allreduce([torch.ones(1)], dist.AllreduceOptions()).wait()  # closed: not recorded
    finally:
        dist.destroy_process_group()
    got = {}
    for name, path in paths.items():
        with RingReader(path) as rd:
            h = rd.header()
            assert h.backend and h.cpu_times and h.clock_kind == "host" and h.finished
            assert h.comm_name == f"gloo:{name}:0,1"  # the comm key, as on the Python path
            b = rd.poll()
            assert len(b.in_flight) == 0
            got[name] = b.done
    py_d, cpp_d = got["py"], got["cpp"]
    assert len(cpp_d) == len(py_d) == 9
    for f in SAME:
        assert cpp_d[f].tolist() == py_d[f].tolist(), f
    d = cpp_d
    assert d["func"].tolist()[:5] == [
        rf.FUNC_CODES[n]
        for n in ("AllReduce", "AllReduce", "Broadcast", "AllGather", "ReduceScatter")
    ]
    assert d["bytes"].tolist()[:7] == [16, 40, 40, 8, 16, 24, 7]
    assert (d["clock"] == rf.REC_HOST).all()
    assert (d["end"] >= d["start"]).all() and (d["start"] >= d["enqueue_ns"]).all()
    assert (d["enqueue_ns"] > 0).all()
    assert (d["cpu_end_ns"] >= d["cpu_start_ns"]).all() and (d["cpu_start_ns"] > 0).all()


def test_the_creator_picks_the_python_path_only_when_it_must(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ARTEMIS_ISLANDS", raising=False)
    monkeypatch.delenv("NCCL_PROFILER_PLUGIN", raising=False)
    built = backend.load_ext() is not None
    monkeypatch.setenv("ARTEMIS_BACKEND_IMPL", "auto")
    assert (backend._python_path_reason("") == "") == built
    monkeypatch.setenv("ARTEMIS_BACKEND_IMPL", "python")
    assert backend._python_path_reason("") == "ARTEMIS_BACKEND_IMPL=python"
    monkeypatch.setenv("ARTEMIS_BACKEND_IMPL", "cpp")
    monkeypatch.setenv("ARTEMIS_ISLANDS", "a,a,b,b")
    with pytest.raises(RuntimeError, match="ARTEMIS_ISLANDS"):  # islands need Python
        backend._python_path_reason("")
    monkeypatch.setenv("ARTEMIS_BACKEND_IMPL", "auto")
    assert "ARTEMIS_ISLANDS" in backend._python_path_reason("")
    monkeypatch.setenv("ARTEMIS_BACKEND_IMPL", "fast")
    with pytest.raises(ValueError, match="auto, cpp or python"):
        backend._python_path_reason("")
