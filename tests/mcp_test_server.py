"""A small MCP server for the tests, run as a real subprocess over stdio (or HTTP).

``python mcp_test_server.py MODE [DIR]``; DIR is where the tools leave traces.

- ``ok``: the SDK's ``MCPServer`` with tools ``echo`` (read-only), ``add`` (structured
  result), ``fail`` (an ``isError`` result), ``image``, ``big`` (50 MB of text, or ``mb``),
  ``die`` (exits mid-call), ``slow`` (sleeps; touches DIR/slow-started, writes
  ``cancelled`` to DIR when the client cancels it), ``count`` (appends a line to
  DIR/count), ``bash`` (a built-in's name), ``spawn`` (starts a grandchild
  ``sleep``, writes its pid and the server's).
- ``hang``: as ``ok``, but ignores SIGTERM and end-of-file on stdin at shutdown.
- ``http``: the tools of ``ok`` over Streamable HTTP (uvicorn, the SDK's Starlette app)
  on 127.0.0.1, port $HTTP_PORT or one the system picks, written to DIR/port once it
  listens. Each request's headers (and its method, as ``(method)``) are appended to
  DIR/headers (one JSON line); while
  DIR/http-status holds a number, every request is answered with that HTTP status
  instead; while DIR/http-hang exists, every request waits for ever.
- ``sse``: as ``http``, over the older HTTP+SSE transport (the SDK's ``sse_app``, the
  stream at ``/sse``).
- ``many``: 129 tools (``$MANY_TOOLS`` if set), ``tool_0``, ``tool_1``...: one more
  than fanfold takes (``fanfold.mcp.client.MAX_TOOLS``; each tool costs the SDK's
  server some 5 ms to build at start).
- With $WAIT_FOR set (any mode), the server waits until that file exists before it
  answers anything (at most 20 s, then exits).
- ``typed``: the SDK's ``MCPServer`` with tools typed as users type them with pydantic
  (``X | None`` (Optional), ``Literal``, ``Field`` constraints, nested models, ``dict[str, int]``,
  ``date``, ``AnyUrl``): their schemas hold ``$defs``/``$ref``, ``anyOf``, ``format``,
  ``pattern``, ``maxLength`` and ``additionalProperties`` schemas. Each call appends its
  tool's name to DIR/calls and answers with its arguments as JSON.
- ``banner``: as ``ok``, after printing lines that are not JSON-RPC on stdout (a
  banner) before it reads anything: two, or $BANNER_LINES.
- ``noinit``: reads requests and never answers.
- ``garbage``: answers every line with a line that is not JSON.
- ``badschema``: hand-written JSON-RPC: one tool whose schema uses ``$ref`` (outside
  the subset fanfold checks), one fine, one (``weird``) answering a malformed result;
  ``stringschema``: a schema that is not an object; ``dupes``: two tools named
  ``fine`` (described ``first`` and ``second``) and ``weird``.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODE = sys.argv[1]
DIR = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(".")
print(f"test server {MODE} starting", file=sys.stderr, flush=True)
(DIR / f"started-{MODE}").touch()
if os.environ.get("WAIT_FOR"):
    # Start only once another server has: two servers waiting for each other start only
    # side by side (given up after 20 s, so a one-after-the-other start fails).
    for _ in range(400):
        if Path(os.environ["WAIT_FOR"]).exists():
            break
        time.sleep(0.05)
    else:
        sys.exit(3)


def raw() -> None:
    for line in sys.stdin:
        if MODE == "noinit":
            continue
        if MODE == "garbage":
            sys.stdout.write("this is not json-rpc\n")
            sys.stdout.flush()
            continue
        message = json.loads(line)
        if "id" not in message:
            continue
        method = message["method"]
        if method == "initialize":
            result = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "bad", "version": "1"},
            }
        elif method == "tools/list":
            result = {
                "tools": [
                    {"name": "fine", "description": "first", "inputSchema": {"type": "object"}}
                    if MODE == "dupes"
                    else {"name": "stringy", "inputSchema": {"type": "string"}}
                    if MODE == "stringschema"
                    else {
                        "name": "refy",
                        "inputSchema": {
                            "type": "object",
                            "properties": {"x": {"$ref": "#/$defs/X"}},
                        },
                    },
                    {
                        "name": "fine",
                        "description": "second" if MODE == "dupes" else "",
                        "inputSchema": {"type": "object", "properties": {}},
                    },
                    {"name": "weird", "inputSchema": {"type": "object", "properties": {}}},
                ]
            }
        elif method == "tools/call" and message["params"]["name"] == "weird":
            result = {"content": "not a list of blocks"}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": "fine indeed"}]}
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}))
        sys.stdout.write("\n")
        sys.stdout.flush()


def typed() -> None:
    import datetime
    from typing import Annotated, Literal

    import anyio
    from mcp.server.mcpserver import MCPServer
    from pydantic import AnyUrl, BaseModel, Field

    server = MCPServer("typed", log_level="ERROR")

    class Address(BaseModel):
        street: str = Field(max_length=20, description="Street and number")
        zip: str = Field(pattern=r"^[0-9]{5}$", description="Five digits")

    class Person(BaseModel):
        name: str
        home: Address
        work: Address | None = None
        tags: list[str] = []

    def answer(tool: str, **arguments: Any) -> str:
        with open(DIR / "calls", "a") as f:
            f.write(tool + "\n")
        return json.dumps(arguments, sort_keys=True, default=str)

    @server.tool()
    def tag(items: list[str] | None = None) -> str:
        """Tags, or none."""
        return answer("tag", items=items)

    @server.tool()
    def pick(mode: Literal["fast", "slow"], level: Literal["a", "b"] | None = None) -> str:
        """A mode and maybe a level."""
        return answer("pick", mode=mode, level=level)

    @server.tool()
    def short(text: Annotated[str, Field(max_length=5, description="At most 5")]) -> str:
        """A short text."""
        return answer("short", text=text)

    @server.tool()
    def register(person: Person) -> str:
        """A person with addresses (nested models)."""
        return answer("register", person=person.model_dump())

    @server.tool()
    def scores(values: dict[str, int]) -> str:
        """Named whole numbers."""
        return answer("scores", values=values)

    @server.tool()
    def ranged(
        n: Annotated[int, Field(ge=1, le=10)], ratio: Annotated[float, Field(gt=0, lt=1)] = 0.5
    ) -> str:
        """Numbers in ranges."""
        return answer("ranged", n=n, ratio=ratio)

    @server.tool()
    def when(day: datetime.date) -> str:
        """A day."""
        return answer("when", day=day)

    @server.tool()
    def link(url: AnyUrl) -> str:
        """A URL."""
        return answer("link", url=str(url))

    anyio.run(server.run_stdio_async)


def served() -> None:
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.mcpserver.utilities.types import Image
    from mcp_types import ToolAnnotations

    server = MCPServer("test", log_level="ERROR")

    if MODE == "many":
        for i in range(int(os.environ.get("MANY_TOOLS", "129"))):

            def tool_n(x: int) -> int:
                return x

            server.add_tool(tool_n, name=f"tool_{i}")
        anyio.run(server.run_stdio_async)
        return

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def echo(text: str) -> str:
        """Say it back."""
        return f"echo: {text}"

    @server.tool()
    def add(a: int, b: int) -> dict[str, int]:
        """Add two numbers."""
        return {"sum": a + b}

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise ToolError("it failed on purpose")

    @server.tool()
    def image() -> Image:
        """A tiny picture."""
        return Image(data=b"\x89PNG" + b"0" * 300, format="png")

    @server.tool()
    def big(mb: int = 50) -> str:
        """MB megabytes of text (50 by default), "<start>" first and "<end>" last."""
        return "<start>" + "x" * (mb * 1024 * 1024) + "<end>"

    @server.tool()
    def die() -> str:
        """Dies mid-call."""
        print("dying now", file=sys.stderr, flush=True)
        os._exit(3)

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleeps."""
        (DIR / "slow-started").touch()
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            (DIR / "cancelled").write_text("cancelled")
            raise
        return "slept"

    @server.tool()
    def count(tag: str) -> str:
        """Counts its calls in DIR/count."""
        with open(DIR / "count", "a") as f:
            f.write(tag + "\n")
        time.sleep(float(os.environ.get("COUNT_SLEEP", "0")))
        return "counted"

    @server.tool(name="bash")
    def bash_named(command: str) -> str:
        """Named like fanfold's built-in."""
        return f"not really bash: {command}"

    @server.tool()
    def spawn() -> str:
        """Starts a grandchild that would outlive us if nothing killed it."""
        child = subprocess.Popen(["sleep", "3600"], start_new_session=True)
        (DIR / "pids").write_text(f"{os.getpid()} {child.pid}")
        return "spawned"

    @server.tool()
    def secret() -> str:
        """The value of the variable the declaration passed."""
        return os.environ.get("PASSED", "unset") + " " + os.environ.get("OTHER_TOKEN", "absent")

    if MODE in ("http", "sse"):
        http(server)
        return
    anyio.run(server.run_stdio_async)
    if MODE == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        (DIR / "hanging").write_text(str(os.getpid()))
        time.sleep(3600)


