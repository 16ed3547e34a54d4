"""The agent link's counters and its reconnect back-off (protocol/client.py's AgentLink),
apart from the link so the agent's metrics and uplinks read them without the link."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field


@dataclass
class LinkStats:
    connected: bool = False
    buffered: int = 0  # data messages not yet acked
    dropped: int = 0  # data messages dropped because the outbox was full
    reconnects: int = 0  # established connections after the first
    connect_attempts: int = 0
    sent_frames: int = 0
    resent_frames: int = 0  # frames sent again after a reconnect
    acked_upto: int = 0
    refusals: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    peer_version: tuple[int, int] | None = None
    outages: int = 0  # established connections lost (each ends at the next one)
    down_s: float = 0.0  # seconds of the outages that ended
    down_since: float | None = None  # monotonic start of the outage now, if any
    stalls: int = 0  # connections dropped for taking data without acknowledging it

    def down_seconds(self, now: float | None = None) -> float:
        """Seconds without an uplink since the first connection, the outage now included."""
        if self.down_since is None:
            return self.down_s
        return self.down_s + max(0.0, (time.monotonic() if now is None else now) - self.down_since)


@dataclass
class Backoff:
    """Jittered exponential back-off: attempt n waits uniform(d/2, d), d = min(cap, base * 2**n).

    The lower half-bound guarantees a minimum wait (no spinning); the jitter
    spreads a fleet of agents reconnecting after a coordinator restart.
    """

    base: float = 0.2
    cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        d = min(self.cap, self.base * (2.0 ** min(self.attempt, 62)))
        self.attempt += 1
        return self.rng.uniform(d / 2, d)

    def reset(self) -> None:
        self.attempt = 0


__all__ = ["Backoff", "LinkStats"]
