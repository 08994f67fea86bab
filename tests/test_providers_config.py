"""Provider configuration (TOML + environment) and per-call routing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fakeserver import FakeServer, anthropic_stream, openai_completion
from hypothesis import given, settings
from hypothesis import strategies as st

from fanfold.providers.anthropic import AnthropicProvider
from fanfold.providers.base import CallContext, Provider, ProviderError
from fanfold.providers.config import (
    OFFLINE,
    Config,
    ConfigError,
    MissingApiKey,
    Profile,
    ProviderRouter,
    RetryPolicy,
    build_provider,
    load_config,
    read_config_file,
)
from fanfold.providers.http import Timeouts
from fanfold.providers.openai import OpenAIProvider
from fanfold.statemachine import ErrorKind, Limits, ModelReply, ModelRequest, UserMessage

EXAMPLE = Path(__file__).parent.parent / "examples" / "fanfold.toml"
SECRET = "sk-config-test-SECRET-0123456789"


def write(tmp_path: Path, text: str, name: str = "fanfold.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def env(tmp_path: Path, **values: str) -> dict[str, str]:
    """An environment with no user config file in reach."""
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"), **values}


# ------------------------------------------------------------------ the file


def test_example_config_loads() -> None:
    config = read_config_file(EXAMPLE)
    assert config.names() == ("openai", "fast", "claude", "local", "offline")
    # A user with a local server only runs it as it is (issue 22, item 13).
    assert config.default_profile().name == "local"
    assert config.sub_agent_profile().name == "local"
    assert config.retry == RetryPolicy(4, 1.0, 60.0)
    openai = config.profile("openai")
    assert openai == Profile(
        "openai",
        "openai",
        model="gpt-4o",
        api_key_env="OPENAI_API_KEY",
        timeouts=Timeouts(10.0, 120.0, 600.0),
        stream=True,
        max_tokens=4096,
        temperature=0.2,
    )
    local = config.profile("local")
    assert (local.base_url, local.api_key_env, local.timeouts) == (
        "http://127.0.0.1:8080/v1",
        None,
        Timeouts(5.0, 300.0, None),
    )
    assert config.profile("offline").provider == "scripted"


def test_a_file_without_profiles_has_the_models_of_no_file(tmp_path: Path) -> None:
    # A file that only declares tools (here web_fetch domains and a prompt) is a valid
    # configuration: its models are those without a file, the environment's if named.
    path = write(tmp_path, 'system_prompt = "Be brief."\n[tools.web_fetch]\ndomains = ["a.org"]\n')
    config = load_config(path, environ={})
    assert (config.profiles, config.default) == (OFFLINE.profiles, OFFLINE.default)
    assert (config.web_domains, config.system_prompt) == (("a.org",), "Be brief.")
    named = load_config(
        path, environ={"FANFOLD_BASE_URL": "http://127.0.0.1:9/v1", "FANFOLD_MODEL": "m"}
    )
    assert named.default_profile().base_url == "http://127.0.0.1:9/v1"
    assert named.default_profile().model == "m" and named.web_domains == ("a.org",)


def test_single_profile_is_the_default(tmp_path: Path) -> None:
    config = read_config_file(write(tmp_path, '[profiles.a]\nprovider = "openai"\nmodel = "m"\n'))
    assert (config.default, config.sub_agents, config.sub_agent_profile().name) == ("a", None, "a")


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ('default = "a"\n', "default", "has no [profiles.NAME] table"),
        ('sub_agents = "a"\n', "sub_agents", "has no [profiles.NAME] table"),
        ("[profiles]\n", "profiles", "at least one"),
        ("[profiles.a]\nmodel = 'm'\n", "profiles.a.provider", "missing"),
        ("[profiles.a]\nprovider = 'gemini'\n", "profiles.a.provider", "must be one of"),
        ("[profiles.a]\nprovider = 'openai'\nmodle = 'm'\n", "profiles.a.modle", "unknown setting"),
        (
            "[profiles.a]\nprovider = 'openai'\nbase_url = 'localhost:8080'\n",
            "profiles.a.base_url",
            "http://",
        ),
        (
            "[profiles.a]\nprovider = 'openai'\ntimeouts = { read = -1 }\n",
            "profiles.a.timeouts.read",
            "> 0",
        ),
        (
            "[profiles.a]\nprovider = 'openai'\ntimeouts = { idle = 1 }\n",
            "profiles.a.timeouts.idle",
            "unknown",
        ),
        ("[profiles.a]\nprovider = 'openai'\ntimeouts = 5\n", "profiles.a.timeouts", "table"),
        (
            "[profiles.a]\nprovider = 'openai'\nstream = 'yes'\n",
            "profiles.a.stream",
            "true or false",
        ),
        ("[profiles.a]\nprovider = 'openai'\nmax_tokens = 0\n", "profiles.a.max_tokens", ">= 1"),
        (
            "[profiles.a]\nprovider = 'openai'\ntemperature = 3\n",
            "profiles.a.temperature",
            "between 0 and 2",
        ),
        (
            "[profiles.a]\nprovider = 'openai'\nmax_tokens_param = 'n'\n",
            "profiles.a.max_tokens_param",
            "max_completion_tokens",
        ),
        (
            "[profiles.a]\nprovider='scripted'\n[profiles.b]\nprovider='scripted'\n",
            "default",
            "which profile",
        ),
        ("default = 'zz'\n[profiles.a]\nprovider='scripted'\n", "default", "no profile named 'zz'"),
        (
            "sub_agents = 'zz'\n[profiles.a]\nprovider='scripted'\n",
            "sub_agents",
            "no profile named 'zz'",
        ),
        (
            "[retry]\nmax_attempts = 0\n[profiles.a]\nprovider='scripted'\n",
            "retry.max_attempts",
            ">= 1",
        ),
        ("[retry]\nbackoff = 1\n[profiles.a]\nprovider='scripted'\n", "retry.backoff", "unknown"),
        ("colour = 'blue'\n[profiles.a]\nprovider='scripted'\n", "colour", "unknown"),
        ("[profiles.a]\nprovider = 'openai'\n", "profiles.a.model", "model is required"),
    ],
)
def test_config_errors_name_file_and_key(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ=env(tmp_path))
    assert caught.value.path == str(path)
    assert caught.value.key == key
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"{path}: {key}: ")


def test_invalid_toml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[profiles.a]\nprovider = openai\n")
    with pytest.raises(ConfigError, match=r"invalid TOML.*line 2") as caught:
        load_config(path, environ=env(tmp_path))
    assert caught.value.path == str(path)


def test_keys_in_the_file_are_refused_without_echo(tmp_path: Path) -> None:
    path = write(
        tmp_path, f"[profiles.a]\nprovider = 'openai'\nmodel = 'm'\napi_key = '{SECRET}'\n"
    )
    with pytest.raises(ConfigError, match="api_key_env") as caught:
        load_config(path, environ=env(tmp_path))
    assert SECRET not in str(caught.value)
    path = write(
        tmp_path, f"[profiles.a]\nprovider = 'openai'\nmodel = 'm'\napi_key_env = '{SECRET}'\n"
    )
    with pytest.raises(ConfigError, match="NAME of an environment variable") as caught:
        load_config(path, environ=env(tmp_path))
    assert SECRET not in str(caught.value)


# ------------------------------------------------------------------ finding the file, environment


def test_no_file_no_variables_is_offline(tmp_path: Path) -> None:
    assert load_config(environ=env(tmp_path), cwd=tmp_path) == OFFLINE
    assert OFFLINE.default_profile().provider == "scripted"


def test_file_found_in_cwd_then_xdg(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg" / "fanfold"
    xdg.mkdir(parents=True)
    write(xdg, "[profiles.user]\nprovider='scripted'\n", "config.toml")
    assert load_config(environ=env(tmp_path), cwd=tmp_path).default == "user"
    write(tmp_path, "[profiles.here]\nprovider='scripted'\n")
    assert load_config(environ=env(tmp_path), cwd=tmp_path).default == "here"
    other = write(tmp_path, "[profiles.named]\nprovider='scripted'\n", "other.toml")
    found = load_config(environ=env(tmp_path, FANFOLD_CONFIG=str(other)), cwd=tmp_path)
    assert (found.default, found.source) == ("named", str(other))


def test_fanfold_config_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(environ=env(tmp_path, FANFOLD_CONFIG=str(tmp_path / "nope.toml")), cwd=tmp_path)
    assert caught.value.path == "FANFOLD_CONFIG"


def test_environment_overrides_the_default_profile(tmp_path: Path) -> None:
    environ = env(
        tmp_path,
        FANFOLD_CONFIG=str(EXAMPLE),
        FANFOLD_PROFILE="local",
        FANFOLD_SUB_AGENT_PROFILE="claude",
        FANFOLD_MODEL="llama-3.1-8b",
        FANFOLD_BASE_URL="http://10.0.0.5:8000/v1/",
        FANFOLD_API_KEY_ENV="LOCAL_KEY",
    )
    config = load_config(environ=environ)
    local = config.default_profile()
    assert (local.name, local.model, local.base_url, local.api_key_env) == (
        "local",
        "llama-3.1-8b",
        "http://10.0.0.5:8000/v1",
        "LOCAL_KEY",
    )
    assert config.sub_agent_profile().name == "claude"
    assert config.profile("openai").model == "gpt-4o"  # other profiles untouched


def test_unknown_profile_in_environment(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(environ=env(tmp_path, FANFOLD_CONFIG=str(EXAMPLE), FANFOLD_PROFILE="nope"))
    assert caught.value.path == "FANFOLD_PROFILE"
    assert "no profile named 'nope'" in str(caught.value)


def test_environment_only_profile(tmp_path: Path) -> None:
    local = load_config(
        environ=env(tmp_path, FANFOLD_BASE_URL="http://127.0.0.1:8080/v1", FANFOLD_MODEL="qwen"),
        cwd=tmp_path,
    )
    assert local.default_profile() == Profile(
        "env", "openai", model="qwen", base_url="http://127.0.0.1:8080/v1"
    )
    # A vendor key is only used by default for the vendor's own endpoint.
    vendor = load_config(environ=env(tmp_path, FANFOLD_MODEL="gpt-4o"), cwd=tmp_path)
    assert vendor.default_profile().api_key_env == "OPENAI_API_KEY"
    claude = load_config(
        environ=env(tmp_path, FANFOLD_MODEL="claude", FANFOLD_PROVIDER="anthropic"), cwd=tmp_path
    )
    assert claude.default_profile().api_key_env == "ANTHROPIC_API_KEY"
    with pytest.raises(ConfigError) as caught:
        load_config(environ=env(tmp_path, FANFOLD_BASE_URL="http://x/v1"), cwd=tmp_path)
    assert caught.value.path == "FANFOLD_MODEL"


def test_with_overrides_for_the_cli() -> None:
    config = read_config_file(EXAMPLE).with_overrides(
        profile="claude", model="claude-opus", origin="--model"
    )
    assert config.default_profile().model == "claude-opus"
    with pytest.raises(ConfigError) as caught:
        config.with_overrides(profile="none", origin="--profile")
    assert caught.value.path == "--profile"


def test_retry_policy_applies_to_limits() -> None:
    limits = RetryPolicy(max_attempts=6, cap=5.0).apply(Limits())
    assert (limits.max_attempts, limits.retry_base, limits.retry_cap) == (6, 1.0, 5.0)
    assert RetryPolicy().apply(Limits()) == Limits()


# ------------------------------------------------------------------ building providers


def test_build_provider_from_profiles() -> None:
    config = read_config_file(EXAMPLE)
    keys = {"OPENAI_API_KEY": SECRET, "ANTHROPIC_API_KEY": SECRET}
    openai = build_provider(config.profile("openai"), environ=keys)
    assert isinstance(openai, OpenAIProvider)
    assert (openai.base_url, openai.model, openai.stream, openai.max_tokens) == (
        "https://api.openai.com/v1",
        "gpt-4o",
        True,
        4096,
    )
    claude = build_provider(config.profile("claude"), environ=keys)
    assert isinstance(claude, AnthropicProvider)
    assert claude.url == "https://api.anthropic.com/v1/messages"
    local = build_provider(config.profile("local"), environ={})
    assert isinstance(local, OpenAIProvider)
    assert local.url == "http://127.0.0.1:8080/v1/chat/completions"
    for provider in (openai, claude, local):
        assert SECRET not in repr(provider)


def test_missing_or_broken_keys() -> None:
    profile = read_config_file(EXAMPLE).profile("openai")
    with pytest.raises(MissingApiKey, match="OPENAI_API_KEY"):
        build_provider(profile, environ={})
    with pytest.raises(ConfigError, match="cannot be sent as a header") as caught:
        build_provider(profile, environ={"OPENAI_API_KEY": SECRET + "\n" + SECRET})
    assert SECRET not in str(caught.value)
    with pytest.raises(ConfigError, match="scripted"):
        build_provider(Profile("s", "scripted"), environ={})


# ------------------------------------------------------------------ routing


class Canned:
    """A stand-in for the scripted provider: records what it was asked."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest, context: CallContext) -> ModelReply:
        self.requests.append(request)
        return ModelReply(text=f"canned for {request.model}")


