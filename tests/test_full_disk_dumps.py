"""A hang dump on a full disk is counted and given up, never fatal; the next one is
written once there is space (docs/RELIABILITY.md "3. Full disks"). A real ENOSPC
without root: the dump's path is a symlink to /dev/full."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.service import Coordinator
from artemis.coordinator.sinks import FindingsWriter
from artemis.detect.settings import Settings
from artemis.protocol.messages import Dump
from artemis.rebalance.outputs import PlansWriter


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_dump_that_cannot_be_written_is_counted_and_the_next_one_written(
    tmp_path: Path,
) -> None:
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    c = Coordinator(
        Settings(),
        FindingsWriter(tmp_path / "f.jsonl"),
        PlansWriter(tmp_path / "p.jsonl"),
        Metrics(),
        dumps_dir=dumps,
    )
    target = dumps / "jj-r3-c0.jsonl"
    target.symlink_to("/dev/full")
    d = Dump(job="jj", comm="c0", rank=3, records=({"seq": 1},))

    async def on(msg: Dump) -> None:
        await c.on_message(None, msg)  # type: ignore[arg-type]

    asyncio.run(on(d))
    h = c.dumps_health
    assert h.failing and h.errors == {"no_space": 1} and h.lost == {"dump_not_written": 1}
    assert not target.exists() and not target.is_symlink()  # no half-written dump left
    asyncio.run(on(d))  # space again: written, and the health says so
    assert not h.failing
    assert [json.loads(x) for x in target.read_text().splitlines()] == [{"seq": 1}]
    assert h in c.write_health()
    c.flush()


def test_retention_prunes_old_dumps_rotated_files_and_store_rows(tmp_path: Path) -> None:
    """The coordinator's tick applies [retention]: dumps by age then size, rotated JSONL
    generations by age, store rows by age (once at the first tick, then every
    prune_every_s)."""
    import os
    import time

    from artemis.coordinator.config import RetentionConfig
    from artemis.store.sink import StoreSink

    now = time.time()
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for name, age_days in (("old.jsonl", 40), ("new.jsonl", 1)):
        q = dumps / name
        q.write_text("{}\n")
        os.utime(q, (now - age_days * 86400, now - age_days * 86400))
    old_gen = tmp_path / "f.jsonl.1"
    old_gen.write_text("{}\n")
    os.utime(old_gen, (now - 40 * 86400, now - 40 * 86400))
    store = StoreSink.open("sqlite:///" + str(tmp_path / "a.db"), tmp_path / "f.jsonl")
    assert store.store is not None
    store.write_rows([{"job": "j", "window": 0, "time": now - 40 * 86400}], [])
    store.write_rows([{"job": "j", "window": 1, "time": now}], [])
    r = RetentionConfig(max_age_days=30.0, keep_files=2)
    c = Coordinator(
        Settings(),
        FindingsWriter(tmp_path / "f.jsonl", r.jsonl()),
        PlansWriter(tmp_path / "p.jsonl", r.jsonl()),
        Metrics(),
        dumps_dir=dumps,
        store=store,
        retention=r,
    )
    asyncio.run(c.tick())
    assert sorted(q.name for q in dumps.iterdir()) == ["new.jsonl"]
    assert not old_gen.exists()
    assert store.flush()  # the prune is queued like every store write (store/sink.py)
    assert [w["window"] for w in store.store.job_windows("j")] == [1]
    c.flush()
