"""Request parameters in a model profile: typed settings (``stop``, ``top_p``,
``seed``, ``tool_choice``, ``parallel_tool_calls``, ``reasoning_effort``) and the
checked pass-through (``extra_body``, ``extra_headers``), sent over loopback HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeserver import FakeServer, anthropic_message, openai_completion

from fanfold.providers.base import CallContext
from fanfold.providers.config import ConfigError, build_provider, load_config
from fanfold.providers.http import HttpProvider, RequestSettings
from fanfold.statemachine import ModelRequest, ToolSpec, UserMessage

KEY = "sk-settings-test-SECRET-0123456789"
TOOL = ToolSpec.from_schema("get_weather", "Weather", {"type": "object", "properties": {}})
WITH_TOOLS = ModelRequest("Be brief.", (UserMessage("Weather?"),), (TOOL,))
NO_TOOLS = ModelRequest("Be brief.", (UserMessage("Weather?"),), ())

OPENAI_PROFILE = """
[profiles.local]
provider = "openai"
base_url = "{url}/v1"
model = "qwen2.5-7b-instruct"
stop = ["</tool_call>", "<|im_end|>"]
top_p = 0.9
seed = 42
tool_choice = "required"
parallel_tool_calls = false
reasoning_effort = "low"
extra_headers = {{ "X-Title" = "fanfold", "HTTP-Referer" = "https://example.invalid" }}

