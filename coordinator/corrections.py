"""The coordinator's side of corrections: the I/O around the pure ``CorrectionBook``.

One book per job (rebalance/corrections.py decides). This shell knows what the
core must not: which agent serves a rank and what protocol it announced (a
correction goes only to an agent of 1.2 or later), the rank's host, GPU index and
power limits from the window's columns, and the wall clock (approvals expire by
it, and controls unanswered past correction_ack_timeout_s fail by it, at each
window and tick: the book is told the time and the job's latest policy). It turns the book's output into incident records (through the job's
``IncidentBook``, so every record carries the entries) and into ``correction``
controls, which it resends until the agent acknowledges them (delivery at least
once; the agent is idempotent by the correction's id). The books are saved in
each job's state file (key ``corrections``): a restarted coordinator neither
applies a correction twice nor forgets one it sent (its controls are resent).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import structlog
from artemis.detect.incident_state import MARKERS
from artemis.detect.monitor import JobMonitor, MonitorOutput
from artemis.detect.settings import Settings
from artemis.protocol.columns import WindowColumns
from artemis.protocol.messages import Ack, RankInfo
from artemis.protocol.peers import rank_pairs
from artemis.protocol.records import NAME_MAX
from artemis.protocol.server import PeerInfo
from artemis.rebalance.corrections import (
    CorrectionBook,
    CorrectionError,
    CorrectionPolicy,
    Output,
    RankFacts,
)

log = structlog.get_logger("artemis.coordinator")

RESEND_S = 5.0  # an unacknowledged correction control goes out again after this
ROLLBACK_SUFFIX = ":rollback"  # a rollback's control id: the correction's id and this


def control_id(body: Mapping[str, Any]) -> str | None:
    """The control id a correction control goes out with: the correction's id (its
    rollback's with ``:rollback``, the key the agent journals it under), so an ack
    names its correction and op by itself, whichever life of the coordinator sent it.
    None where that is longer than the wire allows (a job name near its limit): the
    server makes one, and this life matches it (``sent_as``)."""
    cid = str(body["id"]) + ("" if body["op"] == "apply" else ROLLBACK_SUFFIX)
    return cid if len(cid) <= NAME_MAX else None


class CorrectionShell:
    """Every job's corrections, the agents they go to, and what waits to be sent."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.books: dict[str, CorrectionBook] = {}
        self._peers: dict[str, PeerInfo] = {}  # connected agents by id
        # Which agent serves a rank: every hello's ranks, as (agent id, ranks) in the order
        # they came (a later hello naming a rank wins), kept past a disconnect and a job's
        # end: a new run of the job is served by the same agents, which say no new hello.
        # The ranks are the peer's own tuple (nothing more a rank while it is connected);
        # a (job, rank) -> agent dict cost 76 B a rank for lookups made only for ranks
        # with incidents. Those go through `_index`, built at the first after a hello.
        self._hellos: list[tuple[str, Sequence[RankInfo]]] = []
        self._index: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        self._where: dict[tuple[str, int], RankFacts] = {}  # from the latest columns
        self._sent: dict[tuple[str, str], float] = {}  # (id, op) -> when last sent (clock)
        self._outbox: list[tuple[str, dict[str, Any]]] = []  # (agent, body)
        # server-made control id -> (correction id, op), for a correction id too long
        # to be its control id (``control_id``): its ack is still matched.
        self._ctl: dict[str, tuple[str, str]] = {}
        # Each job's policy as of its latest window: the tick times out unanswered
        # controls by it (correction_ack_timeout_s) between windows too.
        self._policy: dict[str, CorrectionPolicy] = {}

    def book(self, job: str) -> CorrectionBook:
        b = self.books.get(job)
        if b is None:
            b = self.books[job] = CorrectionBook(job)
        return b

    # ------------------------------------------------------------------ agents
    def on_connect(self, peer: PeerInfo) -> None:
        self._peers[peer.agent_id] = peer
        # The same hello again (a reconnect): its rows name the same ranks, so only the
        # latest is kept; a different one of the agent stays below it (ranks it alone named).
        hello = (peer.agent_id, peer.ranks)
        self._hellos = [h for h in self._hellos if h != hello]
        self._hellos.append(hello)
        self._index = None
        for job, rank in rank_pairs(peer.ranks) if self.books else ():
            # What this agent did not acknowledge goes out again at the next tick.
            b = self.books.get(job)
            for c in b.corrections if b is not None else ():
                if c.rank == rank and c.pending:
                    self._sent.pop((c.id, c.pending), None)

    def on_disconnect(self, peer: PeerInfo) -> None:
        key = peer.agent_id
        if self._peers.get(key) is peer:
            del self._peers[key]

    def _agent(self, job: str, rank: int) -> str | None:
        """The agent serving ``rank``: the one whose hello named it, else the one
        connected from the rank's host (as its windows report it): an agent that
        connected before the job's rings appeared named none of its ranks."""
        agent = self._hello_agent(job, rank)
        if agent in self._peers:
            return agent
        host = self._where.get((job, rank), RankFacts()).host
        on_host = [p.agent_id for p in self._peers.values() if host is not None and p.host == host]
        return on_host[0] if len(on_host) == 1 else agent

    def _hello_agent(self, job: str, rank: int) -> str | None:
        """The agent whose latest hello naming (job, rank) came last, if any."""
        if self._index is None:
            self._index = _hello_index(self._hellos)
        found = self._index.get(job)
        if found is None:
            return None
        ranks, at = found
        i = int(np.searchsorted(ranks, rank))
        if i == len(ranks) or int(ranks[i]) != rank:
            return None
        return self._hellos[int(at[i])][0]

    def facts(self, job: str, rank: int) -> RankFacts:
        f = self._where.get((job, rank), RankFacts())
        peer = self._peers.get(self._agent(job, rank) or "")
        return RankFacts(
            host=f.host if f.host is not None else (peer.host if peer else None),
            gpu=f.gpu,
            version=None if peer is None else (int(peer.version[0]), int(peer.version[1])),
            power_limit_w=f.power_limit_w,
            power_limit_default_w=f.power_limit_default_w,
        )

    # ------------------------------------------------------------------ windows
    def on_window(
        self,
        job: str,
        m: JobMonitor,
        window: int,
        cols: WindowColumns,
        out: MonitorOutput,
        settings: Settings,
        wall: float,
    ) -> None:
        """After a scored window: the book decides on the job's incidents; its entries
        join the records of ``out`` (more lines of the same group)."""
        b = self.books.get(job)
        policy = self._policy[job] = CorrectionPolicy.from_settings(settings)
        if settings.corrections == "off" and (b is None or not b.busy):
            return  # nothing to decide, nothing in flight: no records built
        records = m.incidents.open_incidents
        closed = [r for r in out.incidents if r.get("status") == "closed"]
        ranks = {int(r["rank"]) for r in records if r.get("rank") is not None}
        self._learn(job, cols, ranks)
        if not records and not closed and b is None:
            return  # no incident yet: no book made, none saved
        facts = {r: self.facts(job, r) for r in ranks}
        b = self.book(job)
        pol = m.policy
        plan = pol.active_plan if pol is not None and pol.verifying else None
        res = b.on_window(
            window, [*records, *closed], out.incident_rows, facts, policy, wall,
            None if plan is None else f"plan {plan.id} {plan.status}",
        )  # fmt: skip
        self.into(job, m, res, out, closed)

    def _learn(self, job: str, cols: WindowColumns, ranks: set[int]) -> None:
        """The host, GPU and power limits of the ranks of open incidents, as reported."""
        if not ranks or not cols.n:
            return
        rr = cols.ints("rank")
        for i in np.flatnonzero(np.isin(rr, list(ranks))).tolist():
            self._where[(job, int(rr[i]))] = RankFacts(
                host=str(cols.cols["host"][i]),
                gpu=_opt_int(cols.cols.get("tel_gpu_index"), i),
                power_limit_w=_opt_float(cols.cols.get("tel_power_limit_w"), i),
                power_limit_default_w=_opt_float(cols.cols.get("tel_power_limit_default_w"), i),
            )

    def into(
        self,
        job: str,
        m: JobMonitor | None,
        res: Output,
        out: MonitorOutput,
        closed: list[dict[str, Any]] | None = None,
    ) -> None:
        """The book's output: entries into the incidents (records into ``out``),
        controls into the outbox; the job's rebalancing waits while a correction of it
        is on its way (RebalancePolicy.hold, saved with the policy)."""
        b = self.books.get(job)
        if m is not None and m.policy is not None and b is not None:
            m.policy.hold(b.in_flight())
        for rank, body in res.controls:
            self._queue(job, rank, body)
        out.incidents += res.records  # incidents that closed before an ack: whole again
        if not res.entries or m is None:
            return
        m.incidents.on_corrections(res.entries)
        recs, rows = m.incidents.take()
        # An entry of an incident that closed in this very window goes into its last record.
        for rec in closed or []:
            mine = {e["id"]: e for i, e in res.entries if i == rec["id"]}
            if mine:
                acts = [a for a in rec["actions"] if a.get("id") not in mine]
                rec["actions"] = acts + list(mine.values())
                at = rec.get("closed") or {}
                rec["markers"] += [
                    {"marker": e["status"], "window": at.get("window"), "time": at.get("time")}
                    for e in mine.values()
                    if e["status"] in ("verified", "rolled_back")
                ]
                rec["markers"].sort(key=lambda m: (m["window"], MARKERS.index(m["marker"])))
        out.incidents += recs
        out.incident_rows += rows

    # ------------------------------------------------------------------ acks, ticks
    def on_ack(self, peer: PeerInfo, ack: Ack, wall: float) -> tuple[str, Output] | None:
        """An agent's ack of a correction control: (its job, the book's output).

        Matched by its control id, which is the correction's (``control_id``): a
        restarted coordinator knows what an ack answers, and an ack of an apply that
        comes in while the rollback is on its way is not taken for the rollback's. An
        ack without a result (an agent that applies no corrections) fails its
        correction with the agent's words; one whose control id is not a correction's
        (a server-made id, of a correction id too long for the wire) is matched by the
        ids this life sent, else by its ``result.id``, as before issue 29's control ids.
        """
        result = ack.result
        known = self._named(ack.control_id) or self._ctl.pop(ack.control_id or "", None)
        if known is None:
            if not isinstance(result, Mapping) or "id" not in result:
                return None
            cid, op = str(result["id"]), None
        else:
            cid, op = known
            if not isinstance(result, Mapping):
                why = ack.detail or "the agent's ack carries no result (it applies no corrections)"
                result = {"status": "failed", "error": why}
            result = {**result, "id": cid}
        job = self._holder(cid)
        if job is None:
            log.warning("ack of an unknown correction", agent=peer.agent_id, id=cid)
            return None
        for o in (op,) if op else ("apply", "rollback"):
            self._sent.pop((cid, o), None)
        if not ack.ok and "status" not in result:
            result = {**result, "status": "failed", "error": ack.detail}
        log.info(
            "correction acknowledged",
            job=job,
            agent=peer.agent_id,
            id=cid,
            op=op,
            status=result.get("status"),
            error=result.get("error"),
        )
        return job, self.books[job].on_ack(result, wall, op)

    def _named(self, control_id: str | None) -> tuple[str, str] | None:
        """(correction id, op) a control id names, when it is a known correction's."""
        if not control_id:
            return None
        cid, op = control_id, "apply"
        if control_id.endswith(ROLLBACK_SUFFIX):
            cid, op = control_id[: -len(ROLLBACK_SUFFIX)], "rollback"
        return (cid, op) if self._holder(cid) is not None else None

    def _holder(self, cid: str) -> str | None:
        for job, b in self.books.items():
            if b.has(cid):
                return job
        return None

    def tick(self, wall: float, now: float) -> list[tuple[str, Output]]:
        """Approvals expire, and so do controls unanswered past correction_ack_timeout_s
        (by ``wall``: the book's clock); the others go out again after RESEND_S."""
        outs = []
        for job, b in self.books.items():
            res = b.expire(wall, policy=self._policy.get(job))
            if res.entries:
                outs.append((job, res))  # its controls go out with it (``into``)
            fresh = {(body["id"], body["op"]) for _r, body in res.controls}
            for rank, body in b.unacked():
                last = self._sent.get((body["id"], body["op"]))
                if (body["id"], body["op"]) in fresh:
                    continue
                if last is None or now - last >= RESEND_S:
                    self._queue(job, rank, body, resend=True)
        return outs

    def _queue(self, job: str, rank: int, body: dict[str, Any], resend: bool = False) -> None:
        """Into the outbox for the rank's agent, logged (a resend only when it goes)."""
        agent = self._agent(job, rank)
        ok = agent is not None and agent in self._peers
        if ok:
            self._sent[(body["id"], body["op"])] = self.clock()
            self._outbox.append((str(agent), body))
        # (not ok: resent once its agent is back, on_connect and tick)
        if ok or not resend:
            log.info(
                "correction control resent" if resend else "correction control",
                job=job,
                rank=rank,
                op=body["op"],
                id=body["id"],
                action=body["action"],
                agent=agent if ok else None,
            )

    def take_sends(self) -> list[tuple[str, dict[str, Any]]]:
        out, self._outbox = self._outbox, []
        return out

    def sent_as(self, ctl: str, body: Mapping[str, Any]) -> None:
        """The control id a correction control went out with (acks name it): only a
        server-made one needs remembering (``control_id``)."""
        if ctl == control_id(body):
            return
        self._ctl[ctl] = (str(body["id"]), str(body["op"]))
        while len(self._ctl) > 4096:  # controls never acked (agents gone) do not pile up
            self._ctl.pop(next(iter(self._ctl)))

    def unsent(self, agent: str, body: Mapping[str, Any]) -> None:
        """A send that found the agent gone: the next tick resends it."""
        self._sent.pop((str(body["id"]), str(body["op"])), None)

    # ------------------------------------------------------------------ commands
    def pending(self) -> list[dict[str, Any]]:
        return [p for b in self.books.values() for p in b.pending()]

    def holder(self, cid: str) -> str:
        """The job whose book holds correction ``cid``."""
        job = self._holder(cid)
        if job is None:
            raise CorrectionError(f"unknown correction id {cid!r}")
        return job

    def job_of_incident(self, incident: str) -> str:
        for job, b in self.books.items():
            if b.knows_incident(incident):
                return job
        raise CorrectionError(f"no open incident {incident!r}")

    def command(
        self, req: Mapping[str, Any], wall: float, emit: Callable[[str, Output], None]
    ) -> dict[str, Any]:
        """pending / approve ID / deny ID / correct INCIDENT ACTION (the control socket's);
        ``emit`` writes a book's output for its job. Raises CorrectionError naming an
        unknown command, id, action or incident, or an expired id."""
        cmd = req.get("cmd")
        for job, b in list(self.books.items()):
            res = b.expire(wall, policy=self._policy.get(job))  # before a command reads them
            if res.entries:
                emit(job, res)
        if cmd == "pending":
            return {"ok": True, "pending": self.pending()}
        if cmd in ("approve", "deny"):
            cid = str(req["id"])
            job = self.holder(cid)
            b = self.books[job]
            res = b.approve(cid, wall) if cmd == "approve" else b.deny(cid, wall)
            emit(job, res)
            return {"ok": True, "correction": b.get(cid).entry()}
        if cmd == "correct":
            incident, action = str(req["incident"]), str(req["action"])
            job = self.job_of_incident(incident)
            b = self.books[job]
            facts = self.facts(job, b.rank_of(incident))
            c, res = b.force(incident, action, facts, wall)
            emit(job, res)
            return {"ok": True, "correction": c.entry()}
        raise CorrectionError(f"unknown command {cmd!r}")

    # ------------------------------------------------------------------ state
    def snapshot(self, job: str) -> dict[str, Any] | None:
        b = self.books.get(job)
        return None if b is None else b.snapshot()

    def restore(self, job: str, data: Mapping[str, Any] | None) -> None:
        """A job's saved book back (before anything saves the job again); one that
        cannot be read is logged and left out, the job's other state restores."""
        if not data:
            return
        try:
            self.books[job] = CorrectionBook.restore(data)
        except (ValueError, KeyError, TypeError) as e:
            log.error(
                "corrections state unreadable: its corrections are lost", job=job, error=str(e)
            )

    def forget(self, job: str) -> None:
        self.books.pop(job, None)
        self._policy.pop(job, None)
        for key in [k for k in self._where if k[0] == job]:
            del self._where[key]


def _opt_int(a: Any, i: int) -> int | None:
    if a is None:
        return None
    v = float(a[i])
    return int(v) if np.isfinite(v) else None


def _opt_float(a: Any, i: int) -> float | None:
    if a is None:
        return None
    v = float(a[i])
    return v if np.isfinite(v) else None


def _hello_index(
    hellos: list[tuple[str, Sequence[RankInfo]]],
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each job's ranks named in `hellos`, sorted, with the position in `hellos` of the
    last hello naming each (12 B a rank)."""
    named: dict[str, tuple[list[int], list[int]]] = {}
    for at, (_, ranks) in enumerate(hellos):
        for job, rank in rank_pairs(ranks):
            rk, pos = named.setdefault(job, ([], []))
            rk.append(rank)
            pos.append(at)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for job, (rk, pos) in named.items():
        # Reversed, the first occurrence of a rank (what unique reports) is its last hello.
        sorted_ranks, first = np.unique(np.asarray(rk[::-1], np.int64), return_index=True)
        out[job] = (sorted_ranks, np.asarray(pos[::-1], np.int32)[first])
    return out
