"""How the end-to-end tests run a real torch job script (tests/ddp_job.py,
tests/islands_job.py, tests/torch_rebalance_job.py): under ``artemis run``, or on
its own with the in-process ``artemis.job.Detector`` (tests/torch_rank.py).

Each returns what the test judges (exit code, output, findings lines); the job's
arguments and the checks stay in the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from run_workdir import KEEP, keep_workdir

BIN = Path(sys.executable).parent
DDP_JOB = Path(__file__).resolve().parent / "ddp_job.py"


def jsonl_lines(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSONL file; none when it was never written."""
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def artemis_run(
    cwd: Path, opts: Sequence[str], job: Sequence[str], *, timeout: float, keep: bool = False
) -> tuple[int, str]:
    """``artemis run OPTS -- JOB`` in ``cwd``: its exit code and output (stdout, then
    stderr). With ``keep``, its work folder (logs, rings) is moved into ``cwd``
    (tests/run_workdir.py), to read after a failure."""
    p = subprocess.run(
        [str(BIN / "artemis"), "run", *([KEEP] if keep else []), *opts, "--", *job],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
    if keep:
        keep_workdir(p.stdout, cwd)
    return p.returncode, p.stdout + p.stderr


def detector_job(
    script: Path,
    out: Path,
    job_args: Sequence[str],
    *,
    window_steps: int,
    settings: Mapping[str, Any],
    shm: Path,
    job: str,
    timeout: float,
    bare_env: bool = False,
) -> list[dict[str, Any]]:
    """``script JOB_ARGS`` with its ranks' in-process Detector writing into ``out``
    (``--detector``, ``--window-steps``, ``--settings``), its rings in ``shm`` under job
    name ``job``; fails the test unless it exits 0. The findings lines it wrote.

    ``bare_env``: nothing of this process's environment but a system PATH, as a job
    started outside any virtualenv or launcher would have."""
    out.mkdir(parents=True, exist_ok=True)
    # bare: a system PATH, and a tree's own code first where the caller put it there
    # (a worktree's PYTHONPATH)
    bare = {"PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    env = bare if bare_env else dict(os.environ)
    p = subprocess.run(
        [
            sys.executable,
            str(script),
            *job_args,
            *("--window-steps", str(window_steps), "--detector", str(out)),
            *("--settings", json.dumps(dict(settings))),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "ARTEMIS_SHM_DIR": str(shm), "ARTEMIS_JOB": job},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return jsonl_lines(out / "findings.jsonl")


def inproc_ddp_job(
    tmp: Path,
    job_args: Sequence[str],
    *,
    window_steps: int,
    settings: Mapping[str, Any],
    timeout: float,
) -> list[dict[str, Any]]:
    """tests/ddp_job.py with the in-process Detector: findings and store in ``tmp/det``,
    rings in ``tmp/shm`` under job ``inproc``, started from a bare environment."""
    return detector_job(
        DDP_JOB,
        tmp / "det",
        job_args,
        window_steps=window_steps,
        settings=settings,
        shm=tmp / "shm",
        job="inproc",
        bare_env=True,
        timeout=timeout,
    )
