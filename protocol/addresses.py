"""Coordinator address lists: "H1:P1,H2:P2" or one name that resolves to several.

One parser for every place that takes ``--coordinator`` (the agent's flag and config
key, ``artemis loadtest``), so they accept and refuse the same things. A fleet of
coordinators (docs/DESIGN.md "Protocol") is reached through any of its members: the
agent starts on the first one that answers and follows redirects from there.
"""

from __future__ import annotations

import ipaddress
import socket

from artemis.protocol.transport import format_address, parse_address


class AddressListError(ValueError):
    """A coordinator list with a bad entry; the message names the entry."""


def parse_address_list(text: str) -> tuple[str, ...]:
    """``"H1:P1,H2:P2"`` -> ("H1:P1", "H2:P2"), each entry checked, order kept,
    repeats dropped. Raises AddressListError naming the first bad entry."""
    entries = [e.strip() for e in str(text).split(",")]
    if not any(entries):
        raise AddressListError(f"coordinator: expected HOST:PORT[,HOST:PORT...], got {text!r}")
    out: list[str] = []
    for i, entry in enumerate(entries):
        if not entry:
            raise AddressListError(
                f"coordinator: entry {i + 1} of {text!r} is empty (a stray comma?)"
            )
        try:
            host, port = parse_address(entry)
        except ValueError:
            host, port = "", -1
        if not entry.rpartition(":")[0] or port < 1:
            raise AddressListError(
                f"coordinator: entry {i + 1} {entry!r} of {text!r} is not HOST:PORT"
                " (a port from 1 to 65535)"
            )
        addr = format_address(host, port)
        if addr not in out:
            out.append(addr)
    return tuple(out)


def is_literal(host: str) -> bool:
    """An IP address literal: nothing to resolve."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def expand(addresses: tuple[str, ...] | list[str]) -> list[str]:
    """Each entry whose host is a name becomes every address it resolves to (the port
    kept, order of resolution kept, repeats dropped); a name that does not resolve (yet)
    stays as it is, so the connect attempt reports it. Blocking: call it off the
    event loop, or where a short stall is fine (once per pass through the list)."""
    out: list[str] = []
    for addr in addresses:
        host, port = parse_address(addr)
        found = [addr]
        if not is_literal(host):
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError:
                infos = []
            if infos:
                found = [format_address(str(ai[4][0]), port) for ai in infos]
        for a in found:
            if a not in out:
                out.append(a)
    return out


__all__ = ["AddressListError", "expand", "is_literal", "parse_address_list"]
