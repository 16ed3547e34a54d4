"""Logging set-up shared by the daemons and CLIs: structlog on top of stdlib logging.

Console output for people by default, one JSON object per line with
`--log-json`. Configured before any hardware library is imported (pyverbs, for
one, calls logging.basicConfig at import time and would otherwise win).
The `straggler` logger (new flags, at WARNING) goes through the same handler.
"""

from __future__ import annotations

import logging
import sys

import structlog


def setup_logging(json_logs: bool = False, level: str = "INFO") -> None:
    lvl = getattr(logging, level.upper(), logging.INFO)
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderers: list[structlog.types.Processor] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if json_logs
        else [structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderers],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(lvl)
