"""The agent's uplinks to a coordinator fleet: one per job owner (issue 30).

In a fleet each job has one owner coordinator, so an agent whose ranks belong to
jobs with different owners keeps one ``AgentLink`` per owner. All ranks start on
the *list link*, which tries the ``--coordinator`` addresses in turn. A coordinator
that does not own a job answers ``Redirect``; the job's ranks then move to the link
for the owner's address (created as needed, with the same transport, so under TLS
the owner's certificate is verified like any peer's), together with every
unacknowledged message about the job (a windows batch or heartbeat of several jobs
is cut in two, order kept), and the old link says a new hello without them. An
empty address sends the job back to the list link, which moves on past the
address that said so. A link left without ranks closes; an owner link that
cannot connect ``owner_retries`` times in a row hands its jobs back to the list
(its coordinator died: another one will take the lease or name the new owner).
When the redirect said how long the holder's lease still runs (``expires_s``),
the jobs go back when it runs out instead: no other coordinator can take them
before, and one will at once after (a failover costs the lease, not the lease
plus the rounds of a back-off that polled the fleet meanwhile).

Callers see one uplink: ``enqueue`` routes each message by job and returns a
*ticket*; ``acked_upto`` is the highest ticket below which everything was
acknowledged, wherever its parts went (the ring cleanup's test). Nothing
unacknowledged is dropped by a move; the outbox bound of each link still counts
drops as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import structlog
from artemis.protocol.client import AgentIdentity, AgentLink, ControlHandler, LinkStats
from artemis.protocol.jobsplit import jobs_of, split_by_job
from artemis.protocol.messages import DataMessage, Heartbeat, JobOwner, RankInfo
from artemis.protocol.transport import Transport

log = structlog.get_logger("artemis.agent.uplinks")


class Uplinks:
    """One link per job owner; the list link for the jobs whose owner is not known."""

    def __init__(
        self,
        transport: Transport,
        addresses: Sequence[str],
        secret: bytes,
        identity: AgentIdentity,
        on_control: ControlHandler | None = None,
        *,
        owner_retries: int = 3,
        **link_kw: Any,
    ) -> None:
        if not addresses:
            raise ValueError("Uplinks needs at least one coordinator address")
        self.transport = transport
        self.addresses = tuple(addresses)
        self.secret = secret
        self.identity = identity
        self.on_control = on_control
        self.owner_retries = owner_retries
        self._link_kw = link_kw
        # Names are resolved to all their addresses only where no certificate is
        # checked: under TLS the name is what the certificate must match.
        self._resolve = getattr(transport, "client_ssl", "tls") is None
        self._ranks: tuple[RankInfo, ...] = identity.ranks
        self._route: dict[str, AgentLink] = {}  # job -> its link
        self._owners: dict[str, AgentLink] = {}  # owner address -> link
        self._list: AgentLink | None = None
        self._pending: dict[AgentLink, dict[int, int]] = {}  # link -> {seq: ticket}
        self._ticket = 0
        self._links_made = 0
        self._retiring: set[asyncio.Task[None]] = set()
        self._tasks: dict[AgentLink, asyncio.Task[None]] = {}
        self._closed = LinkStats()  # the counters of the links closed so far
        self._started = False
        self._stopping = False
        self.moves = 0  # jobs moved between links (redirects followed, owners lost)
        self._moved_at: dict[str, list[float]] = {}  # job -> when redirects moved it lately
        # job -> when (monotonic) its holder's lease runs out unless renewed, as the last
        # redirect to it said; forgotten once a link to the holder is established
        self._expiry: dict[str, float] = {}
        self._expiry_timers: dict[AgentLink, asyncio.TimerHandle] = {}

    # ------------------------------------------------------------------ views

    @property
    def links(self) -> list[AgentLink]:
        out = list(self._owners.values())
        if self._list is not None:
            out.insert(0, self._list)
        return out

    def link_of(self, job: str) -> AgentLink | None:
        return self._route.get(job)

    @property
    def connected(self) -> bool:
        links = self.links
        return bool(links) and all(link.connected for link in links)

    @property
    def stats(self) -> LinkStats:
        """The links' counters added up (one agent, however many uplinks); those of
        closed links stay counted."""
        total = LinkStats()
        _add_counters(total, self._closed)
        links = self.links
        for link in links:
            st = link.stats
            _add_counters(total, st)
            total.buffered += st.buffered
            total.last_error = st.last_error or total.last_error
            total.peer_version = total.peer_version or st.peer_version
            if st.down_since is not None:
                total.down_since = min(total.down_since or st.down_since, st.down_since)
        total.connected = bool(links) and all(link.stats.connected for link in links)
        total.acked_upto = self.acked_upto()
        return total

    # ------------------------------------------------------------------ data

    def enqueue(self, msg: DataMessage) -> int:
        """Queue a data message on the link(s) of its job(s); returns its ticket."""
        self._ticket += 1
        ticket = self._ticket
        for link, part in self._parts(msg):
            seq = link.enqueue(part)
            self._pending.setdefault(link, {})[seq] = ticket
        if isinstance(msg, Heartbeat):
            self._retire_idle()  # now and then: a link whose last job's data was acked
        return ticket

    def _parts(self, msg: DataMessage) -> list[tuple[AgentLink, DataMessage]]:
        """``msg`` cut by the links of its jobs, in the order of the links."""
        jobs = jobs_of(msg)
        by_link: dict[AgentLink, set[str]] = {}
        for job in jobs:
            by_link.setdefault(self._link_for_job(job), set()).add(job)
        if isinstance(msg, Heartbeat):
            # Every link gets one: it is also each coordinator's sign of life. Each
            # carries the progress and plan acks of its own jobs only.
            out: list[tuple[AgentLink, DataMessage]] = []
            # (Not a link without ranks that only waits for its last acks to close.)
            links = self.links
            for link in (
                [lk for lk in links if lk.identity.ranks] or links[:1] or [self._list_link()]
            ):
                stay = split_by_job(msg, jobs - by_link.get(link, set()))[0]
                assert stay is not None  # a heartbeat always stays
                out.append((link, stay))
            return out
        if not by_link:
            return [(self._list_link(), msg)]
        if len(by_link) == 1:
            return [(next(iter(by_link)), msg)]
        return [
            (link, part)
            for link, mine in by_link.items()
            if (part := split_by_job(msg, mine)[1]) is not None
        ]

    def acked_upto(self) -> int:
        """Every ticket <= this one was acknowledged in all its parts."""
        low = self._ticket
        for link, pending in self._pending.items():
            upto = link.stats.acked_upto
            for seq in [s for s in pending if s <= upto]:
                del pending[seq]
            if pending:
                low = min(low, min(pending.values()) - 1)
        return low

    async def wait_acked(self, ticket: int, timeout: float | None = None) -> bool:
        """True once every part of ``ticket`` (and each earlier one) was acknowledged."""

        async def _wait() -> bool:
            while self.acked_upto() < ticket:
                waits = [
                    (link, seq)
                    for link, pending in self._pending.items()
                    for seq, t in pending.items()
                    if t <= ticket
                ]
                link, seq = min(waits, key=lambda w: w[1])
                # Bounded, so a move (the seq now on another link) is seen soon.
                with contextlib.suppress(asyncio.TimeoutError):
                    if not await link.wait_acked(seq, 0.5):
                        # dropped by the outbox bound (counted in stats.dropped)
                        self._pending.get(link, {}).pop(seq, None)
            return True

        return await asyncio.wait_for(_wait(), timeout)

    # ------------------------------------------------------------------ ranks

    def start(self) -> None:
        self._started = True
        self.set_ranks(self._ranks)
        for link in self.links:
            self._tasks[link] = link.start()

    def set_ranks(self, ranks: Sequence[RankInfo]) -> None:
        """The agent's ranks now: each link's hello names the ranks of its jobs (a new
        job starts on the list link); a link left without ranks closes."""
        self._ranks = tuple(ranks)
        jobs = {r.job for r in self._ranks}
        for job in [j for j in self._route if j not in jobs]:
            del self._route[job]
        for job in jobs:
            self._link_for_job(job)
        self._sync()

    def jobs_seen(self, ranks: Sequence[RankInfo]) -> None:
        """The agent's rings now: when a job came or went, ``set_ranks`` (a fleet routes
        a job by the hello that names it). Not for a rank more or less of a known job:
        a new hello for that would only cost a reconnect."""
        if {r.job for r in ranks} != {r.job for r in self._ranks}:
            self.set_ranks(ranks)

    def _link_for_job(self, job: str) -> AgentLink:
        link = self._route.get(job)
        if link is None:
            link = self._route[job] = self._list_link()
        return link

    def _sync(self) -> None:
        """Tell each link its ranks; retire the links that have none (unless it is the
        only one: the agent keeps one uplink, as a lone agent always did)."""
        for link in self.links:
            link.set_ranks([r for r in self._ranks if self._route.get(r.job) is link])
        self._retire_idle()

    def _retire_idle(self) -> None:
        """Close the links without ranks whose data was all acknowledged (a job whose
        rings went keeps its link until then)."""
        self.acked_upto()  # forgets what was acknowledged
        for link in self.links:
            if not link.identity.ranks and not self._pending.get(link) and len(self.links) > 1:
                self._retire(link)

    def _new_link(self, addresses: Sequence[str]) -> AgentLink:
        hooks: dict[str, Any] = {
            "on_redirect": self._on_redirect,
            "on_established": self._on_established,
            "on_failure": self._on_failure,
            "on_connecting": self._on_connecting,
        }
        link = AgentLink(
            self.transport,
            addresses,
            self.secret,
            self.identity,
            self.on_control,
            resolve=self._resolve,
            **hooks,
            **self._link_kw,
        )
        # Each link numbers its messages from 1 (its own outbox): its own incarnation,
        # so a coordinator that saw another link of this agent does not take the new
        # seqs for resends it already has.
        inc = self.identity.incarnation
        self._links_made += 1
        if self._links_made > 1:
            inc = f"{inc[:48]}.{self._links_made}"
        link.identity = dataclasses.replace(self.identity, ranks=(), incarnation=inc)
        self._pending[link] = {}
        if self._started:
            self._tasks[link] = link.start()
        return link

    def _list_link(self) -> AgentLink:
        if self._list is None:
            self._list = self._new_link(self.addresses)
        return self._list

    def _owner_link(self, address: str) -> AgentLink:
        lst = self._list
        if lst is not None and lst.connected and lst.address == address:
            return lst
        link = self._owners.get(address)
        if link is None:
            link = self._owners[address] = self._new_link((address,))
            log.info("uplink to a job owner opened", address=address)
        return link

    def _retire(self, link: AgentLink) -> None:
        if link is self._list:
            self._list = None
        for addr in [a for a, lk in self._owners.items() if lk is link]:
            del self._owners[addr]
        self._pending.pop(link, None)
        self._tasks.pop(link, None)
        timer = self._expiry_timers.pop(link, None)
        if timer is not None:
            timer.cancel()
        _add_counters(self._closed, link.stats)
        log.info("uplink without jobs closed", address=link.address)
        task = asyncio.get_running_loop().create_task(link.close(timeout=0.0))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    # ------------------------------------------------------------------ moves

    def _move(self, src: AgentLink, dst: AgentLink, jobs: set[str]) -> None:
        """``jobs`` (and their unacknowledged messages, in order) from ``src`` to ``dst``."""
        if src is dst or not jobs:
            return
        src_pending = self._pending.get(src, {})
        dst_pending = self._pending.setdefault(dst, {})
        for seq, part, whole in src.take_jobs(jobs):
            ticket = src_pending.pop(seq, None) if whole else src_pending.get(seq)
            new_seq = dst.enqueue(part)
            if ticket is not None:
                dst_pending[new_seq] = ticket
        for job in jobs:
            self._route[job] = dst
        if not src.jobs - jobs:
            # What stays on src is bare heartbeats (their jobs' parts went with the
            # jobs): nothing to wait for before it closes.
            src_pending.clear()
        self.moves += len(jobs)
        log.info(
            "jobs moved to another uplink",
            jobs=sorted(jobs),
            src=src.address,
            dst=dst.address if dst is not self._list else "(the address list)",
        )
        self._sync()

    def _on_redirect(self, src: AgentLink, owners: tuple[JobOwner, ...]) -> None:
        if self._stopping:
            return
        back: set[str] = set()
        moves: dict[AgentLink, set[str]] = {}
        now = time.monotonic()
        for jo in owners:
            if self._route.get(jo.job) is not src:
                continue  # not (or no longer) this link's job
            recent = [t for t in self._moved_at.get(jo.job, []) if now - t < _BOUNCE_S]
            self._moved_at[jo.job] = [*recent, now]
            if len(recent) >= _BOUNCES:
                # Coordinators that disagree while a lease changes hands would bounce
                # the job between them at connect speed: look again in a second (so at
                # most _BOUNCES moves per _BOUNCE_S).
                loop = asyncio.get_running_loop()
                loop.call_later(1.0, self._on_redirect, src, (jo,))
                self._moved_at[jo.job] = recent
                continue
            if jo.expires_s > 0:
                self._expiry[jo.job] = now + jo.expires_s
            else:
                self._expiry.pop(jo.job, None)
            if jo.address:
                dst = self._owner_link(jo.address)
                if dst is not src:
                    moves.setdefault(dst, set()).add(jo.job)
                    continue
            back.add(jo.job)
        for dst, jobs in moves.items():
            self._move(src, dst, jobs)
        if back:
            if self._list is not None and src is self._list:
                # Nobody there holds them: the list's next address may.
                src.skip_address(src.address)
                src.rehello()
            else:
                self._move(src, self._list_link(), back)

    def _on_failure(self, link: AgentLink, failures: int) -> None:
        if link is self._list:
            return
        known = [self._expiry[j] for j in link.jobs if j in self._expiry]
        if known:
            # The holder's lease runs out then: back to the list at that moment.
            if link not in self._expiry_timers:
                wait = max(known) + _EXPIRY_MARGIN_S - time.monotonic()
                loop = asyncio.get_running_loop()
                timer = loop.call_later(max(0.0, wait), self._holder_expired, link)
                self._expiry_timers[link] = timer
            return
        if failures < self.owner_retries:
            return
        log.warning(
            "job owner unreachable: its jobs go back to the address list",
            address=link.address,
            attempts=failures,
            jobs=sorted(link.jobs),
        )
        self._move(link, self._list_link(), link.jobs)

    def _holder_expired(self, link: AgentLink) -> None:
        """The lease of an unreachable holder ran out: its jobs ask the fleet again (the
        first member asked takes the lease); the list starts past the holder's address."""
        self._expiry_timers.pop(link, None)
        if self._stopping or link.connected or link not in self._owners.values():
            return
        jobs = link.jobs
        for job in jobs:
            self._expiry.pop(job, None)
        log.warning(
            "job owner unreachable and its lease ran out: its jobs go back to the address list",
            address=link.address,
            jobs=sorted(jobs),
        )
        lst = self._list_link()
        self._move(link, lst, jobs)
        lst.skip_address(link.address)

    def _on_connecting(self, link: AgentLink) -> bool:
        """The list link about to connect where an owner link is: its jobs join that
        link instead (one agent id on two connections to one coordinator would
        supersede itself, and two seq spaces there would defeat its dedup)."""
        if self._list is None or link is not self._list:
            return True
        other = self._owners.get(link.address)
        if other is None:
            return True
        self._move(link, other, link.jobs)
        # Still the list link with ranks (not retired): connect after all.
        return bool(link.identity.ranks) or self._list is link

    def _on_established(self, link: AgentLink, coordinator_id: str) -> None:
        """Two links to one coordinator would supersede each other (one agent id): the
        newcomer's jobs join the other link. Told by the address, not the coordinator
        id (a coordinator outside a fleet calls itself "coordinator")."""
        for job in link.jobs:
            self._expiry.pop(job, None)  # its holder answers: what a redirect said is old
        for other in self.links:
            if other is link or other.address != link.address:
                continue
            # The list link folds into an owner link; else the newcomer into the other.
            fold: AgentLink = link
            keep: AgentLink = other
            if self._list is not None and other is self._list:
                fold, keep = other, link
            self._move(fold, keep, fold.jobs)
            return

    # ------------------------------------------------------------------ life

    async def wait_connected(self, timeout: float | None = None) -> None:
        """Until every link is connected (they may change while we wait)."""

        async def _wait() -> None:
            while True:
                waiting = [link for link in self.links if not link.connected]
                if not waiting:
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await waiting[0].wait_connected(0.5)

        await asyncio.wait_for(_wait(), timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Give every link up to ``timeout`` to deliver, then close them all."""
        deadline = time.monotonic() + timeout
        self._stopping = True
        links = self.links
        self._list = None
        self._owners.clear()
        await asyncio.gather(
            *(link.close(timeout=max(0.0, deadline - time.monotonic())) for link in links),
            *self._retiring,
            return_exceptions=True,
        )

    def failed(self) -> asyncio.Task[None] | None:
        """A link's task that ended by itself (it gave up: the agent should stop)."""
        return next((t for t in self._tasks.values() if t.done()), None)


# A job redirected this often within this many seconds: its next redirect waits.
_BOUNCES = 4
_BOUNCE_S = 5.0
# Asked again this long after the holder's lease ran out (the database's clock rounds).
_EXPIRY_MARGIN_S = 0.05

_COUNTERS = (
    "dropped",
    "reconnects",
    "connect_attempts",
    "sent_frames",
    "resent_frames",
    "outages",
    "down_s",
    "stalls",
)


def _add_counters(total: LinkStats, st: LinkStats) -> None:
    for name in _COUNTERS:
        setattr(total, name, getattr(total, name) + getattr(st, name))
    for k, n in st.refusals.items():
        total.refusals[k] = total.refusals.get(k, 0) + n


__all__ = ["Uplinks"]
