"""`artemis regress` refusing what it cannot do: exit 2 with a message naming it,
and nothing stored (the real command, one process each)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ARTEMIS = Path(sys.executable).parent / "artemis"


def regress(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ARTEMIS), "regress", *args], capture_output=True, text=True, timeout=120
    )


def test_a_store_it_cannot_open(tmp_path: Path) -> None:
    r = regress("--store", "nowhere://x", "--device", "cpu")
    assert r.returncode == 2 and "error: store 'nowhere://x'" in r.stderr


def test_cpus_it_may_not_use(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    db = tmp_path / "r.db"
    r = regress("--store", f"sqlite:///{db}", "--device", "cpu", "--cpus", "4095")
    assert r.returncode == 2 and "cpus [4095]: not among this process's CPUs" in r.stderr
    assert sqlite3.connect(db).execute("SELECT count(*) FROM regress_runs").fetchone() == (0,)


def test_a_gpu_where_there_is_none(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = regress("--store", f"sqlite:///{tmp_path / 'r.db'}", "--device", "cuda")
    assert r.returncode == 2 and "benchmark: device cuda: torch sees no GPU" in r.stderr
