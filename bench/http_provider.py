"""The HTTP provider path (issue 36): heap per waiting child and CPU until every
child's call is started, for the OpenAI and Anthropic formats, against a loopback
server in its own process (``bench/http_hold_server.py``) that holds every child's
request open.

For each API and N: a root spawns N children; each child's first model call goes to the
server, which holds it. Measured once every child's call is made (``_calls_made``: on
a worker or waiting in the runtime's gate) and the server holds as many requests as
the client lets run (``fanfold.providers.http.POOL_SIZE``; the others wait their turn):

- ``heap/child``: tracemalloc's heap after minus before, over N (a run of its own);
- ``cpu s``: this process's CPU from ``start`` to that moment (a run without tracemalloc).

Usage, from the checkout: ``python -m bench.http_provider [N ...] [--api openai|anthropic]``
(default N = 100 1000, both APIs).
"""

from __future__ import annotations

import argparse
import gc
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path

import trio

from bench.workload import fanout_limits
from fanfold.providers import http as _http
from fanfold.providers.base import Provider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.tools.registry import ToolSet

SERVER = Path(__file__).with_name("http_hold_server.py")
# The client's pool: 100 before issue 36 too (httpx's default), so the bench runs on either.
POOL_SIZE: int = getattr(_http, "POOL_SIZE", 100)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _held(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/held", timeout=5) as reply:
        return int(reply.read())


def _provider(api: str, port: int) -> Provider:
    base = f"http://127.0.0.1:{port}/v1"
    if api == "anthropic":
        from fanfold.providers.anthropic import AnthropicProvider

        return AnthropicProvider(base_url=base, model="m", api_key="k")
    from fanfold.providers.openai import OpenAIProvider

    return OpenAIProvider(base_url=base, model="m")


def _calls_made(runtime: Runtime) -> int:
    """How many conversations have a model call made and not ended: started on a
    worker, or waiting in the runtime's gate for one (``fanfold.runtime.calls``)."""
    return sum(1 for actor in runtime._actors.values() if actor._call is not None)


def run(api: str, n: int, traced: bool) -> float:
    """Heap bytes per waiting child (``traced``) or CPU seconds until all wait."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, str(SERVER), str(port), str(n)])
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        with tempfile.TemporaryDirectory() as tmp:
            return trio.run(_measure, api, n, port, Path(tmp) / "tree.db", traced)
    finally:
        server.kill()
        server.wait()


async def _measure(api: str, n: int, port: int, database: Path, traced: bool) -> float:
    provider = _provider(api, port)
    limits = fanout_limits(n)
    if traced:
        tracemalloc.start()
    try:
        async with Runtime.open(
            database,
            provider,
            ToolSet.default(),
            limits=limits,
            logger=quiet_logger(),
        ) as runtime:
            gc.collect()
            heap0 = tracemalloc.get_traced_memory()[0] if traced else 0
            cpu0 = time.process_time()
            await runtime.start("fan out", limits=limits)
            with trio.fail_after(1800):
                while _calls_made(runtime) < n:
                    await trio.sleep(0.05)
                while await trio.to_thread.run_sync(_held, port) < min(n, POOL_SIZE):
                    await trio.sleep(0.05)
            cpu = time.process_time() - cpu0
            gc.collect()
            heap = tracemalloc.get_traced_memory()[0] - heap0 if traced else 0
            # Leave at once: the held calls are cancelled with the runtime.
            return heap / n if traced else cpu
    finally:
        if traced:
            tracemalloc.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", nargs="*", type=int, default=[100, 1000])
    parser.add_argument("--api", choices=["openai", "anthropic"], action="append")
    args = parser.parse_args()
    print("| api | N | heap per waiting child | CPU until all wait |")
    print("|---|---:|---:|---:|")
    for api in args.api or ["openai", "anthropic"]:
        for n in args.sizes:
            cpu = run(api, n, traced=False)
            heap = run(api, n, traced=True)
            print(f"| {api} | {n} | {heap:,.0f} B | {cpu:.2f} s |", flush=True)


if __name__ == "__main__":
    main()
