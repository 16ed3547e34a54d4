"""The agent's part of a correction: consent, the result, and at-most-once application.

The handler runs against the simulated GPU (its control file beside a ring,
agent/corrections/simulated.py) and against the NVML fake of
tests/test_corrections_hw.py; the kill test runs a real ``artemis-agent``
process against a real protocol server in this process, delivers a protocol 1.2
correction, lets the agent SIGKILL itself right after the hardware call
(``ARTEMIS_CORRECTION_FAILPOINT=kill_after_apply``: before the result is
persisted or acknowledged), restarts it, and delivers the same correction again.
"Applied twice" is observable: every write of the control file replaces it (a new
inode), so the file's inode and content must not change after the first apply.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from artemis.agent.corrections.base import GpuControl
from artemis.agent.corrections.handler import FAILPOINT_ENV, REFUSED_DETAIL, CorrectionHandler
from artemis.agent.corrections.nvml import NvmlControl
from artemis.agent.corrections.simulated import (
    SimulatedControl,
    gpu_state_path,
    read_gpu_state,
    write_gpu_state,
)
from artemis.coordinator.corrections import control_id
from artemis.protocol.auth import load_secret
from artemis.protocol.messages import Ack, Message
from artemis.protocol.peers import PeerInfo
from artemis.protocol.server import ProtocolServer
from artemis.protocol.tcp import TcpTransport
from artemis.ring.writer import RingWriter
from daemon_harness import Daemon, write_secret
from test_corrections_hw import NVML_ERROR_NO_PERMISSION, NvGpu, fake_pynvml

LOCKED = {
    "vendor": "nvidia",
    "sm_mhz_max": 1980.0,
    "mem_mhz": 2619.0,
    "locked_sm_mhz": 1620.0,
    "power_limit_w": 700.0,
    "power_limit_default_w": 700.0,
}


def body(cid: str = "c-inc1-1", op: str = "apply", **kw: Any) -> dict[str, Any]:
    return {"op": op, "id": cid, "action": "reset_clocks", "rank": 0, "gpu": None, **kw}


def sim_gpu(tmp: Path) -> tuple[Path, Path]:
    ring = tmp / "j.00000000000000aa.r0.ring"
    state = gpu_state_path(ring)
    write_gpu_state(state, LOCKED)
    return ring, state


def handler(tmp: Path, backend: GpuControl, allowed: bool = True) -> CorrectionHandler:
    return CorrectionHandler(lambda: allowed, tmp / "state", lambda rank: backend, lambda r: 0)


def test_consent_off_refuses_with_the_reason_and_changes_nothing(tmp_path: Path) -> None:
    ring, state = sim_gpu(tmp_path)
    h = handler(tmp_path, SimulatedControl([ring]), allowed=False)
    ok, detail, res = h.handle(body())
    assert not ok and detail == REFUSED_DETAIL
    assert res["status"] == "refused" and "allow_corrections = false" in res["error"]
    assert read_gpu_state(state) == LOCKED and h.applied == 0


def test_apply_rollback_and_redelivery_on_the_simulated_gpu(tmp_path: Path) -> None:
    ring, state = sim_gpu(tmp_path)
    h = handler(tmp_path, SimulatedControl([ring]))
    ok, _, res = h.handle(body())
    assert ok and res["status"] == "applied" and res["gpu"] is None
    assert res["before"]["locked_sm_mhz"] == 1620.0 and res["after"]["locked_sm_mhz"] is None
    assert (read_gpu_state(state) or {})["locked_sm_mhz"] is None
    ino = state.stat().st_ino
    # at least once: the same id again is answered from the journal, not applied again
    ok2, detail2, res2 = h.handle(body())
    assert ok2 and res2 == res and "already done" in detail2
    assert state.stat().st_ino == ino and h.applied == 1
    # a new handler (a restarted agent) reads the same journal
    again = handler(tmp_path, SimulatedControl([ring]))
    assert again.handle(body())[2] == res and again.applied == 0
    # the rollback restores the state before, from the coordinator's copy of it
    ok3, _, res3 = again.handle(body(op="rollback", before=res["before"]))
    assert ok3 and res3["status"] == "rolled_back"
    assert (read_gpu_state(state) or {})["locked_sm_mhz"] == 1620.0


def test_power_limit_on_the_simulated_gpu(tmp_path: Path) -> None:
    ring, state = sim_gpu(tmp_path)
    write_gpu_state(state, {**LOCKED, "locked_sm_mhz": None, "power_limit_w": 480.0})
    h = handler(tmp_path, SimulatedControl([ring]))
    ok, _, res = h.handle(body(action="restore_power_limit"))
    assert ok and res["before"]["power_limit_w"] == 480.0 and res["after"]["power_limit_w"] == 700.0


def test_nvml_no_permission_is_failed_with_its_text_not_a_crash(tmp_path: Path) -> None:
    gpu = NvGpu()
    gpu.deny["nvmlDeviceSetPowerManagementLimit"] = NVML_ERROR_NO_PERMISSION
    h = handler(tmp_path, NvmlControl(fake_pynvml(gpu)))
    ok, detail, res = h.handle(body(action="restore_power_limit", gpu=0))
    assert not ok and res["status"] == "failed" and res["gpu"] == 0
    assert "Insufficient Permissions" in res["error"] == detail
    assert res["before"] == {"vendor": "nvidia", "power_limit_w": 450.0, "default_w": 700.0}
    assert gpu.limit_mw == 450_000


def test_bad_bodies_are_named(tmp_path: Path) -> None:
    ring, _ = sim_gpu(tmp_path)
    h = handler(tmp_path, SimulatedControl([ring]))
    assert "unknown correction action 'reboot'" in h.handle(body(action="reboot"))[1]
    assert "without an id" in h.handle(body(cid=""))[1]
    assert "unknown correction op 'undo'" in h.handle(body(op="undo"))[1]


# ------------------------------------------------------------------ a real agent, killed


class Sink:
    """The coordinator side's app: takes the agent's data, nothing else."""

    async def on_message(self, peer: PeerInfo, msg: Message) -> None:
        return None

    def on_disconnect(self, peer: PeerInfo) -> None:
        return None


async def deliver(srv: ProtocolServer, agent: str, b: dict[str, Any], timeout: float) -> Ack:
    """Send one protocol 1.2 correction control under the control id the coordinator
    gives it (the correction's id; a rollback's ``<id>:rollback``) and wait for its
    Ack, which names that id."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while agent not in srv.peers():
        assert loop.time() < end, "the agent did not connect"
        await asyncio.sleep(0.05)
    want = control_id(b)
    assert await srv.send_control(agent, "correction", b, control_id=want) == want
    ack = await srv.control_result(str(want), end - loop.time())
    assert ack.control_id == want
    return ack


