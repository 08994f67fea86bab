"""OpenTelemetry spans of a tree: GenAI conventions, parenting, privacy by default;
checked with the SDK's in-memory exporter and sent to a loopback OTLP/HTTP receiver."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from db_scenarios import Driver, cancelled_fan_out, fan_out
from replay_helpers import write
from trace_helpers import MARKS_SCRIPT, run_script

from fanfold.cli import cli
from fanfold.db import Store

pytest.importorskip("opentelemetry.sdk", reason="needs the otel extra: pip install '.[otel]'")

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from fanfold.otel import SpanObserver, tree_spans


@pytest.fixture(scope="module")
def marks_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return run_script(tmp_path_factory.mktemp("otel"), MARKS_SCRIPT)


def spans_of(db: Path, root: str, **options: Any) -> tuple[ReadableSpan, ...]:
    with Store.open(db, read_only=True) as store:
        return tree_spans(store, root, **options)


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def times(span: ReadableSpan) -> tuple[int, int]:
    assert span.start_time is not None and span.end_time is not None
    return span.start_time, span.end_time


def test_spans_follow_the_genai_conventions_along_the_tree(marks_log: tuple[Path, str]) -> None:
    db, root = marks_log
    spans = spans_of(db, root)
    by_id = {s.context.span_id: s for s in spans}
    agents = {attrs(s)["gen_ai.agent.id"]: s for s in spans if s.name.startswith("invoke_agent")}
    assert set(agents) == {root, f"{root}.1", f"{root}.2", f"{root}.3"}
    assert len({s.context.trace_id for s in spans}) == 1  # one trace for the tree
    assert agents[root].parent is None
    for child in (f"{root}.1", f"{root}.2", f"{root}.3"):
        parent = agents[child].parent
        assert parent is not None and parent.span_id == agents[root].context.span_id
    for span in spans:
        operation = attrs(span)["gen_ai.operation.name"]
        assert span.name.split()[0] == operation
        assert operation in {"invoke_agent", "chat", "execute_tool"}
        if operation != "invoke_agent":
            assert span.parent is not None
            owner = by_id[span.parent.span_id]
            assert attrs(owner)["gen_ai.agent.id"] == attrs(span)["gen_ai.conversation.id"]
            assert times(owner)[0] <= times(span)[0] <= times(span)[1] <= times(owner)[1]
    chats = [s for s in spans if s.name == "chat"]
    first = min((s for s in chats if s.parent == agents[root].context), key=lambda s: times(s)[0])
    assert attrs(first)["gen_ai.usage.input_tokens"] == 100
    assert attrs(first)["gen_ai.usage.output_tokens"] == 10
    assert attrs(first)["gen_ai.response.finish_reasons"] == ("tool_use",)
    failed = [s for s in chats if s.status.status_code is StatusCode.ERROR]
    assert {attrs(s)["error.type"] for s in failed} == {"rate_limit", "aborted"}
    tools = {attrs(s)["gen_ai.tool.name"] for s in spans if s.name.startswith("execute_tool")}
    assert tools == {"bash", "think"}
    slow = agents[f"{root}.3"]
    assert slow.status.status_code is StatusCode.ERROR
    assert attrs(slow)["error.type"] == "timed_out"


def test_no_text_in_spans_unless_asked(marks_log: tuple[Path, str]) -> None:
    db, root = marks_log
    quiet = spans_of(db, root)
    everything = " ".join(str(v) for s in quiet for v in attrs(s).values())
    assert "pwned" not in everything and "echo hi" not in everything
    assert "sub-agent" in everything  # names are there; texts are not
    loud = spans_of(db, root, capture_content=True)
    texts = " ".join(str(v) for s in loud for v in attrs(s).values())
    assert "window.__pwned" in texts and "echo hi" in texts
    keys = {k for s in loud for k in attrs(s)}
    assert {
        "gen_ai.system_instructions",
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    } <= keys


def test_the_observer_gives_the_same_spans_live_as_from_the_log(tmp_path: Path) -> None:
    """What a runtime would call with each step it records (the live hook) gives the
    spans that exporting the recorded log gives."""
    driver = Driver()
    fan_out(driver)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    observer = SpanObserver(provider.get_tracer("test"))
    for step in driver.steps:
        observer.step(step.conversation_id, step.event, step.effects, step.state, step.at)
    live = memory.get_finished_spans()
    db = tmp_path / "log.db"
    write(db, driver.steps)
    recorded = spans_of(db, "r")

    def shape(spans: tuple[ReadableSpan, ...]) -> list[tuple[Any, ...]]:
        return sorted(
            (s.name, s.start_time, s.end_time, s.status.status_code.name, sorted(attrs(s).items()))
            for s in spans
        )

    assert shape(live) == shape(recorded)
    assert len(live) > 8


def test_a_cancelled_turn_ends_its_span_in_error(tmp_path: Path) -> None:
    driver = Driver()
    cancelled_fan_out(driver)
    write(tmp_path / "c.db", driver.steps)
    spans = spans_of(tmp_path / "c.db", "c")
    agents = {attrs(s)["gen_ai.agent.id"]: s for s in spans if s.name.startswith("invoke_agent")}
    assert attrs(agents["c"])["error.type"] == "cancelled"
    assert attrs(agents["c.2"])["error.type"] == "cancelled"
    assert agents["c.1"].status.status_code is StatusCode.UNSET
    assert "error.type" not in attrs(agents["c.1"])


class Receiver(BaseHTTPRequestHandler):
    """A loopback OTLP/HTTP receiver: decodes each request's protobuf body."""

    received: list[ExportTraceServiceRequest]
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        type(self).received.append(request)
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, type[Receiver]]]:
    handler = type("Handler", (Receiver,), {"received": [], "status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # Polled every 10 ms, not serve_forever's 0.5 s: shutdown() waits for the next poll.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def run(*args: str | Path) -> Result:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def test_export_sends_the_tree_to_an_otlp_endpoint(
    marks_log: tuple[Path, str], receiver: tuple[str, type[Receiver]]
) -> None:
    db, root = marks_log
    url, handler = receiver
    result = run("export", root, "--format", "otlp", "--endpoint", url, "--db", db)
    assert result.exit_code == 0, result.output
    spans = [
        span
        for request in handler.received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    expected = spans_of(db, root)
    assert len(spans) == len(expected) and f"sent {len(spans)} span(s)" in result.output
    assert sorted(s.name for s in spans) == sorted(s.name for s in expected)
    service = handler.received[0].resource_spans[0].resource.attributes
    assert any(a.key == "service.name" and a.value.string_value == "fanfold" for a in service)
    assert not any("pwned" in str(s) for s in spans)


def test_a_refusing_endpoint_is_one_line(
    marks_log: tuple[Path, str], receiver: tuple[str, type[Receiver]]
) -> None:
    db, root = marks_log
    url, handler = receiver
    handler.status = 400
    result = run("export", root, "--format", "otlp", "--endpoint", url, "--db", db)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: the OTLP endpoint") and "/v1/traces" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    bad = run("export", root, "--format", "otlp", "--endpoint", "file:///etc", "--db", db)
    assert bad.exit_code == 2 and "http:// or https://" in bad.stderr
    with_file = run("export", root, "--format", "otlp", "-o", "x.json", "--db", db)
    assert with_file.exit_code == 2 and "writes no file" in with_file.stderr


def test_a_failed_send_is_one_line_with_its_cause_and_no_exporter_log(
    marks_log: tuple[Path, str],
    receiver: tuple[str, type[Receiver]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An unreachable endpoint once printed the OTLP exporter's own log lines (one per
    retry, each a repr of the whole requests exception) before fanfold's error, which
    did not say why; now the error ends with the cause and nothing else is printed."""
    import socket

    from fanfold.otel import ExportFailed, send_otlp

    db, root = marks_log
    spans = spans_of(db, root)
    url, handler = receiver
    handler.status = 404
    with pytest.raises(ExportFailed) as refused:
        send_otlp(spans, url)
    assert str(refused.value).endswith("sent): HTTP 404 Not Found")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(ExportFailed) as unreachable:
        send_otlp(spans, closed)
    assert str(unreachable.value).endswith("sent): Connection refused")
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


def test_a_bad_endpoint_from_the_environment_is_named_as_such(
    marks_log: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad $OTEL_EXPORTER_OTLP_ENDPOINT was reported as a bad --endpoint, an option
    the user never gave."""
    db, root = marks_log
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")
    result = run("export", root, "--format", "otlp", "--db", db)
    assert result.exit_code == 2
    assert result.stderr == (
        "error: $OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL, "
        "not 'collector:4318'\n"
    )
    given = run("export", root, "--format", "otlp", "--endpoint", "x:1", "--db", db)
    assert given.stderr.startswith("error: --endpoint must be an http:// or https:// URL")


def _scripted_spawns(folder: Path) -> tuple[Path, str]:
    """A scripted tree whose root spawns the built-in ``explorer`` and a plain task."""
    spawn = {
        "name": "spawn_agents",
        "arguments": {"tasks": [{"task": "look", "agent": "explorer"}, {"task": "plain"}]},
    }
    script = {
        "agents": [
            {"match": {"path": "root"}, "replies": [{"tool_calls": [spawn]}, {"text": "ok"}]},
            {
                "match": {"depth": 1},
                "replies": [
                    {"tool_calls": [{"name": "submit_result", "arguments": {"result": "r"}}]}
                ],
            },
        ]
    }
    return run_script(folder, script)


def test_agents_are_named_by_their_definition_and_calls_by_provider_and_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, receiver: tuple[str, type[Receiver]]
) -> None:
    """Issue 22, item 14: a defined agent's span was named "sub-agent", and no span
    said which provider served it."""
    from fanfold.cli.otel_export import recorded_served_by

    db, root = _scripted_spawns(tmp_path)
    monkeypatch.setenv("FANFOLD_KEY_FILE", str(tmp_path / "provenance.key"))  # run_script's
    # What a backend receives from `fanfold export --format otlp`.
    url, handler = receiver
    assert run("export", root, "--format", "otlp", "--endpoint", url, "--db", db).exit_code == 0
    sent = {
        (span.name, attribute.key, attribute.value.string_value)
        for request in handler.received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
        for attribute in span.attributes
        if attribute.key in ("gen_ai.agent.name", "gen_ai.provider.name")
    }
    assert ("invoke_agent explorer", "gen_ai.agent.name", "explorer") in sent
    assert ("chat", "gen_ai.provider.name", "scripted") in sent
    with Store.open(db, read_only=True) as store:
        served_by = recorded_served_by(store, root)
        spans = tree_spans(store, root, served_by=served_by)
    agents = {
        attrs(s)["gen_ai.agent.id"]: attrs(s)["gen_ai.agent.name"]
        for s in spans
        if s.name.startswith("invoke_agent")
    }
    assert agents == {root: "agent", f"{root}.1": "explorer", f"{root}.2": "sub-agent"}
    assert any(s.name == "invoke_agent explorer" for s in spans)
    chats = [s for s in spans if s.name.startswith("chat")]
    assert len(chats) == 4
    assert {attrs(s)["gen_ai.provider.name"] for s in chats} == {"scripted"}


def test_a_configured_profile_s_calls_carry_its_provider_and_model(tmp_path: Path) -> None:
    """Issue 22, item 14: a root on a configured profile exported ``chat`` spans with
    no request or response model (Phoenix and Langfuse price spans by them); the model
    named is the profile's, never the one the server puts in its replies."""
    import json as jsonlib

    from fakeserver import FakeServer, Json, first_user_contains

    from fanfold.cli.otel_export import recorded_served_by

    def completion(text: str, calls: list[dict[str, Any]]) -> Json:
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else "stop"
        choice = {"index": 0, "message": message, "finish_reason": finish}
        usage = {"prompt_tokens": 100, "completion_tokens": 5}
        return Json({"model": "server-says-x", "choices": [choice], "usage": usage})

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        function = {"name": name, "arguments": jsonlib.dumps(arguments)}
        return {"id": f"call_{name}", "type": "function", "function": function}

    with FakeServer() as server:
        server.when(
            first_user_contains("delegate"),
            completion("", [call("spawn_agents", {"tasks": [{"task": "small job"}]})]),
            completion("all done", []),
        )
        server.when(
            first_user_contains("small job"),
            completion("", [call("submit_result", {"result": "done"})]),
        )
        config = tmp_path / "fanfold.toml"
        profile = f"provider = 'openai'\nbase_url = '{server.url}/v1'\nstream = false\n"
        config.write_text(
            "default = 'big'\nsub_agents = 'small'\n"
            f"[profiles.big]\n{profile}model = 'big-1'\n"
            f"[profiles.small]\n{profile}model = 'small-1'\n",
            encoding="utf-8",
        )
        db = tmp_path / "log.db"
        ran = run("run", "--no-live", "--db", db, "--config", config, "delegate")
        assert ran.exit_code == 0, ran.output
    with Store.open(db, read_only=True) as store:
        (row,) = store.list_roots()
        spans = tree_spans(store, row.id, served_by=recorded_served_by(store, row.id))
    chats = [s for s in spans if s.name.startswith("chat")]
    models = sorted(
        (
            attrs(s)["gen_ai.conversation.id"] == row.id,
            s.name,
            attrs(s)["gen_ai.provider.name"],
            attrs(s)["gen_ai.request.model"],
            attrs(s)["gen_ai.response.model"],
        )
        for s in chats
    )
    assert models == [
        (False, "chat small-1", "openai", "small-1", "small-1"),
        (True, "chat big-1", "openai", "big-1", "big-1"),
        (True, "chat big-1", "openai", "big-1", "big-1"),
    ]
    assert not any("server-says-x" in str(attrs(s)) for s in spans)


# ------------------------------------------------------------------ OTLP over the network


_CONNECTS: list[tuple[str, int]] | None = None  # where the audit hook records, when set


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect" and _CONNECTS is not None:
        address = args[1]
        if isinstance(address, tuple) and address[:1] == ("127.0.0.1",):
            _CONNECTS.append(address[:2])


_HOOKED = False


def connection_attempts() -> list[tuple[str, int]]:
    """A list that records, from now until ``stop_counting``, every connection this
    process opens to 127.0.0.1 (Python's ``socket.connect`` audit event: whichever
    HTTP library makes it, a refused connection counts)."""
    global _CONNECTS, _HOOKED
    if not _HOOKED:
        import sys

        sys.addaudithook(_audit)  # audit hooks cannot be removed: gated by _CONNECTS
        _HOOKED = True
    _CONNECTS = []
    return _CONNECTS


def stop_counting() -> None:
    global _CONNECTS
    _CONNECTS = None


def closed_port() -> int:
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Redirector(BaseHTTPRequestHandler):
    """Answers every POST with a 307 to ``location``."""

    location = ""
    posts = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts += 1
        self.send_response(307)
        self.send_header("Location", type(self).location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class HugeBody(BaseHTTPRequestHandler):
    """Answers with a 200 MB body, written until the client stops reading; ``sent``
    counts the bytes the socket took."""

    size = 200 * 1024 * 1024
    status = 200
    sent = 0
    finished = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(type(self).status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(type(self).size))
        self.end_headers()
        chunk = b"x" * 65536
        try:
            while type(self).sent < type(self).size:
                self.wfile.write(chunk)
                type(self).sent += len(chunk)
        except OSError:  # the client closed the connection
            pass
        finally:
            type(self).finished.set()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
    ).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_a_redirect_is_an_error_naming_its_location(marks_log: tuple[Path, str]) -> None:
    """Issue 22, item 8: an endpoint that answered 307 to an unreachable host was
    reported as "sent 2 span(s)". A redirect is not followed: the export fails, naming
    where it pointed, and nothing connects there."""
    db, root = marks_log
    target = f"http://127.0.0.1:{closed_port()}/v1/traces"

    class Handler(Redirector):
        location = target
        posts = 0

    server, url = serve(Handler)
    attempts = connection_attempts()
    try:
        result = run("export", root, "--format", "otlp", "--endpoint", url, "--db", db)
    finally:
        stop_counting()
        server.shutdown()
        server.server_close()
    assert result.exit_code == 2, result.output
    assert "sent" not in result.stdout
    assert result.stderr.startswith("error: the OTLP endpoint ")
    assert f"HTTP 307 redirect to {target}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert Handler.posts == 1
    assert int(target.split(":")[2].split("/")[0]) not in {port for _, port in attempts}


def test_a_closed_port_fails_at_the_first_connection_attempt(
    marks_log: tuple[Path, str],
) -> None:
    """Issue 22, item 8: a closed port took 25 s to fail (the exporter retried the
    refused connection with backoff). One attempt, then the connect error."""
    from fanfold.otel import ExportFailed, send_otlp

    db, root = marks_log
    spans = spans_of(db, root)
    port = closed_port()
    attempts = connection_attempts()
    try:
        with pytest.raises(ExportFailed) as refused:
            send_otlp(spans, f"http://127.0.0.1:{port}")
    finally:
        stop_counting()
    assert str(refused.value).endswith(f"(0 of {len(spans)} sent): Connection refused")
    assert attempts == [("127.0.0.1", port)]


def test_an_endpoint_s_credentials_are_not_echoed(marks_log: tuple[Path, str]) -> None:
    """An endpoint given as http://user:password@host was echoed whole in the failure
    (and success) messages; the credentials are shown as ***."""
    from fanfold.otel import ExportFailed, send_otlp, shown_url

    db, root = marks_log
    port = closed_port()
    with pytest.raises(ExportFailed) as refused:
        send_otlp(spans_of(db, root), f"http://otel:s3cret@127.0.0.1:{port}")
    assert "s3cret" not in str(refused.value) and "otel:" not in str(refused.value)
    assert f"http://***@127.0.0.1:{port}/v1/traces" in str(refused.value)
    done = CliRunner().invoke(
        cli,
        ["export", root, "--db", str(db), "--format", "otlp", "--endpoint",
         f"http://otel:s3cret@127.0.0.1:{port}"],
    )  # fmt: skip
    assert done.exit_code == 2 and "s3cret" not in done.output
    assert shown_url("https://a.example/v1/traces") == "https://a.example/v1/traces"


@pytest.mark.parametrize("status", [200, 500])
def test_a_huge_response_is_not_read_whole(marks_log: tuple[Path, str], status: int) -> None:
    """Issue 22, item 8: a 200 MB response body was read whole (450 MB RSS). The
    client reads at most RESPONSE_LIMIT bytes and closes: the server could hand its
    socket only what the two kernels' buffers hold, a small part of the body."""
    from fanfold.otel import ExportFailed, send_otlp

    db, root = marks_log
    spans = spans_of(db, root)

    class Handler(HugeBody):
        sent = 0
        finished = threading.Event()

    Handler.status = status
    server, url = serve(Handler)
    try:
        if status == 200:
            send_otlp(spans, url)
        else:
            with pytest.raises(ExportFailed) as failed:
                send_otlp(spans, url)
            assert "HTTP 500" in str(failed.value) and "xxxx" in str(failed.value)
            assert len(str(failed.value)) < 400
        assert Handler.finished.wait(60)
    finally:
        server.shutdown()
        server.server_close()
    assert Handler.sent < 32 * 1024 * 1024, Handler.sent  # of 200 MB


def test_credentials_and_compression_from_the_standard_variables(
    marks_log: tuple[Path, str], receiver: tuple[str, type[Receiver]]
) -> None:
    """The OTLP variables a backend's setup page gives (Langfuse's Basic credentials)
    are honoured, as the SDK's exporter did."""
    import gzip

    from fanfold.otel import send_otlp

    db, root = marks_log
    spans = spans_of(db, root)
    _, handler = receiver
    seen: list[tuple[str | None, str | None]] = []

    class Checking(handler):  # type: ignore[valid-type, misc]
        def do_POST(self) -> None:
            seen.append((self.headers["Authorization"], self.headers["Content-Encoding"]))
            length = int(self.headers["Content-Length"])
            body = gzip.decompress(self.rfile.read(length))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            type(self).received.append(request)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server, checking_url = serve(Checking)
    try:
        send_otlp(
            spans,
            checking_url,
            environ={
                "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Basic%20cGs6c2s=",
                "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip",
            },
        )
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [("Basic cGs6c2s=", "gzip")]
    assert sum(len(r.resource_spans[0].scope_spans[0].spans) for r in handler.received) == len(
        spans
    )


def test_a_malformed_headers_variable_is_named_without_its_text(
    marks_log: tuple[Path, str],
    monkeypatch: pytest.MonkeyPatch,
    receiver: tuple[str, type[Receiver]],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The SDK's parser of OTEL_EXPORTER_OTLP_HEADERS logged a malformed value whole
    (a credential with it) to the console; the export now names the variable only."""
    db, root = marks_log
    url, handler = receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization Basic s3cr3t-value")
    result = run("export", root, "--format", "otlp", "--endpoint", url, "--db", db)
    assert result.exit_code == 2
    assert result.stderr == (
        "error: $OTEL_EXPORTER_OTLP_HEADERS is not a comma-separated list of name=value "
        "(its text is not shown: it may hold a credential)\n"
    )
    assert handler.received == []
    logged = " ".join(r.getMessage() for r in caplog.records) + str(capsys.readouterr())
    assert "s3cr3t" not in logged + result.output
