"""Typed protocol messages and the strict validation that turns decoded maps into them.

Every frame body is one msgpack map with three envelope keys, ``v`` (protocol
version ``[major, minor]``), ``t`` (type tag) and ``seq`` (sequence number),
plus the message's own fields (see protocol/README.md). Decoding never trusts
the peer: every field is type- and range-checked and nested records
(RankWindow, Telemetry, RankProgress, RankInfo) are rebuilt field by field, so
nothing malformed reaches the coordinator core. Failures raise
``ProtocolError`` naming the message type and the field.

Compatibility rule: within one major version unknown keys are ignored and
missing optional keys take their defaults, so a 1.1 peer can add fields that a
1.0 peer skips. A different major is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, ClassVar, Literal, TypeAlias

from artemis.protocol import _fastcheck
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import RankProgress, RankWindow, Telemetry

PROTOCOL_VERSION: tuple[int, int] = (1, 0)

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

_U63 = (1 << 63) - 1
_NAME_MAX = 256  # ids, hosts, job names
_TEXT_MAX = 8192  # free text (error texts, details)
_NONCE_MIN, _NONCE_MAX = 16, 64
_LIST_MAX = 65536  # entries in any list field


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


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class RankInfo:
    """One rank an agent watches on its node (sent in Hello)."""

    job: str
    comm: str
    rank: int
    nranks: int
    pid: int | None = None
    gpu_index: int | None = None
    vendor: str | None = None
    gpu_model: str | None = None


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """Envelope shared by every message.

    ``seq``: for data messages (Windows, Heartbeat, Dump) the agent's sequence
    number, continuous for the life of the agent process and the dedup key on
    the coordinator; for the others a per-connection counter kept for logs.
    ``version``: the sender's protocol version (set on decode; encode writes
    its own).
    """

    TYPE: ClassVar[str] = ""
    seq: int = 0
    version: tuple[int, int] = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello(Message):
    """Agent -> coordinator, first frame of a connection."""

    TYPE: ClassVar[str] = "hello"
    agent_id: str
    host: str
    agent_version: str
    nonce: bytes
    ranks: tuple[RankInfo, ...] = ()
    # Random per agent process: a new incarnation restarts the seq space, so
    # the coordinator forgets the old process's dedup state.
    incarnation: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome(Message):
    """Coordinator -> agent: its nonce and its proof that it knows the secret."""

    TYPE: ClassVar[str] = "welcome"
    coordinator_id: str
    nonce: bytes
    proof: bytes
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Auth(Message):
    """Agent -> coordinator: the agent's proof (third leg of the handshake)."""

    TYPE: ClassVar[str] = "auth"
    proof: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Windows(Message):
    """Agent -> coordinator: window summaries of the ranks on one node."""

    TYPE: ClassVar[str] = "windows"
    host: str
    windows: tuple[RankWindow, ...]

    @property
    def columns(self) -> WindowColumns:
        """The summaries as columns: what the coordinator core consumes."""
        return WindowColumns.from_records(self.windows)


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat(Message):
    """Agent -> coordinator: liveness, per-rank progress and delivery health."""

    TYPE: ClassVar[str] = "heartbeat"
    progress: tuple[RankProgress, ...] = ()
    buffered: int = 0
    dropped: int = 0
    plan_acks: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Dump(Message):
    """Agent -> coordinator: a rank's last collectives (hang evidence)."""

    TYPE: ClassVar[str] = "dump"
    job: str
    comm: str
    rank: int
    request_id: str = ""
    records: tuple[dict[str, Any], ...] = ()


ControlAction: TypeAlias = Literal["dump", "plan", "settings"]
CONTROL_ACTIONS: tuple[str, ...] = ("dump", "plan", "settings")


@dataclass(frozen=True, slots=True, kw_only=True)
class Control(Message):
    """Coordinator -> agent: a dump request, a rebalance plan or new settings."""

    TYPE: ClassVar[str] = "control"
    control_id: str
    action: ControlAction
    body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack(Message):
    """Either direction.

    Coordinator -> agent: ``upto`` = every data seq <= upto is handed to the
    coordinator's app (or was dropped by the agent). Agent -> coordinator:
    ``control_id`` with ``ok``/``detail`` = the result of one Control.
    """

    TYPE: ClassVar[str] = "ack"
    upto: int | None = None
    control_id: str | None = None
    ok: bool = True
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Error(Message):
    """Either direction: something was refused; ``code`` is one of REASONS or a session code."""

    TYPE: ClassVar[str] = "error"
    code: str
    text: str
    fatal: bool = False