def agent_daemon(tmp: Path, port: int, secret: Path, name: str, consent: bool = True) -> Daemon:
    cfg = tmp / "agent.toml"
    cfg.write_text(
        'telemetry = ["simulated"]\npoll_interval_s = 0.05\nscan_interval_s = 0.1\n'
        f"state_dir = {json.dumps(str(tmp / 'state'))}\n"
        + ("[policy]\nallow_corrections = true\n" if consent else "")
    )
    exe = Path(sys.executable).parent / "artemis-agent"
    argv = [str(exe), "run", "--coordinator", f"127.0.0.1:{port}", "--shm-dir", str(tmp / "shm")]
    argv += ["--secret-file", str(secret), "--host", "node-a", "--config", str(cfg), "--log-json"]
    return Daemon(name, argv, tmp / f"{name}.log")


def test_agent_killed_after_applying_does_not_apply_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = write_secret(tmp_path / "secret")
    shm = tmp_path / "shm"
    shm.mkdir()
    writer = RingWriter(shm, "j", 0xAA, 0, 2, 64)
    state = gpu_state_path(writer.path)
    write_gpu_state(state, LOCKED)
    b = body()

    async def scenario() -> tuple[Ack, Ack, Ack, int, bool]:
        srv = ProtocolServer(TcpTransport(), "127.0.0.1:0", load_secret(secret), Sink())
        port = int((await srv.start()).rsplit(":", 1)[1])
        monkeypatch.setenv(FAILPOINT_ENV, "kill_after_apply")
        first = agent_daemon(tmp_path, port, secret, "agent-1").start()
        monkeypatch.delenv(FAILPOINT_ENV)
        try:
            with pytest.raises(Exception, match="disconnected before acking"):
                await deliver(srv, "node-a", b, 30)
            assert first.proc is not None
            rc = await asyncio.to_thread(first.proc.wait, 30)
            ino = state.stat().st_ino
            second = agent_daemon(tmp_path, port, secret, "agent-2").start()
            try:
                redelivered = await deliver(srv, "node-a", b, 30)
                once_more = await deliver(srv, "node-a", b, 30)
                untouched = state.stat().st_ino == ino  # no second write of the GPU
                rolled = await deliver(srv, "node-a", {**b, "op": "rollback"}, 30)
            finally:
                second.stop()
            return redelivered, once_more, rolled, rc, untouched
        finally:
            await srv.close()

    try:
        redelivered, once_more, rolled, rc, untouched = asyncio.run(scenario())
    finally:
        writer.close()
    assert rc == -signal.SIGKILL  # killed between the hardware call and the ack
    res = redelivered.result or {}
    assert redelivered.ok and res["status"] == "applied" and res["recovered"] is True
    # the state before, persisted before the kill; the GPU as the one apply left it
    assert res["before"]["locked_sm_mhz"] == 1620.0 and res["after"]["locked_sm_mhz"] is None
    assert once_more.result == res and untouched
    # the rollback (the coordinator's verification failing) restores the state before,
    # from the journal when the control carries none
    assert rolled.ok and (rolled.result or {})["status"] == "rolled_back"
    assert (read_gpu_state(state) or {})["locked_sm_mhz"] == 1620.0
    journal = json.loads((tmp_path / "state" / "corrections.json").read_text())
    assert journal[b["id"]]["phase"] == "done" and os.path.exists(writer.path)


def test_a_real_agent_without_consent_acks_refused_with_the_reason(tmp_path: Path) -> None:
    """The default agent.toml (no [policy] allow_corrections): the Ack says why."""
    secret = write_secret(tmp_path / "secret")
    (tmp_path / "shm").mkdir()
    writer = RingWriter(tmp_path / "shm", "j", 0xAA, 0, 2, 64)
    write_gpu_state(gpu_state_path(writer.path), LOCKED)

    async def scenario() -> Ack:
        srv = ProtocolServer(TcpTransport(), "127.0.0.1:0", load_secret(secret), Sink())
        port = int((await srv.start()).rsplit(":", 1)[1])
        agent = agent_daemon(tmp_path, port, secret, "agent", consent=False).start()
        try:
            return await deliver(srv, "node-a", body(), 30)
        finally:
            agent.stop()
            await srv.close()

    try:
        ack = asyncio.run(scenario())
    finally:
        writer.close()
    assert not ack.ok and ack.detail == REFUSED_DETAIL
    assert (ack.result or {})["status"] == "refused" and (ack.result or {})["id"] == "c-inc1-1"
    assert read_gpu_state(gpu_state_path(writer.path)) == LOCKED
    assert not (tmp_path / "state").exists()  # nothing journalled, nothing touched
