"""AgentLink: the agent's uplink to the coordinator (asyncio shell over AgentSession).

Callers hand data messages to ``enqueue``/``send``; they go into the Outbox
(seq assigned there) and are sent whenever a connection is up. The link
connects, runs the handshake, resends what the coordinator does not have yet,
applies acks, runs incoming Control through ``on_control`` and acks it, and on
any loss reconnects with jittered exponential back-off. A connection that takes
data but acknowledges none for ``stall_s`` (a partition: TCP alone would wait
minutes for its retransmissions to give up) is dropped and reconnected. An
outage (from the loss of an established connection to the next one) is logged
at both ends with its duration and counted (``LinkStats``: the agent's
``straggler_agent_uplink_*`` metrics). A refusal (other major
version, wrong secret) is logged as one clear ERROR and retried with the same
back-off, so a misconfigured fleet never spins against the coordinator.

A link may be given several addresses (a coordinator fleet's list): it tries them in
turn, moving on after each attempt that does not establish a session, and stays on
one while it works. In a fleet a coordinator may answer ``Redirect`` for some of the
hello's jobs: ``on_redirect`` decides where they go (agent/uplinks.py), taking their
unacknowledged messages out of this link (``take_jobs``) and calling ``set_ranks``,
which makes the link say a new hello without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import ssl
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

import structlog
from artemis.common.aio import cancel_all
from artemis.protocol.addresses import expand
from artemis.protocol.codec import (
    DEFAULT_MAX_FRAME,
    HEADER,
    FrameDecoder,
    decode_frame_body,
    encode,
)
from artemis.protocol.jobsplit import split_by_job
from artemis.protocol.linkstate import Backoff, LinkStats
from artemis.protocol.messages import (
    DATA_TYPES,
    PROTOCOL_VERSION,
    Control,
    DataMessage,
    JobOwner,
    Message,
    ProtocolError,
    RankInfo,
)
from artemis.protocol.session import (
    Acked,
    AgentIdentity,
    AgentSession,
    BadFrame,
    Close,
    ControlReceived,
    Effect,
    Established,
    Outbox,
    PeerError,
    Redirected,
    Refused,
    Send,
)
from artemis.protocol.transport import ChannelClosed, FrameChannel, Transport

log = structlog.get_logger("artemis.protocol.client")

# What on_control may return: True/None = applied, False = refused,
# (ok, detail) to explain, (ok, detail, result) with a result map for the Ack
# (protocol 1.2: a correction's outcome). An exception counts as (False, repr(exc)).
ControlResult = bool | tuple[bool, str] | tuple[bool, str, dict[str, Any] | None] | None
ControlHandler = Callable[[Control], Awaitable[ControlResult]]
# Called (synchronously, in the link's task) with the jobs a coordinator redirected.
RedirectHandler = Callable[["AgentLink", tuple[JobOwner, ...]], None]
# Called once a session is established, with the coordinator's id.
EstablishedHandler = Callable[["AgentLink", str], None]


class _Refusal(Exception):
    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason
        self.text = text


class AgentLink:
    """The agent's reconnecting, resending, authenticated uplink."""

    def __init__(
        self,
        transport: Transport,
        address: str | Sequence[str],
        secret: bytes,
        identity: AgentIdentity,
        on_control: ControlHandler | None = None,
        *,
        outbox_capacity: int = 10_000,
        outbox_max_bytes: int = 64 * 1024 * 1024,
        backoff_base: float = 0.2,
        backoff_cap: float = 30.0,
        healthy_s: float = 5.0,
        handshake_timeout: float = 10.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        version: tuple[int, int] = PROTOCOL_VERSION,
        rng: random.Random | None = None,
        refusal_log_interval_s: float = 60.0,
        stall_s: float | None = None,
        on_redirect: RedirectHandler | None = None,
        on_established: EstablishedHandler | None = None,
        on_failure: Callable[[AgentLink, int], None] | None = None,
        on_connecting: Callable[[AgentLink], bool] | None = None,
        resolve: bool = False,
    ) -> None:
        self.transport = transport
        # The list tried in turn; ``resolve``: each name becomes the addresses it
        # resolves to, once per pass (not under TLS, where the name is what we verify).
        self._listed = (address,) if isinstance(address, str) else tuple(address)
        if not self._listed:
            raise ValueError("AgentLink needs at least one address")
        self._resolve = resolve
        self._candidates: list[str] = list(self._listed)
        self._at = 0
        self.identity = identity
        self.on_control = on_control
        self.on_redirect = on_redirect
        self.on_established = on_established
        # Called after each attempt that gave no session, with how many in a row.
        self.on_failure = on_failure
        # Asked before each connect to ``address``: False = do not (this link handed
        # its jobs to another one there and is being closed).
        self.on_connecting = on_connecting
        self._failures = 0
        self.coordinator_id: str | None = None  # of the session now, if any
        self._restart = asyncio.Event()  # say a new hello (the ranks changed)
        self.version = version
        self.max_frame = max_frame
        self.handshake_timeout = handshake_timeout
        self.healthy_s = healthy_s
        self.refusal_log_interval_s = refusal_log_interval_s
        self.stall_s = stall_s  # None: never dropped for want of acks
        self._unacked_since: float | None = None  # first send not acknowledged since
        self._stalled_from: float | None = None  # a stalled connection's last progress
        self.settings: dict[str, Any] = {}
        self._secret = secret
        self._outbox = Outbox(
            outbox_capacity, outbox_max_bytes, version=version, max_frame=max_frame
        )
        self._backoff = Backoff(backoff_base, backoff_cap, rng or random.Random())
        self._stats = LinkStats()
        self._data = asyncio.Event()  # new data in the outbox
        self._acked = asyncio.Event()  # pulsed on every ack / drop
        self._connected = asyncio.Event()
        self._stop = asyncio.Event()
        self._dropped_seqs_max = 0  # highest seq ever dropped (for wait_acked)
        self._dropped_seqs: set[int] = set()
        self._highest_sent = 0
        self._established_once = False
        self._channel: FrameChannel | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_refusal_log: dict[tuple[str, str], float] = {}

    # ------------------------------------------------------------------ public

    @property
    def stats(self) -> LinkStats:
        s = self._stats
        s.buffered = self._outbox.buffered
        s.dropped = self._outbox.dropped
        s.acked_upto = self._outbox.acked_upto
        return s

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def address(self) -> str:
        """The address this link connects (or is connected) to now."""
        return self._candidates[self._at % len(self._candidates)]

    @property
    def addresses(self) -> tuple[str, ...]:
        return self._listed

    @property
    def jobs(self) -> set[str]:
        return {r.job for r in self.identity.ranks}

    def set_ranks(self, ranks: Sequence[RankInfo]) -> None:
        """The ranks this link speaks for changed: the next session's hello names
        ``ranks``; an established session ends now (without counting an outage)."""
        ranks = tuple(ranks)
        if ranks == self.identity.ranks:
            return
        self.identity = dataclasses.replace(self.identity, ranks=ranks)
        self._restart.set()

    def skip_address(self, address: str) -> None:
        """Try the address after ``address`` next (it told us to try elsewhere)."""
        if self.address == address:
            self._at += 1

    def rehello(self) -> None:
        """End the session now (if any) and say a new hello, to the address next in turn
        after ``skip_address``."""
        self._restart.set()

    def take_jobs(self, jobs: Collection[str]) -> list[tuple[int, DataMessage, bool]]:
        """Take the unacknowledged data about ``jobs`` out of this link, in order (a
        windows batch or heartbeat of several jobs is cut in two); the rest stays
        under its seqs. Returns (seq, the part taken, whether the whole message went);
        for a move to another uplink: enqueue the parts there."""
        moved: list[tuple[int, DataMessage, bool]] = []

        def cut(seq: int, frame: bytes) -> bytes | None:
            msg = decode_frame_body(memoryview(frame)[HEADER:], version=self.version)
            assert type(msg) in DATA_TYPES
            data: DataMessage = msg  # type: ignore[assignment]
            stay, move = split_by_job(data, jobs)
            if move is not None:
                moved.append((seq, move, stay is None))
            if stay is data:
                return frame
            if stay is None:
                return None
            return encode(stay, seq=seq, version=self.version, max_frame=self.max_frame)

        self._outbox.rewrite(cut)
        self._acked.set()  # waiters re-check (a seq taken away is no longer theirs)
        return moved

    def enqueue(self, msg: Message) -> int:
        """Queue a data message (Windows, Heartbeat, Dump, Fingerprint); returns its seq.

        Never blocks. Raises ProtocolError("oversize") for a message that
        cannot fit one frame (split it) and TypeError for non-data messages.
        """
        seq, dropped = self._outbox.add(msg)
        if dropped:
            self._dropped_seqs.update(dropped)
            self._dropped_seqs_max = max(self._dropped_seqs_max, dropped[-1])
            if len(self._dropped_seqs) > 100_000:
                # Only recent drops matter to waiters; keep the set bounded.
                self._dropped_seqs = {s for s in self._dropped_seqs if s >= dropped[0]}
            log.warning(
                "outbox full, dropped oldest data messages",
                dropped=len(dropped),
                dropped_total=self._outbox.dropped,
                buffered=self._outbox.buffered,
            )
            self._acked.set()
        self._data.set()
        return seq

    async def send(self, msg: Message, *, wait: bool = False, timeout: float | None = None) -> int:
        """``enqueue``; with ``wait`` also wait until acked (raises TimeoutError on timeout)."""
        seq = self.enqueue(msg)
        if wait and not await self.wait_acked(seq, timeout):
            raise TimeoutError(f"data message {seq} was dropped before it was acknowledged")
        return seq

    async def wait_acked(self, seq: int, timeout: float | None = None) -> bool:
        """True once the coordinator acked ``seq``; False if it was dropped from the outbox."""

        async def _wait() -> bool:
            while True:
                if seq in self._dropped_seqs:
                    return False
                if self._outbox.acked_upto >= seq:
                    return True
                self._acked.clear()
                await self._acked.wait()

        return await asyncio.wait_for(_wait(), timeout)

    async def wait_connected(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    def start(self) -> asyncio.Task[None]:
        """Run the link in a background task (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=f"agent-link-{self.address}")
        return self._task

    async def close(self, timeout: float = 5.0) -> None:
        """Stop: first wait up to ``timeout`` for the outbox to be acked, then disconnect."""
        if self._task is not None and not self._task.done() and self.connected:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained(), timeout)
        self._stop.set()
        ch = self._channel
        if ch is not None:
            await ch.close()
        if self._task is not None:
            self._task.cancel()
            # gather, not "suppress(CancelledError)": a cancellation of close()
            # itself must still propagate to our caller.
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._outbox.buffered:
            log.warning("closing with unacknowledged data", buffered=self._outbox.buffered)

    async def _drained(self) -> None:
        while self._outbox.buffered:
            self._acked.clear()
            await self._acked.wait()

    # ------------------------------------------------------------------ loop

    async def run(self) -> None:
        """Connect, serve, reconnect until ``close()``."""
        while not self._stop.is_set():
            self._stats.connect_attempts += 1
            healthy = False
            self._restart.clear()
            established_before = self._stats.reconnects + int(self._established_once)
            if self._resolve and self._at % len(self._candidates) == 0:
                # Once per pass: a name's addresses may have changed.
                self._candidates = await asyncio.to_thread(expand, self._listed) or list(
                    self._listed
                )
                self._at = 0
            if self.on_connecting is not None and not self.on_connecting(self):
                await self._stop.wait()
                break
            try:
                ch = await self.transport.connect(self.address)
            except (OSError, ConnectionError, asyncio.TimeoutError, ValueError) as e:
                self._stats.last_error = f"connect to {self.address} failed: {e}"
                if isinstance(e, ssl.SSLCertVerificationError):
                    # A redirect's target, like any peer, must prove who it is.
                    self._refused(_Refusal("tls_bad_cert", self._stats.last_error))
                else:
                    log.debug("connect failed", address=self.address, error=str(e))
            else:
                self._channel = ch
                try:
                    healthy = await self._serve(ch)
                except _Refusal as r:
                    self._refused(r)
                except ChannelClosed as e:
                    self._stats.last_error = str(e) or "connection closed"
                except asyncio.TimeoutError:
                    self._stats.last_error = "handshake timed out"
                    log.warning("handshake timed out", address=self.address)
                finally:
                    self._connected.clear()
                    lost = self._stats.connected
                    self._stats.connected = False
                    self._channel = None
                    await ch.close()
                    self.coordinator_id = None
                    restart = self._restart.is_set()
                    if lost and not self._stop.is_set() and not restart:
                        self._outage_begins(self._stalled_from)
                    self._stalled_from = None
            if self._stop.is_set():
                break
            if self._restart.is_set():
                # A new hello (ranks moved), not a failure: at once, same address.
                continue
            if self._stats.reconnects + int(self._established_once) == established_before:
                # This address did not give us a session: the next one of the list.
                self._at += 1
                self._failures += 1
                if self.on_failure is not None:
                    self.on_failure(self, self._failures)
            else:
                self._failures = 0
            if healthy:
                self._backoff.reset()
            delay = self._backoff.next_delay()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    def _outage_begins(self, since: float | None = None) -> None:
        """The uplink is down: since `since` (a stall: when the connection stopped
        acknowledging, the last moment it was known to work), else since now."""
        st = self._stats
        st.outages += 1
        st.down_since = time.monotonic() if since is None else since
        log.warning(
            "uplink to coordinator lost",
            address=self.address,
            error=st.last_error,
            buffered=self._outbox.buffered,
            outages=st.outages,
        )

    def _outage_ends(self) -> None:
        st = self._stats
        if st.down_since is None:
            return
        took = max(0.0, time.monotonic() - st.down_since)
        st.down_s += took
        st.down_since = None
        log.warning(
            "uplink to coordinator restored",
            address=self.address,
            outage_s=round(took, 3),
            resend=self._outbox.buffered,
            down_s_total=round(st.down_s, 3),
        )

    def _refused(self, r: _Refusal) -> None:
        if r.reason == "not_owner":
            # A fleet coordinator, to an agent whose minor cannot follow a redirect.
            self._stats.last_error = r.text
            log.error(
                "coordinator does not serve this agent's job: another coordinator of the"
                " fleet owns it, and this protocol minor cannot follow a redirect",
                detail=r.text,
                address=self.address,
                protocol=f"{self.version[0]}.{self.version[1]}",
                retry="the next address of the list, with back-off",
            )
        self._stats.refusals[r.reason] = self._stats.refusals.get(r.reason, 0) + 1
        self._stats.last_error = r.text
        key = (r.reason, r.text)
        now = time.monotonic()
        last = self._last_refusal_log.get(key)
        # One ERROR per distinct refusal per interval: loud once, never a flood.
        if last is None or now - last >= self.refusal_log_interval_s:
            self._last_refusal_log[key] = now
            log.error(
                "coordinator connection refused",
                reason=r.reason,
                detail=r.text,
                address=self.address,
                retry="with back-off",
            )

    async def _serve(self, ch: FrameChannel) -> bool:
        """One connection: handshake, then traffic until it ends. True if it was healthy."""
        session = AgentSession(self._secret, self.identity, version=self.version)
        decoder = FrameDecoder(self.max_frame, version=self.version)
        await ch.send(encode(session.hello(), version=self.version, max_frame=self.max_frame))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.handshake_timeout
        established: Established | None = None
        while established is None:
            frame = await asyncio.wait_for(ch.recv(), max(0.0, deadline - loop.time()))
            for item in decoder.feed(frame):
                for eff in session.receive(item):
                    if isinstance(eff, Established):
                        established = eff
                    elif isinstance(eff, Send):
                        await ch.send(encode(eff.msg, version=self.version))
                    elif isinstance(eff, Refused):
                        raise _Refusal(eff.reason, eff.text)
                    elif isinstance(eff, Redirected):
                        self._redirected(eff)
            if decoder.poisoned:
                raise _Refusal("protocol", "coordinator sent an oversize frame")
        return await self._established(ch, session, decoder, established)

    async def _established(
        self,
        ch: FrameChannel,
        session: AgentSession,
        decoder: FrameDecoder,
        est: Established,
    ) -> bool:
        self._outbox.ack(est.upto)
        self.settings = est.settings
        self._stats.peer_version = est.peer_version
        if self._established_once:
            self._stats.reconnects += 1
        self._established_once = True
        self._stats.connected = True
        self.coordinator_id = est.coordinator_id
        self._connected.set()
        self._acked.set()
        self._unacked_since = None
        self._outage_ends()
        log.info(
            "connected to coordinator",
            address=self.address,
            coordinator=est.coordinator_id,
            peer_version=f"{est.peer_version[0]}.{est.peer_version[1]}",
            resend=self._outbox.buffered,
            jobs=sorted(self.jobs),
        )
        if self.on_established is not None:
            self.on_established(self, est.coordinator_id)
        started = asyncio.get_running_loop().time()
        controls: asyncio.Queue[Control] = asyncio.Queue()
        sender = asyncio.create_task(self._sender(ch))
        worker = asyncio.create_task(self._control_worker(ch, session, controls))
        watchdog = asyncio.create_task(self._stall_watch())
        restart = asyncio.create_task(self._restart.wait())
        recv: asyncio.Future[bytes] | None = None
        try:
            while True:
                recv = asyncio.ensure_future(ch.recv())
                done, _ = await asyncio.wait(
                    {recv, sender, watchdog, restart}, return_when=asyncio.FIRST_COMPLETED
                )
                if restart in done and recv not in done:
                    log.info(
                        "saying a new hello: this uplink's jobs changed",
                        address=self.address,
                        jobs=sorted(self.jobs),
                    )
                    break
                if watchdog in done:
                    self._stats.stalls += 1
                    self._stalled_from = self._unacked_since
                    self._stats.last_error = watchdog.result()
                    log.warning(
                        "coordinator connection stalled: reconnecting",
                        address=self.address,
                        detail=self._stats.last_error,
                        buffered=self._outbox.buffered,
                    )
                    break
                if recv not in done:
                    # The sender only ends by raising (channel gone).
                    sender.result()
                    break
                frame = recv.result()
                for item in decoder.feed(frame):
                    for eff in session.receive(item):
                        if not self._apply(eff, controls):
                            return self._healthy(started)
                if decoder.poisoned:
                    return self._healthy(started)
        except ChannelClosed as e:
            self._stats.last_error = str(e) or "connection closed"
            log.warning("lost connection to coordinator", address=self.address, error=str(e))
        finally:
            tasks: list[asyncio.Future[Any]] = [sender, worker, watchdog, restart]
            if recv is not None:
                tasks.append(recv)
            await cancel_all(tasks)
        return self._healthy(started)

    async def _stall_watch(self) -> str:
        """Returns (ending the connection) once data sent on it went unacknowledged for
        stall_s; never without a stall_s."""
        if self.stall_s is None:
            await asyncio.Event().wait()  # forever: cancelled with the connection
        assert self.stall_s is not None
        step = min(1.0, self.stall_s / 4)
        while True:
            await asyncio.sleep(step)
            since = self._unacked_since
            if since is not None and self._outbox.buffered:
                waited = time.monotonic() - since
                if waited >= self.stall_s:
                    return f"no acknowledgement for {waited:.1f} s"

    def _healthy(self, started: float) -> bool:
        return asyncio.get_running_loop().time() - started >= self.healthy_s

    def _apply(self, eff: Effect, controls: asyncio.Queue[Control]) -> bool:
        """Carry out one effect of an established session; False = close the connection."""
        if isinstance(eff, Acked):
            self._outbox.ack(eff.upto)
            self._acked.set()
            # progress: what is still unacknowledged waits from now
            self._unacked_since = time.monotonic() if self._outbox.buffered else None
        elif isinstance(eff, ControlReceived):
            controls.put_nowait(eff.control)
        elif isinstance(eff, Redirected):
            self._redirected(eff)
        elif isinstance(eff, BadFrame):
            log.warning(
                "bad frame from coordinator", reason=eff.error.reason, detail=eff.error.text
            )
        elif isinstance(eff, PeerError):
            log.warning("coordinator reported an error", code=eff.error.code, text=eff.error.text)
        elif isinstance(eff, Refused | Close):
            self._stats.last_error = eff.text
            log.warning("coordinator closed the session", reason=eff.reason, detail=eff.text)
            return False
        return True

    def _redirected(self, eff: Redirected) -> None:
        log.info(
            "coordinator redirects jobs",
            address=self.address,
            jobs={j.job: j.address or "(the address list)" for j in eff.jobs},
        )
        if self.on_redirect is None:
            log.warning(
                "redirect ignored: this uplink has nowhere to move jobs",
                address=self.address,
                jobs=[j.job for j in eff.jobs],
            )
            return
        self.on_redirect(self, eff.jobs)

    async def _sender(self, ch: FrameChannel) -> None:
        next_seq = self._outbox.first_seq
        while True:
            self._data.clear()
            sent_any = False
            for seq, frame in list(self._outbox.frames_from(next_seq)):
                await ch.send(frame)
                if self._unacked_since is None:
                    self._unacked_since = time.monotonic()
                self._stats.sent_frames += 1
                if seq <= self._highest_sent:
                    self._stats.resent_frames += 1
                else:
                    self._highest_sent = seq
                next_seq = seq + 1
                sent_any = True
            if next_seq < self._outbox.first_seq:
                # Dropped while we were away from the loop: skip the gap.
                next_seq = self._outbox.first_seq
            if not sent_any:
                await self._data.wait()

    async def _control_worker(
        self, ch: FrameChannel, session: AgentSession, controls: asyncio.Queue[Control]
    ) -> None:
        # One at a time and in order: plans and settings must apply in the
        # order the coordinator sent them.
        while True:
            ctl = await controls.get()
            ok, detail, result = await self._run_control(ctl)
            ack = session.control_result(ctl.control_id, ok, detail, result)
            await ch.send(encode(ack, version=self.version))

    async def _run_control(self, ctl: Control) -> tuple[bool, str, dict[str, Any] | None]:
        if self.on_control is None:
            return False, "this agent does not accept control messages", None
        try:
            res = await self.on_control(ctl)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("control handler failed", action=ctl.action, control_id=ctl.control_id)
            return False, f"{type(e).__name__}: {e}", None
        if res is None:
            return True, "", None
        if isinstance(res, bool):
            return res, "", None
        return bool(res[0]), str(res[1]), (res[2] if len(res) > 2 else None)


__all__ = [
    "AgentIdentity",
    "AgentLink",
    "Backoff",
    "ControlHandler",
    "ControlResult",
    "EstablishedHandler",
    "LinkStats",
    "ProtocolError",
    "RedirectHandler",
]