DATA_TYPES: tuple[type[Message], ...] = (Windows, Heartbeat, Dump)
DataMessage: TypeAlias = Windows | Heartbeat | Dump
MESSAGE_TYPES: dict[str, type[Message]] = {
    c.TYPE: c for c in (Hello, Welcome, Auth, Windows, Heartbeat, Dump, Control, Ack, Error)
}


def is_data(msg: Message) -> bool:
    return type(msg) in DATA_TYPES


# --------------------------------------------------------------------------- checks
#
# A check takes (value, where, name) and returns the value to store or raises
# ProtocolError. ``where`` is the dotted path of the enclosing object
# ("windows.windows[3].telemetry") and is only formatted on failure, so the
# happy path costs one call and a couple of type tests per field.
#
# That generic walk is the slow, precise path. Each check also registers a
# "kind" (see _fastcheck.py) from which one straight-line validator per record
# and message type is generated; decoding runs that first and falls back to the
# walk only when it refuses something, to name the field and the reason.

Check = Callable[[Any, str, str], Any]

_KINDS: dict[Check, _fastcheck.Kind] = {}


def _kind(check: Check, kind: _fastcheck.Kind) -> Check:
    _KINDS[check] = kind
    return check


def _kind_of(check: Check) -> _fastcheck.Kind:
    # A check without a registered kind is run as is by the generated code.
    return _KINDS.get(check) or ("slow", check)


def _fail(where: str, name: str, what: str, got: Any) -> ProtocolError:
    shown = repr(got)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    msg_type = where.split(".", 1)[0].split("[", 1)[0]
    return ProtocolError(
        "invalid",
        f"{where}.{name}: expected {what}, got {shown}",
        msg_type=msg_type,
        field=f"{where}.{name}",
    )


def c_str(max_len: int = _NAME_MAX, nonempty: bool = True) -> Check:
    what = f"{'non-empty ' if nonempty else ''}string of at most {max_len} chars"

    def check(v: Any, where: str, name: str) -> Any:
        if type(v) is not str or len(v) > max_len or (nonempty and not v):
            raise _fail(where, name, what, v)
        return v

    return _kind(check, ("str", max_len, nonempty))


def c_choice(choices: tuple[str, ...]) -> Check:
    what = "one of " + ", ".join(repr(c) for c in choices)
    allowed = frozenset(choices)

    def check(v: Any, where: str, name: str) -> Any:
        if type(v) is not str or v not in allowed:
            raise _fail(where, name, what, v)
        return v

    return _kind(check, ("choice", allowed))


def c_int(lo: int = 0, hi: int = _U63) -> Check:
    what = f"integer in [{lo}, {hi}]"

    def check(v: Any, where: str, name: str) -> Any:
        if type(v) is not int or v < lo or v > hi:
            raise _fail(where, name, what, v)
        return v

    return _kind(check, ("int", lo, hi))


def c_float(lo: float = 0.0, hi: float = math.inf) -> Check:
    what = f"finite number in [{lo}, {hi}]"

    def check(v: Any, where: str, name: str) -> Any:
        t = type(v)
        if t is float:
            # NaN fails both comparisons' negation below; inf fails isfinite.
            if not (lo <= v <= hi) or not math.isfinite(v):
                raise _fail(where, name, what, v)
            return v
        if t is int and lo <= v <= hi:
            return float(v)
        raise _fail(where, name, what, v)

    return _kind(check, ("float", lo, hi))


def c_bool(v: Any, where: str, name: str) -> Any:
    if type(v) is not bool:
        raise _fail(where, name, "boolean", v)
    return v


_kind(c_bool, ("bool",))


def c_bytes(lo: int, hi: int) -> Check:
    what = f"binary of {lo}..{hi} bytes"

    def check(v: Any, where: str, name: str) -> Any:
        if type(v) is not bytes or not (lo <= len(v) <= hi):
            raise _fail(where, name, what, v)
        return v

    return _kind(check, ("bytes", lo, hi))


def c_opt(inner: Check) -> Check:
    def check(v: Any, where: str, name: str) -> Any:
        return None if v is None else inner(v, where, name)

    return _kind(check, ("opt", _kind_of(inner)))


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
    if t is list:
        return all(_plain(x, depth + 1) for x in v)
    if t is dict:
        return all(type(k) is str and _plain(x, depth + 1) for k, x in v.items())
    return False