def ctx(depth: int = 0) -> CallContext:
    return CallContext("c", "r", "root" if depth == 0 else "root/1", depth, None, 1)


ROUTING = """
default = "main"
sub_agents = "small"
[profiles.main]
provider = "openai"
model = "big-model"
api_key_env = "MAIN_KEY"
[profiles.small]
provider = "anthropic"
model = "small-model"
base_url = "http://small.local"
[profiles.other]
provider = "openai"
base_url = "http://other.local/v1"
model = "other-model"
api_key_env = "OTHER_KEY"
[profiles.offline]
provider = "scripted"
"""


@pytest.fixture
def routing(tmp_path: Path) -> Config:
    return read_config_file(write(tmp_path, ROUTING))


def test_router_resolution(routing: Config) -> None:
    router: Provider = ProviderRouter(routing, environ={"MAIN_KEY": SECRET}, scripted=Canned())
    assert isinstance(router, ProviderRouter)
    names = {
        (None, 0): ("main", "big-model"),
        (None, 1): ("small", "small-model"),
        (None, 2): ("small", "small-model"),
        ("other", 0): ("other", "other-model"),
        ("small", 0): ("small", "small-model"),
        ("other-model", 1): ("other", "other-model"),
        ("gpt-4o-mini", 0): ("main", "gpt-4o-mini"),
        ("gpt-4o-mini", 1): ("small", "gpt-4o-mini"),
    }
    for (model, depth), expected in names.items():
        profile, chosen = router.resolve(model, depth)
        assert (profile.name, chosen) == expected, (model, depth)
    assert SECRET not in repr(router)
    assert SECRET not in repr(vars(router))


