"""ProtocolServer: the coordinator's ingress (asyncio shell over CoordinatorSession).

One task per connection runs the handshake and then the traffic. Every frame
is validated by the codec before anything else sees it; a bad frame is
answered with an Error naming the problem, counted by reason and dropped (a
poisoned stream is closed), and never reaches the app. Data messages are
deduplicated on (agent, seq) and acked only after the app's ``on_message``
returned, so an ack means "the app has it".

If the same agent connects again while its old connection is still open (a
half-open socket the agent gave up on), the old connection is closed and the
new one waits for the old handler to finish before it takes data, so one
agent's messages are never handed over by two tasks at once.

Hostile peers (docs/DESIGN.md "Hostile peers"): what a peer that never
authenticates may cost is bounded by ``PeerLimits``: so many unauthenticated
connections per source address and in all, a handshake deadline (a slowloris
peer is cut off at it), a smaller frame limit before auth, and an idle
time-out on authenticated connections. The TLS handshake runs inside those
limits (after admission, within the handshake deadline), and a failed one is a
refusal with its own reason (``tls_*``). With mutual TLS the channel carries the
identity of the agent's certificate, and a hello naming another agent is
refused. Every refusal is counted by reason (``REFUSAL_REASONS``, protocol/peers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import structlog
from artemis.protocol.codec import DEFAULT_MAX_FRAME, FrameDecoder, encode
from artemis.protocol.messages import (
    PROTOCOL_VERSION,
    Ack,
    DataMessage,
    Error,
    JobOwner,
    Message,
)
from artemis.protocol.peers import (
    App,
    NotConnected,
    NotTaken,
    PeerInfo,
    PeerLimits,
    ProtocolStats,
    source_of,
)
from artemis.protocol.session import (
    BadFrame,
    Close,
    ControlAcked,
    CoordinatorSession,
    Deliver,
    Duplicate,
    Effect,
    PeerError,
    PeerEstablished,
    Refused,
    Send,
    SeqTracker,
)
from artemis.protocol.transport import (
    ChannelClosed,
    FrameChannel,
    Listener,
    TlsRefused,
    Transport,
)

log = structlog.get_logger("artemis.protocol.server")


LOG_REFUSALS_PER_S = 20


def _bump(d: dict[str, int], key: str) -> None:
    d[key] = d.get(key, 0) + 1


async def _maybe_await(v: Any) -> None:
    if inspect.isawaitable(v):
        await v


class _Conn:
    __slots__ = (
        "ack_event",
        "ack_upto",
        "ch",
        "done",
        "id",
        "peer",
        "send_lock",
        "session",
        "superseded",
    )

    def __init__(self, conn_id: int, ch: FrameChannel, session: CoordinatorSession) -> None:
        self.id = conn_id
        self.ch = ch
        self.session = session
        self.peer: PeerInfo | None = None
        self.done = asyncio.Event()
        self.superseded = False
        self.send_lock = asyncio.Lock()
        self.ack_upto = -1
        self.ack_event = asyncio.Event()


class ProtocolServer:
    """Authenticated, validating, deduplicating ingress for agents."""

    def __init__(
        self,
        transport: Transport,
        address: str,
        secret: bytes,
        app: App,
        *,
        coordinator_id: str = "coordinator",
        settings: dict[str, Any] | None = None,
        tracker: SeqTracker | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
        handshake_timeout: float | None = None,
        supersede_timeout: float = 10.0,
        limits: PeerLimits | None = None,
        version: tuple[int, int] = PROTOCOL_VERSION,
    ) -> None:
        self.transport = transport
        self.listen_address = address
        self.app = app
        self.coordinator_id = coordinator_id
        self.settings = settings or {}
        # Pass the same tracker to a new server to keep dedup across a restart
        # of the listener inside one coordinator process.
        self.tracker = tracker if tracker is not None else SeqTracker()
        self.max_frame = max_frame
        lim = limits or PeerLimits()
        if handshake_timeout is not None:
            lim = replace(lim, handshake_timeout_s=handshake_timeout)
        self.limits = lim.validated()
        self.handshake_timeout = lim.handshake_timeout_s
        self.supersede_timeout = supersede_timeout
        self.version = version
        self.stats = ProtocolStats()
        self._secret = secret
        self._listener: Listener | None = None
        self._conns: set[_Conn] = set()
        self._by_agent: dict[str, _Conn] = {}
        self._seen_agents: set[str] = set()
        self._next_conn = 0
        self._controls: dict[str, tuple[_Conn, asyncio.Future[Ack]]] = {}
        self._control_done: OrderedDict[str, asyncio.Future[Ack]] = OrderedDict()
        self._closing = False
        self._unauth: dict[str, int] = {}  # source address -> connections not yet authenticated
        self._unauth_total = 0
        self._refusal_log: dict[
            str, tuple[float, int, int]
        ] = {}  # reason -> (second, logged, hidden)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        """Listen; returns the bound address (with the real port when 0 was asked)."""
        self._closing = False
        self._listener = await self.transport.listen(self.listen_address, self._handle)
        log.info("protocol server listening", address=self._listener.address)
        return self._listener.address

    @property
    def address(self) -> str:
        if self._listener is None:
            raise RuntimeError("server is not listening; call start() first")
        return self._listener.address

    async def close(self, timeout: float = 10.0) -> None:
        """Stop: close every connection (letting a running ``on_message`` finish), then listen no more.

        Un-acked data stays in the agents' outboxes and is resent to whoever
        listens next; pending control results fail with ChannelClosed.
        """
        self._closing = True
        conns = list(self._conns)
        await asyncio.gather(*(c.ch.close() for c in conns), return_exceptions=True)
        if conns:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(c.done.wait() for c in conns)), timeout)
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        for cid, (_, fut) in list(self._controls.items()):
            _fail(fut, "server closed before the agent acked")
            self._finish_control(cid)

    async def __aenter__(self) -> ProtocolServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def peers(self) -> dict[str, PeerInfo]:
        """Authenticated agents connected right now, by agent_id."""
        return {a: c.peer for a, c in self._by_agent.items() if c.peer is not None}

    # ------------------------------------------------------------------ control

    async def send_control(
        self,
        agent_id: str,
        action: str,
        body: dict[str, Any] | None = None,
        *,
        control_id: str | None = None,
    ) -> str:
        """Send a Control to a connected agent; returns its control_id.

        Control is not buffered: if the agent is not connected, NotConnected is
        raised and the caller decides whether to retry later. ``control_id``: the
        caller's own (a correction's id), else a new one. The agent's Ack
        arrives through ``control_result(control_id)`` and, when the app has
        one, ``app.on_control_ack(peer, ack)``.
        """
        conn = self._by_agent.get(agent_id)
        if conn is None or conn.peer is None:
            raise NotConnected(f"agent {agent_id!r} is not connected")
        ctl = conn.session.control(action, body, control_id)
        fut: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self._controls[ctl.control_id] = (conn, fut)
        try:
            await self._send(conn, ctl)
        except ChannelClosed:
            self._controls.pop(ctl.control_id, None)
            raise NotConnected(f"agent {agent_id!r} disconnected") from None
        self.stats.controls_sent_total += 1
        return ctl.control_id

    async def control_result(self, control_id: str, timeout: float | None = None) -> Ack:
        """The agent's Ack for a control; raises ChannelClosed if it disconnected first."""
        entry = self._controls.get(control_id)
        fut = entry[1] if entry is not None else self._control_done.get(control_id)
        if fut is None:
            raise KeyError(f"unknown control_id {control_id!r}")
        return await asyncio.wait_for(asyncio.shield(fut), timeout)

    def _finish_control(self, control_id: str) -> None:
        entry = self._controls.pop(control_id, None)
        if entry is not None:
            self._control_done[control_id] = entry[1]
            # Results nobody asked for must not pile up forever.
            while len(self._control_done) > 1024:
                _, old = self._control_done.popitem(last=False)
                if not old.done():
                    old.cancel()

    # ------------------------------------------------------------------ connections

    async def _send(self, conn: _Conn, msg: Message) -> None:
        frame = encode(msg, version=self.version, max_frame=self.max_frame)
        async with conn.send_lock:
            await conn.ch.send(frame)

    async def _handle(self, ch: FrameChannel) -> None:
        self._next_conn += 1
        session = CoordinatorSession(
            self._secret,
            self.tracker,
            coordinator_id=self.coordinator_id,
            settings=self.settings,
            version=self.version,
        )
        conn = _Conn(self._next_conn, ch, session)
        lim = self.limits
        # Until auth only a hello or an auth may come: a smaller frame limit.
        decoder = FrameDecoder(min(lim.max_handshake_frame, self.max_frame), version=self.version)
        self._conns.add(conn)
        self.stats.connections += 1
        self.stats.connections_total += 1
        acker: asyncio.Task[None] | None = None
        source = source_of(ch.peer)
        admitted = False
        try:
            if self._closing:
                return
            # Admission comes first, before any decoding or HMAC work is spent on the peer.
            if self._unauth.get(source, 0) >= lim.max_unauthenticated_per_peer:
                self._refuse(
                    conn,
                    "peer_limit",
                    f"{source} already has {lim.max_unauthenticated_per_peer} unauthenticated"
                    " connections",
                )
                return
            if self._unauth_total >= lim.max_unauthenticated:
                self._refuse(
                    conn, "busy", f"{lim.max_unauthenticated} unauthenticated connections open"
                )
                return
            admitted = True
            self._admit(source, +1)
            _set_frame_limit(ch, decoder.max_frame)
            ok = await self._handshake(conn, decoder)
            self._admit(source, -1)
            admitted = False
            if not ok:
                return
            decoder.max_frame = self.max_frame
            _set_frame_limit(ch, self.max_frame)
            acker = asyncio.create_task(self._acker(conn))
            await self._traffic(conn, decoder)
        except ChannelClosed:
            pass
        except Exception:
            log.exception("connection failed", peer=ch.peer, conn=conn.id)
        finally:
            if admitted:
                self._admit(source, -1)
            trunc = decoder.eof()
            if trunc is not None:
                self._count_bad(conn, trunc.reason, trunc.text)
            if acker is not None:
                acker.cancel()
                await asyncio.gather(acker, return_exceptions=True)
            await self._cleanup(conn)

    def _admit(self, source: str, delta: int) -> None:
        n = self._unauth.get(source, 0) + delta
        if n > 0:
            self._unauth[source] = n
        else:
            self._unauth.pop(source, None)
        self._unauth_total += delta
        self.stats.unauthenticated = self._unauth_total

    async def _handshake(self, conn: _Conn, decoder: FrameDecoder) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.handshake_timeout
        # TLS first (a transport with it runs the handshake here, not at the accept: a
        # failed one is counted by its reason, under the same admission and deadline).
        secure = getattr(conn.ch, "secure", None)
        if secure is not None:
            try:
                await secure(self.handshake_timeout)
            except TlsRefused as e:
                self._refuse(conn, e.reason, e.text)
                return False
        identity = getattr(conn.ch, "identity", None)
        if identity is not None:
            if not identity:
                self._refuse(
                    conn,
                    "identity",
                    "the client certificate names no agent (no artemis://agent/ID URI, no CN)",
                )
                with contextlib.suppress(ChannelClosed):
                    text = "the client certificate names no agent"
                    await self._send(conn, Error(code="identity", text=text, fatal=True))
                return False
            conn.session.identity = identity
        while True:
            left = deadline - loop.time()
            try:
                frame = await asyncio.wait_for(conn.ch.recv(), max(0.0, left))
            except asyncio.TimeoutError:
                self._refuse(conn, "timeout", "handshake not finished in time")
                with contextlib.suppress(ChannelClosed):
                    err = Error(code="timeout", text="handshake not finished in time", fatal=True)
                    await self._send(conn, err)
                return False
            self.stats.frames_total += 1
            for item in decoder.feed(frame):
                for eff in conn.session.receive(item):
                    if isinstance(eff, Send):
                        await self._send(conn, eff.msg)
                    elif isinstance(eff, BadFrame):
                        self._count_bad(conn, eff.error.reason, eff.error.text)
                    elif isinstance(eff, Refused):
                        reason = eff.reason
                        if reason == "protocol" and decoder.poisoned:
                            reason = "oversize"
                        self._refuse(conn, reason, eff.text)
                        return False
                    elif isinstance(eff, PeerEstablished):
                        return await self._established(conn, eff)

    def _refuse(self, conn: _Conn, reason: str, text: str) -> None:
        _bump(self.stats.refused_peers_total, reason)
        # A flood must not become a flood of log lines: at most LOG_REFUSALS_PER_S
        # lines per reason and second; the counter above has every refusal.
        now = time.monotonic()
        sec, n, hidden = self._refusal_log.get(reason, (0.0, 0, 0))
        if now - sec >= 1.0:
            sec, n = now, 0
        if n >= LOG_REFUSALS_PER_S:
            self._refusal_log[reason] = (sec, n, hidden + 1)
            return
        self._refusal_log[reason] = (sec, n + 1, 0)
        log.warning(
            "peer refused", peer=conn.ch.peer, reason=reason, detail=text, not_logged_before=hidden
        )

    def _count_bad(self, conn: _Conn, reason: str, text: str) -> None:
        _bump(self.stats.bad_frames_total, reason)
        agent = conn.peer.agent_id if conn.peer else None
        log.warning("bad frame", peer=conn.ch.peer, agent=agent, reason=reason, detail=text)

    async def _established(self, conn: _Conn, eff: PeerEstablished) -> bool:
        """The agent is authenticated: registered, confirmed, then routed (a fleet's app
        says which of its jobs are served elsewhere: `route`); False when it must go."""
        hello = eff.hello
        old = self._by_agent.get(hello.agent_id)
        if old is not None and old is not conn:
            old.superseded = True
            _bump(self.stats.refused_peers_total, "superseded")
            log.info("agent reconnected; closing its previous connection", agent=hello.agent_id)
            with contextlib.suppress(ChannelClosed):
                await self._send(
                    old, Error(code="superseded", text="a newer connection replaced this one")
                )
            await old.ch.close()
            try:
                await asyncio.wait_for(old.done.wait(), self.supersede_timeout)
            except asyncio.TimeoutError:
                log.error(
                    "previous connection still busy in the app; proceeding",
                    agent=hello.agent_id,
                )
        self._by_agent[hello.agent_id] = conn
        if hello.agent_id in self._seen_agents:
            self.stats.reconnects += 1
        self._seen_agents.add(hello.agent_id)
        conn.peer = PeerInfo(
            agent_id=hello.agent_id,
            host=hello.host,
            agent_version=hello.agent_version,
            incarnation=hello.incarnation,
            ranks=hello.ranks,
            address=conn.ch.peer,
            version=hello.version,
            connected_at=time.time(),
            conn_id=conn.id,
        )
        self.stats.established += 1
        await self._send(conn, conn.session.confirm())
        log.info(
            "agent connected",
            agent=hello.agent_id,
            host=hello.host,
            peer=conn.ch.peer,
            version=f"{hello.version[0]}.{hello.version[1]}",
            ranks=len(hello.ranks),
        )
        route = getattr(self.app, "route", None)
        moved: list[JobOwner] = [] if route is None else list(route(conn.peer))
        if moved and not await self._redirect(conn, tuple(moved)):
            return False
        on_connect = getattr(self.app, "on_connect", None)
        if on_connect is not None:
            await _maybe_await(on_connect(conn.peer))
        return True

    async def _redirect(self, conn: _Conn, owners: tuple[JobOwner, ...]) -> bool:
        """Tell the agent of `conn` who serves `owners`' jobs: a Redirect (1.3), after
        which the connection stays for its other jobs; else `not_owner` and the connection
        closes (False)."""
        assert conn.peer is not None
        msg = conn.session.redirect(owners)
        log.info(
            "jobs served by another coordinator of the fleet",
            agent=conn.peer.agent_id,
            jobs={o.job: o.address for o in owners},
            how=msg.TYPE,
        )
        with contextlib.suppress(ChannelClosed):
            await self._send(conn, msg)
        if isinstance(msg, Error):
            conn.superseded = True  # ends its traffic loop: nothing more is taken from it
            await conn.ch.close()
            return False
        return True

    async def redirect(self, owner: JobOwner) -> int:
        """A job this coordinator no longer serves (its lease lost mid-session): every
        connected agent that holds ranks of it is told who does (`_redirect`). Returns
        how many agents were told."""
        told = 0
        for conn in list(self._by_agent.values()):
            if conn.peer is not None and any(r.job == owner.job for r in conn.peer.ranks):
                await self._redirect(conn, (owner,))
                told += 1
        return told

    async def _traffic(self, conn: _Conn, decoder: FrameDecoder) -> None:
        # Stop at once when closing or superseded: frames still buffered here
        # are not acked, so the agent resends them to whoever serves it next.
        idle = self.limits.idle_timeout_s or None
        while not (conn.superseded or self._closing):
            try:
                frame = await asyncio.wait_for(conn.ch.recv(), idle)
            except asyncio.TimeoutError:
                assert conn.peer is not None
                text = f"nothing received for {idle:g} s"
                self._refuse(conn, "idle", f"agent {conn.peer.agent_id!r}: {text}")
                with contextlib.suppress(ChannelClosed):
                    await self._send(conn, Error(code="idle", text=text, fatal=True))
                return
            self.stats.frames_total += 1
            items = decoder.feed(frame)
            # Nothing of a frame (its bytes, its messages) is held while the next one is
            # awaited, nor while this task yields (_items): across the connections that
            # would be a window's worth.
            del frame
            if not await self._items(conn, items):
                return

    async def _items(self, conn: _Conn, items: list[Any]) -> bool:
        """Apply the messages (or ProtocolErrors) of one frame, letting go of each once
        applied; False when the connection is to end."""
        items.reverse()
        while items:
            if not await self._item(conn, items.pop()):
                return False
            # Let the acker write: a backlog read in one chunk (an agent's resend after a
            # partition) would otherwise be acked only once all of it is processed, and
            # the agent, seeing no ack for that long, takes the link for stalled. The
            # message is let go of first: every connection of a window's burst yields
            # here in the same turn of the loop, and what each held then (its decoded
            # batch) would add up to a window's worth of the coordinator's peak memory.
            await asyncio.sleep(0)
        return True

    async def _item(self, conn: _Conn, item: Any) -> bool:
        for eff in conn.session.receive(item):
            if not await self._apply(conn, eff):
                return False
            if conn.superseded or self._closing:
                return False
        return True

    async def _apply(self, conn: _Conn, eff: Effect) -> bool:
        assert conn.peer is not None
        if isinstance(eff, Deliver):
            if not await self._deliver(conn, eff.msg):
                return False
        elif isinstance(eff, Send):
            await self._send(conn, eff.msg)
        elif isinstance(eff, Duplicate):
            self.stats.duplicates_total += 1
        elif isinstance(eff, ControlAcked):
            self._control_acked(conn, eff.ack)
        elif isinstance(eff, BadFrame):
            self._count_bad(conn, eff.error.reason, eff.error.text)
        elif isinstance(eff, PeerError):
            log.warning(
                "agent reported an error",
                agent=conn.peer.agent_id,
                code=eff.error.code,
                text=eff.error.text,
            )
        elif isinstance(eff, Close | Refused):
            log.warning("closing connection", agent=conn.peer.agent_id, reason=eff.reason)
            return False
        return True

    async def _deliver(self, conn: _Conn, msg: DataMessage) -> bool:
        """Hand ``msg`` to the app; False when the app could not take it (NotTaken)."""
        assert conn.peer is not None
        try:
            await self.app.on_message(conn.peer, msg)
        except asyncio.CancelledError:
            raise
        except NotTaken as e:
            # Acks are cumulative: nothing after this message may be acked either, so
            # the connection ends here and the agent resends from it.
            self.stats.not_taken_total += 1
            log.warning(
                "message not taken: not acked, closing so the agent resends",
                agent=conn.peer.agent_id,
                type=msg.TYPE,
                seq=msg.seq,
                reason=str(e),
            )
            with contextlib.suppress(ChannelClosed):
                await self._send(conn, Error(code="unavailable", text=str(e)[:512]))
            return False
        except Exception:
            # Retrying a message the app chokes on would wedge the agent's
            # outbox forever; count it, log it, and treat it as handed over.
            self.stats.app_errors_total += 1
            log.exception(
                "app failed on a message", agent=conn.peer.agent_id, type=msg.TYPE, seq=msg.seq
            )
        self.stats.delivered_total += 1
        conn.ack_upto = conn.session.delivered(msg)
        conn.ack_event.set()  # the acker writes when _items yields
        return True

    async def _acker(self, conn: _Conn) -> None:
        # Acks are coalesced: while one is being written, later deliveries only
        # raise ``ack_upto``, and the next write covers them all.
        sent = -1
        while True:
            await conn.ack_event.wait()
            conn.ack_event.clear()
            if conn.ack_upto > sent:
                sent = conn.ack_upto
                await self._send(conn, conn.session.ack(sent))

    def _control_acked(self, conn: _Conn, ack: Ack) -> None:
        assert conn.peer is not None and ack.control_id is not None
        self.stats.control_acks_total += 1
        entry = self._controls.get(ack.control_id)
        if entry is not None and not entry[1].done():
            entry[1].set_result(ack)
            self._finish_control(ack.control_id)
        cb = getattr(self.app, "on_control_ack", None)
        if cb is not None:
            res = cb(conn.peer, ack)
            if inspect.isawaitable(res):
                task = asyncio.ensure_future(res)
                task.add_done_callback(_log_task_error)

    async def _cleanup(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        self.stats.connections -= 1
        await conn.ch.close()
        for cid, (c, fut) in list(self._controls.items()):
            if c is conn:
                _fail(fut, "agent disconnected before acking the control")
                self._finish_control(cid)
        peer = conn.peer
        if peer is not None:
            self.stats.established -= 1
            if self._by_agent.get(peer.agent_id) is conn:
                del self._by_agent[peer.agent_id]
            log.info("agent disconnected", agent=peer.agent_id, peer=conn.ch.peer)
            try:
                await _maybe_await(self.app.on_disconnect(peer))
            except Exception:
                log.exception("app on_disconnect failed", agent=peer.agent_id)
        conn.done.set()


def _set_frame_limit(ch: FrameChannel, n: int) -> None:
    # A transport that reads the length prefix itself (TCP) refuses a longer
    # frame before buffering its body; others leave it to the decoder.
    setter = getattr(ch, "set_max_frame", None)
    if setter is not None:
        setter(n)


def _fail(fut: asyncio.Future[Ack], text: str) -> None:
    if not fut.done():
        fut.set_exception(ChannelClosed(text))
        # Mark it retrieved: nobody may ever ask for this result, and asyncio
        # would log the exception at garbage collection otherwise.
        fut.exception()


def _log_task_error(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("app callback failed", error=repr(task.exception()))
