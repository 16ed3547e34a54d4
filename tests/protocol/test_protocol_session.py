"""Sans-IO sessions driven message by message: handshake, refusals, control gating, dedup."""

from __future__ import annotations

from typing import Any

import pytest
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.messages import (
    Ack,
    Auth,
    Control,
    Error,
    Message,
    ProtocolError,
    RankInfo,
    Welcome,
)
from artemis.protocol.session import (
    Acked,
    AgentIdentity,
    AgentSession,
    BadFrame,
    Close,
    ControlAcked,
    ControlReceived,
    CoordinatorSession,
    Deliver,
    Duplicate,
    Established,
    Outbox,
    PeerEstablished,
    Refused,
    Send,
    SeqTracker,
)
from protocol_helpers import SECRET, heartbeat, windows_msg

IDENT = AgentIdentity("agent-a", "node-a", "0.1.0", incarnation="inc-1")


def wire(msg: Message, version: tuple[int, int] = (1, 0), peer: tuple[int, int] = (1, 0)) -> Any:
    """Send a message across a real encode/decode, as the peer's decoder would see it."""
    out = FrameDecoder(version=peer).feed(encode(msg, version=version))
    assert len(out) == 1
    return out[0]


def sends(effects: list[Any]) -> list[Message]:
    return [e.msg for e in effects if isinstance(e, Send)]


def handshake(
    agent_secret: bytes = SECRET,
    coord_secret: bytes = SECRET,
    tracker: SeqTracker | None = None,
    ident: AgentIdentity = IDENT,
) -> tuple[AgentSession, CoordinatorSession, list[Any], list[Any]]:
    a = AgentSession(agent_secret, ident)
    c = CoordinatorSession(coord_secret, tracker or SeqTracker(), coordinator_id="coord")
    ce = c.receive(wire(a.hello()))
    ae: list[Any] = []
    for m in sends(ce):
        ae += a.receive(wire(m))
    ce2: list[Any] = []
    for m in sends(ae):
        ce2 += c.receive(wire(m))
    if any(isinstance(e, PeerEstablished) for e in ce2):
        ae += a.receive(wire(c.confirm()))
    return a, c, ae, ce + ce2


def test_handshake_establishes_both_sides() -> None:
    a, c, ae, ce = handshake()
    assert a.state == c.state == "established"
    assert [type(m).__name__ for m in sends(ce)] == ["Welcome"]
    est = [e for e in ae if isinstance(e, Established)]
    assert est and est[0].upto == 0 and est[0].coordinator_id == "coord"
    assert c.hello is not None and c.hello.agent_id == "agent-a"


def test_an_established_peers_ranks_hold_each_repeated_value_once() -> None:
    # A peer's ranks are held while it is connected: decoded, every rank would carry a
    # copy of its own of the job's name, the communicator's and its size.
    ranks = tuple(RankInfo("job-" + "x" * 40, "comm-" + "y" * 40, r, 4096) for r in range(64))
    ident = AgentIdentity("agent-a", "node-a", "0.1.0", ranks=ranks, incarnation="inc-1")
    _, c, _, ce = handshake(ident=ident)
    (est,) = [e for e in ce if isinstance(e, PeerEstablished)]
    got = est.hello.ranks
    assert got == ranks and c.hello is est.hello
    for name in ("job", "comm", "nranks"):
        assert len({id(getattr(r, name)) for r in got}) == 1, name


def test_wrong_secret_refused_by_coordinator_side_checks() -> None:
    # The agent holds the wrong secret: it rejects the coordinator's proof first
    # (mutual auth), tells the coordinator, and never sends its own proof.
    a, c, ae, ce = handshake(agent_secret=b"wrong")
    assert a.state == "closed"
    ref = [e for e in ae if isinstance(e, Refused)]
    assert ref and ref[0].reason == "auth"
    assert not any(isinstance(m, Auth) for m in sends(ae))
    assert c.state == "closed"
    assert any(isinstance(e, Refused) and e.reason == "auth" for e in ce)


def test_forged_agent_proof_refused() -> None:
    a = AgentSession(SECRET, IDENT)
    c = CoordinatorSession(SECRET, SeqTracker())
    welcome = sends(c.receive(wire(a.hello())))[0]
    assert isinstance(welcome, Welcome)
    eff = c.receive(wire(Auth(seq=2, proof=b"\0" * 32)))
    assert c.state == "closed"
    err = sends(eff)[0]
    assert isinstance(err, Error) and err.code == "auth" and err.fatal
    assert any(isinstance(e, Refused) and e.reason == "auth" for e in eff)


def test_version_mismatch_refused_on_both_sides_naming_both() -> None:
    # A 2.0 agent hello reaches a 1.0 coordinator.
    a = AgentSession(SECRET, IDENT, version=(2, 0))
    c = CoordinatorSession(SECRET, SeqTracker(), version=(1, 0))
    eff = c.receive(wire(a.hello(), version=(2, 0), peer=(1, 0)))
    ref = [e for e in eff if isinstance(e, Refused)]
    assert ref and ref[0].reason == "version" and "2.0" in ref[0].text and "1.0" in ref[0].text
    err = sends(eff)[0]
    assert isinstance(err, Error) and err.code == "version"
    # The 2.0 agent cannot decode the 1.0 error frame, and says so naming both.
    eff2 = a.receive(wire(err, version=(1, 0), peer=(2, 0)))
    assert isinstance(eff2[0], Refused) and eff2[0].reason == "version"
    assert "1.0" in eff2[0].text and "2.0" in eff2[0].text and eff2[0].peer_version == (1, 0)


