"""Saved job state is read through msgspec Structs (detect/state.py): a state of the
wrong shape is refused with an error that names the field, and a restarting
coordinator logs such a job's state file and skips it, as it does any unreadable one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import pytest
import structlog
from artemis.coordinator.service import Coordinator
from artemis.detect.monitor import JobMonitor
from artemis.detect.settings import Settings
from artemis.detect.state import JobState, MonitorState, plain, read
from artemis.protocol.messages import Windows
from service_records import file_coordinator, host_peer, rank_window

JOB = "jj"


def _life(tmp: Path) -> Coordinator:
    return file_coordinator(tmp, lambda: 0.0)


async def _windows(c: Coordinator, first: int, last: int) -> None:
    p = host_peer(JOB, "h0", minor=0)
    c.on_connect(p)
    for w in range(first, last):
        ranks = tuple(
            rank_window(JOB, r, w, gap_ms=130.0 if r == 1 else 100.0, step_ms=140.0)
            for r in range(4)
        )
        await c.on_message(p, Windows(host="h0", windows=ranks))


def _saved(tmp: Path) -> tuple[Path, dict[str, Any]]:
    (path,) = sorted((tmp / "f.assembly.jobs").glob("*.state"))
    return path, msgpack.unpackb(path.read_bytes(), raw=False, strict_map_key=False)


def _monitor_after_windows(tmp: Path) -> dict[str, Any]:
    async def run() -> None:
        c = _life(tmp)
        await _windows(c, 0, 4)  # rank 1 slow: a track, a finding, an incident

    asyncio.run(run())
    return _saved(tmp)[1]["monitor"]


def test_the_plain_form_of_a_read_state_is_the_saved_one(tmp_path: Path) -> None:
    saved = _monitor_after_windows(tmp_path)
    assert saved["detector"]["tracks"], "the first life left a track"
    st = read(saved, MonitorState)
    assert msgpack.packb(plain(st), use_bin_type=True) == msgpack.packb(saved, use_bin_type=True)
    again = JobMonitor.restore(saved, Settings()).snapshot()
    assert msgpack.packb(again, use_bin_type=True) == msgpack.packb(saved, use_bin_type=True)


@pytest.mark.parametrize(
    ("where", "value", "named"),
    [
        (("window_steps",), "many", "$.window_steps"),
        (("hosts",), ["h0"], "$.hosts"),
        (("detector", "gpu_hours"), "lots", "$.detector.gpu_hours"),
        (("detector", "tracks", 0, 2, "active"), "yes", "$.detector.tracks[0][2].active"),
    ],
)
def test_a_wrong_typed_field_is_refused_by_name(
    tmp_path: Path, where: tuple[Any, ...], value: Any, named: str
) -> None:
    saved = _monitor_after_windows(tmp_path)
    d: Any = saved
    for k in where[:-1]:
        d = d[k]
    d[where[-1]] = value
    with pytest.raises(msgspec.ValidationError) as e:
        JobMonitor.restore(saved, Settings())
    assert named in str(e.value)
    assert isinstance(e.value, ValueError)  # what the coordinator's restore catches


def test_a_job_state_of_the_wrong_shape_is_named() -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.out_seq"):
        read({"job": "j", "monitor": None, "assembly": {}, "out_seq": "3"}, JobState)


def test_the_coordinator_logs_and_skips_a_job_whose_saved_state_is_wrong(tmp_path: Path) -> None:
    _monitor_after_windows(tmp_path)
    path, state = _saved(tmp_path)
    state["monitor"]["detector"]["tracks"][0][2]["active"] = "yes"
    path.write_bytes(msgpack.packb(state, use_bin_type=True))

    async def run() -> Coordinator:
        c = _life(tmp_path)  # restores: must not raise
        await _windows(c, 4, 8)  # and carries on with the job, from a fresh monitor
        return c

    with structlog.testing.capture_logs() as logs:
        c = asyncio.run(run())
    skipped = [x for x in logs if x["event"] == "job state unreadable: skipped"]
    assert len(skipped) == 1 and skipped[0]["path"] == str(path)
    assert "$.detector.tracks[0][2].active" in skipped[0]["error"]
    assert not any(x["event"] == "job state restored" for x in logs)
    assert JOB in c.jobs.monitors
    lines = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert max(f["window"] for f in lines) >= 4


def test_a_policy_state_of_the_wrong_shape_is_named() -> None:
    from artemis.rebalance.policy import PolicySettings, RebalancePolicy

    saved = RebalancePolicy(PolicySettings(), 4, 64, job=JOB).snapshot(binary=True)
    assert RebalancePolicy.restore(saved).snapshot(binary=True) == saved
    with pytest.raises(msgspec.ValidationError, match=r"\$\.blocked"):
        RebalancePolicy.restore({**saved, "blocked": {"1": "soon"}})
