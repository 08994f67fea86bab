"""The ``web_fetch`` tool (Claude Code's ``WebFetch``): a page's text, from the allowed
domains only.

- **Domains**: the tool fetches only from hosts its ``domains`` name (the
  configuration's ``[tools.web_fetch] domains``; none by default, and with none the
  tool is not offered): ``docs.python.org`` exactly, ``*.python.org`` any host below.
  Agent definitions narrow it further with ``web_fetch(domain:...)`` rules, which the
  reducer checks (``fanfold.statemachine.permissions``) before the call runs.
- **Addresses**: every connection (the first and each redirect's) resolves the host
  itself and refuses a loopback, private, link-local, multicast or otherwise
  non-global address unless a domain names that host exactly (``127.0.0.1``,
  ``localhost``, ``intranet.example``): a wildcard never reaches the inside of the
  network. The connection then goes to the address that was checked, so a name that
  resolves differently a moment later (DNS rebinding) cannot slip past the check.
- **Redirects**: followed on the same host (up to ``max_redirects``); to another host
  they are not followed: the result says where it leads, and the model may fetch that
  URL with a call of its own, which the rules judge like any other.
- **Caps**: ``timeout`` for the whole fetch, ``max_bytes`` read of a body, the text cut
  to ``max_chars``. No proxy from the environment, no cookies, no credentials.
- **Text**: HTML becomes its text (scripts, styles and the like dropped, one line per
  block) with the standard library's ``html.parser``; other text as it is; anything
  else is described, not shown.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin

import attrs
import httpcore
import httpx
import trio

from fanfold.statemachine import ToolSpec
from fanfold.statemachine.permissions import DOMAIN, domain_matches, domain_problem, url_host
from fanfold.tools.output import HeadTailBuffer
from fanfold.tools.tool import ToolInputError, ToolOutput

Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (the system's resolver, through Trio)."""
    infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def normalise_domains(domains: Iterable[str]) -> tuple[str, ...]:
    """``domains`` as ``domain:HOST`` patterns; ``ValueError`` names a bad one."""
    out = []
    for domain in domains:
        text = domain.strip()
        pattern = text if text.startswith(DOMAIN) else DOMAIN + text
        problem = domain_problem(pattern)
        if problem is not None:
            raise ValueError(f"web_fetch domain {domain!r}: {problem}")
        out.append(DOMAIN + pattern[len(DOMAIN) :].strip().lower().rstrip("."))
    return tuple(out)


def _inside(address: str) -> bool:
    """Whether ``address`` is not a public internet address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        not ip.is_global
        or ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


class Refused(Exception):
    """A connection the address rule refuses (turned into the call's error result)."""


class _CheckedBackend(httpcore.AsyncNetworkBackend):
    """Resolves each host itself, checks every address, connects to a checked one."""

    def __init__(self, private_hosts: frozenset[str], resolver: Resolver) -> None:
        self._inner = httpcore.TrioBackend()
        self._private_hosts = private_hosts
        self._resolver = resolver

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await self._resolver(host, port)
        except OSError as exc:
            raise Refused(f"cannot resolve {host}: {exc.strerror or exc}") from None
        if not addresses:
            raise Refused(f"cannot resolve {host}")
        if host.lower().rstrip(".") not in self._private_hosts:
            inside = [a for a in addresses if _inside(a)]
            if inside:
                raise Refused(
                    f"{host} resolves to {inside[0]}, a loopback, private or reserved "
                    f"address: only a domain naming {host} exactly (not a wildcard) "
                    "allows that"
                )
        return await self._inner.connect_tcp(
            addresses[0],
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise Refused("no unix sockets")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


def _client(private_hosts: frozenset[str], resolver: Resolver) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    # httpx takes no network backend; its transport's pool is replaced by one that
    # connects through the checking backend (tests/test_tools_web.py holds this: a
    # loopback server is refused without a rule naming it).
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False),
        network_backend=_CheckedBackend(private_hosts, resolver),
        max_connections=4,
        retries=0,
    )
    return httpx.AsyncClient(
        transport=transport,
        trust_env=False,
        follow_redirects=False,
        # The tool's own cancel scope bounds the whole fetch; httpx's default 5 s
        # per-phase timeouts would cut a slow page short of it.
        timeout=None,
        headers={"User-Agent": "fanfold-web-fetch", "Accept": "text/html, text/*;q=0.9"},
    )


_SKIPPED = frozenset({"script", "style", "noscript", "template", "svg", "iframe"})
_BLOCKS = frozenset(
    {
        "p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header",
        "footer", "nav", "main", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote",
        "hr", "dt", "dd", "title", "aside", "figure", "figcaption", "form",
    }
)  # fmt: skip


