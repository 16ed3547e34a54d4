"""What the protocol server shows its app (the coordinator): the peer it talks to, the
limits a peer lives under before it authenticates, why one was refused, the
counters the coordinator exports, and the errors the two hand each other. No I/O."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, overload

from artemis.protocol.messages import Message, RankInfo
from artemis.protocol.transport import TLS_REASONS


@dataclass(frozen=True)
class PeerInfo:
    """An authenticated agent connection, as the app sees it."""

    agent_id: str
    host: str
    agent_version: str
    incarnation: str
    ranks: Sequence[RankInfo]  # a HelloRanks from the server
    address: str  # transport peer address, for logs
    version: tuple[int, int]  # the agent's protocol version
    connected_at: float  # wall-clock time.time() of the handshake
    conn_id: int  # unique per connection in this server


_RANK_FIELDS = tuple(f.name for f in fields(RankInfo))


class HelloRanks(Sequence[RankInfo]):
    """A hello's ranks, held by field: a field every rank has the same value of (the
    job's name, the communicator's, its size: the usual hello) as that one value, an
    integer field as an array of int64, any other as a tuple of its values (equal ones
    one object). A peer's ranks are held for as long as it is connected: as RankInfo
    objects that was about 170 B a rank (an object and its rank's int), by field 8 B
    and a few. Each RankInfo is built when it is read (the app reads them at the
    handshake and when a job moves); equal to the tuple of the same RankInfos."""

    __slots__ = ("_cols", "_n")

    def __init__(self, ranks: Sequence[RankInfo]) -> None:
        one: dict[tuple[type, Any], Any] = {}
        cols: list[tuple[bool, Any]] = []  # (the same for all, that value or the column)
        for name in _RANK_FIELDS:
            vals = [getattr(r, name) for r in ranks]
            kinds = {(type(v), v) for v in vals}
            if len(kinds) <= 1:
                cols.append((True, vals[0] if vals else None))
            elif all(type(v) is int for v in vals) and -(2**63) <= min(vals) <= max(vals) < 2**63:
                cols.append((False, array("q", vals)))
            else:
                cols.append((False, tuple(one.setdefault((type(v), v), v) for v in vals)))
        self._cols = tuple(cols)
        self._n = len(ranks)

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> RankInfo: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[RankInfo, ...]: ...
    def __getitem__(self, i: int | slice) -> RankInfo | tuple[RankInfo, ...]:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(self._n)))
        if not -self._n <= i < self._n:
            raise IndexError(f"rank {i} of a hello of {self._n}")
        i %= self._n
        return RankInfo(*[v if same else v[i] for same, v in self._cols])

    def __iter__(self) -> Iterator[RankInfo]:
        for i in range(self._n):
            yield self[i]

    def values(self, name: str) -> Sequence[Any]:
        """One field of every rank, in order, with no RankInfo built."""
        same, v = self._cols[_RANK_FIELDS.index(name)]
        return (v,) * self._n if same else v

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HelloRanks):
            return self._n == other._n and self._cols == other._cols
        if isinstance(other, tuple | list):
            return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"HelloRanks({tuple(self)!r})"


def rank_pairs(ranks: Sequence[RankInfo]) -> Iterator[tuple[str, int]]:
    """(job, rank) of each of `ranks` (read by field from a HelloRanks)."""
    if isinstance(ranks, HelloRanks):
        return zip(ranks.values("job"), map(int, ranks.values("rank")), strict=True)
    return ((r.job, r.rank) for r in ranks)


# Why a connection was refused or closed by the coordinator: the labels of
# straggler_protocol_refused_peers_total (exported at 0 from the start).
REFUSAL_REASONS = (
    "auth",  # a proof did not match the shared secret
    "protocol",  # a bad frame or a message out of place before auth
    "oversize",  # a length prefix above the (pre-auth) frame limit
    "timeout",  # the handshake did not finish before its deadline (slowloris, idle)
    "version",  # another major protocol version
    "peer_limit",  # too many unauthenticated connections from that source address
    "busy",  # too many unauthenticated connections in all
    "idle",  # an authenticated connection sent nothing for idle_timeout_s
    "identity",  # mTLS: no usable identity in the certificate, or a hello naming another agent
    "superseded",  # the same agent connected again; its old connection was closed
    *TLS_REASONS,  # the TLS handshake failed: tls_no_cert, tls_bad_cert, tls_not_tls, ...
)


@dataclass(frozen=True)
class PeerLimits:
    """``[limits]`` of the coordinator: what one peer may cost before it authenticates.

    Worst case, unauthenticated peers hold ``max_unauthenticated`` connections
    for ``handshake_timeout_s`` each, buffering at most ``max_handshake_frame``
    bytes each (docs/DESIGN.md "Hostile peers" has the measured cost).
    """

    # TLS handshake (when on) + hello + auth, from the accept.
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0  # authenticated and silent this long: closed (0 = never)
    max_unauthenticated_per_peer: int = 64  # per source address
    max_unauthenticated: int = 4096  # over all sources
    # Before auth only a hello or an auth may come: the largest valid hello
    # (4096 ranks with long names) is about 0.5 MiB.
    max_handshake_frame: int = 1 << 20

    def validated(self) -> PeerLimits:
        if self.handshake_timeout_s <= 0:
            raise ValueError(f"handshake_timeout_s must be > 0, got {self.handshake_timeout_s}")
        if self.idle_timeout_s < 0:
            raise ValueError(f"idle_timeout_s must be >= 0, got {self.idle_timeout_s}")
        for k in ("max_unauthenticated_per_peer", "max_unauthenticated", "max_handshake_frame"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be >= 1, got {getattr(self, k)}")
        return self


def source_of(peer: str) -> str:
    """The source address of a ``host:port`` / ``[v6]:port`` peer string (the per-peer key)."""
    host, sep, _ = peer.rpartition(":")
    return host if sep else peer


class App(Protocol):
    """What the server needs from the coordinator.

    Optional extras, called when present: ``on_connect(peer)`` and
    ``on_control_ack(peer, ack)`` (each may be sync or async), and, in a coordinator
    fleet, ``route(peer) -> list[JobOwner]`` (sync, after auth, before ``on_connect``):
    the hello's jobs served by another coordinator, which the agent is redirected to
    (``ProtocolServer.redirect(owner)`` does the same mid-session).
    """

    async def on_message(self, peer: PeerInfo, msg: Message) -> None: ...

    def on_disconnect(self, peer: PeerInfo) -> Any: ...


@dataclass
class ProtocolStats:
    """Plain counters; the coordinator exports them as Prometheus metrics."""

    frames_total: int = 0  # frames received (good or bad)
    bad_frames_total: dict[str, int] = field(default_factory=dict)  # by reason
    refused_peers_total: dict[str, int] = field(default_factory=dict)  # by reason
    connections: int = 0  # open right now
    connections_total: int = 0  # accepted since start
    unauthenticated: int = 0  # open right now and not (yet) authenticated
    established: int = 0  # authenticated right now
    reconnects: int = 0  # authenticated connections of an agent seen before
    delivered_total: int = 0  # data messages handed to the app
    duplicates_total: int = 0  # resent data already handed over (re-acked, not delivered)
    app_errors_total: int = 0  # on_message raised (logged; the message counts as handed over)
    not_taken_total: int = 0  # the app could not keep a message (NotTaken): not acked
    controls_sent_total: int = 0
    control_acks_total: int = 0

    def snapshot(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["bad_frames_total"] = dict(self.bad_frames_total)
        d["refused_peers_total"] = dict(self.refused_peers_total)
        return d


class NotConnected(LookupError):
    """No authenticated connection for that agent right now."""


class NotTaken(Exception):
    """Raised by the app's ``on_message``: it could not keep the message (its journal's
    disk is full). The message is not acked and not recorded as delivered; the
    connection is closed, so the agent keeps it (and everything after it) and
    resends on its next connection (docs/RELIABILITY.md "3. Full disks")."""
