"""A port picked free and taken before the coordinator binds it (common/ports.py).

Stop 40's CI failed `artemis run` on one: "the coordinator exited with code 1 at
start", with a traceback in a log the user never saw. Real coordinators here, on
ports a real socket holds.
"""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from artemis.common.ports import PortTaken, error_line, free_port, on_free_ports, port_taken
from daemon_harness import metric, scrape, serve_argv, start_agent, wait_for, write_secret


@contextmanager
def held_port() -> Iterator[int]:
    """A loopback port another process would see taken (listening, as a server's is)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def serve(tmp: Path, port: int, mport: int) -> subprocess.Popen[bytes]:
    cfg = tmp / "coordinator.toml"
    cfg.write_text(f'store = "off"\nmetrics_addr = "127.0.0.1"\ncontrol_socket = "{tmp}/c.sock"\n')
    argv = serve_argv(
        port, mport, tmp / "f.jsonl", tmp / "p.jsonl", write_secret(tmp / "secret"), cfg
    )
    with open(tmp / "coordinator.log", "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("which", ["listen", "metrics_port"])
def test_a_coordinator_on_a_taken_port_says_which_in_one_line(tmp_path: Path, which: str) -> None:
    with held_port() as taken:
        # metrics off (0) when the agents' port is under test: metrics bind first
        port, mport = (taken, 0) if which == "listen" else (free_port(), taken)
        proc = serve(tmp_path, port, mport)
        assert proc.wait(30) == 2
    log = (tmp_path / "coordinator.log").read_text()
    assert "Traceback" not in log and "╭" not in log, log
    line = error_line(tmp_path / "coordinator.log")
    assert line == f"{which}: cannot listen on 127.0.0.1:{taken}: address already in use", log
    e = port_taken(line)
    assert e is not None and e.key == which


def test_a_start_on_a_taken_port_is_tried_again_on_other_ports(tmp_path: Path) -> None:
    tries: list[tuple[int, int]] = []
    procs: list[subprocess.Popen[bytes]] = []

    def attempt(port: int, mport: int) -> int:
        tries.append((port, mport))
        with held_port() as taken:
            # the first try's agent port is taken by someone else before it binds
            proc = serve(tmp_path, taken if len(tries) == 1 else port, mport)
            procs.append(proc)
            url = f"http://127.0.0.1:{mport}/metrics"
            wait_for(
                lambda: (
                    proc.poll() is not None or metric(scrape(url), "straggler_detector_active") == 1
                ),
                30,
                "the coordinator up or gone",
            )
        if proc.poll() is not None:
            raise port_taken(error_line(tmp_path / "coordinator.log")) or AssertionError(
                (tmp_path / "coordinator.log").read_text()
            )
        return mport

    try:
        mport = on_free_ports(attempt)
        assert len(tries) == 2 and procs[0].returncode == 2 and procs[1].poll() is None
        assert metric(scrape(f"http://127.0.0.1:{mport}/metrics"), "straggler_detector_active")
    finally:
        for p in procs:
            p.terminate()
            p.wait(15)


def test_a_metrics_port_the_user_gave_taken_is_final(tmp_path: Path) -> None:
    tries: list[int] = []

    def attempt(port: int, mport: int) -> None:
        tries.append(mport)
        raise PortTaken(f"metrics_port: cannot listen on 127.0.0.1:{mport}: x", "metrics_port")

    with pytest.raises(PortTaken):
        on_free_ports(attempt, metrics_port=9999)
    assert tries == [9999]


def test_an_agent_whose_metrics_port_is_taken_says_so_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "shm").mkdir()
    secret = write_secret(tmp_path / "agent-secret")
    with held_port() as taken:
        agent = start_agent(
            tmp_path,
            f"127.0.0.1:{free_port()}",  # nobody there: it would only retry
            tmp_path / "shm",
            secret,
            "h0",
            window_steps=4,
            colls_per_step=1,
            extra=[f"metrics_port = {taken}", 'metrics_addr = "127.0.0.1"'],
        ).start()
        assert agent.proc is not None and agent.proc.wait(30) == 2
    assert "Traceback" not in agent.log_text(), agent.log_text()
    assert error_line(agent.log) == (
        f"metrics_port: cannot listen on 127.0.0.1:{taken}: address already in use"
    )


def test_a_coordinator_is_up_only_once_it_says_it_serves() -> None:
    # Metrics bind before the agents' port (coordinator/server_main.py): `artemis run`
    # took an answering endpoint for a started coordinator and missed its exit on a
    # taken port (stop 41's CI). Real metrics, over HTTP, before and after.
    from artemis.cli.run import _serving
    from artemis.coordinator.metrics import Metrics

    m = Metrics()
    m.set_active(False)
    stop = m.serve(0, addr="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{stop.port}/metrics"
        assert metric(scrape(url), "straggler_detector_active") == 0
        with urllib.request.urlopen(url, timeout=5) as r:
            assert not _serving(r.read())
        m.set_active(True)
        with urllib.request.urlopen(url, timeout=5) as r:
            assert _serving(r.read())
    finally:
        stop()


def test_a_start_on_a_taken_agents_port_is_seen_by_the_wait(tmp_path: Path) -> None:
    from artemis.cli.run import _wait_metrics

    with held_port() as taken:
        mport = free_port()
        proc = serve(tmp_path, taken, mport)
        with pytest.raises(PortTaken) as e:
            url = f"http://127.0.0.1:{mport}/metrics"
            _wait_metrics(url, proc, 30.0, tmp_path / "coordinator.log", 0)
        assert e.value.key == "listen"
        assert proc.wait(30) == 2
