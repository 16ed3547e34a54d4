"""Corrections through the real Coordinator service (coordinator/corrections.py): its
incidents, state files and restarts, with agents as the protocol server presents them
(PeerInfo, their acks). A stand-in server records the controls it is asked to send."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

from artemis.coordinator.corrections import control_id
from artemis.coordinator.journal import AssemblyJournal
from artemis.coordinator.metrics import Metrics
from artemis.coordinator.service import Coordinator
from artemis.coordinator.sinks import FindingsWriter
from artemis.detect.incident_state import MARKERS
from artemis.detect.settings import Settings
from artemis.protocol.messages import Ack, RankInfo, Windows
from artemis.protocol.peers import PeerInfo
from artemis.protocol.records import RankWindow, Telemetry
from artemis.rebalance.outputs import PlansWriter
from artemis.report.html import action_part
from artemis.report.story import story
from service_records import rank_window

JOB = "cj"
NRANKS = 8
SLOW = 5


class Server:
    """The protocol server's send side, as the coordinator uses it: every control kept."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []

    async def send_control(
        self, agent: str, action: str, body: dict[str, Any], *, control_id: str | None = None
    ) -> str:
        self.sent.append((agent, action, body))
        return control_id or f"ctl-{len(self.sent)}"

    def corrections(self) -> list[dict[str, Any]]:
        return [b for _a, action, b in self.sent if action == "correction"]


def peer(host: int, minor: int = 2, announced: bool = True) -> PeerInfo:
    """Agent ``a<host>`` on host ``h<host>``; ``announced`` False: it connected before the
    job's rings appeared, and its hello names no rank."""
    ranks = tuple(RankInfo(JOB, "c0", r, NRANKS) for r in range(4 * host, 4 * host + 4))
    ranks = ranks if announced else ()
    return PeerInfo(
        f"a{host}", f"h{host}", "t", "i", ranks, "127.0.0.1:1", (1, minor), 0.0, host + 1
    )


def locked_window(
    job: str, rank: int, window: int, slow: set[int], nranks: int, per_host: int
) -> RankWindow:
    """Rank `rank`'s window in a job of `nranks`, `per_host` ranks a host: ranks in `slow`
    compute 30% longer with their SM clock locked low (no throttle reason); the others
    wait for them in their collectives (one step time for all)."""
    step = 140.0 if slow else 111.0
    gap = 130.0 if rank in slow else 100.0 + rank * 0.5
    sm = 1200.0 if rank in slow else 1980.0
    tel = Telemetry(gpu_index=rank % per_host, sm_mhz=sm, sm_mhz_max=1980.0, throttle={})
    base = rank_window(job, rank, window, gap_ms=gap, step_ms=step)
    return dataclasses.replace(
        base, nranks=nranks, host=f"h{rank // per_host}", coll_ms=step - gap, samples=8,
        telemetry=tel,
    )  # fmt: skip


def make(
    tmp: Path, settings: Settings, wall: list[float], minor: int = 2, unannounced: int = -1
) -> Coordinator:
    """A coordinator with agents a0 and a1 connected (``unannounced``: the host whose
    agent connected before the job's rings appeared)."""
    out = (FindingsWriter(tmp / "f.jsonl"), PlansWriter(tmp / "p.jsonl"), Metrics())

    def now() -> float:
        return wall[0]

    c = Coordinator(settings, *out, deadline_s=30.0, grace_s=0.0, clock=now, wall=now)
    c.server = Server()
    c.restore(AssemblyJournal(tmp / "f.assembly"))
    for h in (0, 1):
        c.on_connect(peer(h, minor, h != unannounced))
    return c


async def windows(c: Coordinator, lo: int, hi: int, slow: bool, wall: list[float]) -> None:
    for w in range(lo, hi):
        wall[0] += 1.0
        for h in (0, 1):
            bad = {SLOW} if slow else set()
            recs = tuple(locked_window(JOB, r, w, bad, NRANKS, 4) for r in range(4 * h, 4 * h + 4))
            await c.on_message(peer(h), Windows(host=f"h{h}", windows=recs))


