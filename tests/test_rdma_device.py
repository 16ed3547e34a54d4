"""The pyverbs adapter against a real RDMA device (NIC or Soft-RoCE).

Skipped, with probe()'s reason, where pyverbs or a device is missing (this
repository's CI: no kernel RDMA support). On a node with a device it runs
as-is: ``ARTEMIS_RDMA_DEVICE`` / ``ARTEMIS_RDMA_GID_INDEX`` pick the device
and GID (by default the adapter picks the RoCE v2 IPv4 GID as NCCL does; see
protocol/rdma/README.md). Both ends live in this process and talk through
the device's loopback path, with the real TCP side channel on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from artemis.protocol.rdma.transport import RdmaTransport
from artemis.protocol.rdma.verbs import VerbsAdapter, probe
from artemis.protocol.transport import ChannelClosed, FrameChannel

_OK, _WHY = probe()
pytestmark = [
    pytest.mark.rdma,
    pytest.mark.timeout(60),
    pytest.mark.skipif(not _OK, reason=_WHY),
]

DEVICE = os.environ.get("ARTEMIS_RDMA_DEVICE") or None
GID_INDEX = int(os.environ.get("ARTEMIS_RDMA_GID_INDEX", "-1"))
SECRET = b"device test secret"


def transport() -> RdmaTransport:
    return RdmaTransport(
        VerbsAdapter, device=DEVICE, gid_index=GID_INDEX, buffer_size=4096, buffers=8, secret=SECRET
    )


def test_frames_over_a_real_queue_pair() -> None:
    frames = [
        bytes((i + j) % 256 for j in range(n))
        for i, n in enumerate([0, 1, 4086, 4087, 100_000, 1 << 20])
    ]

    async def main() -> None:
        got: list[bytes] = []
        closed = asyncio.Event()

        async def echo(ch: FrameChannel) -> None:
            try:
                while True:
                    f = await ch.recv()
                    got.append(f)
                    await ch.send(f)
            except ChannelClosed:
                closed.set()

        listener = await transport().listen("127.0.0.1:0", echo)
        ch = await transport().connect(listener.address)
        for f in frames:
            await ch.send(f)
            assert await ch.recv() == f
        await ch.close()
        await asyncio.wait_for(closed.wait(), 10)
        assert got == frames
        await listener.close()

    asyncio.run(main())


def test_wrong_secret_is_refused_before_any_queue_pair() -> None:
    from artemis.protocol.rdma.transport import RdmaHandshakeError

    async def main() -> None:
        listener = await transport().listen("127.0.0.1:0", lambda ch: ch.close())
        bad = RdmaTransport(VerbsAdapter, device=DEVICE, gid_index=GID_INDEX, secret=b"nope")
        with pytest.raises(RdmaHandshakeError):
            await bad.connect(listener.address)
        await listener.close()

    asyncio.run(main())
