"""Event-loop entry point shared by the daemons: uvloop where it exists, asyncio otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
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
