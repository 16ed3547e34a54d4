"""Typed protocol messages, derived from one declarative schema and validated in C.

Every frame body is one msgpack map with three envelope keys, ``v`` (protocol
version ``[major, minor]``), ``t`` (type tag) and ``seq`` (sequence number),
plus the message's own fields (see protocol/README.md). The messages are
msgspec Structs whose annotations (with the records of records.py) are the
schema: msgspec decodes a frame straight into them, checking every type and
bound in C, and encodes them back. Decoding never trusts the peer; failures
raise ``ProtocolError`` naming the message type and the field path.

A ``windows`` message carries its summaries as columns (minor 1.1, see
columns.py); the per-rank maps of minor 1.0 are still accepted and turned
into the same columns.

Compatibility rule: within one major version unknown keys are ignored and
missing optional keys take their defaults, so a 1.1 peer can add fields that a
1.0 peer skips. A different major is refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, TypeAlias, Union, get_args

import msgspec
from artemis.protocol import columns as _columns
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import (
    NAME_MAX,
    TEXT_MAX,
    U63,
    Count,
    Name,
    RankInfo,
    RankProgress,
    RankWindow,
    ShortName,
    Software,
    Telemetry,
)

__all__ = [
    "CONTROL_ACTIONS",
    "CORRECTION_MINOR",
    "DATA_TYPES",
    "FLEET_MINOR",
    "MESSAGE_TYPES",
    "PROTOCOL_VERSION",
    "REASONS",
    "Ack",
    "Auth",
    "Control",
    "ControlAction",
    "DataMessage",
    "Dump",
    "Error",
    "Fingerprint",
    "Heartbeat",
    "Hello",
    "JobOwner",
    "Message",
    "ProtocolError",
    "RankInfo",
    "Redirect",
    "Welcome",
    "Windows",
    "decode_body",
    "encode_body",
    "is_data",
    "message_to_map",
]

# 1.1: `windows` carries columns (columns.py); 1.0 per-rank maps still accepted.
# 1.2: control action `correction` and `Ack.result` (docs/DESIGN.md "Corrections");
# a correction goes only to agents that announced 1.2 or later.
# 1.3: `redirect` (the coordinator fleet, docs/DESIGN.md "The coordinator fleet"):
# a coordinator that does not own a job names its owner; an agent of 1.2 or
# earlier gets `error{code: "not_owner"}` naming the owner instead.
PROTOCOL_VERSION: tuple[int, int] = (1, 3)
# The first minor that understands a `correction` control.
CORRECTION_MINOR = 2
# The first minor that understands `redirect`.
FLEET_MINOR = 3
# The last minor whose `windows` message carries one map per rank.
ROW_WINDOWS_MINOR = 0

# Reason codes carried by ProtocolError (and by Error.code on the wire); they
# are also the label values of the bad-frame / refused-peer counters.
REASONS = (
    "oversize",  # length prefix above the frame limit: the stream is poisoned
    "truncated",  # the stream ended inside a frame
    "msgpack",  # body is not valid msgpack
    "not_a_map",  # body is valid msgpack but not a map
    "unknown_type",  # type tag missing or not one we know
    "version",  # other major protocol version
    "invalid",  # a field has the wrong type, range or is missing
)

_NONCE_MIN, _NONCE_MAX = 16, 64


class ProtocolError(Exception):
    """A frame or message that breaks the protocol.

    ``reason`` is one of REASONS (a metrics label); ``text`` says what was
    wrong, naming the message type and field where known. ``fatal`` means the
    byte stream cannot be resynchronised and the connection must close.
    """

    def __init__(
        self,
        reason: str,
        text: str,
        *,
        msg_type: str | None = None,
        field: str | None = None,
        fatal: bool = False,
        peer_version: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(text)
        self.reason = reason
        self.text = text
        self.msg_type = msg_type
        self.field = field
        self.fatal = fatal
        self.peer_version = peer_version

    def __repr__(self) -> str:
        return f"ProtocolError({self.reason!r}, {self.text!r})"


def version_mismatch_text(peer: tuple[int, int], ours: tuple[int, int]) -> str:
    return (
        f"protocol version mismatch: peer speaks {peer[0]}.{peer[1]}, this side speaks "
        f"{ours[0]}.{ours[1]}; the major versions must match (upgrade the older side)"
    )


# --------------------------------------------------------------------------- free maps

_PLAIN_SCALARS = (str, int, float, bool, bytes, type(None))


def _plain(v: Any, depth: int) -> bool:
    t = type(v)
    if t is float:
        # NaN and infinities mean nothing in a control body or a dump record, and
        # NaN would make a message unequal to itself after a round trip.
        return math.isfinite(v)
    if t in _PLAIN_SCALARS:
        return True
    if depth > 16:
        return False
    if t is list or t is tuple:
        return all(_plain(x, depth + 1) for x in v)
    if t is dict:
        return all(type(k) is str and _plain(x, depth + 1) for k, x in v.items())
    return False  # msgpack ext types among them


_FREE = "map with string keys and plain, finite values (at most 16 deep)"


def _check_free(name: str, v: Any) -> None:
    if not _plain(v, 0):
        raise ValueError(f"{name}: expected {_FREE}")


def _check_free_list(name: str, vs: Sequence[Any]) -> None:
    for i, v in enumerate(vs):
        if not _plain(v, 0):
            raise ValueError(f"{name}[{i}]: expected {_FREE}")


# --------------------------------------------------------------------------- messages

U16 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFF)]
FreeMap = dict[str, Any]
Text = Annotated[str, msgspec.Meta(max_length=TEXT_MAX)]
ShortText = Annotated[str, msgspec.Meta(max_length=64)]
Nonce = Annotated[bytes, msgspec.Meta(min_length=_NONCE_MIN, max_length=_NONCE_MAX)]
Proof = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]


class Message:
    """Envelope shared by every message.

    ``seq``: for data messages (Windows, Heartbeat, Dump) the agent's sequence
    number, continuous for the life of the agent process and the dedup key on
    the coordinator; for the others a per-connection counter kept for logs.
    ``version``: the sender's protocol version (set on decode; encode writes
    its own).
    """

    __slots__ = ()
    TYPE: ClassVar[str] = ""
    seq: int
    version: tuple[int, int]


class _UnsetSeq(int):
    """The default seq of a message built here: 0, and never what a peer sent."""


class _UnsetVersion(tuple[int, int]):
    """The default version of a message built here: ours, and never what a peer sent."""


# A decoded message still holding these defaults lacked `seq` or `v`, which every
# frame must carry (a typed default cannot tell "absent" from "sent" otherwise).
_NO_SEQ: Any = _UnsetSeq(0)
_NO_VERSION: Any = _UnsetVersion(PROTOCOL_VERSION)


class _Wire(msgspec.Struct, frozen=True, kw_only=True, tag_field="t", rename={"version": "v"}):
    """The envelope as msgspec sees it (the ``t`` tag selects the type)."""

    seq: Count = _NO_SEQ
    version: tuple[U16, U16] = _NO_VERSION


class Hello(_Wire, Message, tag="hello", frozen=True, kw_only=True):
    """Agent -> coordinator, first frame of a connection."""

    TYPE: ClassVar[str] = "hello"
    agent_id: Name
    host: Name
    agent_version: ShortName
    nonce: Nonce
    ranks: Annotated[tuple[RankInfo, ...], msgspec.Meta(max_length=4096)] = ()
    # Random per agent process: a new incarnation restarts the seq space, so
    # the coordinator forgets the old process's dedup state.
    incarnation: ShortText = ""


class Welcome(_Wire, Message, tag="welcome", frozen=True, kw_only=True):
    """Coordinator -> agent: its nonce and its proof that it knows the secret."""

    TYPE: ClassVar[str] = "welcome"
    coordinator_id: Name
    nonce: Nonce
    proof: Proof
    settings: FreeMap = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_free("settings", self.settings)


class Auth(_Wire, Message, tag="auth", frozen=True, kw_only=True):
    """Agent -> coordinator: the agent's proof (third leg of the handshake)."""

    TYPE: ClassVar[str] = "auth"
    proof: Proof