def c_map(v: Any, where: str, name: str) -> Any:
    """A free-form map: string keys, plain msgpack values (no ext types), bounded depth."""
    if type(v) is not dict or not _plain(v, 0):
        raise _fail(where, name, "map with string keys and plain, finite values", v)
    return v


def _map_ok(v: Any) -> bool:
    return type(v) is dict and _plain(v, 0)


_kind(c_map, ("pred", _map_ok))


def c_list(inner: Check, max_len: int = _LIST_MAX, min_len: int = 0) -> Check:
    what = f"list of {min_len}..{max_len} entries"

    def check(v: Any, where: str, name: str) -> Any:
        if type(v) is not list or not (min_len <= len(v) <= max_len):
            raise _fail(where, name, what, v)
        return tuple(inner(x, where, f"{name}[{i}]") for i, x in enumerate(v))

    return _kind(check, ("list", _kind_of(inner), min_len, max_len))


def c_throttle(v: Any, where: str, name: str) -> Any:
    if type(v) is not dict or not all(
        type(k) is str and len(k) <= 64 and type(x) is bool for k, x in v.items()
    ):
        raise _fail(where, name, "map of reason -> boolean", v)
    return v


def _throttle_ok(v: Any) -> bool:
    if type(v) is not dict:
        return False
    # A plain loop: a generator under all() costs a frame switch per entry.
    for k, x in v.items():  # noqa: SIM110
        if type(k) is not str or len(k) > 64 or type(x) is not bool:
            return False
    return True


_kind(c_throttle, ("pred", _throttle_ok))


_MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class Spec:
    name: str
    check: Check
    required: bool = True
    default: Any = None
    factory: Callable[[], Any] | None = None


