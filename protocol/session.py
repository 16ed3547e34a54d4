"""Sans-IO session state machines for both ends of one connection, plus delivery state.

Nothing here touches a socket or a clock. The asyncio shells (client.py,
server.py) feed decoded items in and carry out the returned effects: ``Send``
a message, ``Deliver`` data to the app, close after ``Refused``/``Close``.
That keeps the whole handshake, the auth and the dedup logic testable as plain
function calls.

Handshake (three legs, mutual auth)::

    agent                                   coordinator
      Hello(nonce_a, identity)      ->
                                    <-      Welcome(nonce_c, proof_c, settings)
      [check proof_c]
      Auth(proof_a)                 ->
                                            [check proof_a]
                                    <-      Ack(upto=highest seq already handed over)
      established                           established

Delivery: the agent numbers data messages (Windows, Heartbeat, Dump) 1, 2, 3...
for the life of its process and keeps every un-acked one in its ``Outbox``;
after a reconnect it resends them in order. The coordinator hands a data
message to its app only if its seq is above the highest seq already handed
over for that agent incarnation (``SeqTracker``), and acks ``upto`` = that
highest seq once the app returned. So a resend is acked again but never
delivered twice, and "acked" means "the app has it".
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import msgspec
from artemis.protocol import auth
from artemis.protocol.codec import DEFAULT_MAX_FRAME, encode
from artemis.protocol.messages import (
    CONTROL_ACTIONS,
    DATA_TYPES,
    FLEET_MINOR,
    PROTOCOL_VERSION,
    Ack,
    Auth,
    Control,
    DataMessage,
    Error,
    Hello,
    JobOwner,
    Message,
    ProtocolError,
    RankInfo,
    Redirect,
    Welcome,
)
from artemis.protocol.peers import HelloRanks

# Session-level codes (Error.code, Refused.reason, refused-peer counter labels),
# next to the frame-level codes in messages.REASONS.
SESSION_CODES = (
    "auth",  # a proof did not match the shared secret
    "protocol",  # a message out of place during the handshake, or a bad frame before auth
    "unexpected",  # a message out of place after the handshake (frame dropped)
    "timeout",  # the handshake did not finish in time
    "superseded",  # the same agent connected again; the old connection is closed
    "identity",  # mTLS: the hello names another agent than the client certificate
    "idle",  # an authenticated connection sent nothing for the idle time-out
    "shutdown",  # the coordinator is closing
    "not_owner",  # fleet: the job is served by another coordinator (agents before 1.3)
)


# --------------------------------------------------------------------------- effects


@dataclass(frozen=True, slots=True)
class Send:
    msg: Message


@dataclass(frozen=True, slots=True)
class Refused:
    """The handshake failed (or the peer refused us); close after sending pending ``Send``s."""

    reason: str
    text: str
    peer_version: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """An established connection must close (poisoned stream, fatal error from the peer)."""

    reason: str
    text: str


@dataclass(frozen=True, slots=True)
class BadFrame:
    """A frame was dropped; count it by ``error.reason`` and log it."""

    error: ProtocolError


@dataclass(frozen=True, slots=True)
class PeerError:
    """The peer reported a non-fatal error about something we sent."""

    error: Error


@dataclass(frozen=True, slots=True)
class Established:
    """Agent side: mutual auth done. ``upto``: the coordinator already has every seq <= upto."""

    peer_version: tuple[int, int]
    coordinator_id: str
    settings: dict[str, Any]
    upto: int


@dataclass(frozen=True, slots=True)
class PeerEstablished:
    """Coordinator side: mutual auth done; call ``confirm()`` to send the first Ack."""

    hello: Hello


@dataclass(frozen=True, slots=True)
class Acked:
    """Agent side: the coordinator has every data seq <= upto."""

    upto: int


@dataclass(frozen=True, slots=True)
class ControlReceived:
    control: Control


@dataclass(frozen=True, slots=True)
class Redirected:
    """Agent side (1.3): another coordinator of the fleet serves these jobs; move their
    ranks and unacknowledged messages to an uplink to ``JobOwner.address`` (empty:
    back to the address list). May come before or after ``Established``."""

    jobs: tuple[JobOwner, ...]


@dataclass(frozen=True, slots=True)
class Deliver:
    """Coordinator side: new data; hand it to the app, then call ``delivered(msg)``."""

    msg: DataMessage


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Coordinator side: a resend of data already handed over (already re-acked)."""

    msg: DataMessage


