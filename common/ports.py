"""Loopback ports for the daemons a shell starts (`artemis run`, the simulator).

A port found free is closed again before the daemon binds it, so another process
(a test beside it, an outgoing connection) can take it in between. The coordinator
then exits with one line naming the port (``ADDRESS_IN_USE``); the shell picks
other ports and starts it again rather than failing the user's job.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

ADDRESS_IN_USE = "address already in use"  # the reason the coordinator's error line names
START_TRIES = 4


class PortTaken(Exception):
    """A daemon could not listen on a port picked free; ``key`` names its config key."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cannot_listen(key: str, where: str, e: OSError) -> str:
    """The one line a daemon exits with when ``key`` (its config key) cannot be bound;
    `port_taken` reads it back."""
    # asyncio words its own ("error while attempting to bind on address ..."): the errno's
    why = (os.strerror(e.errno) if e.errno else str(e)).lower()
    return f"{key}: cannot listen on {where}: {why}"


def error_line(log: Path, since: int = 0) -> str:
    """A daemon's last ``error: ...`` line in its log (what it said as it exited), or "";
    ``since``: the byte the log ended at when this life started (a log appended to by
    earlier lives holds their lines too)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(since)
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return next((ln[len("error: ") :] for ln in reversed(lines) if ln.startswith("error: ")), "")


def port_taken(error_line: str) -> PortTaken | None:
    """The coordinator's ``error:`` line read as a taken port, or None.

    Its lines read ``listen: cannot listen on HOST:PORT: address already in use`` or
    the same after ``metrics_port:`` (coordinator/server_main.py)."""
    if ADDRESS_IN_USE not in error_line:
        return None
    key = error_line.split(":", 1)[0].strip()
    return PortTaken(error_line, key if key in ("listen", "metrics_port") else "listen")


def on_free_ports(
    attempt: Callable[[int, int], T], metrics_port: int | None = None, tries: int = START_TRIES
) -> T:
    """``attempt(port, metrics_port)`` on freshly picked ports until it does not raise
    PortTaken (at most ``tries`` times). A ``metrics_port`` the user gave is kept, and
    its being taken is final."""
    for left in range(tries - 1, -1, -1):
        try:
            return attempt(free_port(), metrics_port or free_port())
        except PortTaken as e:
            if not left or (metrics_port and e.key == "metrics_port"):
                raise
    raise AssertionError("unreachable: tries >= 1")
