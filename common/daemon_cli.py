"""How a daemon's command starts it (`artemis-agent run`, `artemis-coordinator serve`):
the config from its file with the flags given on top, logs as it says, then the daemon
until it exits. A config that cannot be used ends the command with one line that names
the key, before or after the daemon has started."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, Protocol, TypeVar

import typer
from artemis.common.exits import exit_error
from artemis.common.tomlfile import ConfigError, load_config

C = TypeVar("C", bound="DaemonConfig")

# The daemons' --log-json flag (the config's log_json).
LogJson = Annotated[bool, typer.Option("--log-json", help="Logs as JSON lines.")]


class DaemonConfig(Protocol):
    @property
    def log_json(self) -> bool: ...

    def validated(self: C) -> C: ...


def run_daemon(
    cls: type[C],
    path: Path | None,
    flags: dict[str, Any],
    main: Callable[[C], Coroutine[Any, Any, None]],
) -> None:
    """``flags``: the command's options by config key, None where not given (a Path is
    passed on as its string, as the file would give it)."""
    from artemis.common.aio import run
    from artemis.common.logs import setup_logging

    given = {k: str(v) if isinstance(v, Path) else v for k, v in flags.items()}
    try:
        cfg = load_config(cls, path, given).validated()
    except ConfigError as e:
        exit_error(e)
    setup_logging(json_logs=cfg.log_json)
    try:
        run(main(cfg))
    except ConfigError as e:
        exit_error(e)
