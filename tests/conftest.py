"""Shared fixtures.

``plugin_lib`` builds the real profiler plugin once per session (incremental
``make -C profiler_plugin lib``) and hands tests its path. The plugin reads its
ARTEMIS_* environment at every communicator init, so ``shm_dir`` (which sets
ARTEMIS_SHM_DIR and clears the other knobs) is enough to isolate a test.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The tests read their jobs' rings after the jobs end, with no agent serving the
# folder: keep them, as ARTEMIS_KEEP_RINGS is there for (artemis.ring.lifetime).
# The tests of ring removal (tests/test_ring_lifetime.py) clear it.
os.environ.setdefault("ARTEMIS_KEEP_RINGS", "1")
PLUGIN_DIR = REPO / "profiler_plugin"
PLUGIN_SO = PLUGIN_DIR / "build" / "libnccl-profiler-artemis.so"


# The watchdog behind pytest-timeout (tests/watchdog_hooks.py).
from watchdog_hooks import pytest_configure, pytest_runtest_protocol  # noqa: E402, F401


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def plugin_lib() -> Path:
    """The compiled plugin (built now if missing or older than its sources)."""
    if not (PLUGIN_DIR / "core.c").exists():
        from artemis.agent.plugin_path import plugin_path

        return plugin_path()
    (PLUGIN_DIR / "build").mkdir(exist_ok=True)
    # Several test sessions may share this tree: serialise the build.
    with open(PLUGIN_DIR / "build" / ".build.lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        proc = subprocess.run(
            ["make", "-s", "-C", str(PLUGIN_DIR), "lib"],
            capture_output=True,
            text=True,
        )
    if proc.returncode != 0:
        pytest.fail(f"make -C profiler_plugin lib failed:\n{proc.stdout}\n{proc.stderr}")
    assert PLUGIN_SO.exists(), f"{PLUGIN_SO} missing after make"
    return PLUGIN_SO


@pytest.fixture
def shm_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private ring folder, exported as ARTEMIS_SHM_DIR for the plugin."""
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setenv("ARTEMIS_SHM_DIR", str(d))
    monkeypatch.setenv("ARTEMIS_JOB", "testjob")
    for var in ("ARTEMIS_DISABLE", "ARTEMIS_DEVICE_TIMING", "ARTEMIS_RING_SLOTS"):
        monkeypatch.delenv(var, raising=False)
    yield d
    assert os.path.isdir(d)


# A real PostgreSQL server (tests/pg.py): `pg_server` for the session, `pg_url` a
# fresh database per test.
from pg import pg_server, pg_url  # noqa: E402, F401
