"""The uplink through a partition on loopback: a relay that stops forwarding (a black hole).

A real ProtocolServer behind an in-process TCP relay; the relay's black hole keeps
every connection open but moves no byte, as a cut network does (no RST, no FIN).
The agent's link must notice (no acknowledgement for `stall_s`), reconnect once
the path is back, resend what was not acknowledged and count and log the outage.
The network-namespace forms (link down, loss, delay, flapping) are in
tests/test_partition.py.
"""

from __future__ import annotations

import asyncio
import contextlib

from artemis.protocol.client import AgentLink
from artemis.protocol.server import ProtocolServer
from artemis.protocol.session import AgentIdentity
from artemis.protocol.tcp import TcpTransport
from protocol_helpers import SECRET, RecordingApp, arun, heartbeat, wait_until
from structlog.testing import capture_logs


class Relay:
    """TCP relay 127.0.0.1:port -> target; `cut = True` blackholes every connection."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.cut = False
        self.server: asyncio.base_events.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(*self.target)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while True:
                while self.cut:  # bytes wait in the kernel's buffers, as in a partition
                    await asyncio.sleep(0.02)
                data = await src.read(65536)
                if not data:
                    break
                while self.cut:
                    await asyncio.sleep(0.02)
                dst.write(data)
                await dst.drain()

        for t in (pump(r, uw), pump(ur, w)):
            task = asyncio.ensure_future(t)
            self.tasks.add(task)

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.server is not None:
            self.server.close()


def test_a_blackholed_uplink_is_noticed_reconnected_counted_and_logged() -> None:
    async def main() -> None:
        app = RecordingApp()
        async with ProtocolServer(TcpTransport(), "127.0.0.1:0", SECRET, app) as srv:
            relay = Relay(srv.address)
            addr = await relay.start()
            lk = AgentLink(
                TcpTransport(),
                addr,
                SECRET,
                AgentIdentity("agent-b", "node-b", "0.1.0"),
                backoff_base=0.05,
                backoff_cap=0.3,
                healthy_s=0.0,
                handshake_timeout=0.5,
                stall_s=0.6,
            )
            with capture_logs() as logs:
                lk.start()
                for _ in range(5):
                    lk.enqueue(heartbeat())
                assert await lk.wait_acked(5, 10)
                assert lk.stats.outages == 0 and lk.stats.down_seconds() == 0.0
                relay.cut = True
                for _ in range(5):
                    lk.enqueue(heartbeat())
                await wait_until(lambda: lk.stats.stalls >= 1, 10, "the stall noticed")
                assert lk.stats.down_since is not None and not lk.connected
                await asyncio.sleep(1.0)  # still cut: reconnects fail their handshake
                down = lk.stats.down_seconds()
                assert down >= 0.9
                relay.cut = False
                assert await lk.wait_acked(10, 15)
                await wait_until(lambda: lk.connected, 10, "reconnected")
            assert app.seqs("agent-b") == list(range(1, 11))  # each once, in order
            st = lk.stats
            assert st.outages == 1 and st.down_since is None and st.down_s >= down
            lost = [e for e in logs if e["event"] == "uplink to coordinator lost"]
            back = [e for e in logs if e["event"] == "uplink to coordinator restored"]
            assert len(lost) == 1 and lost[0]["log_level"] == "warning"
            assert len(back) == 1 and back[0]["outage_s"] >= down and back[0]["resend"] >= 0
            await lk.close()
            await relay.close()

    arun(main())