@dataclass(frozen=True, slots=True)
class ControlAcked:
    ack: Ack


Effect: TypeAlias = (
    Send
    | Refused
    | Close
    | BadFrame
    | PeerError
    | Established
    | PeerEstablished
    | Acked
    | ControlReceived
    | Redirected
    | Deliver
    | Duplicate
    | ControlAcked
)
Item: TypeAlias = Message | ProtocolError


# --------------------------------------------------------------------------- outbox


class Outbox:
    """The agent's un-acked data messages, encoded once, oldest first.

    Seqs are assigned here, so they keep counting across reconnects for the
    life of the process. When full (by count or bytes) the oldest message is
    dropped and counted: under a long coordinator outage the newest windows
    are worth more than the oldest.
    """

    def __init__(
        self,
        capacity: int = 10_000,
        max_bytes: int = 64 * 1024 * 1024,
        *,
        version: tuple[int, int] = PROTOCOL_VERSION,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        if capacity < 1 or max_bytes < 1:
            raise ValueError("outbox capacity and max_bytes must be positive")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.version = version
        self.max_frame = max_frame
        self.next_seq = 1
        self.dropped = 0
        self.acked_upto = 0
        self._items: deque[tuple[int, bytes]] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def buffered(self) -> int:
        return len(self._items)

    @property
    def buffered_bytes(self) -> int:
        return self._bytes

    @property
    def first_seq(self) -> int:
        """Seq of the oldest buffered message (``next_seq`` when empty)."""
        return self._items[0][0] if self._items else self.next_seq

    def add(self, msg: Message) -> tuple[int, list[int]]:
        """Stamp ``msg`` with the next seq and keep it; returns (seq, seqs dropped to make room).

        Raises ProtocolError("oversize") if it cannot fit one frame, and
        TypeError for a non-data message (those are never buffered).
        """
        if type(msg) not in DATA_TYPES:
            raise TypeError(f"only data messages are sequenced, not {type(msg).__name__}")
        seq = self.next_seq
        frame = encode(msg, seq=seq, version=self.version, max_frame=self.max_frame)
        self.next_seq = seq + 1
        self._items.append((seq, frame))
        self._bytes += len(frame)
        dropped: list[int] = []
        # Never drop the message just added: one frame always fits.
        while len(self._items) > 1 and (
            len(self._items) > self.capacity or self._bytes > self.max_bytes
        ):
            old_seq, old = self._items.popleft()
            self._bytes -= len(old)
            dropped.append(old_seq)
        self.dropped += len(dropped)
        return seq, dropped

    def ack(self, upto: int) -> int:
        """Forget everything with seq <= upto; returns how many were removed."""
        if upto > self.acked_upto:
            self.acked_upto = min(upto, self.next_seq - 1)
        n = 0
        items = self._items
        while items and items[0][0] <= upto:
            self._bytes -= len(items.popleft()[1])
            n += 1
        return n

    def frames_from(self, seq: int) -> Iterator[tuple[int, bytes]]:
        """Buffered (seq, frame) pairs with seq >= ``seq``, in order."""
        items = self._items
        if not items:
            return iter(())
        # Seqs in the deque are increasing and contiguous unless a job moved to another
        # uplink (``rewrite``), so the start is an index; after a move, walk back over
        # the gaps.
        start = min(max(0, seq - items[0][0]), len(items))
        while start > 0 and items[start - 1][0] >= seq:
            start -= 1
        return (items[i] for i in range(start, len(items)))

    def rewrite(self, fn: Callable[[int, bytes], bytes | None]) -> None:
        """Replace each buffered frame by ``fn(seq, frame)`` under the same seq, or drop
        it for None (its content went to another uplink: the seqs keep their order, so
        the coordinator's dedup is unchanged, and a gap is nothing to it)."""
        items: deque[tuple[int, bytes]] = deque()
        size = 0
        for seq, frame in self._items:
            new = fn(seq, frame)
            if new is not None:
                items.append((seq, new))
                size += len(new)
        self._items = items
        self._bytes = size


# --------------------------------------------------------------------------- dedup


class SeqTracker:
    """Coordinator side: highest data seq handed to the app, per agent incarnation.

    Kept outside the per-connection session (and outside the server, if the
    coordinator passes its own) so it survives reconnects and listener
    restarts.
    """

    def __init__(self) -> None:
        self._agents: dict[str, tuple[str, int]] = {}

    def begin(self, agent_id: str, incarnation: str) -> int:
        """A connection of ``agent_id`` is established; returns its current ``upto``.

        A new incarnation is a restarted agent process whose seqs start at 1
        again, so its old state is dropped.
        """
        cur = self._agents.get(agent_id)
        if cur is None or cur[0] != incarnation:
            self._agents[agent_id] = (incarnation, 0)
            return 0
        return cur[1]

    def upto(self, agent_id: str) -> int:
        cur = self._agents.get(agent_id)
        return 0 if cur is None else cur[1]

    def is_new(self, agent_id: str, seq: int) -> bool:
        return seq > self.upto(agent_id)

    def mark(self, agent_id: str, seq: int) -> int:
        inc, upto = self._agents.get(agent_id, ("", 0))
        if seq > upto:
            upto = seq
            self._agents[agent_id] = (inc, upto)
        return upto

    def forget(self, agent_id: str) -> None:
        self._agents.pop(agent_id, None)


# --------------------------------------------------------------------------- agent side


@dataclass(frozen=True)
class AgentIdentity:
    """What an agent says about itself in Hello."""

    agent_id: str
    host: str
    agent_version: str
    ranks: tuple[RankInfo, ...] = ()
    # One per process: lets the coordinator tell a reconnect (same seq space)
    # from a restarted agent (seqs start at 1 again).
    incarnation: str = field(default_factory=lambda: secrets.token_hex(8))


class AgentSession:
    """Agent end of one connection."""

    def __init__(
        self,
        secret: bytes,
        identity: AgentIdentity,
        *,
        version: tuple[int, int] = PROTOCOL_VERSION,
    ) -> None:
        self.secret = secret
        self.identity = identity
        self.version = version
        self.state = "start"  # start -> hello_sent -> auth_sent -> established | closed
        self.peer_version: tuple[int, int] | None = None
        self.coordinator_id: str | None = None
        self._nonce = auth.make_nonce()
        self._nonce_c = b""
        self._settings: dict[str, Any] = {}
        self._seq = 0

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def hello(self) -> Hello:
        """The first message to send."""
        if self.state != "start":
            raise RuntimeError("hello() is the first step of a session")
        self.state = "hello_sent"
        ident = self.identity
        return Hello(
            seq=self._next(),
            agent_id=ident.agent_id,
            host=ident.host,
            agent_version=ident.agent_version,
            nonce=self._nonce,
            ranks=ident.ranks,
            incarnation=ident.incarnation,
        )

    def _refuse(self, reason: str, text: str, peer: tuple[int, int] | None = None) -> list[Effect]:
        self.state = "closed"
        return [Refused(reason, text, peer)]

    def receive(self, item: Item) -> list[Effect]:
        if self.state == "closed":
            return []
        if isinstance(item, ProtocolError):
            if item.reason == "version":
                ours = self.version
                peer = item.peer_version or (0, 0)
                return self._refuse(
                    "version",
                    f"coordinator speaks protocol {peer[0]}.{peer[1]}, this agent speaks"
                    f" {ours[0]}.{ours[1]}; the major versions must match",
                    peer,
                )
            if item.fatal or self.state != "established":
                return self._refuse("protocol", f"bad frame from coordinator: {item.text}")
            return [BadFrame(item)]
        msg = item
        if isinstance(msg, Error):
            if msg.fatal or self.state != "established":
                return self._refuse(msg.code, f"coordinator refused: {msg.text}", msg.version)
            return [PeerError(msg)]
        if self.state == "hello_sent":
            if not isinstance(msg, Welcome):
                return self._refuse("protocol", f"expected welcome, got {msg.TYPE}")
            if not auth.check(self.secret, "coordinator", self._nonce, msg.nonce, msg.proof):
                self.state = "closed"
                text = "the coordinator's proof does not match our shared secret"
                return [
                    Send(Error(seq=self._next(), code="auth", text=text, fatal=True)),
                    Refused(
                        "auth",
                        "coordinator failed to prove the shared secret (the secret files differ?)",
                        msg.version,
                    ),
                ]
            self._nonce_c = msg.nonce
            self.peer_version = msg.version
            self.coordinator_id = msg.coordinator_id
            self._settings = msg.settings
            self.state = "auth_sent"
            p = auth.proof(self.secret, "agent", self._nonce, msg.nonce)
            return [Send(Auth(seq=self._next(), proof=p))]
        if isinstance(msg, Redirect) and self.state in ("auth_sent", "established"):
            # After our proof: the coordinator routes a job only once it knows who asks.
            return [Redirected(msg.jobs)]
        if self.state == "auth_sent":
            if not isinstance(msg, Ack) or msg.upto is None:
                return self._refuse("protocol", f"expected ack of auth, got {msg.TYPE}")
            self.state = "established"
            assert self.peer_version is not None and self.coordinator_id is not None
            return [Established(self.peer_version, self.coordinator_id, self._settings, msg.upto)]
        # established
        if isinstance(msg, Ack):
            return [] if msg.upto is None else [Acked(msg.upto)]
        if isinstance(msg, Control):
            # Only reachable after both proofs checked out: control from an
            # unauthenticated peer never gets here.
            return [ControlReceived(msg)]
        return [
            BadFrame(
                ProtocolError(
                    "unexpected", f"unexpected {msg.TYPE} from coordinator", msg_type=msg.TYPE
                )
            )
        ]

    def control_result(
        self, control_id: str, ok: bool, detail: str = "", result: dict[str, Any] | None = None
    ) -> Ack:
        """The Ack to send once a Control was applied (or failed); ``result``: 1.2's map."""
        return Ack(
            seq=self._next(), control_id=control_id, ok=ok, detail=detail[:8192], result=result
        )


# --------------------------------------------------------------------------- coordinator side


class CoordinatorSession:
    """Coordinator end of one connection."""

    def __init__(
        self,
        secret: bytes,
        tracker: SeqTracker,
        *,
        coordinator_id: str = "coordinator",
        settings: dict[str, Any] | None = None,
        version: tuple[int, int] = PROTOCOL_VERSION,
    ) -> None:
        self.secret = secret
        self.tracker = tracker
        self.coordinator_id = coordinator_id
        self.settings = settings or {}
        self.version = version
        self.state = "await_hello"  # -> await_auth -> established | closed
        self.hello: Hello | None = None
        # The agent id of a verified client certificate (mutual TLS); the hello
        # must name it as both agent_id and host, so one agent cannot speak for another.
        self.identity: str | None = None
        self._nonce = auth.make_nonce()
        self._seq = 0
        self._controls = 0

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _refuse(
        self, reason: str, text: str, tell_peer: str | None = None, code: str | None = None
    ) -> list[Effect]:
        self.state = "closed"
        out: list[Effect] = []
        if tell_peer is not None:
            err = Error(seq=self._next(), code=code or reason, text=tell_peer, fatal=True)
            out.append(Send(err))
        out.append(Refused(reason, text))
        return out

    @property
    def agent_id(self) -> str | None:
        return self.hello.agent_id if self.hello else None

    def receive(self, item: Item) -> list[Effect]:
        if self.state == "closed":
            return []
        if isinstance(item, ProtocolError):
            return self._bad_frame(item)
        msg = item
        if isinstance(msg, Error):
            if msg.fatal or self.state != "established":
                reason = msg.code if msg.code in SESSION_CODES else "protocol"
                return self._refuse(reason, f"agent refused: {msg.text}")
            return [PeerError(msg)]
        if self.state == "await_hello":
            if not isinstance(msg, Hello):
                text = f"expected hello, got {msg.TYPE}"
                return self._refuse("protocol", text, text)
            if self.identity is not None and (
                msg.agent_id != self.identity or msg.host != self.identity
            ):
                text = (
                    f"hello claims agent {msg.agent_id!r} on host {msg.host!r}, but the client"
                    f" certificate is agent {self.identity!r}"
                )
                return self._refuse("identity", text, text)
            self.hello = msg
            self.state = "await_auth"
            p = auth.proof(self.secret, "coordinator", msg.nonce, self._nonce)
            welcome = Welcome(
                seq=self._next(),
                coordinator_id=self.coordinator_id,
                nonce=self._nonce,
                proof=p,
                settings=self.settings,
            )
            return [Send(welcome)]
        if self.state == "await_auth":
            assert self.hello is not None
            if not isinstance(msg, Auth):
                text = f"expected auth, got {msg.TYPE}"
                return self._refuse("protocol", text, text)
            if not auth.check(self.secret, "agent", self.hello.nonce, self._nonce, msg.proof):
                return self._refuse(
                    "auth",
                    f"agent {self.hello.agent_id!r} failed to prove the shared secret",
                    "the agent's proof does not match the coordinator's shared secret",
                )
            self.state = "established"
            # Held as long as the peer is connected (its PeerInfo's ranks): once each.
            self.hello = msgspec.structs.replace(self.hello, ranks=HelloRanks(self.hello.ranks))
            return [PeerEstablished(self.hello)]
        # established
        assert self.hello is not None
        if type(msg) in DATA_TYPES:
            data: DataMessage = msg
            if self.tracker.is_new(self.hello.agent_id, msg.seq):
                return [Deliver(data)]
            upto = self.tracker.upto(self.hello.agent_id)
            return [Duplicate(data), Send(Ack(seq=self._next(), upto=upto))]
        if isinstance(msg, Ack):
            if msg.control_id is not None:
                return [ControlAcked(msg)]
            return []
        err = ProtocolError("unexpected", f"unexpected {msg.TYPE} from agent", msg_type=msg.TYPE)
        return [Send(Error(seq=self._next(), code=err.reason, text=err.text)), BadFrame(err)]

    def _bad_frame(self, e: ProtocolError) -> list[Effect]:
        if self.state != "established":
            if e.reason == "version":
                ours = self.version
                peer = e.peer_version or (0, 0)
                text = (
                    f"agent speaks protocol {peer[0]}.{peer[1]}, this coordinator speaks"
                    f" {ours[0]}.{ours[1]}; the major versions must match"
                )
                return [BadFrame(e), *self._refuse("version", text, text)]
            return [
                BadFrame(e),
                *self._refuse("protocol", f"bad frame before auth: {e.text}", e.text, e.reason),
            ]
        tell = Send(Error(seq=self._next(), code=e.reason, text=e.text, fatal=e.fatal))
        if e.fatal:
            self.state = "closed"
            return [tell, BadFrame(e), Close(e.reason, e.text)]
        return [tell, BadFrame(e)]

    def redirect(self, owners: tuple[JobOwner, ...]) -> Redirect | Error:
        """What tells this agent that `owners`' jobs are served elsewhere in the fleet: a
        Redirect (1.3 and later), else a fatal `not_owner` error naming the owner (the
        connection then closes; the agent reconnects and is told again)."""
        assert self.hello is not None and owners
        if self.hello.version[1] >= FLEET_MINOR:
            return Redirect(seq=self._next(), jobs=owners)
        named = "; ".join(
            f"job {o.job} is served by coordinator {o.owner} at {o.address}"
            if o.owner
            else f"job {o.job} has no owner this coordinator can see"
            for o in owners
        )
        text = f"{named}; connect there (protocol 1.{FLEET_MINOR} agents follow it themselves)"
        return Error(seq=self._next(), code="not_owner", text=text[:4096], fatal=True)

    def confirm(self) -> Ack:
        """First Ack after auth: tells the agent what it need not resend."""
        assert self.hello is not None and self.state == "established"
        upto = self.tracker.begin(self.hello.agent_id, self.hello.incarnation)
        return Ack(seq=self._next(), upto=upto)

    def delivered(self, msg: DataMessage) -> int:
        """The app has ``msg``: record it; returns the new ``upto`` to ack."""
        assert self.hello is not None
        return self.tracker.mark(self.hello.agent_id, msg.seq)

    def ack(self, upto: int) -> Ack:
        return Ack(seq=self._next(), upto=upto)

    def control(
        self, action: str, body: dict[str, Any] | None = None, control_id: str | None = None
    ) -> Control:
        """``control_id``: the caller's own (a correction's id, so its ack is matched
        across a coordinator restart); None: a new one."""
        if action not in CONTROL_ACTIONS:
            raise ValueError(f"control action must be one of {CONTROL_ACTIONS}, got {action!r}")
        self._controls += 1
        cid = control_id or f"{self.coordinator_id[:200]}:{secrets.token_hex(4)}:{self._controls}"
        return Control(seq=self._next(), control_id=cid, action=action, body=body or {})