class Heartbeat(_Wire, Message, tag="heartbeat", frozen=True, kw_only=True):
    """Agent -> coordinator: liveness, per-rank progress and delivery health."""

    TYPE: ClassVar[str] = "heartbeat"
    progress: Annotated[tuple[RankProgress, ...], msgspec.Meta(max_length=16384)] = ()
    buffered: Count = 0
    dropped: Count = 0
    plan_acks: Annotated[tuple[FreeMap, ...], msgspec.Meta(max_length=4096)] = ()

    def __post_init__(self) -> None:
        if self.plan_acks:
            _check_free_list("plan_acks", self.plan_acks)


class Dump(_Wire, Message, tag="dump", frozen=True, kw_only=True):
    """Agent -> coordinator: a rank's last collectives (hang evidence)."""

    TYPE: ClassVar[str] = "dump"
    job: Name
    comm: Name
    rank: Count
    request_id: Annotated[str, msgspec.Meta(max_length=NAME_MAX)] = ""
    records: Annotated[tuple[FreeMap, ...], msgspec.Meta(max_length=4096)] = ()

    def __post_init__(self) -> None:
        if self.records:
            _check_free_list("records", self.records)


Workload = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{16,64}$")]


class Fingerprint(_Wire, Message, tag="fingerprint", frozen=True, kw_only=True):
    """Agent -> coordinator: one rank's software fingerprint and workload signature.

    Sent once per rank and again whenever either changes (docs/DESIGN.md
    "Fingerprints"); a data message, so kept until acked and resent after a
    reconnect. ``workload``: hex hash of the rank's per-step collective
    signature on its main communicator, None until its steps are known.
    """

    TYPE: ClassVar[str] = "fingerprint"
    job: Name
    rank: Count
    software: Software = msgspec.field(default_factory=Software)
    workload: Workload | None = None


