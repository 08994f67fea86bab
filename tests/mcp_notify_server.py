"""A hand-written MCP server (JSON-RPC 2.0 over stdio, no SDK: it starts in a tenth of
a second where the SDK's takes seconds) that sends the notifications of issue 33's
item 8, run as a real subprocess: ``python mcp_notify_server.py DIR``.

Tools:

- ``echo``: answers ``echo``.
- ``grow``: adds the tool ``late``, sends ``notifications/tools/list_changed``, then
  answers ``grown`` (the SDK's client hears the notification before the answer).
- ``late``: listed once ``grow`` ran; answers ``late answer``.
- ``slow``: sends $PROGRESS (default 5) ``notifications/progress`` for the call's
  progress token, their message holding markup, touches DIR/reported, then answers
  ``slow done`` once DIR/release exists.

Each ``tools/call`` appends the tool's name to DIR/calls.
"""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

DIR = Path(sys.argv[1])
grown = False


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
    sys.stdout.flush()


def tools() -> list[dict[str, Any]]:
    names = ["echo", "grow", "slow", *(["late"] if grown else [])]
    schema = {"type": "object", "properties": {}}
    return [{"name": n, "description": f"the {n} tool", "inputSchema": schema} for n in names]


def call(params: dict[str, Any]) -> str:
    global grown
    name = str(params["name"])
    with (DIR / "calls").open("a") as out:
        out.write(name + "\n")
    if name == "grow":
        grown = True
        send({"method": "notifications/tools/list_changed"})
        return "grown"
    if name == "late" and grown:
        return "late answer"
    if name == "slow":
        token = (params.get("_meta") or {}).get("progressToken")
        count = int(os.environ.get("PROGRESS", "5"))
        for i in range(count):
            if token is not None:
                message = f"<img src=x onerror=alert(1)> step {i + 1}"
                params = {"progressToken": token, "progress": i + 1, "total": count}
                send({"method": "notifications/progress", "params": {**params, "message": message}})
        (DIR / "reported").touch()
        while not (DIR / "release").exists():
            time.sleep(0.02)
        return "slow done"
    return name


for line in sys.stdin:
    request = json.loads(line)
    if "id" not in request:
        continue  # a notification (initialized, cancelled)
    method = request["method"]
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": request["params"]["protocolVersion"],
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "notify", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": tools()}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": call(request["params"])}]}
    else:
        result = {}
    send({"id": request["id"], "result": result})
