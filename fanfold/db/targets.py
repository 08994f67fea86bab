"""What names an event log: a file path, or a PostgreSQL URL, and how either may be
shown (pure text functions, shared by ``factory``, ``postgres``, the workers and the
CLI)."""

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


def url_secrets(url: str) -> list[str]:
    """The password a URL holds, in every form a message may quote it (as written,
    percent-decoded, percent-encoded; in the user part or a ``password=`` query)."""
    from urllib.parse import parse_qs, quote, unquote, urlsplit

    try:
        parts = urlsplit(url)
        found = [parts.password or "", *parse_qs(parts.query).get("password", [])]
    except ValueError:
        return []
    forms = {
        form
        for secret in found
        if secret
        for form in (secret, unquote(secret), quote(secret), quote(secret, safe=""))
    }
    # The longest first: a form that holds another is cut whole.
    return sorted((f for f in forms if f), key=len, reverse=True)


def without_password(text: str, url: str) -> str:
    """``text`` with the URL's password cut out (``***``): what a driver's error may
    quote, before anyone sees it."""
    for secret in url_secrets(url):
        text = text.replace(secret, "***")
    return text
