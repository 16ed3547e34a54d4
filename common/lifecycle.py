"""The daemons' lifecycle, after uvicorn's ``Server``.

A daemon object (``AgentDaemon``, ``CoordinatorServer``) runs
``serve() = startup(); main_loop(); shutdown()``. The main loop ticks until
``should_exit`` is set; setting it wakes the loop at once rather than at its
next tick. Signals belong to the shell that runs the daemon: ``capture_signals``
routes SIGTERM/SIGINT to ``handle_exit``, the first asking for a graceful
stop, a second one for ``force_exit`` (the daemon skips its bounded waits,
e.g. the agent's uplink flush).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from abc import ABC, abstractmethod
from collections.abc import Iterator

import structlog

log = structlog.get_logger("artemis.lifecycle")

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Lifecycle:
    """The exit flags and the wake-up a main loop waits on between ticks."""

    def __init__(self) -> None:
        self._should_exit = False
        self.force_exit = False
        self._wake: asyncio.Event | None = None

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value and self._wake is not None:
            self._wake.set()

    def handle_exit(self, sig: int | None = None) -> None:
        """First call: stop gracefully; a second one: stop without the bounded waits."""
        if self._should_exit:
            self.force_exit = True
        self.should_exit = True
        log.info("exit requested", signal=signal.Signals(sig).name if sig else None)

    async def wait_tick(self, seconds: float) -> None:
        """Sleep until the next tick, or less when exit is asked for."""
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._should_exit:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)


class Daemon(Lifecycle, ABC):
    """A daemon's run: ``serve`` starts it, loops until asked to exit, and always shuts
    it down; each daemon (agent, coordinator) gives the three steps."""

    async def serve(self) -> None:
        """Run the daemon: start it, loop until asked to exit, and always shut it down."""
        try:
            await self.startup()
            await self.main_loop()
        finally:
            await self.shutdown()

    @abstractmethod
    async def startup(self) -> None: ...

    @abstractmethod
    async def main_loop(self) -> None: ...

    @abstractmethod
    async def shutdown(self) -> None: ...


@contextlib.contextmanager
def capture_signals(target: Lifecycle) -> Iterator[None]:
    """SIGTERM/SIGINT -> ``target.handle_exit`` on the running loop, for the block."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in EXIT_SIGNALS:
        # RuntimeError/NotImplementedError: not the main thread, or no signal support.
        with contextlib.suppress(RuntimeError, NotImplementedError, ValueError):
            loop.add_signal_handler(sig, target.handle_exit, sig)
            installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
