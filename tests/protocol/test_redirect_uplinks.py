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
from artemis.protocol.client import AgentIdentity, AgentLink
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.jobsplit import jobs_of
from artemis.protocol.messages import (
    FLEET_MINOR,
    Error,
    Heartbeat,
    Hello,
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
from artemis.protocol.transport import ChannelClosed, FrameChannel, Listener, Transport
from artemis.sim.loadtest import LoadSpec, run_load
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
        self._live: dict[FrameChannel, set[str]] = {}  # established: the hello's jobs

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

    async def lose(self, job: str, owner_address: str) -> None:
        """The lease of ``job`` passed to ``owner_address``: tell the agents holding it."""
        self.owns.discard(job)
        self.owners[job] = owner_address
        for ch, jobs in list(self._live.items()):
            if job in jobs:
                self.redirects_sent += 1
                redirect = Redirect(jobs=(JobOwner(job=job, owner=job, address=owner_address),))
                await ch.send(encode(redirect))

    def windows_of(self, job: str) -> list[tuple[int, int]]:
        return sorted((r, w) for j, r, w in self.delivered if j == job)

    async def _handle(self, ch: FrameChannel) -> None:
        secure = getattr(ch, "secure", None)
        if secure is not None:
            await secure(10.0)
        session = CoordinatorSession(SECRET, self.tracker, coordinator_id=self.name)
        decoder = FrameDecoder()
        try:
            await self._serve(ch, session, decoder)
        except ChannelClosed:
            pass  # the agent went: as a coordinator, nothing to do
        finally:
            self._live.pop(ch, None)

    async def _serve(
        self, ch: FrameChannel, session: CoordinatorSession, decoder: FrameDecoder
    ) -> None:
        while True:
            frame = await ch.recv()
            for item in decoder.feed(frame):
                for eff in session.receive(item):
                    if isinstance(eff, Send):
                        await ch.send(encode(eff.msg))
                    elif isinstance(eff, PeerEstablished):
                        if eff.hello.version[1] < FLEET_MINOR and self._old_agent(eff.hello):
                            text = f"job is served by coordinator {self.owners} (redirect)"
                            await ch.send(encode(Error(code="not_owner", text=text, fatal=True)))
                            return
                        self.sessions += 1
                        self._live[ch] = {r.job for r in eff.hello.ranks}
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

    def _old_agent(self, hello: Hello) -> bool:
        """An agent below FLEET_MINOR with a job here that another coordinator serves."""
        return bool({r.job for r in hello.ranks} - self.owns)

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


async def two_jobs_two_owners(
    start: bool = True,
) -> tuple[FleetDouble, FleetDouble, Uplinks]:
    """a serves job-a and names b as job-b's owner; an agent with ranks of both, on a
    (started unless told otherwise)."""
    a = FleetDouble("coord-a", {"job-a"})
    b = FleetDouble("coord-b", {"job-b"})
    a.owners["job-b"] = await b.start()
    await a.start()
    up = uplinks([a.address], ("job-a", "job-b"), TcpTransport())
    if start:
        up.start()
    return a, b, up


def test_two_jobs_redirected_for_one_end_on_two_links_each_window_acked_once() -> None:
    async def main() -> None:
        a, b, up = await two_jobs_two_owners(start=False)
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


def test_loadtest_agents_follow_a_redirect_to_the_jobs_owner() -> None:
    async def main() -> None:
        a = FleetDouble("coord-a", set())
        b = FleetDouble("coord-b", {"lt"})
        a.owners["lt"] = await b.start()
        await a.start()
        spec = LoadSpec(
            coordinator=f"{a.address},{b.address}",
            secret=SECRET,
            ranks=6,
            ranks_per_agent=2,
            windows=3,
            window_s=0.0,
            job="lt",
            connect_timeout_s=20,
            ack_timeout_s=20,
        )
        try:
            res = await run_load(spec)
        finally:
            await a.close()
            await b.close()
        assert res.ok and res.acked == 6 * 3
        assert a.redirects_sent >= 1 and not a.delivered
        assert b.windows_of("lt") == sorted((r, w) for r in range(6) for w in range(3))

    arun(main(), 60)


def test_a_job_redirected_mid_session_moves_with_its_unacknowledged_windows() -> None:
    async def main() -> None:
        a = FleetDouble("coord-a", {"job-a", "job-b"})
        b = FleetDouble("coord-b", {"job-b"})
        await b.start()
        await a.start()
        up = uplinks([a.address], ("job-a", "job-b"), TcpTransport())
        up.start()
        tickets: list[int] = []
        try:
            await up.wait_connected(20)
            for w in range(10):
                tickets.append(up.enqueue(batch(w, "job-a", "job-b")))
            assert await up.wait_acked(tickets[-1], 20)
            # a loses job-b's lease with windows still queued for it: they must reach b
            # (the ones a did not take), each once.
            for w in range(10, 20):
                tickets.append(up.enqueue(batch(w, "job-a", "job-b")))
            await a.lose("job-b", b.address)
            for w in range(20, 30):
                tickets.append(up.enqueue(batch(w, "job-a", "job-b")))
                await asyncio.sleep(0)
            assert await up.wait_acked(tickets[-1], 30)
            links = len(up.links)
        finally:
            await up.close(timeout=1.0)
            await a.close()
            await b.close()
        assert a.windows_of("job-a") == every_window("job-a", range(30))
        got_b = a.windows_of("job-b") + b.windows_of("job-b")
        assert sorted(got_b) == every_window("job-b", range(30))  # all, and none twice
        assert every_window("job-b", range(10)) == sorted(a.windows_of("job-b"))[: 10 * NRANKS]
        assert b.windows_of("job-b")  # the rest went to the new owner
        assert links == 2

    arun(main(), 60)


def test_coordinators_that_disagree_do_not_bounce_a_job_at_connect_speed() -> None:
    async def main() -> None:
        a = FleetDouble("coord-a", set())
        b = FleetDouble("coord-b", set())
        await a.start()
        await b.start()
        a.owners["job-x"] = b.address  # each says the other owns it
        b.owners["job-x"] = a.address
        up = uplinks([a.address], ("job-x",), TcpTransport())
        up.start()
        loop = asyncio.get_running_loop()
        try:
            await wait_until(lambda: up.moves >= 4, 10, "the first bounces")
            t0, moves0 = loop.time(), up.moves
            await asyncio.sleep(3.0)  # a rate over a fixed span: an upper bound, not a race
            rate = (up.moves - moves0) / (loop.time() - t0)
        finally:
            await up.close(timeout=0.5)
            await a.close()
            await b.close()
        # undamped it moves once per handshake (hundreds a second on loopback)
        assert rate <= 4 / 5.0 + 1.0, rate

    arun(main(), 60)


def test_when_the_owner_dies_its_jobs_go_back_to_the_list() -> None:
    async def main() -> None:
        a, b, up = await two_jobs_two_owners()
        try:
            t = up.enqueue(batch(0, "job-a", "job-b"))
            assert await up.wait_acked(t, 20)
            # b dies; a takes job-b's lease (it expired): the agent must find that out
            await b.close()
            for ch in list(b._live):
                await ch.close()
            a.owns.add("job-b")
            t = up.enqueue(batch(1, "job-a", "job-b"))
            assert await up.wait_acked(t, 20)
        finally:
            await up.close(timeout=1.0)
            await a.close()
            await b.close()
        assert b.windows_of("job-b") == every_window("job-b", range(1))
        assert a.windows_of("job-b") == sorted((r, 1) for r in range(NRANKS))
        assert a.windows_of("job-a") == every_window("job-a", range(2))

    arun(main(), 60)


def test_an_agent_below_the_fleet_minor_is_told_not_owner() -> None:
    async def main() -> None:
        a = FleetDouble("coord-a", set())
        await a.start()
        ident = AgentIdentity(
            agent_id="node-a", host="node-a", agent_version="old", ranks=ranks_of("job-x")
        )
        old = AgentLink(
            TcpTransport(),
            a.address,
            SECRET,
            ident,
            version=(1, FLEET_MINOR - 1),
            backoff_base=0.02,
            backoff_cap=0.1,
        )
        old.start()
        try:
            await wait_until(
                lambda: old.stats.refusals.get("not_owner", 0) >= 1, 20, "a not_owner refusal"
            )
        finally:
            await old.close(timeout=0.1)
            await a.close()
        assert "served by coordinator" in (old.stats.last_error or "")
        assert a.sessions == 0

    arun(main(), 60)


def test_a_job_that_comes_back_to_a_coordinator_on_a_new_link_is_not_taken_for_resends() -> None:
    async def main() -> None:
        a = FleetDouble("coord-a", {"job-x"})
        b = FleetDouble("coord-b", set())
        await a.start()
        await b.start()
        up = uplinks([a.address], ("job-x",), TcpTransport())
        up.start()

        async def send(windows: range) -> None:
            for w in windows:
                t = up.enqueue(batch(w, "job-x"))
            assert await up.wait_acked(t, 20)

        try:
            await send(range(5))  # on the first link, seqs 1..5 at a
            b.owns.add("job-x")
            await a.lose("job-x", b.address)
            await send(range(5, 10))
            # back to a, on a new link (the first one closed when it lost its job):
            # its seqs start at 1 again, and a must not take them for resends
            a.owns.add("job-x")
            await b.lose("job-x", a.address)
            await send(range(10, 15))
        finally:
            await up.close(timeout=1.0)
            await a.close()
            await b.close()
        got = a.windows_of("job-x") + b.windows_of("job-x")
        assert sorted(got) == every_window("job-x", range(15))
        assert a.windows_of("job-x") == sorted(
            every_window("job-x", range(5)) + every_window("job-x", range(10, 15))
        )

    arun(main(), 60)


def test_the_list_link_reaching_an_owners_address_folds_into_that_link() -> None:
    async def main() -> None:
        a, b, _ = await two_jobs_two_owners(start=False)
        up = uplinks([a.address, b.address], ("job-a", "job-b"), TcpTransport())
        up.start()
        try:
            t = up.enqueue(batch(0, "job-a", "job-b"))
            assert await up.wait_acked(t, 20)
            assert len(up.links) == 2
            # a dies and b takes job-a: the list link moves on to b, where the owner
            # link already is; one agent id on two connections would supersede itself
            b.owns.add("job-a")
            await a.close()
            for ch in list(a._live):
                await ch.close()
            t = up.enqueue(batch(1, "job-a", "job-b"))
            assert await up.wait_acked(t, 20)
            links = [link.address for link in up.links]
        finally:
            await up.close(timeout=1.0)
            await a.close()
            await b.close()
        assert links == [b.address]
        assert b.windows_of("job-a") == every_window("job-a", range(1, 2))
        assert b.windows_of("job-b") == every_window("job-b", range(2))

    arun(main(), 60)


def test_a_job_whose_rings_went_keeps_its_link_until_its_windows_are_acked() -> None:
    async def main() -> None:
        a, b, up = await two_jobs_two_owners()
        try:
            await wait_until(lambda: len(up.links) == 2, 20, "job-b's own uplink")
            t = up.enqueue(batch(0, "job-a", "job-b"))
            up.jobs_seen(ranks_of("job-a"))  # job-b's rings are gone, its window is not
            assert len(up.links) == 2
            assert await up.wait_acked(t, 20)
            up.enqueue(Heartbeat())  # the agent's next heartbeat closes the idle link
            links = [link.address for link in up.links]
        finally:
            await up.close(timeout=1.0)
            await a.close()
            await b.close()
        assert b.windows_of("job-b") == every_window("job-b", range(1))
        assert links == [a.address]

    arun(main(), 60)