_SPACES = re.compile(r"\s+")


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0
        self.preformatted = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED:
            self.skipping += 1
        elif tag in _BLOCKS:
            self.parts.append("\n")
        if tag == "pre":
            self.preformatted += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif tag in _BLOCKS:
            self.parts.append("\n")
        if tag == "pre":
            self.preformatted = max(0, self.preformatted - 1)

    def handle_data(self, data: str) -> None:
        if self.skipping:
            return
        # Line breaks in the source are spaces, except in <pre>.
        self.parts.append(data if self.preformatted else _SPACES.sub(" ", data))


def html_text(html: str) -> str:
    """The readable text of an HTML page: one line per block, spaces collapsed."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


@attrs.frozen
class WebFetchTool:
    """``web_fetch``: a page's text from an allowed domain (see the module docstring)."""

    domains: tuple[str, ...] = attrs.field(converter=normalise_domains)
    timeout: float = 30.0
    max_bytes: int = 2 << 20
    max_chars: int = 30_000
    max_redirects: int = 5
    resolver: Resolver = attrs.field(default=resolve, repr=False)
    read_only = False
    idempotent = True

    @property
    def spec(self) -> ToolSpec:
        """The tool's name, description and schema."""
        shown = ", ".join(d[len(DOMAIN) :] for d in self.domains) or "none"
        return ToolSpec.from_schema(
            "web_fetch",
            "Fetch a web page (http or https) and return its text. Only these domains are "
            f"allowed: {shown}. A redirect to another host is reported, not followed. "
            f"The text is cut at {self.max_chars} characters.",
            {
                "type": "object",
                "required": ["url"],
                "additionalProperties": False,
                "properties": {
                    "url": {"type": "string", "minLength": 1, "description": "The URL"},
                },
            },
        )

    async def run(self, args: Mapping[str, Any], cwd: str) -> ToolOutput:
        """Fetch ``args["url"]``."""
        url: str = args["url"].strip()
        host = url_host(url)
        if host is None:
            raise ToolInputError(
                "not a plain http(s) URL (no user name, spaces, backslashes, or %-escapes "
                "in the host)"
            )
        self._check(host)
        private_hosts = frozenset(d[len(DOMAIN) :] for d in self.domains if "*" not in d)
        try:
            with trio.fail_after(self.timeout):
                async with _client(private_hosts, self.resolver) as client:
                    return await self._fetch(client, url, host)
        except trio.TooSlowError:
            raise ToolInputError(f"timed out after {self.timeout:g} s") from None
        except Refused as exc:
            raise ToolInputError(str(exc)) from None
        except httpx.HTTPError as exc:
            raise ToolInputError(f"{type(exc).__name__}: {exc}") from None

    def _check(self, host: str) -> None:
        if not any(domain_matches(d, host) for d in self.domains):
            shown = ", ".join(d[len(DOMAIN) :] for d in self.domains) or "none"
            raise ToolInputError(
                f"{host} is not an allowed domain (allowed: {shown}; the configuration's "
                "[tools.web_fetch] domains)"
            )

    async def _fetch(self, client: httpx.AsyncClient, url: str, host: str) -> ToolOutput:
        for _ in range(self.max_redirects + 1):
            async with client.stream("GET", url) as response:
                location = response.headers.get("location")
                if response.is_redirect and location:
                    target = urljoin(url, location)
                    if url_host(target) != host:
                        return ToolOutput.ok(
                            f"{url} redirects to {target}, on another host: not followed. "
                            "Call web_fetch with that URL to follow it."
                        )
                    url = target
                    continue
                body, cut = await self._read(response)
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                text = self._text(body, kind, response.encoding or "utf-8")
                status = f"{url} ({response.status_code}, {kind or 'no content type'})"
                if cut:
                    text += f"\n[the body is larger than {self.max_bytes} bytes: cut there]"
                buffer = HeadTailBuffer(self.max_chars)
                buffer.feed(text.encode())
                content = f"{status}\n\n{buffer.text()}"
                if response.status_code >= 400:
                    return ToolOutput.error(content)
                return ToolOutput.ok(content)
        raise ToolInputError(f"more than {self.max_redirects} redirects")

    async def _read(self, response: httpx.Response) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_bytes:
                return b"".join(chunks)[: self.max_bytes], True
        return b"".join(chunks), False

    def _text(self, body: bytes, kind: str, encoding: str) -> str:
        textual = not kind or kind.startswith("text/") or kind in _TEXTUAL
        if not textual:
            return f"({kind} content, {len(body)} bytes: not shown)"
        try:
            text = body.decode(encoding, errors="replace")
        except LookupError:
            text = body.decode("utf-8", errors="replace")
        if kind in ("text/html", "application/xhtml+xml") or (
            not kind and text.lstrip()[:15].lower().startswith(("<!doctype html", "<html"))
        ):
            return html_text(text)
        return text


_TEXTUAL = frozenset(
    {"application/json", "application/xml", "application/xhtml+xml", "application/javascript"}
)
