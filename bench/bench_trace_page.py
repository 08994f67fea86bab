"""The trace page of a large fan-out (issue 14): how long building it takes, how big it
is, and how long headless Chromium takes to load and draw it; then (issue 24) how long
a search through every message takes in the page, a zoom step, and building the page
of the tree beside a second run of the same fan-out (``trace A --vs B``).

    python -m bench.bench_trace_page [--n 1000] [--runs 3] [--screenshot PATH]

Needs Debian's ``chromium`` and Playwright (``pip install -e '.[browser]'``). The page
counts as loaded when its script has drawn it (``body[data-ready]``), from navigation
start; the figure is the median of ``--runs`` fresh pages. A search's time is the
page's own (``performance.now()`` around the scan, shown in its hits' heading; the
first search also lower-cases every text once); the end-to-end time adds the wait
for the hits to be drawn, seen from Playwright (after the box's 120 ms debounce,
which is left out).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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
    parser.add_argument(
        "--no-compare", action="store_true", help="skip the second run and the --vs page"
    )
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "fanout.db"

        async def run() -> None:
            await fanfold_fanout(args.n, db, logging_on=False)

        trio.run(run)
        with Store.open(db, read_only=True) as store:
            (root,) = store.list_roots()
            start, cpu = time.perf_counter(), time.process_time()
            data = build_trace(store, root.id)
            built, built_cpu = time.perf_counter() - start, time.process_time() - cpu
        if not args.no_compare:
            trio.run(run)  # a second run of the same fan-out, in the same database
            with Store.open(db, read_only=True) as store:
                first, second = sorted(store.list_roots(), key=lambda r: r.created_at)
                start, cpu = time.perf_counter(), time.process_time()
                beside = build_trace(store, first.id, vs=second.id)
                compared, compared_cpu = time.perf_counter() - start, time.process_time() - cpu
            size = len(render_html(beside).encode())
            print(
                f"trace A --vs B (two runs, {len(beside['compare']['agents'])} pairs): "
                f"build_trace {compared:.2f} s (CPU {compared_cpu:.2f} s), "
                f"page {size / 1e6:.1f} MB"
            )
        start = time.perf_counter()
        html = render_html(data)
        rendered = time.perf_counter() - start
        page_file = Path(tmp) / "trace.html"
        page_file.write_text(html, encoding="utf-8")
        print(
            f"{args.n} sub-agents, {len(data['steps'])} steps: build_trace {built:.2f} s "
            f"(CPU {built_cpu:.2f} s), "
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
                if len(loads) == 1:
                    searches = [_search(page, query) for query in QUERIES]
                    zoom_ms = _zoom(page)
                page.close()
            browser.close()
        shown = ", ".join(f"{s:.2f}" for s in loads)
        print(f"headless Chromium load to drawn: median {statistics.median(loads):.2f} s ({shown})")
        for query, (hits, in_page, seen) in zip(QUERIES, searches, strict=True):
            print(f"search {query!r}: {hits}; in the page {in_page:.1f} ms, drawn in {seen:.0f} ms")
        print(f"zoom step (+ button, rows in view redrawn): {zoom_ms:.1f} ms")


# The first lower-cases every text; then a rare text, a common one, and a miss.
QUERIES = ("TASK 999", "task 998", "working", "not in any message")


def _search(page: Any, query: str) -> tuple[str, float, float]:
    """Search ``query``: the hits' heading, the page's own time (ms), and the time
    until the hits are drawn seen from here (ms, the debounce left out)."""
    box = page.locator("#search")
    box.fill("")
    page.locator("#hits").wait_for(state="hidden")
    box.fill(query)
    start = time.perf_counter()
    box.press("Enter")  # searches at once (no debounce)
    page.locator("#hits-head").wait_for()
    seen = (time.perf_counter() - start) * 1000
    heading = page.locator("#hits-head").inner_text().split(" (")[0]
    return heading, float(page.locator("#hits").get_attribute("data-ms")), seen


def _zoom(page: Any) -> float:
    """The mean script time of one zoom step (ms), over ten clicks of the + button."""
    page.locator("#zoom-fit").click()
    took: float = page.evaluate(
        """() => {
            const button = document.getElementById("zoom-in");
            const start = performance.now();
            for (let i = 0; i < 10; i++) button.click();
            return (performance.now() - start) / 10;
        }"""
    )
    return took


if __name__ == "__main__":
    main()
