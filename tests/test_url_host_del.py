"""``url_host`` reads a DEL (0x7f) anywhere in a URL as it reads any other control
character: no host, so a ``web_fetch(domain:...)`` rule refuses the call and the tool
refuses the URL (it was read as the host before it)."""

from __future__ import annotations

import pytest
import trio

from fanfold.statemachine import ToolCall
from fanfold.statemachine.permissions import Permissions, Rule, RuleSet, refusal, url_host
from fanfold.tools.tool import ToolInputError
from fanfold.tools.web import WebFetchTool


@pytest.mark.parametrize(
    "url",
    ["http://a.com/x\x7fy", "http://a.com/\x7f", "https://a.com/?q=\x7f", "http://a.com\x7f/"],
)
def test_a_url_holding_del_names_no_host_and_is_refused(url: str) -> None:
    assert url_host(url) is None
    allow = Permissions((RuleSet((Rule("web_fetch", "domain:a.com"),), (), "agent 'a'", "/w"),))
    assert refusal(allow, ToolCall.of("t", "web_fetch", {"url": url}), "/w") is not None
    with pytest.raises(ToolInputError, match="not a plain http"):
        trio.run(WebFetchTool(("domain:a.com",)).run, {"url": url}, "/w")
    # The same URL without the DEL is read and allowed.
    plain = url.replace("\x7f", "")
    assert url_host(plain) == "a.com"
    assert refusal(allow, ToolCall.of("t", "web_fetch", {"url": plain}), "/w") is None
