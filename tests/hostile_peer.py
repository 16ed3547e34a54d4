"""A hostile peer, run as its own process by tests/test_hostile_peers.py (and by hand).

    python tests/hostile_peer.py ADDRESS MODE [options]   -> one JSON line on stdout

Modes (each uses only loopback addresses; sources are 127.x.y.z):
  idle       open --count connections spread over --sources source addresses,
             send nothing, and report how many the coordinator held and when
             it closed them (the handshake deadline);
  slowloris  send a valid hello frame one byte every --interval seconds and
             report when the coordinator closed the connection;
  badsecret  --count handshakes answered with a proof made from the wrong secret;
  oversize   --count connections sending a length prefix of 4 GiB - 1;
  tls        against a TLS listener, --count failed handshakes of each --kinds:
             nocert (TLS without a client certificate), badca (a certificate of
             --cert/--key, which another CA signed), plain (an agent's hello in
             plain TCP), http (an HTTP request), garbage (random bytes), silent
             (connects and sends nothing); reports how many the coordinator closed
             and whether any got past the handshake.
Raises its own soft limit on open files to the hard one first.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import resource
import secrets
import selectors
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.messages import Auth, Hello, Welcome
from artemis.protocol.tcp import parse_address


def raise_nofile() -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def source(i: int, sources: int, base: int) -> str:
    k = i % sources
    return f"127.{base}.{k // 250}.{1 + k % 250}"


async def _open(
    host: str, port: int, src: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(host, port, local_addr=(src, 0))


async def _closed_after(reader: asyncio.StreamReader, t0: float, limit: float) -> float | None:
    """Seconds until the coordinator closed the connection (None: still open at ``limit``)."""
    try:
        while True:
            left = limit - (time.monotonic() - t0)
            if left <= 0:
                return None
            data = await asyncio.wait_for(reader.read(65536), left)
            if not data:
                return time.monotonic() - t0
    except asyncio.TimeoutError:
        return None
    except (ConnectionError, OSError):
        return time.monotonic() - t0


async def idle(host: str, port: int, a: argparse.Namespace) -> dict[str, Any]:
    # Plain non-blocking sockets: opening 10k takes well under a second, so the
    # coordinator holds them all at once before its handshake deadline.
    socks: list[socket.socket] = []
    failed = 0
    t0 = time.monotonic()
    for i in range(a.count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((source(i, a.sources, a.base), 0))
            s.setblocking(False)
            err = s.connect_ex((host, port))
        except OSError:
            err = -1
        if err not in (0, errno.EINPROGRESS):
            failed += 1
            s.close()
            continue
        socks.append(s)
    opened_s = time.monotonic() - t0
    print(json.dumps({"event": "opened", "opened": len(socks)}), flush=True)
    # Watch every socket until the coordinator closes it (EOF, or a reset) or --hold passes.
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    closed: list[float] = []
    end = t0 + a.hold
    while len(closed) < len(socks) and time.monotonic() < end:
        for key, _ in sel.select(timeout=max(0.0, end - time.monotonic())):
            s = key.fileobj  # type: ignore[assignment]
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                closed.append(time.monotonic() - t0)
                sel.unregister(s)
                s.close()
    for s in socks:
        if s.fileno() >= 0:
            s.close()
    closed.sort()
    return {
        "mode": "idle",
        "count": a.count,
        "opened": len(socks),
        "connect_failed": failed,
        "opened_in_s": round(opened_s, 2),
        "closed_by_server": len(closed),
        "closed_within_1s": sum(1 for c in closed if c < 1.0),
        "still_open": len(socks) - len(closed),
        "median_closed_after_s": closed[len(closed) // 2] if closed else None,
    }


def _hello(agent: str) -> bytes:
    return encode(
        Hello(
            seq=1,
            agent_id=agent,
            host=agent,
            agent_version="hostile",
            nonce=secrets.token_bytes(32),
        )
    )


async def slowloris(host: str, port: int, a: argparse.Namespace) -> dict[str, Any]:
    frame = _hello("slowloris")
    r, w = await _open(host, port, source(0, 1, a.base))
    t0 = time.monotonic()
    sent = 0
    closed_after = None
    for b in frame:
        try:
            w.write(bytes([b]))
            await w.drain()
        except (ConnectionError, OSError):
            closed_after = time.monotonic() - t0
            break
        sent += 1
        c = await _closed_after(r, t0, (time.monotonic() - t0) + a.interval)
        if c is not None:
            closed_after = c
            break
    w.close()
    return {
        "mode": "slowloris",
        "frame_bytes": len(frame),
        "sent": sent,
        "closed_after_s": closed_after,
    }


async def _count_refused(
    host: str,
    port: int,
    a: argparse.Namespace,
    attack: Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]],
) -> int:
    """How many of ``a.count`` connections (32 at a time, from ``a.sources`` addresses) the
    coordinator closed within 10 s of ``attack``; an attack that returns False (it met no
    coordinator to attack) is not counted."""
    refused = 0
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        nonlocal refused
        async with sem:
            r, w = await _open(host, port, source(i, a.sources, a.base))
            try:
                if (
                    await attack(r, w, i)
                    and await _closed_after(r, time.monotonic(), 10) is not None
                ):
                    refused += 1
            finally:
                w.close()

    await asyncio.gather(*(one(i) for i in range(a.count)))
    return refused


async def badsecret(host: str, port: int, a: argparse.Namespace) -> dict[str, Any]:
    async def attack(r: asyncio.StreamReader, w: asyncio.StreamWriter, i: int) -> bool:
        w.write(_hello(f"intruder-{i}"))
        dec = FrameDecoder()
        items: list[Any] = []
        while not items:
            data = await asyncio.wait_for(r.read(65536), 10)
            if not data:
                return False
            items = dec.feed(data)
        assert isinstance(items[0], Welcome), items
        # A proof made with the wrong secret.
        w.write(encode(Auth(seq=2, proof=secrets.token_bytes(32))))
        await w.drain()
        return True

    refused = await _count_refused(host, port, a, attack)
    return {"mode": "badsecret", "count": a.count, "refused": refused}


async def oversize(host: str, port: int, a: argparse.Namespace) -> dict[str, Any]:
    async def attack(r: asyncio.StreamReader, w: asyncio.StreamWriter, i: int) -> bool:
        w.write(b"\xff\xff\xff\xff" + b"A" * 64)
        await w.drain()
        return True

    refused = await _count_refused(host, port, a, attack)
    return {"mode": "oversize", "count": a.count, "refused": refused}


TLS_KINDS = ("nocert", "badca", "plain", "http", "garbage", "silent")


async def tls(host: str, port: int, a: argparse.Namespace) -> dict[str, Any]:
    kinds = a.kinds.split(",")
    sem = asyncio.Semaphore(32)
    closed = dict.fromkeys(kinds, 0)
    through = dict.fromkeys(kinds, 0)  # got a Welcome: the handshake let it in

    def context(cert: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=a.ca)
        if cert:
            ctx.load_cert_chain(a.cert, a.key)
        return ctx

    async def one(kind: str, i: int) -> None:
        src = source(i, a.sources, a.base)
        async with sem:
            try:
                if kind in ("nocert", "badca"):
                    r, w = await asyncio.wait_for(
                        asyncio.open_connection(
                            host,
                            port,
                            ssl=context(kind == "badca"),
                            server_hostname="localhost",
                            local_addr=(src, 0),
                        ),
                        10,
                    )
                else:
                    r, w = await _open(host, port, src)
            except (ssl.SSLError, OSError, asyncio.TimeoutError):
                closed[kind] += 1  # refused inside the handshake (TLS 1.2 order)
                return
            try:
                payload = {
                    "nocert": _hello(f"tls-{i}"),  # TLS 1.3: the client sends first
                    "badca": _hello(f"tls-{i}"),
                    "plain": _hello(f"plain-{i}"),
                    "http": b"GET /metrics HTTP/1.1\r\nHost: coordinator\r\n\r\n",
                    # random bytes, the first none of TLS's record types
                    "garbage": b"\xff" + secrets.token_bytes(255),
                    "silent": b"",
                }[kind]
                if payload:
                    w.write(payload)
                    await w.drain()
                dec = FrameDecoder()
                t0 = time.monotonic()
                while True:
                    data = await asyncio.wait_for(
                        r.read(65536), max(0.1, 20 - (time.monotonic() - t0))
                    )
                    if not data:
                        break
                    if kind in ("nocert", "badca") and any(
                        isinstance(x, Welcome) for x in dec.feed(data)
                    ):
                        through[kind] += 1
                closed[kind] += 1
            except (ssl.SSLError, OSError):
                closed[kind] += 1
            except asyncio.TimeoutError:
                pass  # still open: not closed by the coordinator
            finally:
                w.close()

    t0 = time.monotonic()
    await asyncio.gather(*(one(k, i) for k in kinds for i in range(a.count)))
    return {
        "mode": "tls",
        "count": a.count,
        "closed": closed,
        "through": through,
        "took_s": round(time.monotonic() - t0, 2),
    }


def spawn(address: str, *args: str) -> subprocess.Popen[str]:
    """This script in a process of its own (the tests' attacker), output captured."""
    return subprocess.Popen(
        [sys.executable, __file__, address, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def result(p: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
    """The JSON line a spawned peer ends with, once it exited cleanly."""
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("address")
    p.add_argument("mode", choices=["idle", "slowloris", "badsecret", "oversize", "tls"])
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--sources", type=int, default=1)
    p.add_argument("--base", type=int, default=10, help="second octet of the source addresses")
    p.add_argument("--hold", type=float, default=30.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--kinds", default=",".join(TLS_KINDS), help="tls: the handshakes to fail")
    p.add_argument("--ca", help="tls: the CA the coordinator's certificate is checked with")
    p.add_argument("--cert", help="tls (badca): a client certificate the coordinator refuses")
    p.add_argument("--key")
    a = p.parse_args()
    raise_nofile()
    host, port = parse_address(a.address)
    modes = {"idle": idle, "slowloris": slowloris, "badsecret": badsecret, "oversize": oversize}
    fn = {**modes, "tls": tls}[a.mode]
    print(json.dumps(asyncio.run(fn(host, port, a))), flush=True)


if __name__ == "__main__":
    main()
