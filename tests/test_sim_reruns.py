"""The same scenario run twice into the same outputs: the second run is scored too.

A coordinator restores a job's state from its journal folder, so a job id that
ran before must be told apart from a resend of its windows. The simulator makes
communicator hashes new with each run, as NCCL does (its unique id), and the
coordinator sees a new run. Before, a second `make demo` scored nothing (every
window dropped as already scored).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from artemis.sim.cluster import SimCluster, SimOptions
from e2e_expect import read_jsonl

pytestmark = pytest.mark.slow

SCENARIO = """
[job]
ranks = 4
ranks_per_host = 4
step_ms = 20.0
collectives_per_step = 2
window_steps = 20
windows = 8
noise = 0.01
seed = 3

[[fault]]
kind = "clocks"
rank = 1
start_window = 2
slowdown = 0.3
"""


def test_a_second_run_into_the_same_outputs_is_scored(tmp_path: Path) -> None:
    path = tmp_path / "rerun.toml"
    path.write_text(SCENARIO)
    out = tmp_path / "out"
    for i in range(2):
        res = SimCluster(
            path,
            SimOptions(
                jsonl=out / "findings.jsonl",
                plans_jsonl=out / "plans.jsonl",
                workdir=tmp_path / f"work{i}",
                timeout_s=120,
            ),
        ).run()
        assert res.ok, f"run {i}: {res.reason}"
        assert res.windows_scored == 8, f"run {i} scored {res.windows_scored} windows"
        # Each run starts its findings file afresh (SimCluster); the second run
        # flags the straggler again, in a finding of its own.
        found = read_jsonl(out / "findings.jsonl")
        assert [f["window"] for f in found if f["state"] == "flagged" and f.get("rank") == 1]
