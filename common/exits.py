"""How the command-line tools end on a bad input: one line on stderr, a non-zero exit."""

from __future__ import annotations

from typing import NoReturn

import typer

EXIT_USAGE = 2  # bad input: a scenario, a config, a store or a report that cannot be used


def exit_error(e: BaseException | str, code: int = EXIT_USAGE) -> NoReturn:
    """`error: <e>` on stderr, then exit with `code` (no traceback: the message says it)."""
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(code)
