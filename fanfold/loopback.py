"""The access rules shared by fanfold's loopback HTTP servers (``fanfold ui``'s trace
server and ``fanfold mcp --http``): the per-launch token and which ``Host`` headers
name the server (DESIGN.md, "Security model").

A page on another site can make a browser send requests to 127.0.0.1 under a name it
controls (DNS rebinding): the ``Host`` header then names that site. Both servers answer
only a request whose single ``Host`` is a loopback name, the address the connection
arrived at (an IP literal cannot be rebound) or a name the user gave, with the port
the connection arrived on; one set of rules, so that the two cannot drift apart.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Iterable

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
"""The names (IPv6 without brackets) that always mean this machine."""


def new_token() -> str:
    """A fresh per-launch token: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def host_name_and_port(host: str) -> tuple[str, int | None] | None:
    """``host`` (a Host header or an Origin's authority) as its lower-case name (IPv6
    without brackets) and port, or None if it is not one."""
    match = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::([0-9]{1,5}))?", host)
    if match is None:
        return None
    name = match.group(1).lower().removeprefix("[").removesuffix("]")
    return name, int(match.group(2)) if match.group(2) is not None else None


def address(name: str) -> str:
    """An IP literal in its canonical text (``::0001`` is ``::1``); other names as given."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


def names_this_server(host: str, server: tuple[str, int] | None, extra: Iterable[str] = ()) -> bool:
    """Whether ``host`` names the server the connection arrived at (``server``, the
    ASGI scope's ``(address, port)``): a loopback name, that address, or one of
    ``extra`` (canonical, as ``address`` gives), with that port (80 if none is given)."""
    parsed = host_name_and_port(host)
    if parsed is None or server is None:
        return False
    name, port = parsed
    if (80 if port is None else port) != server[1]:
        return False
    # The loopback names, the address the connection arrived at (an IP literal
    # cannot be rebound), and the names given: never a name an outside page chose.
    name = address(name)
    return name in LOOPBACK_NAMES or name == address(server[0]) or name in extra


def single_host_names_this_server(
    hosts: list[str], server: tuple[str, int] | None, extra: Iterable[str] = ()
) -> bool:
    """Whether a request's ``Host`` headers (all of them) are one that names this
    server: two Host headers are refused, whichever of them a framework would read."""
    return len(hosts) == 1 and names_this_server(hosts[0], server, extra)
