"""Fleet routing over a real protocol server, and fleet mode's flags.

- A lease lost mid-session (taken over in PostgreSQL while its owner holds agents
  of the job): the owner's renewal finds it lost, the coordinator drops the job and
  sends the connected agent (a real 1.3 client over loopback TCP) a `redirect`
  naming the new owner, its address and epoch; its series go (no
  `straggler_job_owner` for the job any more).
- `artemis-coordinator serve --fleet` refuses, with an error naming the key, a store
  that is not PostgreSQL, a wildcard listen address without `--advertise`, and an
  `--advertise` that is not HOST:PORT; before binding anything.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import psycopg
import pytest
from artemis.coordinator.config import FleetConfig
from artemis.coordinator.fleet import Fleet, FleetCoordinator
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.messages import Message, RankInfo, Redirect
from artemis.protocol.server import ProtocolServer
from artemis.protocol.session import AgentIdentity, AgentSession, Established, Send
from artemis.protocol.tcp import TcpTransport
from artemis.protocol.transport import FrameChannel
from artemis.store.fleet import FleetStore
from daemon_harness import BIN, free_port, write_secret
from service_records import file_coordinator

JOB = "rj"
SECRET = b"a fleet's shared secret, 32 bytes or so"


class Probe:
    """A real 1.3 agent connection, read message by message."""

    def __init__(self, ch: FrameChannel, session: AgentSession) -> None:
        self.ch, self.session = ch, session
        self.dec = FrameDecoder()
        self.queue: list[Message] = []

    @classmethod
    async def connect(cls, address: str) -> Probe:
        ident = AgentIdentity(
            agent_id="h0",
            host="h0",
            agent_version="t",
            ranks=tuple(RankInfo(JOB, "c0", r, 2) for r in range(2)),
        )
        p = cls(await TcpTransport().connect(address), AgentSession(SECRET, ident))
        await p.ch.send(encode(p.session.hello()))
        while True:
            for item in p.dec.feed(await asyncio.wait_for(p.ch.recv(), 10)):
                for eff in p.session.receive(item):
                    if isinstance(eff, Send):
                        await p.ch.send(encode(eff.msg))
                    elif isinstance(eff, Established):
                        return p

    async def next(self, timeout: float) -> Message:
        while not self.queue:
            for item in self.dec.feed(await asyncio.wait_for(self.ch.recv(), timeout)):
                assert isinstance(item, Message), item
                self.queue.append(item)
        return self.queue.pop(0)


def owner_gauge(c: FleetCoordinator) -> float | None:
    return c.metrics.registry.get_sample_value("straggler_job_owner", {"job": JOB})


def test_a_lease_lost_mid_session_redirects_the_agents(pg_url: str, tmp_path: Path) -> None:
    cfg = FleetConfig(enabled=True, id="a", lease_s=5.0, renew_s=0.1, advertise="10.0.0.1:7470")

    async def run() -> None:
        fleet = Fleet(cfg, pg_url)
        coord = file_coordinator(
            tmp_path, lambda: 0.0, cls=FleetCoordinator, restore=False, fleet=fleet
        )
        server = ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, coord)
        coord.server = server
        address = await server.start()
        fleet.start()
        other = FleetStore(pg_url, "b", "10.0.0.2:7470", 5.0)
        try:
            probe = await Probe.connect(address)  # A takes the job on the hello
            assert fleet.epoch(JOB) == 1 and owner_gauge(coord) == 1.0
            # A's lease runs out while it is stalled (here: its expiry moved to the past
            # on the database), and B takes the job.
            with psycopg.connect(pg_url, autocommit=True) as db:
                db.execute("UPDATE fleet_leases SET expires = 0 WHERE job = %s", (JOB,))
            assert other.acquire(JOB).epoch == 2
            msg: Message | None = None
            for _ in range(100):  # the coordinator's ticks, as its main loop runs them
                await coord.tick()
                try:
                    msg = await probe.next(0.05)
                    break
                except asyncio.TimeoutError:
                    continue
            assert isinstance(msg, Redirect), msg
            assert [(o.job, o.owner, o.address, o.epoch) for o in msg.jobs] == [
                (JOB, "b", "10.0.0.2:7470", 2)
            ]
            assert fleet.epoch(JOB) is None and owner_gauge(coord) is None
            await probe.ch.close()
        finally:
            other.close()
            await server.close()
            coord.flush()

    asyncio.run(asyncio.wait_for(run(), 40))


@pytest.mark.parametrize(
    ("store", "listen", "extra", "says"),
    [
        ("sqlite:///{tmp}/a.db", "127.0.0.1:{port}", [], "fleet mode needs a PostgreSQL store"),
        (
            "postgresql://u:p@127.0.0.1:1/db",
            "0.0.0.0:{port}",
            [],
            "[fleet] advertise (--advertise HOST:PORT) is required",
        ),
        (
            "postgresql://u:p@127.0.0.1:1/db",
            "0.0.0.0:{port}",
            ["--advertise", "coord-1"],
            "[fleet] advertise: expected HOST:PORT, got 'coord-1'",
        ),
    ],
)
def test_fleet_flags_fail_clearly(
    tmp_path: Path, store: str, listen: str, extra: list[str], says: str
) -> None:
    port = free_port()
    secret = write_secret(tmp_path / "secret")
    argv = [
        str(BIN / "artemis-coordinator"),
        "serve",
        *("--fleet", "--store", store.format(tmp=tmp_path)),
        *("--listen", listen.format(port=port), "--metrics-port", "0"),
        *("--jsonl", str(tmp_path / "f.jsonl"), "--secret-file", str(secret)),
        *("--control-socket", str(tmp_path / "c.sock"), *extra),
    ]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert says in p.stderr, p.stderr
    assert "p@" not in p.stderr  # never the password