ControlAction: TypeAlias = Literal["dump", "plan", "settings", "correction"]
CONTROL_ACTIONS: tuple[str, ...] = get_args(ControlAction)  # the wire's one list


class Control(_Wire, Message, tag="control", frozen=True, kw_only=True):
    """Coordinator -> agent: a dump request, a rebalance plan, new settings or (1.2) a
    correction to apply or roll back."""

    TYPE: ClassVar[str] = "control"
    control_id: Name
    action: ControlAction
    body: FreeMap = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_free("body", self.body)


class Ack(_Wire, Message, tag="ack", frozen=True, kw_only=True):
    """Either direction.

    Coordinator -> agent: ``upto`` = every data seq <= upto is handed to the
    coordinator's app (or was dropped by the agent). Agent -> coordinator:
    ``control_id`` with ``ok``/``detail`` = the result of one Control; from 1.2
    ``result`` carries a correction's outcome (status, before, after, error).
    """

    TYPE: ClassVar[str] = "ack"
    upto: Count | None = None
    control_id: Name | None = None
    ok: bool = True
    detail: Text = ""
    result: FreeMap | None = None

    def __post_init__(self) -> None:
        if self.upto is None and self.control_id is None:
            raise ValueError("upto: missing; an ack needs upto or control_id (or both)")
        if self.result is not None:
            _check_free("result", self.result)


class Error(_Wire, Message, tag="error", frozen=True, kw_only=True):
    """Either direction: something was refused; ``code`` is one of REASONS or a session code."""

    TYPE: ClassVar[str] = "error"
    code: ShortName
    text: Text
    fatal: bool = False


class JobOwner(msgspec.Struct, frozen=True, kw_only=True):
    """Who serves one job in a coordinator fleet: its lease holder's id and advertised
    ``HOST:PORT``, with the lease's epoch. ``owner`` and ``address`` empty: nobody
    holds the lease that this coordinator could see (try the next address)."""

    job: Name
    owner: Annotated[str, msgspec.Meta(max_length=NAME_MAX)] = ""
    address: Annotated[str, msgspec.Meta(max_length=NAME_MAX)] = ""
    epoch: Count = 0
    # Seconds the lease still runs unless its holder renews it, by the database's clock
    # when this was said (0: not known). An agent that cannot reach the holder (it
    # died) asks the fleet again then, when the lease is free, not on a blind back-off.
    # Optional, added within 1.3: agents that do not know it ignore it.
    expires_s: Annotated[float, msgspec.Meta(ge=0.0, le=86400.0)] = 0.0


