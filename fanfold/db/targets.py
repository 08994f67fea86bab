"""What names an event log: a file path, or a PostgreSQL URL, and how either may be
shown (pure text functions, shared by ``factory`` and ``postgres``)."""

from __future__ import annotations

import os

URL_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` is a PostgreSQL URL (a str: a ``Path`` is always a file)."""
    return isinstance(target, str) and target.startswith(URL_SCHEMES)


def display_target(target: str | os.PathLike[str]) -> str:
    """``target`` as it may be printed or logged: a path as it is, a URL without its
    password or query string."""
    if not is_postgres(target):
        return os.fspath(target)
    from urllib.parse import urlsplit

    text = str(target)
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
        user = f"{parts.username}@" if parts.username else ""
    except ValueError:
        return f"{text.split('://', 1)[0]}://(unparsable URL)"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"