def _build(specs: tuple[Spec, ...], m: Mapping[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    get = m.get
    for s in specs:
        v = get(s.name, _MISSING)
        if v is _MISSING:
            if s.required:
                raise ProtocolError(
                    "invalid",
                    f"{where}.{s.name}: required field is missing",
                    msg_type=where.split(".", 1)[0].split("[", 1)[0],
                    field=f"{where}.{s.name}",
                )
            out[s.name] = s.factory() if s.factory is not None else s.default
        else:
            out[s.name] = s.check(v, where, s.name)
    return out


class _Record:
    """Check for a nested record: a map rebuilt field by field into ``cls``.

    ``post`` checks across fields on the slow path; ``fast_post`` is the same
    condition, inverted, for the generated validator (``{field}`` placeholders:
    true means refuse). ``empty``: the object an empty map stands for, if any.
    """

    __slots__ = ("cls", "empty", "fast", "post", "specs")

    def __init__(
        self,
        specs: tuple[Spec, ...],
        cls: Callable[..., Any],
        post: Callable[[dict[str, Any], str], None] | None = None,
        *,
        fast_post: str | None = None,
        empty: Any = None,
    ) -> None:
        if (post is None) != (fast_post is None):
            raise ValueError("post and fast_post go together")
        self.specs = specs
        self.cls = cls
        self.post = post
        self.empty = empty
        self.fast: Callable[[Any], Any] = _fastcheck.compile_record(
            specs,
            cls,
            _kind_of,
            post=fast_post,
            empty=empty,
            label=getattr(cls, "__name__", "record"),
        )
        _KINDS[self] = ("call", self.fast)

    def build(self, v: Any, path: str) -> Any:
        try:
            return self.fast(v)
        except Exception:
            # Refused (or a fast-path surprise): the precise walk says why.
            return self.build_slow(v, path)

    def build_slow(self, v: Any, path: str) -> Any:
        if type(v) is not dict:
            raise ProtocolError(
                "invalid",
                f"{path}: expected map, got {type(v).__name__}",
                msg_type=path.split(".", 1)[0].split("[", 1)[0],
                field=path,
            )
        if not v and self.empty is not None:
            return self.empty
        kw = _build(self.specs, v, path)
        if self.post is not None:
            self.post(kw, path)
        return self.cls(**kw)

    def __call__(self, v: Any, where: str, name: str) -> Any:
        return self.build(v, f"{where}.{name}")


def _opt(name: str, check: Check, default: Any = None) -> Spec:
    return Spec(name, check, required=False, default=default)


_name = c_str()
_opt_name = c_opt(c_str())
_nonneg_int = c_int()
_opt_nonneg_int = c_opt(c_int())
_nonneg = c_float()
_opt_nonneg = c_opt(c_float())
_pct = c_opt(c_float(0.0, 100.0 * 4096))  # per-process CPU % can exceed 100 per core count

_TELEMETRY_SPECS: tuple[Spec, ...] = (
    _opt("vendor", c_opt(c_str(64))),
    _opt("gpu_model", _opt_name),
    _opt("gpu_index", _opt_nonneg_int),
    _opt("sm_mhz", _opt_nonneg),
    _opt("sm_mhz_max", _opt_nonneg),
    _opt("mem_mhz", _opt_nonneg),
    _opt("temp_c", c_opt(c_float(-273.15, 1000.0))),
    _opt("power_w", _opt_nonneg),
    _opt("power_limit_w", _opt_nonneg),
    _opt("throttle", c_opt(c_throttle)),
    _opt("pcie_gen", _opt_nonneg_int),
    _opt("pcie_gen_max", _opt_nonneg_int),
    _opt("pcie_width", _opt_nonneg_int),
    _opt("pcie_width_max", _opt_nonneg_int),
    _opt("cpu_pct", _pct),
    _opt("steal_pct", _pct),
    _opt("iowait_pct", _pct),
    _opt("psi_cpu_some", _pct),
    _opt("load1", _opt_nonneg),
    _opt("ncpu", _opt_nonneg_int),
    _opt("proc_cpu_pct", _pct),
    Spec("missing", c_list(c_str(64), 64), required=False, default=()),
)


_EMPTY_TELEMETRY = Telemetry()

# An empty map (a node without telemetry) is the shared empty record.
telemetry_check = _Record(_TELEMETRY_SPECS, Telemetry, empty=_EMPTY_TELEMETRY)


def _post_rank_window(kw: dict[str, Any], path: str) -> None:
    # `rank` is the job-wide rank and `nranks` the communicator's size, so a
    # rank of a second island's communicator may well be >= nranks.
    if kw["step_hi"] < kw["step_lo"]:
        raise _fail(path, "step_hi", f"step_hi >= step_lo ({kw['step_lo']})", kw["step_hi"])
    if kw["coll_hi"] < kw["coll_lo"]:
        raise _fail(path, "coll_hi", f"coll_hi >= coll_lo ({kw['coll_lo']})", kw["coll_hi"])


_RANK_WINDOW_SPECS: tuple[Spec, ...] = (
    Spec("job", _name),
    Spec("comm", _name),
    Spec("rank", _nonneg_int),
    Spec("nranks", c_int(1)),
    Spec("host", _name),
    Spec("window", _nonneg_int),
    Spec("step_lo", _nonneg_int),
    Spec("step_hi", _nonneg_int),
    Spec("coll_lo", _nonneg_int),
    Spec("coll_hi", _nonneg_int),
    Spec("gap_ms", _nonneg),
    Spec("coll_ms", _nonneg),
    Spec("step_ms", _nonneg),
    Spec("collectives", _nonneg_int),
    Spec("bytes", _nonneg_int),
    Spec("lost", _nonneg_int),
    Spec("clock", c_choice(("device", "host", "ticks"))),
    _opt("island", c_opt(c_str(64))),
    _opt("hw_class", _opt_name),
    _opt("samples", _opt_nonneg_int),
    _opt("bridge_ms", _opt_nonneg),
    _opt("bridge_peer", _opt_nonneg_int),
    # Absent telemetry is the empty record (frozen, all None), shared.
    Spec("telemetry", telemetry_check, required=False, default=_EMPTY_TELEMETRY),
)

rank_window_check = _Record(
    _RANK_WINDOW_SPECS,
    RankWindow,
    _post_rank_window,
    fast_post="{step_hi} < {step_lo} or {coll_hi} < {coll_lo}",
)

_RANK_PROGRESS_SPECS: tuple[Spec, ...] = (
    Spec("job", _name),
    Spec("comm", _name),
    Spec("rank", _nonneg_int),
    Spec("host", _name),
    Spec("last_done", c_int(-1)),
    Spec("inflight", _opt_nonneg_int),
    Spec("inflight_s", _nonneg),
    Spec("idle_s", _nonneg),
    _opt("finished", c_bool, False),
)

rank_progress_check = _Record(_RANK_PROGRESS_SPECS, RankProgress)


_RANK_INFO_SPECS: tuple[Spec, ...] = (
    Spec("job", _name),
    Spec("comm", _name),
    Spec("rank", _nonneg_int),
    Spec("nranks", c_int(1)),
    _opt("pid", c_opt(c_int(1, 1 << 31))),
    _opt("gpu_index", _opt_nonneg_int),
    _opt("vendor", c_opt(c_str(64))),
    _opt("gpu_model", _opt_name),
)

# RankInfo.rank is the job-wide rank and nranks the communicator's size, so
# there is no ordering between them to check (same for RankWindow).
rank_info_check = _Record(_RANK_INFO_SPECS, RankInfo)


def rank_window_from_dict(d: Mapping[str, Any], path: str = "rank_window") -> RankWindow:
    """Rebuild a RankWindow from a map with full validation (raises ProtocolError)."""
    return rank_window_check.build(d if type(d) is dict else dict(d), path)


def rank_progress_from_dict(d: Mapping[str, Any], path: str = "rank_progress") -> RankProgress:
    """Rebuild a RankProgress from a map with full validation (raises ProtocolError)."""
    return rank_progress_check.build(d if type(d) is dict else dict(d), path)


def rank_info_from_dict(d: Mapping[str, Any], path: str = "rank_info") -> RankInfo:
    """Rebuild a RankInfo from a map with full validation (raises ProtocolError)."""
    return rank_info_check.build(d if type(d) is dict else dict(d), path)


def telemetry_from_dict(d: Mapping[str, Any], path: str = "telemetry") -> Telemetry:
    """Rebuild a Telemetry from a map with full validation (raises ProtocolError)."""
    return telemetry_check.build(d if type(d) is dict else dict(d), path)


def _post_ack(kw: dict[str, Any], path: str) -> None:
    if kw["upto"] is None and kw["control_id"] is None:
        raise ProtocolError(
            "invalid",
            f"{path}.upto: missing; an ack needs upto or control_id (or both)",
            msg_type="ack",
            field=f"{path}.upto",
        )


_nonce = c_bytes(_NONCE_MIN, _NONCE_MAX)
_proof = c_bytes(32, 32)

_MESSAGE_SPECS: dict[str, tuple[tuple[Spec, ...], Callable[..., None] | None]] = {
    "hello": (
        (
            Spec("agent_id", _name),
            Spec("host", _name),
            Spec("agent_version", c_str(64)),
            Spec("nonce", _nonce),
            Spec("ranks", c_list(rank_info_check, 4096), required=False, default=()),
            _opt("incarnation", c_str(64, nonempty=False), ""),
        ),
        None,
    ),
    "welcome": (
        (
            Spec("coordinator_id", _name),
            Spec("nonce", _nonce),
            Spec("proof", _proof),
            Spec("settings", c_map, required=False, factory=dict),
        ),
        None,
    ),
    "auth": ((Spec("proof", _proof),), None),
    "windows": (
        (Spec("host", _name), Spec("windows", c_list(rank_window_check, 16384))),
        None,
    ),
    "heartbeat": (
        (
            Spec("progress", c_list(rank_progress_check, 16384), required=False, default=()),
            _opt("buffered", _nonneg_int, 0),
            _opt("dropped", _nonneg_int, 0),
            Spec("plan_acks", c_list(c_map, 4096), required=False, default=()),
        ),
        None,
    ),
    "dump": (
        (
            Spec("job", _name),
            Spec("comm", _name),
            Spec("rank", _nonneg_int),
            _opt("request_id", c_str(nonempty=False), ""),
            Spec("records", c_list(c_map, 4096), required=False, default=()),
        ),
        None,
    ),
    "control": (
        (
            Spec("control_id", _name),
            Spec("action", c_choice(CONTROL_ACTIONS)),
            Spec("body", c_map, required=False, factory=dict),
        ),
        None,
    ),
    "ack": (
        (
            _opt("upto", _opt_nonneg_int),
            _opt("control_id", _opt_name),
            _opt("ok", c_bool, True),
            _opt("detail", c_str(_TEXT_MAX, nonempty=False), ""),
        ),
        _post_ack,
    ),
    "error": (
        (
            Spec("code", c_str(64)),
            Spec("text", c_str(_TEXT_MAX, nonempty=False)),
            _opt("fatal", c_bool, False),
        ),
        None,
    ),
}

_ENVELOPE = ("v", "t", "seq")

# The same condition as _post_ack, for the generated validator (true = refuse).
_FAST_POSTS: dict[str, str] = {"ack": "{upto} is None and {control_id} is None"}

_FAST_MESSAGES: dict[str, Callable[[Any, int, tuple[int, int]], Message]] = {
    t: _fastcheck.compile_message(
        specs, MESSAGE_TYPES[t], _kind_of, post=_FAST_POSTS.get(t), label=t
    )
    for t, (specs, _) in _MESSAGE_SPECS.items()
}


def message_from_map(m: Any, version: tuple[int, int] = PROTOCOL_VERSION) -> Message:
    """Validate one decoded frame body and build its typed message (raises ProtocolError)."""
    if type(m) is not dict:
        raise ProtocolError(
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
        raise ProtocolError(
            "invalid",
            f"{shown_t}.v: expected protocol version [major, minor], got {v!r:.40}",
            msg_type=shown_t,
            field="v",
        )
    peer = (v[0], v[1])
    if peer[0] != version[0]:
        raise ProtocolError(
            "version",
            version_mismatch_text(peer, version),
            msg_type=shown_t,
            field="v",
            peer_version=peer,
        )
    if type(t) is not str or t not in _MESSAGE_SPECS:
        raise ProtocolError(
            "unknown_type", f"unknown message type {t!r:.40}", msg_type=shown_t, field="t"
        )
    seq = m.get("seq")
    if type(seq) is not int or not (0 <= seq <= _U63):
        raise ProtocolError(
            "invalid",
            f"{t}.seq: expected integer in [0, {_U63}], got {seq!r:.40}",
            msg_type=t,
            field="seq",
        )
    try:
        return _FAST_MESSAGES[t](m, seq, peer)
    except Exception:
        pass  # refused (or a fast-path surprise): the precise walk below says why
    specs, post = _MESSAGE_SPECS[t]
    kw = _build(specs, m, t)
    if post is not None:
        post(kw, t)
    return MESSAGE_TYPES[t](seq=seq, version=peer, **kw)


# --------------------------------------------------------------------------- to maps

_RW_NAMES = tuple(f.name for f in fields(RankWindow) if f.name != "telemetry")
_rw_values = attrgetter(*_RW_NAMES)
_TEL_NAMES = tuple(f.name for f in fields(Telemetry))
_tel_values = attrgetter(*_TEL_NAMES)
_RP_NAMES = tuple(f.name for f in fields(RankProgress))
_rp_values = attrgetter(*_RP_NAMES)
_RI_NAMES = tuple(f.name for f in fields(RankInfo))
_ri_values = attrgetter(*_RI_NAMES)


def telemetry_to_map(t: Telemetry) -> dict[str, Any]:
    # Absent telemetry (None) is left out: the decoder defaults it back to
    # None, and a node without GPU telemetry then costs a few bytes per window.
    return {
        k: v
        for k, v in zip(_TEL_NAMES, _tel_values(t), strict=True)
        if v is not None and not (k == "missing" and not v)
    }


def rank_window_to_map(w: RankWindow) -> dict[str, Any]:
    d = dict(zip(_RW_NAMES, _rw_values(w), strict=True))
    d["telemetry"] = telemetry_to_map(w.telemetry)
    return d


def rank_progress_to_map(p: RankProgress) -> dict[str, Any]:
    return dict(zip(_RP_NAMES, _rp_values(p), strict=True))


def rank_info_to_map(r: RankInfo) -> dict[str, Any]:
    return dict(zip(_RI_NAMES, _ri_values(r), strict=True))


def _fields_map(msg: Message) -> dict[str, Any]:
    t = type(msg)
    if t is Windows:
        assert isinstance(msg, Windows)
        return {"host": msg.host, "windows": [rank_window_to_map(w) for w in msg.windows]}
    if t is Heartbeat:
        assert isinstance(msg, Heartbeat)
        return {
            "progress": [rank_progress_to_map(p) for p in msg.progress],
            "buffered": msg.buffered,
            "dropped": msg.dropped,
            "plan_acks": msg.plan_acks,
        }
    if t is Hello:
        assert isinstance(msg, Hello)
        return {
            "agent_id": msg.agent_id,
            "host": msg.host,
            "agent_version": msg.agent_version,
            "nonce": msg.nonce,
            "ranks": [rank_info_to_map(r) for r in msg.ranks],
            "incarnation": msg.incarnation,
        }
    specs, _ = _MESSAGE_SPECS[t.TYPE]
    return {s.name: getattr(msg, s.name) for s in specs}


def message_to_map(
    msg: Message, *, seq: int | None = None, version: tuple[int, int] = PROTOCOL_VERSION
) -> dict[str, Any]:
    """The wire map of a message (envelope included)."""
    d = _fields_map(msg)
    d["v"] = version
    d["t"] = msg.TYPE
    d["seq"] = msg.seq if seq is None else seq
    return d