class Redirect(_Wire, Message, tag="redirect", frozen=True, kw_only=True):
    """Coordinator -> agent (1.3): these jobs are served by another coordinator of the
    fleet. Sent after authentication for the hello's jobs it does not own, and later
    for a job whose lease it lost. Not acknowledged; the agent moves the jobs' ranks
    (and their unacknowledged messages) to an uplink to the owner."""

    TYPE: ClassVar[str] = "redirect"
    jobs: Annotated[tuple[JobOwner, ...], msgspec.Meta(min_length=1, max_length=4096)]


class _WindowsWire(_Wire, tag="windows", frozen=True, kw_only=True):
    """A ``windows`` message as it travels: columns (1.1) or one map per rank (1.0)."""

    host: Name
    cols: _columns.WireBatch | None = None
    windows: Annotated[tuple[RankWindow, ...], msgspec.Meta(max_length=16384)] | None = None


class Windows(Message):
    """Agent -> coordinator: window summaries of the ranks on one node, as columns.

    Build it from ``columns`` (the native form) or from ``windows`` (records,
    converted once). ``.columns`` is what the coordinator core consumes;
    ``.windows`` gives the records back, for code at the edges.
    """

    __slots__ = ("_records", "columns", "host", "seq", "version")
    TYPE: ClassVar[str] = "windows"
    host: str
    columns: WindowColumns
    _records: tuple[RankWindow, ...] | None

    def __init__(
        self,
        *,
        host: str,
        windows: Sequence[RankWindow] | None = None,
        columns: WindowColumns | None = None,
        seq: int = 0,
        version: tuple[int, int] = PROTOCOL_VERSION,
    ) -> None:
        if (windows is None) == (columns is None):
            raise TypeError("Windows takes either windows= (records) or columns=")
        records = tuple(windows) if windows is not None else None
        cols = columns if columns is not None else WindowColumns.from_records(records or ())
        set_ = object.__setattr__
        set_(self, "host", host)
        set_(self, "columns", cols)
        set_(self, "seq", seq)
        set_(self, "version", version)
        set_(self, "_records", records)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Windows is immutable (setting {name!r})")

    @property
    def windows(self) -> tuple[RankWindow, ...]:
        """The summaries as records (built on first use; not for the hot path)."""
        recs = self._records
        if recs is None:
            recs = tuple(self.columns.rows())
            object.__setattr__(self, "_records", recs)
        return recs

    def replace(self, **changes: Any) -> Windows:
        kw: dict[str, Any] = {
            "host": self.host,
            "columns": self.columns,
            "seq": self.seq,
            "version": self.version,
        }
        if "windows" in changes:
            kw.pop("columns")
        kw.update(changes)
        return Windows(**kw)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Windows):
            return NotImplemented
        return (
            self.host == other.host
            and self.seq == other.seq
            and self.version == other.version
            and self.columns == other.columns
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Windows(seq={self.seq}, version={self.version}, host={self.host!r}, n={self.columns.n})"


DATA_TYPES: tuple[type[Message], ...] = (Windows, Heartbeat, Dump, Fingerprint)
DataMessage: TypeAlias = Windows | Heartbeat | Dump | Fingerprint
# Every message type, in wire-tag order of introduction (the decoder's union below
# is the same list with the `windows` wire form).
_ALL = (Hello, Welcome, Auth, Windows, Heartbeat, Dump, Fingerprint, Control, Ack, Error, Redirect)
MESSAGE_TYPES: dict[str, type[Message]] = {c.TYPE: c for c in _ALL}


def is_data(msg: Message) -> bool:
    return type(msg) in DATA_TYPES


# --------------------------------------------------------------------------- decode

_WireMessage = Union[tuple(_WindowsWire if c is Windows else c for c in _ALL)]  # type: ignore[valid-type]  # noqa: UP007
_DECODER = msgspec.msgpack.Decoder(_WireMessage)
_GENERIC = msgspec.msgpack.Decoder()
_ENCODER = msgspec.msgpack.Encoder()


def decode_body(
    body: bytes | bytearray | memoryview, version: tuple[int, int] = PROTOCOL_VERSION
) -> Message:
    """Decode and validate one frame body (no length prefix); raises ProtocolError."""
    try:
        msg: Any = _DECODER.decode(body)
    except msgspec.ValidationError as e:
        raise _explain(body, e, version) from None
    except msgspec.DecodeError as e:
        raise ProtocolError("msgpack", f"frame body is not valid msgpack: {e}") from None
    if type(msg.seq) is not int or type(msg.version) is not tuple:
        raise _explain(body, None, version)
    if msg.version[0] != version[0]:
        raise ProtocolError(
            "version",
            version_mismatch_text(msg.version, version),
            msg_type=msg.TYPE if isinstance(msg, Message) else "windows",
            field="v",
            peer_version=msg.version,
        )
    if type(msg) is _WindowsWire:
        return _windows_from_wire(msg)
    m: Message = msg
    return m


def _windows_from_wire(w: _WindowsWire) -> Windows:
    if w.cols is not None:
        try:
            cols = _columns.from_wire(w.cols)
        except _columns.ColumnError as e:
            f = f"windows.cols.{e.column}"
            raise ProtocolError("invalid", f"{f}: {e.text}", msg_type="windows", field=f) from None
        return Windows(host=w.host, columns=cols, seq=w.seq, version=w.version)
    if w.windows is None:
        raise ProtocolError(
            "invalid",
            "windows.cols: required field is missing (or, before 1.1, windows)",
            msg_type="windows",
            field="windows.cols",
        )
    return Windows(host=w.host, windows=w.windows, seq=w.seq, version=w.version)


_AT = re.compile(r"^(?P<text>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.S)
_MISSING_FIELD = re.compile(r"^Object missing required field `(?P<name>[^`]+)`$")
_NAMED = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])?): (?P<text>.*)$", re.S)
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def _lookup(m: Any, path: str) -> Any:
    """The value at a msgspec-style path (".a[3].b") in a generic decoded map, or _NONE."""
    cur = m
    for key, idx in _STEP.findall(path):
        try:
            cur = cur[key] if key else cur[int(idx)]
        except (KeyError, IndexError, TypeError):
            return _NONE
    return cur


