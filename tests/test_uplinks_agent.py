"""The agent process with a coordinator list (issue 30): `artemis-agent --coordinator
DEAD,LIVE` skips the dead address and its windows are scored by the live coordinator
(real processes: the plugin's rings, the agent daemon and its uplinks, the coordinator)."""

from __future__ import annotations

import socket
from pathlib import Path

from daemon_harness import json_records, scored_paced_job, wait_for, windows_scored


def test_an_agent_whose_first_coordinator_is_dead_is_scored_by_the_second(
    tmp_path: Path, plugin_lib: Path
) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nobody listens there now
    with scored_paced_job(tmp_path, plugin_lib, {}, window_steps=20, listed_first=[dead]) as coord:
        # scored_paced_job waited for the agent to connect and 3 windows to be scored
        n = windows_scored(coord)
        wait_for(lambda: windows_scored(coord) > n, 30, "more windows scored")
        assert coord.value("straggler_agents_connected") == 1
        live = coord.address
    recs = json_records((tmp_path / "agent-h0.log").read_text())
    connected = [r["address"] for r in recs if r.get("event") == "connected to coordinator"]
    assert connected and set(connected) == {live}, connected
