"""Two islands in a real job, a slowed bridge: `artemis run` gives a `link` finding, nothing else.

The job is tests/islands_job.py: 4 gloo ranks through the ``artemis`` backend with
``ARTEMIS_ISLANDS=nvidia,nvidia,amd,amd``, DDP over the job (its all_reduce composed
by island: the leaders, ranks 0 and 2, exchange over a bridge). Each step also
spends 20 ms of modelled device time (a sleep: a GPU's kernels leave the host
idle, and a sleep does not take the other ranks' cores). From step 178 every
leader's bridge transfer takes 30 ms longer (the link slows: about 17x its
warm-up bridge time). The agent reads the bridge records from the leaders'
bridge rings and each rank's island from the per-rank telemetry file, as it does
for the simulator; the coordinator scores them with the simulator's rules.

Settings, for four ranks sharing this machine's two cores with whatever else runs:
the islands have two ranks each, so ``min_island_peers = 2`` judges each rank
against its island peer (not its own history, which the machine's load moves);
``mode = "seed"`` with ``suspect_ratio = 1.5`` (the adaptive rule's change test
is built to catch a 5% shift, and the scheduler makes shifts that size between
two ranks here); the history rules of the whole job (island drift, island
transfer, bridge time) need 2x-3x their warm-up: the load alone moved a few-ms
bridge or transfer time 2x in single windows while this was written, and the
slowed link is 17x.

The same job runs under ``artemis.job.Detector`` too (no daemons). Timing-sensitive
and about a minute each: marked ``torch_e2e`` (``make test-torch``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from job_runs import artemis_run, detector_job, jsonl_lines

JOB = Path(__file__).resolve().parent / "islands_job.py"
WINDOW_STEPS = 20
COLLS_PER_STEP = 2  # DDP's one bucket, composed: the island Reduce and Broadcast
SLOW_FROM = 178  # with DDP's 5 start-up collectives, collective 361: early in window 9
STEPS = 300

JOB_ARGS = (
    "--layout",
    "islands",
    "--islands",
    "nvidia,nvidia,amd,amd",
    "--steps",
    str(STEPS),
    "--compute-ms",
    "20",
)
SETTINGS = """[detector]
mode = "seed"
suspect_ratio = 1.5
min_island_peers = 2
drift_ratio = 2.0
collective_ratio = 3.0
link_ratio = 3.0
"""


def _artemis_run(tmp: Path, *job_args: str) -> tuple[int, str, list[dict[str, Any]]]:
    cfg = tmp / "coordinator.toml"
    cfg.write_text(SETTINGS)
    jsonl = tmp / "findings.jsonl"
    opts = ["--jsonl", str(jsonl), "--window-steps", str(WINDOW_STEPS), "--config", str(cfg)]
    code, out = artemis_run(
        tmp, opts, [sys.executable, str(JOB), *JOB_ARGS, *job_args], timeout=300
    )
    return code, out, jsonl_lines(jsonl)


SLOW_ARGS = ("--slow-from", str(SLOW_FROM), "--bridge-delay-ms", "30")


def _judge(found: list[dict[str, Any]], mark: Path) -> dict[str, Any]:
    """One link finding, within 3 windows of the onset; nothing else flagged."""
    onset = json.loads(mark.read_text())["coll_seq"] // (WINDOW_STEPS * COLLS_PER_STEP)
    flags = [f for f in found if f["state"] == "flagged"]
    assert [(f["kind"], f["island"]) for f in flags] == [("link", "amd<->nvidia")], [
        (f["kind"], f["rank"], f["island"], f["window"], f["ratio"]) for f in flags
    ]
    link = flags[0]
    assert onset <= link["window"] <= onset + 2, (onset, link)  # the onset window counts
    assert sorted(link["ranks"]) == [0, 2]  # the island leaders, by their global ranks
    ev = link["evidence"]
    assert ev["bridge_ms"] >= 25.0 + ev["baseline_bridge_ms"], ev  # the 30 ms, measured
    return link


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_slowed_bridge_gives_one_link_finding(tmp_path: Path) -> None:
    mark = tmp_path / "slow.json"
    code, out, found = _artemis_run(tmp_path, *SLOW_ARGS, "--mark", str(mark))
    assert code == 0, out
    _judge(found, mark)
    # the live line ("amd<->nvidia": each rank's island reached the coordinator)
    assert "flagged link amd<->nvidia" in out, out


@pytest.mark.slow
@pytest.mark.torch_e2e
def test_slowed_bridge_gives_one_link_finding_in_process(tmp_path: Path) -> None:
    """The same job with ``artemis.job.Detector`` (no agent, no coordinator): the
    leaders' bridge rings and the islands reach its summariser and scorer the same way."""
    mark = tmp_path / "slow.json"
    settings = {
        line.split(" = ")[0]: json.loads(line.split(" = ")[1]) for line in SETTINGS.splitlines()[1:]
    }
    found = detector_job(
        JOB,
        tmp_path,
        [*JOB_ARGS, *SLOW_ARGS, "--mark", str(mark)],
        window_steps=WINDOW_STEPS,
        settings=settings,
        shm=tmp_path / "shm",
        job="isl",
        timeout=300,
    )
    _judge(found, mark)