def test_router_needs_default_keys_up_front(routing: Config) -> None:
    with pytest.raises(MissingApiKey, match="MAIN_KEY"):
        ProviderRouter(routing, environ={})


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


async def test_router_sends_each_call_to_its_profile(server: FakeServer) -> None:
    config = Config(
        (
            Profile("main", "openai", model="big", base_url=server.url + "/v1", stream=False),
            Profile(
                "kids", "anthropic", model="small", base_url=server.url, api_key_env="KIDS_KEY"
            ),
            Profile("locked", "openai", model="x", base_url=server.url + "/v1", api_key_env="NOPE"),
            Profile("offline", "scripted"),
        ),
        default="main",
        sub_agents="kids",
    )
    server.enqueue(openai_completion("root says hi"), anthropic_stream("child says hi"))
    canned = Canned()
    router = ProviderRouter(config, environ={"KIDS_KEY": SECRET}, scripted=canned)
    request = ModelRequest("", (UserMessage("hi"),), ())
    try:
        root = await router.complete(request, ctx(0))
        child = await router.complete(request, ctx(1))
        offline = await router.complete(
            ModelRequest("", (UserMessage("x"),), (), model="offline"), ctx(1)
        )
        with pytest.raises(ProviderError) as caught:
            await router.complete(ModelRequest("", (UserMessage("x"),), (), model="locked"), ctx(0))
    finally:
        await router.aclose()
    assert (root.text, child.text, offline.text) == (
        "root says hi",
        "child says hi",
        "canned for None",
    )
    assert canned.requests[0].model is None
    assert caught.value.error.kind is ErrorKind.AUTH
    assert "NOPE" in caught.value.error.message
    first, second = server.requests
    assert (first.path, first.json["model"]) == ("/v1/chat/completions", "big")
    assert (second.path, second.json["model"]) == ("/v1/messages", "small")
    assert "authorization" not in first.headers
    assert second.headers["x-api-key"] == SECRET


