"""Real loopback sockets: ProtocolServer with several AgentLinks, bad peers, refusals, restarts."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
from artemis.protocol.auth import load_secret
from artemis.protocol.client import AgentLink
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.messages import (
    Control,
    Error,
    Message,
    Windows,
    message_to_map,
)
from artemis.protocol.peers import NotConnected, PeerInfo
from artemis.protocol.server import ProtocolServer
from artemis.protocol.session import (
    AgentIdentity,
    AgentSession,
    Established,
    Send,
    SeqTracker,
)
from artemis.protocol.tcp import TcpChannel, TcpTransport, client_ssl_context, server_ssl_context
from artemis.protocol.transport import ChannelClosed
from protocol_helpers import (
    SECRET,
    RecordingApp,
    arun,
    heartbeat,
    secret_file,
    wait_until,
    windows_msg,
)
from tls_certs import localhost_cert as _make_cert

HERE = Path(__file__).resolve().parent
FAST = {"backoff_base": 0.02, "backoff_cap": 0.2, "healthy_s": 0.0}


def link(addr: str, i: int, secret: bytes = SECRET, **kw: object) -> AgentLink:
    ident = AgentIdentity(f"agent-{i}", f"node-{i}", "0.1.0")
    opts = {**FAST, **kw}
    return AgentLink(TcpTransport(), addr, secret, ident, **opts)


def data(i: int, host: str = "node-a") -> Message:
    return windows_msg(2, host=host) if i % 3 == 0 else heartbeat()


async def recv_all(ch: TcpChannel, timeout: float = 5.0) -> list[object]:
    """Everything the server sends until it closes the connection."""
    dec = FrameDecoder()
    out: list[object] = []
    while True:
        try:
            frame = await asyncio.wait_for(ch.recv(), timeout)
        except ChannelClosed:
            return out
        out.extend(dec.feed(frame))


async def raw_authenticated(addr: str, agent_id: str) -> tuple[TcpChannel, AgentSession]:
    """A hand-driven agent: real socket, real sans-IO session, no AgentLink."""
    ch = await TcpTransport().connect(addr)
    s = AgentSession(SECRET, AgentIdentity(agent_id, "raw-host", "0.1.0", incarnation="raw"))
    await ch.send(encode(s.hello()))
    dec = FrameDecoder()
    while s.state != "established":
        for item in dec.feed(await asyncio.wait_for(ch.recv(), 5)):
            for eff in s.receive(item):
                if isinstance(eff, Send):
                    await ch.send(encode(eff.msg))
                assert not isinstance(eff, Established) or eff.upto >= 0
    return ch, s


def test_several_agents_exactly_once_in_order_and_control() -> None:
    async def main() -> None:
        app = RecordingApp()
        async with ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, app) as srv:
            controls: list[Control] = []

            async def on_control(c: Control) -> tuple[bool, str]:
                controls.append(c)
                return True, f"applied {c.action}"

            links = [link(srv.address, i, on_control=on_control) for i in range(4)]
            for lk in links:
                lk.start()
            n = 60
            for k in range(n):
                for lk in links:
                    lk.enqueue(data(k))
            for lk in links:
                assert await lk.wait_acked(n, 15)
            for i in range(4):
                assert app.seqs(f"agent-{i}") == list(range(1, n + 1))
            assert srv.stats.delivered_total == 4 * n and srv.stats.duplicates_total == 0
            assert sorted(srv.peers()) == [f"agent-{i}" for i in range(4)]
            assert all(lk.stats.buffered == 0 and lk.stats.connected for lk in links)
            # Windows arrive as typed records, not maps.
            w = next(m for a, m in app.messages if isinstance(m, Windows))
            assert w.windows[1].rank == 1 and w.windows[1].telemetry.pcie_gen == 5

            cid = await srv.send_control("agent-2", "dump", {"rank": 3})
            ack = await srv.control_result(cid, 5)
            assert ack.ok and ack.detail == "applied dump" and ack.control_id == cid
            assert controls[0].body == {"rank": 3} and controls[0].action == "dump"
            assert app.control_acks == [ack]
            with pytest.raises(NotConnected):
                await srv.send_control("agent-99", "dump", {})
            for lk in links:
                await lk.close()
            await wait_until(lambda: len(app.disconnects) == 4, what="4 disconnects")

    arun(main())


def test_bad_clients_rejected_and_counted_while_others_served() -> None:
    async def main() -> None:
        app = RecordingApp()
        srv = ProtocolServer(
            TcpTransport(max_frame=64 * 1024), "127.0.0.1:0", SECRET, app, max_frame=64 * 1024
        )
        addr = await srv.start()
        good = [link(addr, i) for i in range(2)]
        for lk in good:
            lk.start()
        stop = asyncio.Event()

        async def stream(lk: AgentLink) -> int:
            k = 0
            while not stop.is_set():
                lk.enqueue(heartbeat())
                k += 1
                await asyncio.sleep(0.002)
            return k

        feeders = [asyncio.create_task(stream(lk)) for lk in good]
        t = TcpTransport()

        # 1. Garbage inside a sane length: answered with an Error naming it, closed (pre-auth).
        ch = await t.connect(addr)
        await ch.send(b"\x00\x00\x00\x05hello")
        got = await recv_all(ch)
        assert isinstance(got[0], Error) and got[0].code == "msgpack" and got[0].fatal
        # 2. An oversize prefix: Error "oversize", stream closed.
        ch = await t.connect(addr)
        await ch.send((10 << 20).to_bytes(4, "big") + b"x" * 100)
        got = await recv_all(ch)
        assert isinstance(got[0], Error) and got[0].code == "oversize"
        assert "10485760" in got[0].text
        # 3. A truncated frame, then the client goes away.
        ch = await t.connect(addr)
        await ch.send((100).to_bytes(4, "big") + b"y" * 10)
        await ch.close()
        # 4. Wrong first message: data before hello.
        ch = await t.connect(addr)
        await ch.send(encode(heartbeat(seq=1)))
        got = await recv_all(ch)
        assert isinstance(got[0], Error) and got[0].code == "protocol"
        assert "expected hello" in got[0].text
        # 5. An authenticated agent sending a bad field: Error naming the field,
        #    the frame is dropped, the connection stays and serves the next one.
        ch, _ = await raw_authenticated(addr, "raw-1")
        bad = message_to_map(windows_msg(2), seq=1, version=(1, 0))
        bad["windows"][1]["gap_ms"] = float("nan")
        import msgpack

        body = msgpack.packb(bad, use_bin_type=True)
        await ch.send(len(body).to_bytes(4, "big") + body)
        await ch.send(encode(heartbeat(), seq=2))
        dec = FrameDecoder()
        items: list[object] = []
        while not any(getattr(x, "upto", None) == 2 for x in items):
            items.extend(dec.feed(await asyncio.wait_for(ch.recv(), 5)))
        errs = [x for x in items if isinstance(x, Error)]
        assert errs and errs[0].code == "invalid" and not errs[0].fatal
        assert "windows.windows[1].gap_ms" in errs[0].text
        assert app.seqs("raw-1") == [2]
        await ch.close()

        await wait_until(
            lambda: srv.stats.bad_frames_total.get("truncated", 0) >= 1, what="truncated counted"
        )
        stop.set()
        sent = await asyncio.gather(*feeders)
        for lk, n in zip(good, sent, strict=True):
            assert await lk.wait_acked(n, 10)
        st = srv.stats
        assert st.bad_frames_total == {"msgpack": 1, "oversize": 1, "truncated": 1, "invalid": 1}
        # The oversize prefix is refused under its own reason (docs/DESIGN.md "Hostile peers").
        assert st.refused_peers_total == {"protocol": 2, "oversize": 1}
        for i, n in enumerate(sent):
            assert app.seqs(f"agent-{i}") == list(range(1, n + 1))
        for lk in good:
            assert lk.stats.reconnects == 0
            await lk.close()
        await srv.close()
        assert srv.stats.connections == 0

    arun(main())


def _min_elapsed(base: float, cap: float, attempts: int) -> float:
    """Least time ``attempts`` connection attempts can take: the lower halves of the back-off."""
    return sum(min(cap, base * 2**i) / 2 for i in range(attempts - 1))


@pytest.mark.parametrize(("agent_v", "server_v"), [((2, 0), (1, 0)), ((1, 0), (2, 1))])
def test_version_mismatch_refused_both_sides_with_backoff(
    agent_v: tuple[int, int], server_v: tuple[int, int]
) -> None:
    async def main() -> None:
        app = RecordingApp()
        srv = ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, app, version=server_v)
        addr = await srv.start()
        base, cap = 0.02, 0.16
        lk = link(addr, 0, version=agent_v, backoff_base=base, backoff_cap=cap)
        with structlog.testing.capture_logs() as logs:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            lk.start()
            await wait_until(lambda: lk.stats.refusals.get("version", 0) >= 6, what="6 refusals")
            elapsed = loop.time() - t0
            attempts = lk.stats.connect_attempts
            await lk.close(timeout=0)
        # No spinning: every attempt waited at least its back-off.
        assert elapsed >= _min_elapsed(base, cap, attempts)
        assert attempts <= 7
        a, s = agent_v, server_v
        both = (f"{a[0]}.{a[1]}", f"{s[0]}.{s[1]}")
        errors = [e for e in logs if e["log_level"] == "error"]
        # One clear ERROR on the agent side (rate-limited), naming both versions.
        assert len(errors) == 1 and errors[0]["reason"] == "version"
        assert all(v in errors[0]["detail"] for v in both)
        # The coordinator side refused and counted every attempt, naming both too.
        assert srv.stats.refused_peers_total["version"] >= 6
        refusals = [e for e in logs if e["event"] == "peer refused"]
        assert refusals and all(v in refusals[0]["detail"] for v in both)
        assert app.messages == [] and app.connects == []
        await srv.close()

    arun(main())


def test_wrong_secret_refused_and_counted() -> None:
    async def main() -> None:
        app = RecordingApp()
        srv = ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, app)
        addr = await srv.start()
        bad = link(addr, 0, secret=b"not the secret")
        bad.enqueue(heartbeat())
        good = link(addr, 1)
        good.start()
        with structlog.testing.capture_logs() as logs:
            bad.start()
            await wait_until(
                lambda: (
                    bad.stats.refusals.get("auth", 0) >= 2
                    and srv.stats.refused_peers_total.get("auth", 0) >= 2
                ),
                what="2 refusals seen by both sides",
            )
        assert not bad.connected and bad.stats.buffered == 1
        err = [e for e in logs if e["log_level"] == "error"]
        assert err and "shared secret" in err[0]["detail"]
        good.enqueue(heartbeat())
        assert await good.wait_acked(1, 5)
        assert [a for a, _ in app.messages] == ["agent-1"]
        await bad.close(timeout=0)
        await good.close()
        await srv.close()

    arun(main())


def test_secret_file_mode_0644_refused(tmp_path: Path) -> None:
    from artemis.protocol.auth import SecretFileError

    p = secret_file(tmp_path, mode=0o644)
    with pytest.raises(SecretFileError, match=r"mode 0644, expected 0600"):
        load_secret(p)


def test_server_restart_mid_stream_resends_and_dedups() -> None:
    async def main() -> None:
        tracker = SeqTracker()
        n, k = 300, 40
        closing: list[asyncio.Task[None]] = []
        srv1: list[ProtocolServer] = []

        async def on_msg(peer: PeerInfo, msg: Message) -> None:
            if peer.agent_id == "agent-0" and msg.seq == k and not closing:
                closing.append(asyncio.create_task(srv1[0].close()))

        app = RecordingApp(on_msg)
        s1 = ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, app, tracker=tracker)
        srv1.append(s1)
        addr = await s1.start()
        links = [link(addr, i) for i in range(3)]
        for lk in links:
            for _ in range(n):
                lk.enqueue(heartbeat())
            lk.start()
        await wait_until(lambda: bool(closing) and closing[0].done(), what="server 1 closed")
        # Same port, same dedup state: a coordinator restarting its listener.
        s2 = ProtocolServer(TcpTransport(), addr, SECRET, app, tracker=tracker)
        await s2.start()
        for lk in links:
            assert await lk.wait_acked(n, 20)
        for i in range(3):
            assert app.seqs(f"agent-{i}") == list(range(1, n + 1)), f"agent-{i}"
        assert links[0].stats.reconnects >= 1
        assert sum(lk.stats.resent_frames for lk in links) >= 1
        for lk in links:
            await lk.close()
        await s2.close()

    arun(main())


def test_resent_duplicates_acked_but_not_delivered_twice() -> None:
    async def main() -> None:
        app = RecordingApp()
        async with ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, app) as srv:
            ch, _ = await raw_authenticated(srv.address, "raw-dup")
            for s in (1, 2, 3):
                await ch.send(encode(heartbeat(), seq=s))
            await wait_until(lambda: app.seqs("raw-dup") == [1, 2, 3], what="1..3")
            await ch.close()
            # Same incarnation reconnects and (ignoring the upto it is told)
            # resends 2 and 3 before sending 4.
            ch, _ = await raw_authenticated(srv.address, "raw-dup")
            for s in (2, 3, 4):
                await ch.send(encode(heartbeat(), seq=s))
            dec = FrameDecoder()
            ups: list[int] = []
            while 4 not in ups:
                ups += [
                    x.upto
                    for x in dec.feed(await asyncio.wait_for(ch.recv(), 5))
                    if getattr(x, "upto", None) is not None
                ]
            assert app.seqs("raw-dup") == [1, 2, 3, 4]
            assert srv.stats.duplicates_total == 2 and 3 in ups
            await ch.close()

    arun(main())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_bounded_outbox_counts_drops_then_delivers_the_rest() -> None:
    async def main() -> None:
        addr = f"127.0.0.1:{_free_port()}"
        lk = link(addr, 0, outbox_capacity=5)
        lk.start()
        seqs = [lk.enqueue(heartbeat()) for _ in range(12)]
        assert lk.stats.dropped == 7 and lk.stats.buffered == 5
        await wait_until(lambda: lk.stats.connect_attempts >= 2, what="retrying")
        assert not lk.connected
        app = RecordingApp()
        async with ProtocolServer(TcpTransport(), addr, SECRET, app):
            assert await lk.wait_acked(12, 10)
            assert not await lk.wait_acked(3, 1)  # dropped, never acked
            assert app.seqs("agent-0") == seqs[7:]
            await lk.close()

    arun(main())


def test_app_errors_are_counted_and_do_not_wedge_delivery() -> None:
    async def main() -> None:
        async def explode(peer: PeerInfo, msg: Message) -> None:
            if msg.seq == 2:
                raise RuntimeError("app bug")

        app = RecordingApp(explode)
        async with ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, app) as srv:
            lk = link(srv.address, 0)
            lk.start()
            for _ in range(4):
                lk.enqueue(heartbeat())
            assert await lk.wait_acked(4, 10)
            assert app.seqs("agent-0") == [1, 3, 4]
            assert srv.stats.app_errors_total == 1
            await lk.close()

    arun(main())


def test_control_result_fails_when_agent_leaves_first() -> None:
    async def main() -> None:
        app = RecordingApp()
        gate = asyncio.Event()

        async def slow_control(c: Control) -> bool:
            await gate.wait()
            return True

        async with ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, app) as srv:
            lk = link(srv.address, 0, on_control=slow_control)
            lk.start()
            await lk.wait_connected(5)
            await wait_until(lambda: "agent-0" in srv.peers(), what="peer registered")
            cid = await srv.send_control("agent-0", "settings", {"x": 1})
            await lk.close(timeout=0)
            with pytest.raises(ChannelClosed):
                await srv.control_result(cid, 5)

    arun(main())


def test_tls_transport_delivers(tmp_path: Path) -> None:
    cert, key = _make_cert(tmp_path)

    async def main() -> None:
        app = RecordingApp()
        st = TcpTransport(server_ssl=server_ssl_context(cert, key))
        async with ProtocolServer(st, "127.0.0.1:0", SECRET, app) as srv:
            ct = TcpTransport(client_ssl=client_ssl_context(ca=cert), server_hostname="localhost")
            ident = AgentIdentity("tls-agent", "node-t", "0.1.0")
            lk = AgentLink(ct, srv.address, SECRET, ident, **FAST)
            lk.start()
            for _ in range(5):
                lk.enqueue(windows_msg(8))
            assert await lk.wait_acked(5, 10)
            assert app.seqs("tls-agent") == [1, 2, 3, 4, 5]
            await lk.close()
            # A plain-TCP agent cannot talk to the TLS listener; it keeps backing off.
            plain = link(srv.address, 9)
            plain.start()
            await wait_until(lambda: plain.stats.connect_attempts >= 2, what="plain retries")
            assert not plain.connected
            await plain.close(timeout=0)

    arun(main())


def test_server_in_a_real_subprocess(tmp_path: Path) -> None:
    secret = secret_file(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "protocol_server_proc.py"), str(secret)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("LISTENING "), line
        addr = line.split()[1]

        async def main() -> list[AgentLink]:
            links = [link(addr, i, secret=load_secret(secret)) for i in range(3)]
            for lk in links:
                lk.start()
            for _ in range(100):
                for lk in links:
                    lk.enqueue(heartbeat())
            for lk in links:
                assert await lk.wait_acked(100, 20)
            for lk in links:
                await lk.close()
            return links

        arun(main())
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    got: dict[str, list[int]] = {}
    for ln in out.splitlines():
        if ln.startswith("MSG "):
            _, agent, seq = ln.split()
            got.setdefault(agent, []).append(int(seq))
    assert got == {f"agent-{i}": list(range(1, 101)) for i in range(3)}
    assert "CLOSED" in out
