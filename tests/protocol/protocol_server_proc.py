"""A ProtocolServer in its own process, for tests: prints LISTENING, MSG lines, CLOSED."""

from __future__ import annotations

import asyncio
import signal
import sys

from artemis.common.aio import run
from artemis.protocol.auth import load_secret
from artemis.protocol.messages import Message
from artemis.protocol.peers import PeerInfo
from artemis.protocol.server import ProtocolServer
from artemis.protocol.tcp import TcpTransport


class PrintApp:
    async def on_message(self, peer: PeerInfo, msg: Message) -> None:
        print(f"MSG {peer.agent_id} {msg.seq}", flush=True)

    def on_disconnect(self, peer: PeerInfo) -> None:
        pass


async def main(secret_path: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    srv = ProtocolServer(TcpTransport(), "127.0.0.1:0", load_secret(secret_path), PrintApp())
    print(f"LISTENING {await srv.start()}", flush=True)
    await stop.wait()
    await srv.close()
    print("CLOSED", flush=True)


if __name__ == "__main__":
    import structlog

    # Logs go to stderr so stdout carries only the protocol lines the test reads.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    run(main(sys.argv[1]))
