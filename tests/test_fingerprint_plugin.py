"""The software fingerprint from real rings: the compiled plugin, called from inside the
stand-in NCCL library (so ncclGetVersion is found through the real ABI), writes the
version into the ring header and the kept environment into the env sidecar; the agent
turns them into a fingerprint, sends it once per rank, and again when the rank's
process (its env) or its workload signature changes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from artemis.agent.config import AgentConfig
from artemis.agent.daemon import Agent
from artemis.agent.fingerprint import ring_software
from artemis.protocol.messages import Fingerprint
from artemis.ring import format as rf
from artemis.ring.reader import RingReader
from artemis.sim.nccl import NcclStandIn
from standin_comms import ring_path

SECRETS = {
    "NCCL_FP_API_KEY": "s3cret",
    "CUDA_fp_Token": "s3cret",
    "HSA_FP_SECRET": "s3cret",
    "TORCH_NCCL_FP_PASSWORD": "s3cret",
}


@pytest.fixture
def fp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARTEMIS_STANDIN_NCCL_VERSION", "22105")
    monkeypatch.setenv("NCCL_FP_ALGO", "Ring")
    monkeypatch.setenv("TORCH_NCCL_FP_ASYNC", "1")
    monkeypatch.setenv("NCCL_FP_LONG", "v" * 3000)  # cut at ENV_VALUE_MAX
    monkeypatch.setenv("NCCL_" + "L" * 130, "1")  # too long a name: left out
    monkeypatch.setenv("FP_NCCL_X", "1")  # not a prefix
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)


def test_the_plugin_writes_the_nccl_version_and_the_kept_env(
    plugin_lib: Path, shm_dir: Path, fp_env: None
) -> None:
    n = NcclStandIn(plugin_lib, 7, runtime="nccl")
    c = n.comm_init(0xF1, rank=0, nranks=2, name="dp")
    assert c.init_rc == 0 and c.context
    path = ring_path(shm_dir, 0xF1, 0)
    with RingReader(path) as r:
        h = r.header()
    assert h.nccl_version == 22105 and h.writer_flags & rf.WRITER_ENV
    sw = ring_software(h)
    assert sw["nccl"] == "2.21.5"
    # The C rule and the Python one keep the same names out of this whole process's env.
    assert sw["env"] == rf.filter_env(os.environ)
    assert sw["env"]["NCCL_FP_ALGO"] == "Ring" and sw["env"]["TORCH_NCCL_FP_ASYNC"] == "1"
    assert sw["env"]["NCCL_FP_LONG"] == "v" * rf.ENV_VALUE_MAX
    assert not set(sw["env"]) & (set(SECRETS) | {"FP_NCCL_X", "NCCL_" + "L" * 130})
    side = Path(rf.env_sidecar_path(path)).read_bytes()
    assert b"s3cret" not in side
    # One format: the Python writer (the artemis backend's) gives the same bytes.
    if all(v.isascii() for v in os.environ.values()):
        assert side == rf.encode_env_sidecar(os.getpid(), rf.filter_env(os.environ))
    c.finalize()


def _steps(comm: Any, steps: int, sizes: tuple[int, ...]) -> None:
    t = 1000
    for _ in range(steps):
        for s in sizes:
            comm.collective("AllReduce", s, "ncclFloat32", 1, kernel_times=[(t, t + 400)])
            t += 1000


def test_the_agent_sends_it_once_and_again_on_a_change(
    plugin_lib: Path, shm_dir: Path, fp_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[Any] = []

    def send(msg: Any) -> int:
        sent.append(msg)
        return len(sent)

    cfg = AgentConfig(shm_dir=str(shm_dir), host="h0", window_steps=2, telemetry=[])
    agent = Agent(cfg, [], send, lambda: 0)
    n = NcclStandIn(plugin_lib, 7, runtime="nccl")
    c = n.comm_init(0xF2, rank=0, nranks=2, name="dp")
    agent.scan()
    agent.tick(0.0)
    (first,) = agent.fingerprints()
    assert isinstance(first, Fingerprint) and (first.job, first.rank) == ("testjob", 0)
    sw = first.software.to_dict()
    assert sw["nccl"] == "2.21.5" and sw["kernel"] == os.uname().release
    assert sw["env"]["NCCL_FP_ALGO"] == "Ring" and not set(sw["env"]) & set(SECRETS)
    assert first.workload is None  # no step seen yet
    assert agent.fingerprints() == []  # nothing changed: nothing sent

    # Steps: the signature is learnt, the fingerprint goes again with it.
    _steps(c, 100, (1000, 2000, 3000))
    agent.tick(1.0)
    (second,) = agent.fingerprints()
    assert second.software == first.software and second.workload is not None
    assert agent.fingerprints() == []
    c.finalize()

    # The job restarts with another env: a new ring, a new fingerprint naming it.
    agent.tick(2.0)
    agent.cleanup()
    assert not ring_path(shm_dir, 0xF2, 0).exists()
    assert not Path(rf.env_sidecar_path(ring_path(shm_dir, 0xF2, 0))).exists()  # removed with it
    monkeypatch.setenv("NCCL_FP_ALGO", "Tree")
    c2 = n.comm_init(0xF3, rank=0, nranks=2, name="dp")
    agent.scan()
    agent.tick(3.0)
    (third,) = agent.fingerprints()
    assert third.software.env["NCCL_FP_ALGO"] == "Tree"
    assert third.workload is None
    _steps(c2, 100, (1000, 2000, 3000))
    agent.tick(4.0)
    (fourth,) = agent.fingerprints()
    assert fourth.workload == second.workload  # the same workload as before the restart
    c2.finalize()
    agent.close()
