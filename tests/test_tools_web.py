"""web_fetch over real HTTP to a loopback server, and web_fetch(domain:...) rules."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fanfold.providers.config import ConfigError, parse_config
from fanfold.statemachine import ToolCall
from fanfold.statemachine.permissions import (
    Permissions,
    RuleSet,
    parse_rule,
    refusal,
    url_host,
)
from fanfold.tools import ToolSet
from fanfold.tools.web import WebFetchTool, html_text

PAGE = b"""<!doctype html><html><head><title>T</title><script>var secret = 1;</script>
<style>p { color: red }</style></head><body><h1>Hello &amp; welcome</h1>
<p>First   paragraph,
 spread over lines.</p><ul><li>one</li><li>two</li></ul></body></html>"""


class Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        port = self.headers.get("Host", "").rsplit(":", 1)[-1]
        routes: dict[str, tuple[int, dict[str, str], bytes]] = {
            "/page": (200, {"Content-Type": "text/html; charset=utf-8"}, PAGE),
            "/plain": (200, {"Content-Type": "text/plain"}, b"just text"),
            "/same": (302, {"Location": "/plain"}, b""),
            "/other": (302, {"Location": f"http://localhost:{port}/plain"}, b""),
            "/loop": (302, {"Location": "/loop"}, b""),
            "/missing": (404, {"Content-Type": "text/plain"}, b"no such page"),
            "/big": (200, {"Content-Type": "text/plain"}, b"x" * 300_000),
            "/image": (200, {"Content-Type": "image/png"}, b"\x89PNG\r\n"),
        }
        if self.path == "/slow":
            time.sleep(3)
            routes["/slow"] = (200, {}, b"late")
        if self.path == "/slower":
            time.sleep(6)
            routes["/slower"] = (200, {"Content-Type": "text/plain"}, b"worth the wait")
        status, headers, body = routes.get(self.path, (404, {}, b""))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    # Polled every 10 ms, not serve_forever's 0.5 s: shutdown() waits for the next poll.
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


async def fetch(tool: WebFetchTool, url: str) -> tuple[str, bool]:
    result = await ToolSet([tool]).run(ToolCall("c", "web_fetch", json.dumps({"url": url})), "/")
    return result.content, result.is_error


async def test_a_page_from_an_allowed_loopback_host_is_its_text(server: str) -> None:
    content, is_error = await fetch(WebFetchTool(["127.0.0.1"]), server + "/page")
    assert not is_error
    assert content == (
        f"{server}/page (200, text/html)\n\nT\nHello & welcome\nFirst paragraph, spread over "
        "lines.\none\ntwo"
    )
    assert await fetch(WebFetchTool(["127.0.0.1"]), server + "/plain") == (
        f"{server}/plain (200, text/plain)\n\njust text",
        False,
    )


async def test_no_domain_no_fetch(server: str) -> None:
    content, is_error = await fetch(WebFetchTool(["example.com"]), server + "/page")
    assert is_error
    assert content == (
        "web_fetch: 127.0.0.1 is not an allowed domain (allowed: example.com; the "
        "configuration's [tools.web_fetch] domains)"
    )
    assert "web_fetch" not in ToolSet.default()  # none by default: not even offered
    assert "web_fetch" in ToolSet.default(web_domains=["example.com"])


async def test_a_name_allowed_by_a_wildcard_that_resolves_to_loopback_is_refused(
    server: str,
) -> None:
    # The name passes the domain check; the address it resolves to does not.
    port = server.rsplit(":", 1)[1]

    async def resolver(host: str, port: int) -> list[str]:
        return {"docs.example.test": ["127.0.0.1"], "ten.example.test": ["10.1.2.3"]}[host]

    tool = WebFetchTool(["*.example.test"], resolver=resolver)
    for host, address in (("docs.example.test", "127.0.0.1"), ("ten.example.test", "10.1.2.3")):
        content, is_error = await fetch(tool, f"http://{host}:{port}/plain")
        assert is_error
        assert content.startswith(
            f"web_fetch: {host} resolves to {address}, a loopback, private or reserved address"
        )
    # Named exactly, the same host may reach its loopback address.
    exact = WebFetchTool(["docs.example.test"], resolver=resolver)
    content, is_error = await fetch(exact, f"http://docs.example.test:{port}/plain")
    assert (is_error, content.endswith("just text")) == (False, True)


async def test_localhost_needs_its_own_rule_and_mapped_addresses_count_as_loopback(
    server: str,
) -> None:
    port = server.rsplit(":", 1)[1]

    async def mapped(host: str, port: int) -> list[str]:
        return ["::ffff:127.0.0.1"]

    content, is_error = await fetch(
        WebFetchTool(["*.test"], resolver=mapped), f"http://a.test:{port}/plain"
    )
    assert is_error and "resolves to ::ffff:127.0.0.1" in content
    content, is_error = await fetch(WebFetchTool(["localhost"]), f"http://localhost:{port}/plain")
    assert (is_error, content.endswith("just text")) == (False, True)


async def test_redirects_same_host_followed_other_host_reported(server: str) -> None:
    tool = WebFetchTool(["127.0.0.1", "localhost"])
    assert await fetch(tool, server + "/same") == (
        f"{server}/plain (200, text/plain)\n\njust text",
        False,
    )
    port = server.rsplit(":", 1)[1]
    assert await fetch(tool, server + "/other") == (
        f"{server}/other redirects to http://localhost:{port}/plain, on another host: not "
        "followed. Call web_fetch with that URL to follow it.",
        False,
    )
    assert await fetch(tool, server + "/loop") == ("web_fetch: more than 5 redirects", True)


async def test_caps_errors_and_what_is_not_text(server: str) -> None:
    tool = WebFetchTool(["127.0.0.1"], max_bytes=100_000, max_chars=1000)
    content, is_error = await fetch(tool, server + "/big")
    assert not is_error
    assert "[the body is larger than 100000 bytes: cut there]" in content
    assert "characters omitted" in content and len(content) < 1300
    content, is_error = await fetch(tool, server + "/missing")
    assert (is_error, content) == (True, f"{server}/missing (404, text/plain)\n\nno such page")
    assert await fetch(tool, server + "/image") == (
        f"{server}/image (200, image/png)\n\n(image/png content, 6 bytes: not shown)",
        False,
    )
    slow = WebFetchTool(["127.0.0.1"], timeout=0.5)
    assert await fetch(slow, server + "/slow") == ("web_fetch: timed out after 0.5 s", True)
    for url in ("ftp://127.0.0.1/x", "http://user@127.0.0.1/", "http://127.0.0.1\\@x/"):
        content, is_error = await fetch(tool, url)
        assert is_error and content.startswith("web_fetch: not a plain http(s) URL"), url


@pytest.mark.slow
async def test_only_the_tools_own_time_limit_ends_a_slow_page(server: str) -> None:
    # httpx's default timeouts (5 s a phase) once cut this page short of the 30 s.
    content, is_error = await fetch(WebFetchTool(["127.0.0.1"]), server + "/slower")
    assert (is_error, content.endswith("worth the wait")) == (False, True)


def test_html_text_drops_scripts_and_keeps_blocks() -> None:
    assert html_text(PAGE.decode()) == (
        "T\nHello & welcome\nFirst paragraph, spread over lines.\none\ntwo"
    )


def test_url_hosts_are_read_strictly() -> None:
    assert url_host("https://Docs.Python.org./3/?q=a%20b") == "docs.python.org"
    assert url_host("http://[::1]:8080/") == "::1"
    for url in (
        "http://evil.com\\@docs.python.org/",
        "http://docs.python.org@evil.com/",
        "http://docs%2epython.org/",
        "javascript:alert(1)",
        "http://docs.python.org:80:81/",
        "http://d\u043ecs.python.org/",  # a Cyrillic o
    ):
        assert url_host(url) is None, url


def _call(url: str) -> ToolCall:
    return ToolCall("c", "web_fetch", json.dumps({"url": url}))


def test_web_fetch_domain_rules_in_agent_definitions() -> None:
    allow = parse_rule("WebFetch(domain:docs.python.org)")
    wildcard = parse_rule("web_fetch(domain:*.example.com)")
    deny = parse_rule("web_fetch(domain:secret.example.com)")
    assert not isinstance(allow, str) and not isinstance(wildcard, str)
    assert not isinstance(deny, str)
    permissions = Permissions((RuleSet((allow, wildcard), (deny,), "agent 'reader'"),))
    assert refusal(permissions, _call("https://docs.python.org/3/"), "/") is None
    assert refusal(permissions, _call("https://a.example.com/x"), "/") is None
    assert refusal(permissions, _call("https://example.com/x"), "/") == (
        "refused: no allow rule of agent 'reader' matches this call (allowed: "
        "web_fetch(domain:docs.python.org), web_fetch(domain:*.example.com))"
    )
    assert refusal(permissions, _call("https://secret.example.com/"), "/") == (
        "refused by the deny rule 'web_fetch(domain:secret.example.com)' of agent 'reader'"
    )
    # A URL that is not plain matches no allow rule and every deny rule.
    assert refusal(permissions, _call("https://docs.python.org@evil.com/"), "/") is not None
    assert parse_rule("WebFetch(docs.python.org)") == (
        "rule 'WebFetch(docs.python.org)': web_fetch takes domain:HOST, like "
        "web_fetch(domain:docs.python.org)"
    )
    assert parse_rule("web_fetch(domain:a*b.com)") == (
        "rule 'web_fetch(domain:a*b.com)': 'a*b.com' is not a host name (a wildcard only "
        "as '*.' at the start)"
    )


def test_the_configuration_gives_the_domains_and_refuses_bad_ones() -> None:
    base: dict[str, Any] = {"profiles": {"p": {"provider": "scripted"}}}
    config = parse_config({**base, "tools": {"web_fetch": {"domains": ["docs.python.org"]}}})
    assert config.web_domains == ("docs.python.org",)
    with pytest.raises(ConfigError, match=r"tools\.web_fetch\.domains\[0\]"):
        parse_config({**base, "tools": {"web_fetch": {"domains": ["a b"]}}})