def incidents(tmp: Path) -> dict[str, dict[str, Any]]:
    """The last line of each incident id."""
    out: dict[str, dict[str, Any]] = {}
    for line in (tmp / "incidents.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["id"]] = r
    return out


def corrections_of(tmp: Path) -> list[dict[str, Any]]:
    return [
        a for r in incidents(tmp).values() for a in r["actions"] if a.get("type") == "correction"
    ]


def ack(
    c: Coordinator, body: dict[str, Any], status: str | None, ok: bool = True, **extra: Any
) -> None:
    """The agent's ack of the correction control ``body``, under the control id it went
    out with; ``status`` None: an ack with no result (an agent that applies none)."""
    result = {"id": body["id"], "action": body["action"], "gpu": body["gpu"], "status": status}
    result.update(extra)
    host = 0 if body["rank"] < 4 else 1
    got = Ack(
        control_id=control_id(body),
        ok=ok,
        detail=str(extra.get("error", "")),
        result=result if status is not None else None,
    )
    asyncio.run(c.on_control_ack(peer(host), got))


APPLY = Settings(corrections="apply")


def test_clocks_incident_gets_reset_clocks_verified_and_recovered(tmp_path: Path) -> None:
    wall = [1000.0]
    c = make(tmp_path, APPLY, wall)
    asyncio.run(windows(c, 0, 14, True, wall))
    sent = c.server.corrections()
    assert len(sent) == 1, sent
    body = sent[0]
    assert body["op"] == "apply" and body["action"] == "reset_clocks"
    assert body["rank"] == SLOW and body["gpu"] == SLOW % 4
    ack(c, body, "applied", before={"vendor": "nvidia", "sm_mhz": 1200}, after={"sm_mhz": 1980})
    asyncio.run(windows(c, 14, 30, False, wall))
    (entry,) = corrections_of(tmp_path)
    assert entry["status"] == "verified", entry
    assert entry["before"]["sm_mhz"] == 1200 and entry["host"] == "h1"
    rec = next(r for r in incidents(tmp_path).values() if r["rank"] == SLOW)
    assert rec["verdict"] == "recovered" and "reset_clocks" in rec["reason"]
    marks = [m["marker"] for m in rec["markers"]]
    assert {"applied", "verified"} <= set(marks)
    assert marks == sorted(marks, key=MARKERS.index), marks
    # the report tells the action and what it measured
    told = story(rec)
    assert "Correction reset_clocks on GPU 1 of h1 was verified" in told, told
    assert f'data-correction="{entry["id"]}"' in action_part(rec)
    assert len(c.server.corrections()) == 1  # applied once, nothing rolled back


def test_an_agent_of_protocol_1_1_gets_no_correction_and_the_entry_says_why(
    tmp_path: Path,
) -> None:
    wall = [1000.0]
    c = make(tmp_path, APPLY, wall, minor=1)
    asyncio.run(windows(c, 0, 14, True, wall))
    assert c.server.corrections() == []
    (entry,) = corrections_of(tmp_path)
    assert entry["status"] == "recommended"
    assert "agent speaks protocol 1.1; corrections need 1.2" in entry["reason"]


def test_default_recommends_and_runs_nothing(tmp_path: Path) -> None:
    wall = [1000.0]
    c = make(tmp_path, Settings(), wall)
    asyncio.run(windows(c, 0, 14, True, wall))
    assert c.server.corrections() == []
    (entry,) = corrections_of(tmp_path)
    assert entry["status"] == "recommended" and entry["action"] == "reset_clocks"


def test_a_failed_correction_escalates_with_the_library_error(tmp_path: Path) -> None:
    wall = [1000.0]
    c = make(tmp_path, APPLY, wall)
    asyncio.run(windows(c, 0, 14, True, wall))
    (body,) = c.server.corrections()
    ack(c, body, "failed", error="NVML_ERROR_NOT_SUPPORTED: Not Supported")
    asyncio.run(windows(c, 14, 18, True, wall))
    c.flush()  # the job ends still slow
    rec = next(r for r in incidents(tmp_path).values() if r["rank"] == SLOW)
    (entry,) = [a for a in rec["actions"] if a.get("type") == "correction"]
    assert entry["status"] == "failed" and "NVML_ERROR_NOT_SUPPORTED" in entry["reason"]
    assert rec["verdict"] == "escalated" and "NVML_ERROR_NOT_SUPPORTED" in rec["reason"]


def test_restart_mid_correction_resends_then_verifies_or_rolls_back_once(tmp_path: Path) -> None:
    wall = [1000.0]
    a = make(tmp_path, APPLY, wall)
    asyncio.run(windows(a, 0, 14, True, wall))
    (body,) = a.server.corrections()
    del a  # killed before the agent's ack came in

    b = make(tmp_path, APPLY, wall)
    asyncio.run(b.tick())  # what was sent and not acknowledged goes out again
    asyncio.run(b._flush_controls())
    (again,) = b.server.corrections()
    assert again == body  # the same id: the agent applies it once (idempotent by id)
    ack(b, again, "applied", before={"vendor": "nvidia", "sm_mhz": 1200})
    # it did not help: the clock stays low (the fault is not the setting)
    asyncio.run(windows(b, 14, 18, True, wall))
    rollbacks = [x for x in b.server.corrections() if x["op"] == "rollback"]
    assert len(rollbacks) == 1 and rollbacks[0]["before"] == {"vendor": "nvidia", "sm_mhz": 1200}
    del b  # killed again before the rollback's ack

    c = make(tmp_path, APPLY, wall)
    asyncio.run(c.tick())
    asyncio.run(c._flush_controls())
    (rb,) = c.server.corrections()
    assert rb["op"] == "rollback" and rb["id"] == body["id"]
    ack(c, rb, "rolled_back", after={"sm_mhz": 1200})
    ack(c, rb, "rolled_back", after={"sm_mhz": 1200})  # a resent ack changes nothing
    asyncio.run(windows(c, 18, 22, True, wall))
    assert [x["op"] for x in c.server.corrections()] == ["rollback"]  # no second apply
    entries = [e for e in corrections_of(tmp_path) if e["id"] == body["id"]]
    assert [h["status"] for h in entries[-1]["history"]].count("rolled_back") == 1
    assert entries[-1]["status"] == "rolled_back"


def test_an_approval_waits_across_a_restart_and_is_sent_once_approved(tmp_path: Path) -> None:
    wall = [1000.0]
    held = Settings(corrections="apply", corrections_approve=("reset_clocks",))
    a = make(tmp_path, held, wall)
    asyncio.run(windows(a, 0, 14, True, wall))
    (waiting,) = a.corrections.pending()
    assert a.server.corrections() == []
    del a  # killed while it waits for a person

    b = make(tmp_path, held, wall)
    assert [p["id"] for p in b.corrections.pending()] == [waiting["id"]]
    reply = b.correction_command({"cmd": "approve", "id": waiting["id"]})
    asyncio.run(b._flush_controls())
    assert reply["correction"]["status"] == "approved"
    (body,) = b.server.corrections()
    assert body["id"] == waiting["id"] and body["op"] == "apply"
    entry = next(e for e in corrections_of(tmp_path) if e["id"] == waiting["id"])
    assert [h["status"] for h in entry["history"]] == ["awaiting_approval", "approved"]


def test_acks_are_matched_by_control_id_across_a_restart(tmp_path: Path) -> None:
    """The control id is the correction's id (a rollback's with :rollback): a restarted
    coordinator matches an ack with no result (an agent that applies no corrections)
    to its correction, and an apply's ack that comes in after the rollback went out is
    not taken for the rollback's."""
    wall = [1000.0]
    a = make(tmp_path, APPLY, wall)
    asyncio.run(windows(a, 0, 14, True, wall))
    (body,) = a.server.corrections()
    assert control_id(body) == body["id"]
    ack(a, body, "applied", before={"vendor": "nvidia", "sm_mhz": 1200})
    asyncio.run(windows(a, 14, 18, True, wall))  # no gain: the rollback goes out
    (rb,) = [x for x in a.server.corrections() if x["op"] == "rollback"]
    assert control_id(rb) == f"{body['id']}:rollback"
    ack(a, body, "applied", before={"vendor": "nvidia", "sm_mhz": 1200})  # a late resend's
    assert corrections_of(tmp_path)[-1]["status"] == "applied"  # still waits for the rollback
    del a  # killed before the rollback's ack

    b = make(tmp_path, APPLY, wall)  # never sent the rollback itself
    ack(b, rb, None, ok=False, error="this agent does not accept control messages")
    (entry,) = [e for e in corrections_of(tmp_path) if e["id"] == body["id"]][-1:]
    assert entry["status"] == "failed", entry
    assert "does not accept control messages" in entry["reason"], entry
    asyncio.run(b.tick())
    asyncio.run(b._flush_controls())
    assert b.server.corrections() == []  # ended: not resent


def test_rebalancing_waits_for_the_correction_then_takes_over(tmp_path: Path) -> None:
    """rebalance and corrections both apply: the correction goes first (at the
    confirmation), no plan goes out while it is on its way; once it failed the
    incident is left to rebalancing."""
    wall = [1000.0]
    c = make(tmp_path, Settings(corrections="apply", rebalance="apply"), wall)
    asyncio.run(windows(c, 0, 12, True, wall))
    plans = [b for _a, action, b in c.server.sent if action == "plan"]
    (body,) = c.server.corrections()
    assert plans == [], plans  # without the hold: a plan at window 5
    ack(c, body, "failed", error="NVML_ERROR_NO_PERMISSION: Insufficient Permissions")
    asyncio.run(windows(c, 12, 16, True, wall))
    plans = [b for _a, action, b in c.server.sent if action == "plan"]
    split = plans[0]["plan"]["samples"] if plans else None
    assert split is not None and split[SLOW] < max(split), plans


def test_an_agent_that_connected_before_the_job_still_gets_its_correction(
    tmp_path: Path,
) -> None:
    """An agent whose hello came before the job's rings appeared named no rank: the
    rank's agent is the one connected from the host its windows come from."""
    wall = [1000.0]
    c = make(tmp_path, APPLY, wall, unannounced=1)  # the slow rank's agent named none

    async def run() -> None:
        for w in range(14):
            wall[0] += 1.0
            for h in (1, 0):  # (the assembler waits for the ranks hellos named: h0's)
                recs = tuple(
                    locked_window(JOB, r, w, {SLOW}, NRANKS, 4) for r in range(4 * h, 4 * h + 4)
                )
                await c.on_message(peer(h), Windows(host=f"h{h}", windows=recs))

    asyncio.run(run())
    sent = [(agent, b) for agent, action, b in c.server.sent if action == "correction"]
    assert [(agent, b["rank"], b["op"]) for agent, b in sent] == [("a1", SLOW, "apply")], sent


def test_a_graceful_stop_mid_verification_carries_the_correction_over(tmp_path: Path) -> None:
    """A coordinator stopped gracefully (SIGTERM) while a correction is being verified
    closes the incident (job_end); back, it reopens the episode under a new id, and the
    correction goes on with it: rolled back once, not left applied for ever."""
    wall = [1000.0]
    a = make(tmp_path, APPLY, wall)
    asyncio.run(windows(a, 0, 14, True, wall))
    (body,) = a.server.corrections()
    ack(a, body, "applied", before={"vendor": "nvidia", "sm_mhz": 1200})
    asyncio.run(windows(a, 14, 15, True, wall))
    a.flush()  # the graceful stop

    b = make(tmp_path, APPLY, wall)
    asyncio.run(windows(b, 15, 24, True, wall))  # it did not help: still slow
    (rb,) = b.server.corrections()
    assert rb["op"] == "rollback" and rb["id"] == body["id"] and rb["incident"] != body["incident"]
    ack(b, rb, "rolled_back", after={"vendor": "nvidia", "sm_mhz": 1200})
    b.flush()
    recs = incidents(tmp_path)
    new = recs[rb["incident"]]
    (entry,) = [a for a in new["actions"] if a.get("type") == "correction"]
    assert entry["id"] == body["id"] and entry["status"] == "rolled_back", entry
    assert new["verdict"] == "escalated", new["reason"]


def test_a_correction_never_answered_times_out_and_rebalancing_takes_over(
    tmp_path: Path,
) -> None:
    """The rank's agent never answers the apply: past correction_ack_timeout_s (the
    coordinator's tick) the correction fails naming the host and the wait, the plan
    held back for it goes out, and a late 'applied' is rolled back, not revived."""
    wall = [1000.0]
    s = Settings(corrections="apply", rebalance="apply", correction_ack_timeout_s=30.0)
    c = make(tmp_path, s, wall)
    asyncio.run(windows(c, 0, 12, True, wall))
    (body,) = c.server.corrections()
    assert [b for _a, action, b in c.server.sent if action == "plan"] == []
    wall[0] += 30.0
    asyncio.run(c.tick())
    rollback = c.server.corrections()[1:]
    assert [(b["op"], b["id"]) for b in rollback] == [("rollback", body["id"])]
    (entry,) = corrections_of(tmp_path)
    assert entry["status"] == "failed", entry
    assert "no answer from the agent on h1 within 30 s" in entry["reason"]
    asyncio.run(windows(c, 12, 16, True, wall))
    plans = [b for _a, action, b in c.server.sent if action == "plan"]
    assert plans and plans[0]["plan"]["samples"][SLOW] < max(plans[0]["plan"]["samples"])
    # the late ack: kept in the history, and the GPU put back as it was
    ack(c, body, "applied", before={"vendor": "nvidia", "sm_mhz": 1200})
    last = c.server.corrections()[-1]
    assert last["op"] == "rollback" and last["before"] == {"vendor": "nvidia", "sm_mhz": 1200}
    (entry,) = corrections_of(tmp_path)
    assert entry["status"] == "failed" and entry["history"][-1]["late"] == "apply"
    c.flush()  # the job ends: the failed correction left it to escalation
    rec = next(r for r in incidents(tmp_path).values() if r["rank"] == SLOW)
    assert rec["verdict"] == "escalated", rec["reason"]