_NONE: Any = object()


def _shown(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _explain(
    body: bytes | bytearray | memoryview,
    err: msgspec.ValidationError | None,
    version: tuple[int, int],
) -> ProtocolError:
    """The precise ProtocolError for a body the typed decoder refused (the slow path)."""
    try:
        m = _GENERIC.decode(body)
    except msgspec.DecodeError as e:
        return ProtocolError("msgpack", f"frame body is not valid msgpack: {e}")
    if type(m) is not dict:
        return ProtocolError(
            "not_a_map", f"frame body is a msgpack {type(m).__name__}, expected a map"
        )
    t = m.get("t")
    shown_t = t if type(t) is str and len(t) <= 32 else "?"
    v = m.get("v")
    if (
        type(v) is not list
        or len(v) != 2
        or type(v[0]) is not int
        or type(v[1]) is not int
        or not (0 <= v[0] <= 0xFFFF and 0 <= v[1] <= 0xFFFF)
    ):
        return ProtocolError(
            "invalid",
            f"{shown_t}.v: expected protocol version [major, minor], got {v!r:.40}",
            msg_type=shown_t,
            field="v",
        )
    peer = (v[0], v[1])
    if peer[0] != version[0]:
        return ProtocolError(
            "version",
            version_mismatch_text(peer, version),
            msg_type=shown_t,
            field="v",
            peer_version=peer,
        )
    if type(t) is not str or t not in MESSAGE_TYPES:
        return ProtocolError(
            "unknown_type", f"unknown message type {t!r:.40}", msg_type=shown_t, field="t"
        )
    seq = m.get("seq")
    if type(seq) is not int or not (0 <= seq <= U63):
        return ProtocolError(
            "invalid",
            f"{t}.seq: expected integer in [0, {U63}], got {seq!r:.40}",
            msg_type=t,
            field="seq",
        )
    got = _AT.match(str(err) if err is not None else "")
    assert got is not None  # the pattern matches any text
    text, path = got["text"], got["path"] or ""
    if got["key"]:
        text += " as a map key"
    elif "[...]" in path:
        # msgspec's name for "some value of this map": name the map.
        path = path.split("[...]", 1)[0]
        text += " as a map value"
    missing = _MISSING_FIELD.match(text)
    named = _NAMED.match(text)
    if missing:
        path += f".{missing['name']}"
        text = "required field is missing"
    elif named:
        # A cross-field check (a __post_init__) names its field itself.
        path += f".{named['name']}"
        text = named["text"]
    elif not got["key"]:
        value = _lookup(m, path)
        text = text or "invalid value"
        if value is not _NONE and ", got " not in text:
            text += f", got {_shown(value)}"
    field = t + path
    if not text[:1].islower():
        text = text[:1].lower() + text[1:]
    return ProtocolError("invalid", f"{field}: {text}", msg_type=t, field=field)


# --------------------------------------------------------------------------- encode


def _wire(msg: Message, seq: int | None, version: tuple[int, int]) -> Any:
    s = msg.seq if seq is None else seq
    if type(msg) is Windows:
        # A plain map: the struct would write the form it does not use as nil.
        d: dict[str, Any] = {"t": "windows", "seq": s, "v": version, "host": msg.host}
        if version[0] == 1 and version[1] <= ROW_WINDOWS_MINOR:
            d["windows"] = msg.windows
        else:
            d["cols"] = _columns.to_wire(msg.columns)
        return d
    if type(msg.seq) is not int or type(msg.version) is not tuple:
        return msgspec.structs.replace(msg, seq=int(s), version=tuple(version))  # type: ignore[type-var]
    if s != msg.seq or version != msg.version:
        return msgspec.structs.replace(msg, seq=s, version=version)  # type: ignore[type-var]
    return msg


def encode_body(
    msg: Message, *, seq: int | None = None, version: tuple[int, int] = PROTOCOL_VERSION
) -> bytes:
    """The msgpack body of ``msg`` (envelope included); a minor-1.0 ``version``
    writes a ``windows`` message in the 1.0 form (one map per rank)."""
    return _ENCODER.encode(_wire(msg, seq, version))


def message_to_map(
    msg: Message, *, seq: int | None = None, version: tuple[int, int] = PROTOCOL_VERSION
) -> dict[str, Any]:
    """The wire map of a message (envelope included), as plain msgpack values."""
    d: dict[str, Any] = _GENERIC.decode(encode_body(msg, seq=seq, version=version))
    return d


# --------------------------------------------------------------------------- records


def rank_window_from_dict(d: Mapping[str, Any], path: str = "rank_window") -> RankWindow:
    """Rebuild a RankWindow from a map with full validation (raises ProtocolError)."""
    return _convert(d, RankWindow, path)


def telemetry_from_dict(d: Mapping[str, Any], path: str = "telemetry") -> Telemetry:
    """Rebuild a Telemetry from a map with full validation (raises ProtocolError)."""
    return _convert(d, Telemetry, path)


def _convert(d: Mapping[str, Any], cls: Any, path: str) -> Any:
    try:
        return msgspec.convert(dict(d), cls)
    except msgspec.ValidationError as e:
        got = _AT.match(str(e))
        assert got is not None
        text, sub = got["text"], got["path"] or ""
        named = _NAMED.match(text) or _MISSING_FIELD.match(text)
        if named:
            sub += f".{named['name']}"
        field = path + sub
        raise ProtocolError("invalid", f"{field}: {text}", msg_type=path, field=field) from None
