"""Per-agent identities (mutual TLS) and the per-peer limits, on real loopback sockets.

Certificates are made at test time with the `openssl` CLI in the test's tmp
dir: a CA, the coordinator's certificate, and agent certificates naming their
agent by an ``artemis://agent/ID`` URI, by CN only, or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from pathlib import Path

import pytest
from artemis.protocol.client import AgentLink
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.messages import Error
from artemis.protocol.peers import PeerLimits
from artemis.protocol.server import ProtocolServer
from artemis.protocol.session import AgentIdentity, AgentSession, Send
from artemis.protocol.tcp import TcpChannel, TcpTransport, client_ssl_context, server_ssl_context
from artemis.protocol.transport import ChannelClosed
from protocol_helpers import SECRET, RecordingApp, arun, wait_until, windows_msg

FAST = {"backoff_base": 0.02, "backoff_cap": 0.2, "healthy_s": 0.0}


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class Pki:
    """A CA and the certificates it signed, all made by the openssl CLI."""

    def __init__(self, d: Path) -> None:
        self.d = d
        self.ca, self.ca_key = d / "ca.pem", d / "ca.key"
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(self.ca_key),
            "-out",
            str(self.ca),
            "-subj",
            "/CN=artemis-test-ca",
        )
        self.server = self.issue(
            "coordinator", "/CN=localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1"
        )

    def issue(
        self, name: str, subj: str, ext: str | None = None, ca: tuple[Path, Path] | None = None
    ) -> tuple[Path, Path]:
        key, csr, crt = self.d / f"{name}.key", self.d / f"{name}.csr", self.d / f"{name}.pem"
        _openssl(
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            subj,
        )
        extfile = self.d / f"{name}.ext"
        extfile.write_text((ext or "basicConstraints=CA:FALSE") + "\n")
        ca_crt, ca_key = ca or (self.ca, self.ca_key)
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca_crt),
            "-CAkey",
            str(ca_key),
            "-CAcreateserial",
            "-days",
            "1",
            "-out",
            str(crt),
            "-extfile",
            str(extfile),
        )
        return crt, key

    def server_transport(self, require: bool = True) -> TcpTransport:
        cert, key = self.server
        return TcpTransport(
            server_ssl=server_ssl_context(cert, key, self.ca, require_client_cert=require)
        )

    def client_transport(self, cert: tuple[Path, Path] | None) -> TcpTransport:
        ctx = client_ssl_context(self.ca, *(cert or (None, None)))
        return TcpTransport(client_ssl=ctx, server_hostname="localhost")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.uri_a = p.issue("node-a", "/CN=ignored-cn", "subjectAltName=URI:artemis://agent/node-a")  # type: ignore[attr-defined]
    p.cn_b = p.issue("node-b", "/CN=node-b")  # type: ignore[attr-defined]
    p.anon = p.issue("anon", "/O=nobody-in-particular")  # type: ignore[attr-defined]
    return p


def _link(t: TcpTransport, addr: str, agent: str, host: str | None = None) -> AgentLink:
    return AgentLink(t, addr, SECRET, AgentIdentity(agent, host or agent, "0.1.0"), **FAST)


async def _raw(t: TcpTransport, addr: str, agent: str) -> tuple[TcpChannel, list[object]]:
    """Drive a handshake by hand; returns the channel and what the server answered."""
    ch = await t.connect(addr)
    s = AgentSession(SECRET, AgentIdentity(agent, agent, "0.1.0", incarnation="raw"))
    dec = FrameDecoder()
    got: list[object] = []
    # The server may refuse (and close) before it reads anything: then only read.
    with contextlib.suppress(ChannelClosed):
        await ch.send(encode(s.hello()))
    try:
        while s.state not in ("established", "closed"):
            for item in dec.feed(await asyncio.wait_for(ch.recv(), 5)):
                got.append(item)
                for eff in s.receive(item):
                    if isinstance(eff, Send):
                        await ch.send(encode(eff.msg))
    except ChannelClosed:
        pass
    return ch, got


def test_the_certificate_names_the_agent_and_a_hello_for_another_is_refused(pki: Pki) -> None:
    async def main() -> None:
        app = RecordingApp()
        async with ProtocolServer(pki.server_transport(), "127.0.0.1:0", SECRET, app) as srv:
            a = _link(pki.client_transport(pki.uri_a), srv.address, "node-a")  # type: ignore[attr-defined]
            b = _link(pki.client_transport(pki.cn_b), srv.address, "node-b")  # type: ignore[attr-defined]
            for lk in (a, b):
                lk.start()
                lk.enqueue(windows_msg(2))
            assert await a.wait_acked(1, 10) and await b.wait_acked(1, 10)
            assert app.seqs("node-a") == [1] and app.seqs("node-b") == [1]
            # node-a's certificate speaking for node-b: refused, naming both.
            _, got = await _raw(pki.client_transport(pki.uri_a), srv.address, "node-b")  # type: ignore[attr-defined]
            err = got[-1]
            assert isinstance(err, Error) and err.code == "identity" and err.fatal, got
            assert "'node-b'" in err.text and "'node-a'" in err.text, err.text
            # ... and as its own agent id but another host: refused too.
            ch = await pki.client_transport(pki.uri_a).connect(srv.address)  # type: ignore[attr-defined]
            s = AgentSession(SECRET, AgentIdentity("node-a", "node-b", "0.1.0"))
            await ch.send(encode(s.hello()))
            dec = FrameDecoder()
            items = dec.feed(await asyncio.wait_for(ch.recv(), 5))
            assert isinstance(items[0], Error) and items[0].code == "identity", items
            # A certificate that names no agent: refused before any hello is read.
            _, got = await _raw(pki.client_transport(pki.anon), srv.address, "node-a")  # type: ignore[attr-defined]
            assert isinstance(got[-1], Error) and got[-1].code == "identity", got
            await wait_until(lambda: srv.stats.refused_peers_total.get("identity", 0) == 3)
            assert app.seqs("node-b") == [1], "nothing was delivered under a borrowed identity"
            for lk in (a, b):
                await lk.close()

    arun(main())


def test_without_a_client_certificate_the_tls_handshake_fails(pki: Pki) -> None:
    async def main() -> None:
        app = RecordingApp()
        async with ProtocolServer(pki.server_transport(), "127.0.0.1:0", SECRET, app) as srv:
            with pytest.raises((ssl_error(), ConnectionError, OSError)):
                ch = await pki.client_transport(None).connect(srv.address)
                await ch.send(encode(AgentSession(SECRET, AgentIdentity("x", "x", "1")).hello()))
                await asyncio.wait_for(ch.recv(), 5)
            # A certificate from another CA fails the same way.
            other = Pki(pki.d / "other")
            rogue = pki.issue("rogue", "/CN=node-a", ca=(other.ca, other.ca_key))
            with pytest.raises((ssl_error(), ConnectionError, OSError)):
                ch = await pki.client_transport(rogue).connect(srv.address)
                await ch.send(
                    encode(AgentSession(SECRET, AgentIdentity("node-a", "node-a", "1")).hello())
                )
                await asyncio.wait_for(ch.recv(), 5)
            assert app.messages == []
        # require_client_cert = false: agents without one still authenticate by the secret.
        async with ProtocolServer(
            pki.server_transport(require=False), "127.0.0.1:0", SECRET, app
        ) as srv:
            lk = _link(pki.client_transport(None), srv.address, "node-c")
            lk.start()
            lk.enqueue(windows_msg(2))
            assert await lk.wait_acked(1, 10)
            await lk.close()

    (pki.d / "other").mkdir(exist_ok=True)
    arun(main())


def ssl_error() -> type[Exception]:
    import ssl

    return ssl.SSLError


def test_a_reconnect_with_the_same_certificate_supersedes_the_half_open_session(pki: Pki) -> None:
    async def main() -> None:
        app = RecordingApp()
        async with ProtocolServer(pki.server_transport(), "127.0.0.1:0", SECRET, app) as srv:
            old, _ = await _raw(pki.client_transport(pki.uri_a), srv.address, "node-a")  # type: ignore[attr-defined]
            await wait_until(lambda: "node-a" in srv.peers(), what="old session established")
            # The old one goes silent (half-open: never closed); the agent reconnects.
            new = _link(pki.client_transport(pki.uri_a), srv.address, "node-a")  # type: ignore[attr-defined]
            new.start()
            new.enqueue(windows_msg(2))
            assert await new.wait_acked(1, 10)
            dec = FrameDecoder()
            got: list[object] = []
            with pytest.raises(ChannelClosed):
                while True:
                    got.extend(dec.feed(await asyncio.wait_for(old.recv(), 5)))
            assert any(isinstance(x, Error) and x.code == "superseded" for x in got), got
            assert srv.stats.refused_peers_total.get("superseded") == 1
            assert srv.peers()["node-a"].conn_id != 1 and app.seqs("node-a") == [1]
            await new.close()

    arun(main())


def test_per_peer_and_total_limits_and_idle_time_out() -> None:
    async def main() -> None:
        app = RecordingApp()
        lim = PeerLimits(
            handshake_timeout_s=30,
            idle_timeout_s=0.5,
            max_unauthenticated_per_peer=3,
            max_unauthenticated=5,
        )
        async with ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, app, limits=lim) as srv:
            host, port = srv.address.rsplit(":", 1)
            socks = []
            for i in range(7):  # 4 from one source (1 over), then 3 from another (1 over the total)
                s = socket.socket()
                s.bind(("127.0.0.7" if i < 4 else "127.0.0.8", 0))
                s.connect((host, int(port)))
                socks.append(s)
                await asyncio.sleep(0.05)
            await wait_until(lambda: srv.stats.unauthenticated == 5, what="5 held")
            await wait_until(lambda: sum(srv.stats.refused_peers_total.values()) == 2)
            assert srv.stats.refused_peers_total == {"peer_limit": 1, "busy": 1}
            # A legitimate agent from a third address cannot get in while the total is
            # full, and can once the idle peers go.
            for s in socks:
                s.close()
            await wait_until(lambda: srv.stats.unauthenticated == 0, what="slots freed")
            lk = _link(TcpTransport(), srv.address, "node-a")
            lk.start()
            lk.enqueue(windows_msg(2))
            assert await lk.wait_acked(1, 10)
            await lk.close()
            # Authenticated but silent past idle_timeout_s: closed and counted "idle".
            ch, _ = await _raw(TcpTransport(), srv.address, "node-z")
            t0 = time.monotonic()
            dec = FrameDecoder()
            got: list[object] = []
            with pytest.raises(ChannelClosed):
                while True:
                    got.extend(dec.feed(await asyncio.wait_for(ch.recv(), 5)))
            assert 0.4 < time.monotonic() - t0 < 3
            assert any(isinstance(x, Error) and x.code == "idle" for x in got), got
            assert srv.stats.refused_peers_total.get("idle", 0) >= 1

    arun(main())