def test_control_only_after_auth() -> None:
    a = AgentSession(SECRET, IDENT)
    a.hello()
    eff = a.receive(wire(Control(seq=1, control_id="c1", action="dump")))
    assert a.state == "closed" and isinstance(eff[0], Refused) and eff[0].reason == "protocol"
    assert not any(isinstance(e, ControlReceived) for e in eff)
    a, c, _, _ = handshake()
    ctl = c.control("plan", {"p": 1})
    eff = a.receive(wire(ctl))
    assert eff == [ControlReceived(wire(ctl))]
    ack = a.control_result(ctl.control_id, True, "applied")
    assert c.receive(wire(ack)) == [ControlAcked(wire(ack))]
    with pytest.raises(ValueError, match="action"):
        c.control("reboot")


def test_data_before_auth_is_refused_not_delivered() -> None:
    c = CoordinatorSession(SECRET, SeqTracker())
    eff = c.receive(wire(heartbeat(seq=1)))
    assert not any(isinstance(e, Deliver) for e in eff)
    assert isinstance(eff[-1], Refused) and eff[-1].reason == "protocol"


def test_dedup_across_connections_and_new_incarnation() -> None:
    tracker = SeqTracker()
    _, c, _, _ = handshake(tracker=tracker)
    for s in (1, 2, 3):
        (d,) = c.receive(wire(heartbeat(seq=s)))
        assert isinstance(d, Deliver)
        c.delivered(d.msg)
    # Reconnect of the same process: the first ack tells the agent upto=3,
    # and a resend of 2..3 is acked again but not delivered.
    _, c2, ae, _ = handshake(tracker=tracker)
    assert [e.upto for e in ae if isinstance(e, Established)] == [3]
    eff = c2.receive(wire(heartbeat(seq=3)))
    assert isinstance(eff[0], Duplicate)
    assert isinstance(sends(eff)[0], Ack) and sends(eff)[0].upto == 3
    assert isinstance(c2.receive(wire(heartbeat(seq=4)))[0], Deliver)
    # A restarted agent process (new incarnation) starts again at seq 1.
    ident = AgentIdentity("agent-a", "node-a", "0.1.0", incarnation="inc-2")
    _, c3, ae3, _ = handshake(tracker=tracker, ident=ident)
    assert [e.upto for e in ae3 if isinstance(e, Established)] == [0]
    assert isinstance(c3.receive(wire(heartbeat(seq=1)))[0], Deliver)


def test_bad_frames_after_auth_only_drop_the_frame_unless_fatal() -> None:
    _, c, _, _ = handshake()
    e = ProtocolError("invalid", "heartbeat.buffered: expected ...")
    eff = c.receive(e)
    assert isinstance(eff[1], BadFrame) and c.state == "established"
    assert isinstance(sends(eff)[0], Error) and not sends(eff)[0].fatal
    eff = c.receive(ProtocolError("oversize", "too big", fatal=True))
    assert isinstance(eff[-1], Close) and c.state == "closed"


def test_agent_acks_and_unexpected_messages() -> None:
    a, _, _, _ = handshake()
    assert a.receive(wire(Ack(seq=9, upto=5))) == [Acked(5)]
    eff = a.receive(wire(Welcome(coordinator_id="x", nonce=b"n" * 32, proof=b"p" * 32)))
    assert isinstance(eff[0], BadFrame) and eff[0].error.reason == "unexpected"
    assert a.state == "established"


def test_outbox_sequencing_acks_and_drops_oldest() -> None:
    ob = Outbox(capacity=3)
    seqs = [ob.add(heartbeat())[0] for _ in range(3)]
    assert seqs == [1, 2, 3] and ob.buffered == 3
    seq, dropped = ob.add(windows_msg(2))
    assert seq == 4 and dropped == [1] and ob.dropped == 1
    assert [s for s, _ in ob.frames_from(0)] == [2, 3, 4]
    assert [s for s, _ in ob.frames_from(3)] == [3, 4]
    # Frames carry their seq on the wire.
    (_, f3), _ = list(ob.frames_from(3))
    assert FrameDecoder().feed(f3)[0].seq == 3
    assert ob.ack(3) == 2 and ob.first_seq == 4 and ob.acked_upto == 3
    assert ob.ack(2) == 0
    with pytest.raises(TypeError):
        ob.add(Ack(upto=1))
    byte_capped = Outbox(capacity=100, max_bytes=len(encode(heartbeat())) * 2 + 10)
    for _ in range(5):
        byte_capped.add(heartbeat())
    assert byte_capped.buffered == 2 and byte_capped.dropped == 3
