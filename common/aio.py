"""Event-loop helpers shared by the daemons: the entry point (uvloop where it exists,
asyncio otherwise) and the cancelling of a connection's or a listener's tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

import structlog

T = TypeVar("T")

log = structlog.get_logger("artemis.common.aio")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on uvloop when importable, else the default loop.

    uvloop cuts the per-frame overhead of the coordinator's ingress; without
    it everything still works, and one log line says so.
    """
    try:
        import uvloop
    except ImportError:
        log.info("uvloop not available, using the default asyncio event loop")
        return asyncio.run(coro)
    result: T = uvloop.run(coro)
    return result


async def cancel_all(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait until each has ended (what they raise is dropped)."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