async def test_router_shares_a_client_it_was_given() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json=openai_completion("ok").body)

    config = Config(
        (Profile("a", "openai", model="m", base_url="http://a/v1", stream=False),), default="a"
    )
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        router = ProviderRouter(config, environ={}, client=client)
        await router.complete(ModelRequest("", (UserMessage("x"),), ()), ctx())
        await router.aclose()
        assert not client.is_closed  # not the router's to close
    assert seen == ["http://a/v1/chat/completions"]


# ------------------------------------------------------------------ retry policy per profile

RETRYING = """
default = "cloud"
[retry]
max_attempts = 3
base = 0.5

[profiles.cloud]
provider = "openai"
model = "gpt-4o"

[profiles.local]
provider = "openai"
base_url = "http://127.0.0.1:8080/v1"
model = "qwen"
[profiles.local.retry]
max_attempts = 8
cap = 10
"""


def test_a_profile_sets_its_own_retry_policy(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, RETRYING), environ=env(tmp_path))
    assert config.profile("local").retry == RetryPolicy(max_attempts=8, cap=10.0)
    # The default profile has none: the file's [retry] alone.
    assert config.retry_policy() == RetryPolicy(3, 0.5, None)
    # A root on `local`: its settings over the file's (base still from [retry]).
    local = config.with_overrides(profile="local")
    assert local.retry_policy() == RetryPolicy(8, 0.5, 10.0)
    limits = local.retry_policy().apply(Limits())
    assert (limits.max_attempts, limits.retry_base, limits.retry_cap) == (8, 0.5, 10.0)


