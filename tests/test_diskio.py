"""Outputs on a disk that fills, and their retention (common/diskio.py).

A real ENOSPC without root: the output's path is a symlink to /dev/full (every
write fails with ENOSPC), then a regular file again (space returned). The
mount-namespace test with the real daemons is tests/test_disk_full.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from artemis.common.diskio import JsonlAppender, Retention, prune_dir, rotated_paths
from artemis.coordinator.sinks import IncidentsWriter
from artemis.rebalance.outputs import PlansWriter
from artemis.store.jsonl import JsonlIncidents
from artemis.store.sqlite import SqliteStore

needs_dev_full = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")


def _full(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/full")


@needs_dev_full
def test_lines_wait_in_memory_then_go_out_whole_and_in_order(tmp_path: Path) -> None:
    p = tmp_path / "findings.jsonl"
    out = JsonlAppender(p, "findings")
    assert out.write_lines(["a", "b"]) == 2
    # The disk fills: the next lines wait, counted as a failure, nothing lost.
    p.rename(tmp_path / "saved")
    _full(p)
    out._close_fd()  # a fresh open of the (now full) path, as after a restart
    assert out.write_lines(["c"]) == 0
    assert out.write_lines(["d", "e"]) == 0
    assert out.health.failing and out.health.backlog == 3
    assert out.health.errors == {"no_space": 2}
    assert not out.health.lost
    # Space returns: the backlog is written first, in order.
    p.unlink()
    (tmp_path / "saved").rename(p)
    out._close_fd()
    assert out.retry() == 3
    assert not out.health.failing and out.health.backlog == 0
    assert p.read_text().splitlines() == ["a", "b", "c", "d", "e"]
    out.close()


@needs_dev_full
def test_a_backlog_past_its_bound_counts_the_lines_lost(tmp_path: Path) -> None:
    p = tmp_path / "plans.jsonl"
    _full(p)
    out = JsonlAppender(p, "plans", backlog_lines=3)
    out.write_lines([str(i) for i in range(5)])
    assert out.health.backlog == 3
    assert out.health.lost == {"backlog_full": 2}
    out.close()  # still full at exit: what is left is counted too
    assert out.health.lost == {"backlog_full": 2, "unwritten_at_exit": 3}


@needs_dev_full
def test_plans_writer_survives_a_full_disk(tmp_path: Path) -> None:
    p = tmp_path / "plans.jsonl"
    w = PlansWriter(p)
    w.write({"plan": "p1", "status": "proposed"})
    p.rename(tmp_path / "saved")
    _full(p)
    assert w.out is not None
    w.out._close_fd()
    w.write({"plan": "p1", "status": "applied"})  # does not raise
    assert w.health.failing
    p.unlink()
    (tmp_path / "saved").rename(p)
    w.out._close_fd()
    w.retry()
    w.close()
    assert [json.loads(x)["status"] for x in p.read_text().splitlines()] == ["proposed", "applied"]


def test_rotation_by_size_keeps_keep_files_generations(tmp_path: Path) -> None:
    p = tmp_path / "findings.jsonl"
    out = JsonlAppender(p, "findings", Retention(max_bytes=100, keep_files=2))
    for i in range(40):
        out.write_lines([f"{i:08d}" * 2])  # 17 bytes a line
    out.close()
    gens = rotated_paths(p)
    assert [q.name for q in gens] == ["findings.jsonl.2", "findings.jsonl.1", "findings.jsonl"]
    assert all(q.stat().st_size <= 100 for q in gens)
    lines = [x for q in gens for x in q.read_text().splitlines()]
    # The newest lines, oldest first, without a gap.
    assert lines == [f"{i:08d}" * 2 for i in range(40 - len(lines), 40)]


def test_rotation_by_age_and_pruning_of_old_generations(tmp_path: Path) -> None:
    now = [1000.0]
    p = tmp_path / "incidents.jsonl"
    out = JsonlAppender(
        p, "incidents", Retention(max_age_s=60.0, keep_files=5), wall=lambda: now[0]
    )
    out.write_lines(["old"])
    now[0] += 61
    out.write_lines(["new"])  # the live file's oldest line is past the age: rotated
    assert (tmp_path / "incidents.jsonl.1").read_text() == "old\n"
    assert p.read_text() == "new\n"
    os.utime(tmp_path / "incidents.jsonl.1", (now[0] - 120, now[0] - 120))
    assert out.prune() == 1
    assert rotated_paths(p) == [p]
    out.close()


def test_incidents_reader_reads_rotated_generations(tmp_path: Path) -> None:
    p = tmp_path / "incidents.jsonl"
    w = IncidentsWriter(p, Retention(max_bytes=60, keep_files=3))
    w.write([{"id": "i1", "job": "j", "status": "open"}])
    w.write([{"id": "i2", "job": "j", "status": "open"}])
    w.write([{"id": "i1", "job": "j", "status": "closed"}])
    w.close()
    assert len(rotated_paths(p)) > 1
    store = JsonlIncidents(p)
    assert {r["id"]: r["status"] for r in store.incidents()} == {"i1": "closed", "i2": "open"}


def test_prune_dir_by_age_then_oldest_first_by_size(tmp_path: Path) -> None:
    d = tmp_path / "dumps"
    d.mkdir()
    now = time.time()
    for i, age in enumerate((5000, 300, 200, 100)):
        q = d / f"dump{i}.jsonl"
        q.write_bytes(b"x" * 1000)
        os.utime(q, (now - age, now - age))
    assert prune_dir(d, max_bytes=2000, max_age_s=1000, now=now) == 2
    assert sorted(q.name for q in d.iterdir()) == ["dump2.jsonl", "dump3.jsonl"]


def test_store_prune_deletes_rows_older_than_the_age(tmp_path: Path) -> None:
    st = SqliteStore(tmp_path / "artemis.db")
    try:
        st.write_job("j", {"ranks": 4})
        st.write_incidents([{"id": "j:rank:1:0", "job": "j", "opened": {"window": 0}}])
        st.write_rows(
            [{"job": "j", "window": 0, "time": 100.0}, {"job": "j", "window": 1, "time": 5000.0}],
            [{"incident": "j:rank:1:0", "window": 0, "time": 100.0}],
        )
        out = st.prune(before=1000.0)
        assert out["job_windows"] == 1 and out["incident_windows"] == 1
        assert [r["window"] for r in st.job_windows("j")] == [1]
        # The incident and the job were updated just now: kept.
        assert st.incident("j:rank:1:0") is not None and st.jobs()
        out = st.prune(before=time.time() + 10)
        assert out["incidents"] == 1 and out["jobs"] == 1
        assert st.incidents() == [] and st.jobs() == []
    finally:
        st.close()
