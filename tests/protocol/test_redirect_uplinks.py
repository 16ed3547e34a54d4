"""The agent side of a coordinator fleet (issue 30 item 2): redirects and per-owner uplinks.

The agent's ``Uplinks`` (agent/uplinks.py, real ``AgentLink``s over real TCP and TLS)
against in-process doubles of fleet coordinators. A double is a *peer*: the real
protocol session (``CoordinatorSession``: the HMAC handshake, the seq dedup) behind a
real listener, with the routing rule of docs/DESIGN.md "Protocol": after auth it
answers ``Redirect`` for the hello's jobs it does not own, and a data message about
such a job is not taken (error "unavailable", the connection closes, nothing acked).
So a window a double records was acknowledged by it, and only by it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path

from artemis.agent.uplinks import Uplinks
from artemis.protocol.client import AgentIdentity
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.jobsplit import jobs_of
from artemis.protocol.messages import (
    Error,
    Heartbeat,
    JobOwner,
    Message,
    RankInfo,
    Redirect,
    Windows,
)
from artemis.protocol.records import RankProgress
from artemis.protocol.session import (
    Close,
    CoordinatorSession,
    Deliver,
    PeerEstablished,
    Refused,
    Send,
    SeqTracker,
)
from artemis.protocol.tcp import TcpTransport, client_ssl_context, server_ssl_context
from artemis.protocol.transport import FrameChannel, Listener, Transport
from protocol_helpers import SECRET, arun, progress, wait_until, window
from tls_certs import localhost_cert

COMM = "0123456789abcdef"
NRANKS = 4


class FleetDouble:
    """One coordinator of a fleet as an agent sees it: serves ``owns``, and for any other
    job of a hello answers Redirect to ``owners[job]`` ("" = nobody it knows of)."""

    def __init__(self, name: str, owns: set[str], transport: Transport | None = None) -> None:
        self.name = name
        self.owns = owns
        self.owners: dict[str, str] = {}
        self.transport = transport or TcpTransport()
        self.tracker = SeqTracker()
        self.delivered: list[tuple[str, int, int]] = []  # (job, rank, window) acked here
        self.heartbeat_jobs: set[str] = set()
        self.sessions = 0  # authenticated
        self.refused_data = 0  # messages about a job it does not own
        self.redirects_sent = 0
        self._listener: Listener | None = None

    async def start(self, address: str = "127.0.0.1:0") -> str:
        self._listener = await self.transport.listen(address, self._handle)
        return self.address

    @property
    def address(self) -> str:
        assert self._listener is not None
        return self._listener.address

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.close()

    def windows_of(self, job: str) -> list[tuple[int, int]]:
        return sorted((r, w) for j, r, w in self.delivered if j == job)

    async def _handle(self, ch: FrameChannel) -> None:
        secure = getattr(ch, "secure", None)
        if secure is not None:
            await secure(10.0)
        session = CoordinatorSession(SECRET, self.tracker, coordinator_id=self.name)
        decoder = FrameDecoder()
        while True:
            frame = await ch.recv()
            for item in decoder.feed(frame):
                for eff in session.receive(item):
                    if isinstance(eff, Send):
                        await ch.send(encode(eff.msg))
                    elif isinstance(eff, PeerEstablished):
                        self.sessions += 1
                        await ch.send(encode(session.confirm()))
                        foreign = sorted({r.job for r in eff.hello.ranks} - self.owns)
                        if foreign:
                            self.redirects_sent += 1
                            owners = tuple(
                                JobOwner(job=j, owner=j, address=self.owners.get(j, ""))
                                for j in foreign
                            )
                            await ch.send(encode(Redirect(jobs=owners)))
                    elif isinstance(eff, Deliver):
                        if not self._take(eff.msg):
                            text = f"{self.name} does not own a job of this message"
                            await ch.send(encode(Error(code="unavailable", text=text)))
                            return
                        await ch.send(encode(session.ack(session.delivered(eff.msg))))
                    elif isinstance(eff, Refused | Close):
                        return

    def _take(self, msg: Message) -> bool:
        if jobs_of(msg) - self.owns:
            self.refused_data += 1
            return False
        if isinstance(msg, Windows):
            cols = msg.columns
            for job, rank, w in zip(
                cols["job"], cols.ints("rank").tolist(), cols.ints("window").tolist(), strict=True
            ):
                self.delivered.append((job, rank, w))
        elif isinstance(msg, Heartbeat):
            self.heartbeat_jobs |= jobs_of(msg)
        return True


def ranks_of(*jobs: str) -> tuple[RankInfo, ...]:
    return tuple(RankInfo(job, COMM, r, NRANKS) for job in jobs for r in range(NRANKS))


def batch(w: int, *jobs: str) -> Windows:
    """One window of every rank of ``jobs``: a batch of several jobs, as an agent ships."""
    rows = [
        dataclasses.replace(window(rank=r, w=w), job=job, nranks=NRANKS)
        for job in jobs
        for r in range(NRANKS)
    ]
    return Windows(host="node-a", windows=tuple(rows))


def progress_of(job: str) -> RankProgress:
    return dataclasses.replace(progress(0), job=job)


def uplinks(addresses: list[str], jobs: tuple[str, ...], transport: Transport) -> Uplinks:
    ident = AgentIdentity(
        agent_id="node-a", host="node-a", agent_version="test", ranks=ranks_of(*jobs)
    )
    return Uplinks(
        transport, addresses, SECRET, ident, backoff_base=0.02, backoff_cap=0.2, owner_retries=2
    )


def every_window(job: str, windows: range) -> list[tuple[int, int]]:
    return sorted((r, w) for r in range(NRANKS) for w in windows)


def dead_address() -> str:
    """A loopback port nobody listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def test_two_jobs_redirected_for_one_end_on_two_links_each_window_acked_once() -> None:
    async def main() -> None:
        a = FleetDouble("coord-a", {"job-a"})
        b = FleetDouble("coord-b", {"job-b"})
        a.owners["job-b"] = await b.start()
        await a.start()
        up = uplinks([a.address], ("job-a", "job-b"), TcpTransport())
        # Windows of both jobs queued before any connection: the first hello names both
        # jobs, and every one of these batches must be cut when job-b moves.
        tickets = [up.enqueue(batch(w, "job-a", "job-b")) for w in range(10)]
        up.enqueue(Heartbeat(progress=(progress_of("job-a"), progress_of("job-b"))))
        up.start()
        try:
            await wait_until(lambda: len(up.links) == 2, 20, "a second uplink, to job-b's owner")
            # More windows while (and after) the job moves: each goes to its job's owner.
            for w in range(10, 30):
                tickets.append(up.enqueue(batch(w, "job-a", "job-b")))
                await asyncio.sleep(0)
            assert await up.wait_acked(tickets[-1], 30)
            assert up.acked_upto() >= tickets[-1]
        finally:
            await up.close(timeout=1.0)
            await a.close()
            await b.close()
        assert a.windows_of("job-a") == every_window("job-a", range(30))
        assert b.windows_of("job-b") == every_window("job-b", range(30))
        assert not a.windows_of("job-b") and not b.windows_of("job-a")
        # exactly once: the sorted lists above would show a repeat; say it plainly too
        assert len(a.delivered) == len(set(a.delivered)) == 30 * NRANKS
        assert len(b.delivered) == len(set(b.delivered)) == 30 * NRANKS
        # a heartbeat's progress followed its job
        assert "job-b" in b.heartbeat_jobs and "job-b" not in a.heartbeat_jobs
        assert a.redirects_sent >= 1 and up.moves >= 1

    arun(main(), 60)