def http(server: Any) -> None:
    import socket

    import uvicorn

    app = server.sse_app() if MODE == "sse" else server.streamable_http_app()

    async def recorded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode(): v.decode() for k, v in scope["headers"]}
            headers["(method)"] = scope["method"]
            with open(DIR / "headers", "a") as f:
                f.write(json.dumps(headers) + "\n")
            if (DIR / "http-hang").exists():
                import asyncio

                await asyncio.sleep(3600)
            status = DIR / "http-status"
            if status.exists():
                body = b"scripted failure"
                await send(
                    {
                        "type": "http.response.start",
                        "status": int(status.read_text()),
                        "headers": [(b"content-type", b"text/plain")],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart takes the port
    sock.bind(("127.0.0.1", int(os.environ.get("HTTP_PORT", "0"))))
    sock.listen()
    config = uvicorn.Config(recorded, log_level="error", lifespan="on")
    uvicorn_server = uvicorn.Server(config)

    async def serve() -> None:
        import asyncio

        task = asyncio.create_task(uvicorn_server.serve(sockets=[sock]))
        while not uvicorn_server.started:
            await asyncio.sleep(0.01)
        (DIR / "port.tmp").write_text(str(sock.getsockname()[1]))
        (DIR / "port.tmp").rename(DIR / "port")
        await task

    import asyncio

    asyncio.run(serve())


if MODE == "banner":
    print("Welcome to the banner server v1.0", flush=True)
    for i in range(int(os.environ.get("BANNER_LINES", "2")) - 1):
        print(f"(logging to stdout, as some servers do: line {i + 2})", flush=True)
    MODE = "ok"
if MODE in ("noinit", "garbage", "badschema", "stringschema", "dupes"):
    raw()
elif MODE == "typed":
    typed()
else:
    served()
