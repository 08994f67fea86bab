"""The trace page of a large fan-out (issue 14): how long building it takes, how big it
is, and how long headless Chromium takes to load and draw it.

    python -m bench.bench_trace_page [--n 1000] [--runs 3] [--screenshot PATH]

Needs Debian's ``chromium`` and Playwright (``pip install -e '.[browser]'``). The page
counts as loaded when its script has drawn it (``body[data-ready]``), from navigation
start; the figure is the median of ``--runs`` fresh pages.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import trio

from bench.workload import fanfold_fanout
from fanfold.db import Store
from fanfold.trace import build_trace, render_html


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--screenshot", type=Path, default=None)
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "fanout.db"

        async def run() -> None:
            await fanfold_fanout(args.n, db, logging_on=False)

        trio.run(run)
        with Store.open(db, read_only=True) as store:
            (root,) = store.list_roots()
            start = time.perf_counter()
            data = build_trace(store, root.id)
            built = time.perf_counter() - start
        start = time.perf_counter()
        html = render_html(data)
        rendered = time.perf_counter() - start
        page_file = Path(tmp) / "trace.html"
        page_file.write_text(html, encoding="utf-8")
        print(
            f"{args.n} sub-agents, {len(data['steps'])} steps: build_trace {built:.2f} s, "
            f"render_html {rendered:.3f} s, page {len(html.encode()) / 1e6:.1f} MB"
        )
        loads = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=args.chromium, args=["--no-sandbox", "--disable-gpu"]
            )
            for _ in range(args.runs):
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                start = time.perf_counter()
                page.goto(page_file.as_uri())
                page.wait_for_selector("body[data-ready]")
                loads.append(time.perf_counter() - start)
                if args.screenshot is not None:
                    page.screenshot(path=str(args.screenshot))
                page.close()
            browser.close()
        shown = ", ".join(f"{s:.2f}" for s in loads)
        print(f"headless Chromium load to drawn: median {statistics.median(loads):.2f} s ({shown})")


if __name__ == "__main__":
    main()
