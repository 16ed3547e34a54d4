"""The watchdog (tests/watchdog_hooks.py) ends a session whose test is stuck where
pytest-timeout's signal cannot reach it, and prints where it was stuck."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

STUCK = """
import signal, time
import pytest

@pytest.mark.timeout(1)
def test_stuck_with_the_alarm_blocked():
    # what a C call that never returns looks like to pytest-timeout's signal method
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(120)

def test_after():
    pass
"""


def test_a_test_stuck_past_its_timeout_prints_stacks_and_ends_the_session(tmp_path: Path) -> None:
    (tmp_path / "test_stuck.py").write_text(STUCK)
    env = {**os.environ, "ARTEMIS_WATCHDOG_GRACE_S": "1", "PYTHONPATH": str(Path(__file__).parent)}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "watchdog_hooks",
            "-c",
            os.devnull,
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_stuck.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert p.returncode != 0
    assert "Timeout (0:00:02)!" in p.stderr, p.stderr
    assert "test_stuck_with_the_alarm_blocked" in p.stderr  # the stuck test's frame
    assert "1 passed" not in p.stdout  # the session ended there