def test_an_empty_address_sends_the_job_back_to_the_list() -> None:
    async def main() -> None:
        a = FleetDouble("coord-a", set())  # knows no owner of job-x: redirects to ""
        b = FleetDouble("coord-b", {"job-x"})
        await a.start()
        await b.start()
        up = uplinks([a.address, b.address], ("job-x",), TcpTransport())
        tickets = [up.enqueue(batch(w, "job-x")) for w in range(5)]
        up.start()
        try:
            assert await up.wait_acked(tickets[-1], 30)
        finally:
            await up.close(timeout=1.0)
            await a.close()
            await b.close()
        assert a.redirects_sent >= 1 and not a.delivered
        assert b.windows_of("job-x") == every_window("job-x", range(5))
        assert len(b.delivered) == len(set(b.delivered))

    arun(main(), 60)


def test_a_list_whose_first_address_is_dead_connects_to_the_second() -> None:
    async def main() -> None:
        b = FleetDouble("coord-b", {"job-x"})
        await b.start()
        up = uplinks([dead_address(), b.address], ("job-x",), TcpTransport())
        up.start()
        try:
            await up.wait_connected(20)
            t = up.enqueue(batch(0, "job-x"))
            assert await up.wait_acked(t, 20)
            assert up.links[0].address == b.address
            assert up.stats.connect_attempts >= 2  # the dead one was tried first
        finally:
            await up.close(timeout=1.0)
            await b.close()
        assert b.windows_of("job-x") == every_window("job-x", range(1))

    arun(main(), 60)


def test_under_tls_a_redirect_target_whose_certificate_does_not_verify_is_refused(
    tmp_path: Path,
) -> None:
    good_dir, bad_dir = tmp_path / "good", tmp_path / "bad"
    good_dir.mkdir()
    bad_dir.mkdir()
    good_cert, good_key = localhost_cert(good_dir)
    bad_cert, bad_key = localhost_cert(bad_dir)  # same name, another (untrusted) key

    async def main() -> None:
        a = FleetDouble(
            "coord-a",
            {"job-a"},
            TcpTransport(
                server_ssl=server_ssl_context(good_cert, good_key, require_client_cert=False)
            ),
        )
        b = FleetDouble(
            "coord-b",
            {"job-b"},
            TcpTransport(
                server_ssl=server_ssl_context(bad_cert, bad_key, require_client_cert=False)
            ),
        )
        await a.start()
        await b.start()
        a.owners["job-b"] = b.address
        agent_tls = TcpTransport(
            client_ssl=client_ssl_context(ca=good_cert), server_hostname="localhost"
        )
        up = uplinks([a.address], ("job-a", "job-b"), agent_tls)
        ta = up.enqueue(batch(0, "job-a", "job-b"))
        up.start()
        try:
            # job-a is served; job-b's owner never gets a session, however often the
            # agent is sent there (it goes back to the list after owner_retries).
            await wait_until(lambda: bool(a.windows_of("job-a")), 20, "job-a's window at a")
            await wait_until(
                lambda: up.stats.refusals.get("tls_bad_cert", 0) >= 2, 20, "refusals of b's cert"
            )
        finally:
            await up.close(timeout=0.5)
            await a.close()
            await b.close()
        assert b.sessions == 0 and not b.delivered
        assert a.windows_of("job-a") == every_window("job-a", range(1))
        assert not a.windows_of("job-b")
        assert up.acked_upto() < ta  # job-b's half of the batch was never acknowledged

    arun(main(), 60)
