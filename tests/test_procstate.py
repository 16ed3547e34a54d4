"""Sampled process state (`agent/telemetry/procstate.py`): the share of time stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from artemis.agent.telemetry.base import RankTarget
from artemis.agent.telemetry.host import HostSource
from artemis.agent.telemetry.procstate import MIN_SAMPLES, StateSampler, parse_state


def test_parse_state_reads_past_a_name_with_parens_and_spaces() -> None:
    assert parse_state("42 (py) T (x)) S 1 42 42 0 -1") == "S"
    assert parse_state("42 (python3) T 1 42") == "T"
    assert parse_state("garbage") is None


def _fake_proc(root: Path, pid: int, state: str) -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} (train (rank 2)) {state} 1 {pid} {pid} 0 -1 4194304 0 0\n")


def test_the_share_of_samples_stopped_since_the_last_take(tmp_path: Path) -> None:
    st = StateSampler(tmp_path)
    _fake_proc(tmp_path, 7, "R")
    assert st.take(7) is None  # the first ask starts watching it
    st.close()  # (the passes below are driven by hand)
    for i in range(40):
        _fake_proc(tmp_path, 7, "T" if i % 4 == 0 else "S")
        st.poll()
    assert st.take(7) == pytest.approx(25.0)
    for _ in range(MIN_SAMPLES - 1):
        _fake_proc(tmp_path, 7, "T")
        st.poll()
    assert st.take(7) is None  # too few samples since the last take: no figure yet,
    _fake_proc(tmp_path, 7, "S")
    st.poll()  # and they count into the next
    assert st.take(7) == pytest.approx(100.0 * (MIN_SAMPLES - 1) / MIN_SAMPLES)


def test_a_process_gone_is_dropped(tmp_path: Path) -> None:
    st = StateSampler(tmp_path)
    st.close()
    _fake_proc(tmp_path, 9, "T")
    st.take(9)
    st.poll()
    (tmp_path / "proc" / "9" / "stat").unlink()
    st.poll()
    assert st.take(9) is None  # unknown again: sampling starts afresh


def test_a_real_process_stopped_a_quarter_of_the_time() -> None:
    """A real busy process, SIGSTOPped 25 ms of every 100 ms from outside, sampled by
    the sampler's own thread through HostSource as the agent builds it: about 25%
    (SIGCONT's wake-up adds a little), and 0 for the same process left running."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    states = StateSampler()
    src = HostSource(states=states)
    target = RankTarget(rank=0, pid=p.pid)
    try:
        src.sample(target)
        time.sleep(1.0)  # 50 samples, at least MIN_SAMPLES however loaded the machine
        assert src.sample(target).get("stopped_pct") == 0.0
        done = threading.Event()

        def duty() -> None:
            while not done.is_set():
                os.kill(p.pid, signal.SIGSTOP)
                time.sleep(0.025)
                os.kill(p.pid, signal.SIGCONT)
                time.sleep(0.075)

        t = threading.Thread(target=duty)
        t.start()
        try:
            time.sleep(2.0)
            got = src.sample(target).get("stopped_pct")
        finally:
            done.set()
            t.join()
        assert isinstance(got, float) and 15.0 <= got <= 45.0, got
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()
        states.close()


def test_the_in_process_host_source_reports_no_stop() -> None:
    # a process cannot watch itself stopped: without a sampler, no figure at all
    src = HostSource()
    src.sample(RankTarget(rank=0, pid=os.getpid()))
    time.sleep(0.05)
    assert "stopped_pct" not in src.sample(RankTarget(rank=0, pid=os.getpid()))


def test_the_agent_builds_its_host_source_with_the_sampler() -> None:
    # the agent's process is not the rank's: it can watch it stopped
    from artemis.agent.config import AgentConfig
    from artemis.agent.run_main import make_sources

    (src,) = [s for s in make_sources(AgentConfig(telemetry=["host"])) if s.name == "host"]
    assert isinstance(src, HostSource) and isinstance(src.states, StateSampler)