def test_the_cli_runs_a_tree_with_its_root_profiles_retry_policy(tmp_path: Path) -> None:
    from fanfold.cli.models import choose_model as _choose_model

    path = write(tmp_path, RETRYING)
    assert _choose_model(None, path, "local", None).retry == RetryPolicy(8, 0.5, 10.0)
    assert _choose_model(None, path, None, None).retry == RetryPolicy(3, 0.5, None)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("retry = 3", "profiles.a.retry", "table"),
        ("retry = { max_attempts = 0 }", "profiles.a.retry.max_attempts", ">= 1"),
        ("retry = { cap = -1 }", "profiles.a.retry.cap", ">= 0"),
        ("retry = { backoff = 1 }", "profiles.a.retry.backoff", "unknown"),
    ],
)
def test_bad_profile_retry_is_refused(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = write(tmp_path, f"[profiles.a]\nprovider = 'openai'\nmodel = 'm'\n{text}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ=env(tmp_path))
    assert (caught.value.key, problem in caught.value.problem) == (key, True)


def test_documented_total_waits() -> None:
    # docs/how-to/configuration.md and examples/fanfold.toml quote these numbers.
    assert RetryPolicy().total_wait() == (3.5, 7.0)
    example = read_config_file(EXAMPLE).profile("local").retry
    assert example.total_wait() == (22.5, 45.0)


@given(
    max_attempts=st.integers(1, 9),
    base=st.sampled_from([0.0, 0.25, 1.0, 3.0]),
    cap=st.sampled_from([0.0, 2.0, 10.0, 60.0]),
)
@settings(max_examples=40, deadline=None)
def test_total_wait_is_what_the_reducer_waits(max_attempts: int, base: float, cap: float) -> None:
    from sm_support import failed, only, root, step, steps, user

    from fanfold.statemachine import Error, ErrorKind, ModelError, ScheduleRetry, TimerFired

    policy = RetryPolicy(max_attempts, base, cap)
    state = steps(root(policy.apply(Limits())), user("hi"))
    waited = 0.0
    while True:
        state, effects = step(state, failed(state, ModelError(ErrorKind.NETWORK, "refused")))
        if isinstance(state.phase, Error):
            break
        retry = only(effects, ScheduleRetry)
        waited += retry.delay
        state, _ = step(state, TimerFired(retry.timer))
    least, most = policy.total_wait()
    assert least - 0.01 <= waited <= most + 0.01


def test_a_run_in_another_folder_takes_that_folders_configuration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `--cwd A` is a run in A: A's fanfold.toml, as A's .mcp.json and agent files, not
    # the one of the folder the command was typed in.
    import json

    from click.testing import CliRunner

    from fanfold.cli import cli
    from fanfold.db import Store

    here, there = tmp_path / "here", tmp_path / "there"
    for folder in (here, there):
        folder.mkdir()
        write(folder, f'system_prompt = "from {folder.name}"\n')
    monkeypatch.chdir(here)
    env = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    db = tmp_path / "t.db"
    ran = CliRunner().invoke(
        cli, ["run", "hi", "--no-live", "--cwd", str(there), "--db", str(db)], env=env
    )
    assert ran.exit_code == 0, ran.output
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        assert store.load_state(root.id).system_prompt == "from there"
    listed = CliRunner().invoke(cli, ["tools", "--json", "--cwd", str(there)], env=env)
    assert json.loads(listed.stdout)["config"] == str(there / "fanfold.toml")