[profiles.local.extra_body]
cache_prompt = true
chat_template_kwargs = {{ enable_thinking = false }}
"""

ANTHROPIC_PROFILE = """
[profiles.claude]
provider = "anthropic"
base_url = "{url}"
model = "claude-x"
api_key_env = "TEST_KEY"
stop = "###"
top_p = 0.5
tool_choice = "required"
parallel_tool_calls = false
extra_headers = {{ "anthropic-beta" = "token-efficient-tools-2025-02-19" }}
extra_body = {{ metadata = {{ user_id = "u-1" }} }}
"""


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def load(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "fanfold.toml"
    path.write_text(text)
    return {"FANFOLD_CONFIG": str(path), "HOME": str(tmp_path), "TEST_KEY": KEY}


async def call(provider: HttpProvider, request: ModelRequest) -> None:
    async with provider:
        await provider.complete(request, CallContext("c", "c", "root", 0, None, 1))


def test_profile_settings_are_parsed(tmp_path: Path) -> None:
    environ = load(tmp_path, OPENAI_PROFILE.format(url="http://127.0.0.1:9"))
    profile = load_config(environ=environ).default_profile()
    assert profile.settings == RequestSettings(
        stop=("</tool_call>", "<|im_end|>"),
        top_p=0.9,
        seed=42,
        tool_choice="required",
        parallel_tool_calls=False,
        reasoning_effort="low",
        extra_body=(
            ("cache_prompt", "true"),
            ("chat_template_kwargs", '{"enable_thinking":false}'),
        ),
        extra_headers=(("X-Title", "fanfold"), ("HTTP-Referer", "https://example.invalid")),
    )


async def test_openai_profile_settings_reach_the_server(server: FakeServer, tmp_path: Path) -> None:
    environ = load(tmp_path, OPENAI_PROFILE.format(url=server.url))
    provider = build_provider(load_config(environ=environ).default_profile(), environ=environ)
    assert isinstance(provider, HttpProvider)
    provider.stream = False
    server.enqueue(openai_completion("sunny"), openai_completion("sunny"))
    await call(provider, WITH_TOOLS)
    await call(provider, NO_TOOLS)
    with_tools, without = (request.json for request in server.requests)
    assert with_tools["stop"] == ["</tool_call>", "<|im_end|>"]
    assert (with_tools["top_p"], with_tools["seed"]) == (0.9, 42)
    assert with_tools["reasoning_effort"] == "low"
    assert (with_tools["tool_choice"], with_tools["parallel_tool_calls"]) == ("required", False)
    assert with_tools["cache_prompt"] is True
    assert with_tools["chat_template_kwargs"] == {"enable_thinking": False}
    assert with_tools["model"] == "qwen2.5-7b-instruct"
    # Tool settings only go with tools: servers refuse tool_choice without them.
    assert "tool_choice" not in without and "parallel_tool_calls" not in without
    assert without["stop"] == with_tools["stop"]
    headers = server.requests[0].headers
    assert (headers["x-title"], headers["http-referer"]) == ("fanfold", "https://example.invalid")
    assert "authorization" not in headers


async def test_anthropic_profile_settings_reach_the_server(
    server: FakeServer, tmp_path: Path
) -> None:
    environ = load(tmp_path, ANTHROPIC_PROFILE.format(url=server.url))
    provider = build_provider(load_config(environ=environ).default_profile(), environ=environ)
    assert isinstance(provider, HttpProvider)
    provider.stream = False
    server.enqueue(anthropic_message("sunny"))
    await call(provider, WITH_TOOLS)
    body = server.requests[0].json
    assert body["stop_sequences"] == ["###"]
    assert body["top_p"] == 0.5
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert body["metadata"] == {"user_id": "u-1"}
    headers = server.requests[0].headers
    assert headers["anthropic-beta"] == "token-efficient-tools-2025-02-19"
    assert headers["x-api-key"] == KEY


BASE = "[profiles.a]\nprovider = 'openai'\nmodel = 'm'\n"


@pytest.mark.parametrize(
    ("extra", "key", "problem"),
    [
        (
            "extra_headers = { Authorization = 'Bearer x' }",
            "extra_headers.Authorization",
            "api_key_env",
        ),
        ("extra_headers = { x-api-key = 'x' }", "extra_headers.x-api-key", "api_key_env"),
        ("extra_headers = { Helicone-Auth = 'x' }", "extra_headers.Helicone-Auth", "api_key_env"),
        (
            "extra_headers = { Proxy-Authorization = 'x' }",
            "extra_headers.Proxy-Authorization",
            "api_key_env",
        ),
        ("extra_headers = { Cookie = 'a=b' }", "extra_headers.Cookie", "api_key_env"),
        (
            "extra_headers = { Content-Type = 'text/plain' }",
            "extra_headers.Content-Type",
            "sets this header",
        ),
        ("extra_headers = { 'bad name' = 'x' }", "extra_headers.bad name", "header name"),
        ("extra_headers = { X-A = 'a', x-a = 'b' }", "extra_headers.x-a", "twice"),
        ('extra_headers = { X-A = "line\\nbreak" }', "extra_headers.X-A", "printable ASCII"),
        ("extra_headers = { X-A = 1 }", "extra_headers.X-A", "printable ASCII"),
        ("extra_headers = 'x'", "extra_headers", "table"),
        ("extra_body = { model = 'other' }", "extra_body.model", "fanfold sets"),
        ("extra_body = { messages = [] }", "extra_body.messages", "fanfold sets"),
        ("extra_body = { tools = [] }", "extra_body.tools", "fanfold sets"),
        ("extra_body = { stream = false }", "extra_body.stream", "fanfold sets"),
        ("extra_body = { stream_options = {} }", "extra_body.stream_options", "fanfold sets"),
        ("extra_body = { temperature = 1 }", "extra_body.temperature", "setting temperature"),
        ("extra_body = { stop = ['x'] }", "extra_body.stop", "setting stop"),
        ("extra_body = { x = nan }", "extra_body.x", "finite"),
        ("extra_body = { x = { y = [inf] } }", "extra_body.x.y[0]", "finite"),
        ("extra_body = { x = 1979-05-27 }", "extra_body.x", "not date"),
        ("extra_body = []", "extra_body", "table"),
        ("stop = []", "stop", "non-empty"),
        ("stop = ['a', '']", "stop", "non-empty"),
        ("stop = 3", "stop", "non-empty"),
        ("top_p = 0", "top_p", "> 0"),
        ("top_p = 1.5", "top_p", "<= 1"),
        ("seed = 1.5", "seed", "integer"),
        ("seed = true", "seed", "integer"),
        ("tool_choice = 'always'", "tool_choice", "auto, required, none"),
        ("parallel_tool_calls = 'no'", "parallel_tool_calls", "true or false"),
        ("reasoning_effort = 'max'", "reasoning_effort", "must be one of"),
        ("prices = 3", "prices", "must be a table"),
        ("prices = { input = 1 }", "prices", "needs output"),
        ("prices = { input = 1, output = 2, cache = 1 }", "prices", "unknown price(s) cache"),
        ("prices = { input = -1, output = 2 }", "prices.input", ">= 0"),
        ("prices = { input = 1, output = 'free' }", "prices.output", "number"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, extra: str, key: str, problem: str) -> None:
    environ = load(tmp_path, BASE + extra + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ)
    assert caught.value.key == f"profiles.a.{key}"
    assert problem in caught.value.problem


def test_prices_and_prompt_caching_are_read(tmp_path: Path) -> None:
    """Issue 13, items 6 and 7: prices per million tokens (cached input defaults to
    the input price when not given); prompt caching is an Anthropic setting, on unless
    turned off, and refused on OpenAI-compatible profiles, which cache by themselves."""
    from fanfold.providers.config import Prices

    environ = load(
        tmp_path,
        "[profiles.a]\nprovider = 'anthropic'\nmodel = 'm'\nprompt_caching = false\n"
        "[profiles.a.prices]\ninput = 3\noutput = 15\n",
    )
    profile = load_config(environ=environ).profile("a")
    assert profile.prices == Prices(3.0, 15.0, None)
    assert profile.prices.cost(1_000_000, 400_000, 0) == pytest.approx(3.0)
    assert Prices(3.0, 15.0, 0.3).cost(1_000_000, 400_000, 100_000) == pytest.approx(
        0.6 * 3.0 + 0.4 * 0.3 + 0.1 * 15.0
    )
    assert profile.settings.prompt_caching is False
    assert RequestSettings().prompt_caching is True
    environ = load(tmp_path, BASE + "prompt_caching = true\n")
    with pytest.raises(ConfigError, match="not supported by the openai API"):
        load_config(environ=environ)


@pytest.mark.parametrize("setting", ["seed = 1", "reasoning_effort = 'low'"])
def test_settings_an_api_lacks_are_refused(tmp_path: Path, setting: str) -> None:
    environ = load(tmp_path, "[profiles.a]\nprovider = 'anthropic'\nmodel = 'm'\n" + setting)
    with pytest.raises(ConfigError, match="not supported by the anthropic API"):
        load_config(environ=environ)


@pytest.mark.parametrize(
    "extra",
    [
        f"extra_headers = {{ X-Gateway = '{KEY}' }}",
        f"extra_headers = {{ X-Gateway = 'Bearer {KEY}' }}",
        f"extra_body = {{ user = '{KEY}' }}",
        f"extra_body = {{ deep = {{ list = ['{KEY}'] }} }}",
    ],
)
def test_keys_in_pass_through_values_are_refused_without_echo(tmp_path: Path, extra: str) -> None:
    environ = load(tmp_path, BASE + extra + "\n")
    with pytest.raises(ConfigError, match="looks like an API key") as caught:
        load_config(environ=environ)
    assert KEY not in str(caught.value)


@pytest.mark.parametrize(
    ("extra", "key", "problem"),
    [
        ("prices = { input = nan, output = 1 }", "prices.input", "finite"),
        ("prices = { input = 1, output = inf }", "prices.output", "finite"),
        ("prices = { input = 1, output = 1, cached_input = nan }", "prices.cached_input", "finite"),
        ("prices = { input = 1e308, output = 1 }", "prices.input", "<= 100000"),
        ("retry = { max_attempts = 1000000000 }", "retry.max_attempts", "<= 100"),
        ("retry = { max_attempts = 1e9 }", "retry.max_attempts", "integer"),
        ("retry = { cap = 1e308 }", "retry.cap", "<= 3600"),
        ("retry = { cap = inf }", "retry.cap", "finite"),
        ("retry = { base = nan }", "retry.base", "finite"),
        ("timeouts = { read = inf }", "timeouts.read", "finite"),
        ("timeouts = { connect = nan }", "timeouts.connect", "finite"),
        ("timeouts = { total = 1e12 }", "timeouts.total", "<= 86400"),
        ("max_tokens = 1000000000000", "max_tokens", "<= 100000000"),
        ("temperature = nan", "temperature", "finite"),
        ("top_p = nan", "top_p", "finite"),
    ],
)
def test_non_finite_and_absurd_numbers_are_refused(
    tmp_path: Path, extra: str, key: str, problem: str
) -> None:
    """Issue 22, item 6: TOML reads nan, inf and 1e308 as numbers; each used to be
    accepted (`show` printed "$nan", a retry policy waited for ever). Refused, naming
    the key; the bounds are in DESIGN.md."""
    environ = load(tmp_path, BASE + extra + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ)
    assert caught.value.key == f"profiles.a.{key}"
    assert problem in caught.value.problem


def test_the_file_wide_retry_table_has_the_same_bounds(tmp_path: Path) -> None:
    environ = load(tmp_path, "[retry]\nmax_attempts = 101\n" + BASE)
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ)
    assert (caught.value.key, caught.value.problem) == (
        "retry.max_attempts",
        "must be <= 100, got 101",
    )


def test_a_cost_beyond_a_float_is_infinite_not_an_error() -> None:
    """A damaged or edited log may hold a token count beyond any float: the cost is
    infinite (`show` prints "unknown", `--json` null), never an OverflowError."""
    import math

    from fanfold.providers.config import Prices

    assert Prices(3.0, 15.0).cost(10**400, 0, 0) == math.inf
