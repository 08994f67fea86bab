"""The trace page in a real browser: headless Chromium (Debian's ``chromium``) driven by
pip's Playwright through its executable path (no browser download).

Each test saves a screenshot in ``test-artifacts/`` (or ``$FANFOLD_TEST_ARTIFACTS``).
Without the browser or Playwright the tests are skipped with a message saying how to
install them; ``.ci/run`` installs both, so CI runs them.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from db_scenarios import Driver, fan_out
from trace_helpers import (
    HOSTILE,
    MARKS_SCRIPT,
    UI_TOKEN,
    diverge,
    fan_out_log,
    forked_with_edit,
    offline_example,
    run_script,
)

from fanfold.db import Store
from fanfold.trace import build_trace, render_html

INSTALL = (
    "install headless Chromium and Playwright to run the browser tests: "
    "`apt-get install chromium` (Debian) and `pip install -e '.[browser]'` "
    "(.ci/run does both)"
)

ARTIFACTS = Path(os.environ.get("FANFOLD_TEST_ARTIFACTS", "test-artifacts"))


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(f"Playwright is not installed: {INSTALL}")
    executable = chromium_path()
    if executable is None:
        pytest.skip(f"no chromium on PATH: {INSTALL}")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.errors = errors
    try:
        yield page
    finally:
        context.close()
    assert errors == [], errors


def write_trace(folder: Path, db: Path, root: str, vs: str | None = None) -> Path:
    with Store.open(db, read_only=True) as store:
        html = render_html(build_trace(store, root, vs=vs))
    out = folder / "trace.html"
    out.write_text(html, encoding="utf-8")
    return out


def open_trace(page: Any, path: Path) -> float:
    """Load the page; the seconds until its script has drawn it."""
    start = time.perf_counter()
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-ready]")
    return time.perf_counter() - start


def screenshot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("example")
    db, root = offline_example(folder)
    return write_trace(folder, db, root), root


def test_offline_example_rows_marks_detail_and_slider(page: Any, example: tuple[Path, str]) -> None:
    path, root = example
    open_trace(page, path)
    rows = page.locator("#rows .row")
    assert rows.count() == 4
    assert page.locator("#rows .row.failed").count() == 1
    assert page.locator("#rows .row.completed").count() == 2
    assert page.locator("#row-0 .m-model").count() == 2
    assert page.locator("#row-0 .m-wait").count() == 1
    assert page.locator("#rows .m-tool").count() >= 3
    screenshot(page, "example-timeline")

    # Hover: a model call's duration and tokens.
    page.locator("#row-1 .m-model").first.hover()
    tip = page.locator("#tooltip")
    assert tip.is_visible()
    assert "duration" in tip.inner_text() and "tokens 400 in" in tip.inner_text()

    # Click the failed agent: its outcome, task and messages.
    page.locator("#rows .row.failed").click()
    detail = page.locator("#detail")
    assert detail.locator("h2").inner_text() == f"{root}.3"
    assert "failed (submitted_error)" in detail.inner_text()
    assert "coverage.xml" in detail.inner_text()
    assert page.locator("#row-3").get_attribute("aria-selected") == "true"

    # Keyboard: up to the sibling, left to the parent, whose children's outcomes show.
    page.keyboard.press("ArrowUp")
    assert detail.locator("h2").inner_text() == f"{root}.2"
    page.keyboard.press("ArrowLeft")
    assert detail.locator("h2").inner_text() == root
    assert "Sub-agents' outcomes, as received" in detail.inner_text()
    screenshot(page, "example-detail")

    # The slider: at the first step only the root exists, just created.
    page.locator("#step").focus()
    page.keyboard.press("Home")
    info = page.locator("#step-info").inner_text()
    assert "ConversationCreated" in info and "step 1/" in info
    assert page.locator("#rows .row.absent").count() == 3
    page.keyboard.press("End")
    assert page.locator("#rows .row.absent").count() == 0
    # "[" steps back one step from the end.
    page.locator("#rows").focus()
    page.keyboard.press("[")
    last = page.locator("#step").get_attribute("max")
    assert page.locator("#step").input_value() == str(int(last or 0) - 1)
    screenshot(page, "example-slider")


def test_model_output_is_shown_never_run(page: Any, tmp_path: Path) -> None:
    db, root = run_script(tmp_path, MARKS_SCRIPT)
    open_trace(page, write_trace(tmp_path, db, root))
    assert page.evaluate("window.__pwned") is None
    assert page.locator("img").count() == 0
    assert page.locator("#detail b").count() == 0
    assert HOSTILE.split("<b>")[0] in page.locator("#detail").text_content()
    # The agent whose task and result are hostile too.
    page.locator("#row-2").click()
    assert page.evaluate("window.__pwned") is None
    assert HOSTILE in page.locator("#detail").text_content()
    # Retries and deadlines are marked: the rate limit, the slow child's time limit.
    assert page.locator("#row-2 .m-retry").count() == 1
    assert page.locator("#row-2 .m-model.err").count() == 1
    assert page.locator("#row-3 .m-deadline").count() == 1
    assert page.locator("#row-3.failed").count() == 1
    screenshot(page, "hostile")


def test_divergence_is_shown_recorded_against_recomputed(page: Any, tmp_path: Path) -> None:
    db, root = run_script(tmp_path, MARKS_SCRIPT)
    diverge(db, f"{root}.1", 2)
    open_trace(page, write_trace(tmp_path, db, root))
    banner = page.locator("#banner")
    assert banner.is_visible() and "fails verify" in banner.inner_text()
    assert page.locator("#row-1.diverged .m-div").count() == 1
    page.keyboard.press("d")
    panel = page.locator("#divergence")
    assert panel.is_visible()
    text = panel.inner_text()
    assert f"conversation {root}.1, seq 2 (ToolFinished)" in text
    recorded, recomputed = panel.locator(".cols pre").all()[:2]
    assert '"call": 999' in recorded.inner_text()
    assert '"call": 999' not in recomputed.inner_text()
    assert "mismatch" in (page.locator("#step-info").get_attribute("class") or "")
    assert page.locator("#detail h2").inner_text() == f"{root}.1"
    screenshot(page, "divergence")
    page.keyboard.press("Escape")
    assert not panel.is_visible()


@pytest.mark.slow
def test_a_thousand_agents_load_virtualised(
    page: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db, root = fan_out_log(tmp_path, 1000)
    path = write_trace(tmp_path, db, root)
    seconds = open_trace(page, path)
    with capsys.disabled():
        print(f"\n1,000-agent trace page: {path.stat().st_size} bytes, ready in {seconds:.2f} s")
    assert "1001 of 1001 agent(s) shown" in page.locator("#shown").inner_text()
    in_dom = page.locator("#rows .row").count()
    assert 10 < in_dom < 100  # only the rows in view are drawn
    page.locator("#rows").focus()
    page.keyboard.press("End")
    assert page.locator("#detail h2").inner_text() == f"{root}.1000"
    assert page.locator("#row-1000").is_visible()
    # The root's detail lists the first 100 of its 1,000 children's outcomes, then more.
    page.keyboard.press("Home")
    outcomes = page.locator("#child-outcomes > .msg")
    assert outcomes.count() == 100
    page.locator("#child-outcomes > button").click()
    assert outcomes.count() == 200
    page.locator("#filter").fill("task 999")
    assert "1 of 1001" in page.locator("#shown").inner_text()
    page.locator("#filter").fill("")
    # Search: the last sub-agent's task, far below the rows drawn; the filter cleared
    # of an agent it would hide, the timeline scrolled to it.
    page.locator("#filter").fill("task 5")
    page.locator("#search").fill("TASK 999")
    hit = page.locator("#hits .hit", has_text=f"{root}.1000 · user")
    hit.click()
    assert page.locator("#detail h2").inner_text() == f"{root}.1000"
    assert page.locator("#row-1000").is_visible()
    assert "1001 of 1001" in page.locator("#shown").inner_text()
    page.locator("#search").fill("")
    # At the first step no sub-agent exists yet: every sub-agent's row in view is dim.
    page.locator("#step").focus()
    page.keyboard.press("Home")
    absent = page.locator("#rows .row.absent").count()
    assert absent == page.locator("#rows .row:not(#row-0)").count() > 10
    screenshot(page, "fanout-1000")


@contextmanager
def ui_server(db: Path) -> Iterator[str]:
    """``fanfold ui``'s application served by Hypercorn's Trio worker in a thread."""
    pytest.importorskip("hypercorn", reason="fanfold ui needs the ui extra: pip install '.[ui]'")
    import trio

    from fanfold.serve.ui_server import TraceServer, serve

    binds: queue.Queue[str] = queue.Queue()
    stop: list[Any] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            (bind,) = await nursery.start(
                serve, TraceServer(db, token=UI_TOKEN, poll=0.05), "127.0.0.1", 0
            )
            stop.extend([trio.lowlevel.current_trio_token(), nursery.cancel_scope])
            binds.put(bind)

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    try:
        yield binds.get(timeout=30)
    finally:
        token, scope = stop
        trio.from_thread.run_sync(scope.cancel, trio_token=token)
        thread.join(timeout=30)


def test_ui_pages_follow_a_running_tree(page: Any, tmp_path: Path) -> None:
    driver = Driver()
    fan_out(driver)
    steps = driver.steps
    half = len(steps) // 2
    db = tmp_path / "live.db"
    with Store.open(db) as store:
        store.append(steps[:half])
    with ui_server(db) as base:
        page.goto(f"{base}/?token={UI_TOKEN}")
        page.wait_for_selector("body[data-ready]")
        assert page.url == base + "/"  # the token went into the cookie, out of the URL
        assert page.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
        link = page.locator("#trees a")
        assert link.inner_text() == "r"
        assert "running" in page.locator("#trees tr.tree").inner_text()
        link.click()
        page.wait_for_selector("body[data-ready]")
        assert page.locator("#row-0.running").count() == 1
        with Store.open(db) as store:
            store.append(steps[half:])
        # The page hears the change (server-sent events) and redraws with the new data.
        page.wait_for_selector("#row-0.idle", timeout=15_000)
        assert page.locator("#rows .row").count() == 4
        screenshot(page, "ui-live")
        page.goto("about:blank")  # close the event stream before the server stops


def test_ui_without_the_token_shows_a_refusal(browser: Any, tmp_path: Path) -> None:
    """A browser that never opened the printed URL (another profile, another user) gets
    the one-line refusal, and the token of another launch does not open the pages."""
    db, _ = run_script(tmp_path, MARKS_SCRIPT)
    context = browser.new_context()
    try:
        page = context.new_page()
        with ui_server(db) as base:
            answer = page.goto(base + "/")
            assert answer is not None and answer.status == 403
            assert page.locator("body").inner_text().startswith("refused: open the URL")
            answer = page.goto(base + "/?token=another-launch-0123456789")
            assert answer is not None and answer.status == 403
            assert context.cookies() == []
            page.goto("about:blank")
    finally:
        context.close()


def test_a_refusal_shows_its_category_and_explanation(page: Any, tmp_path: Path) -> None:
    """Issue 22, item 15: the detail of a refused agent, and its parent's list of the
    outcomes it received, say `refused: cyber` and the explanation, not the JSON."""
    details = '{"category": "cyber", "explanation": "Not with exploits."}'
    spawn = {"name": "spawn_agents", "arguments": {"tasks": [{"task": "declines"}]}}
    script = {
        "latency": 0,
        "agents": [
            {"match": {"path": "root"}, "replies": [{"tool_calls": [spawn]}, {"text": "ok"}]},
            {
                "match": {"path": "root/1"},
                "replies": [{"stop_reason": "refusal", "stop_details": details}],
            },
        ],
    }
    db, root = run_script(tmp_path, script)
    open_trace(page, write_trace(tmp_path, db, root))
    detail = page.locator("#detail")
    received = detail.inner_text()
    assert "failed (refused: cyber)" in received and "Not with exploits." in received
    assert '"category"' not in received
    page.locator("#rows .row.failed").click()
    shown = detail.inner_text()
    assert "failed (refused: cyber)" in shown and "Not with exploits." in shown
    assert '"category"' not in shown
    screenshot(page, "refusal")


# ------------------------------------------------------------------ issue 24: the page


def test_a_fork_beside_its_original_marks_the_differing_line(page: Any, tmp_path: Path) -> None:
    db, root, fork = forked_with_edit(tmp_path)
    open_trace(page, write_trace(tmp_path, db, fork))
    # The header names the original and links its page (the file `fanfold trace` writes).
    assert f"fork of {root}@" in page.locator("#fork").inner_text()
    assert page.locator("#original").get_attribute("href") == f"trace-{root}.html"
    # The agents that part are marked in the timeline; root/1 said the same.
    assert page.locator("#row-2 .parts").count() == 1
    assert page.locator("#row-1 .parts").count() == 0
    page.locator("#row-2").click()
    page.keyboard.press("c")
    panel = page.locator("#compare")
    assert panel.is_visible()
    assert "parts at item 1" in page.locator("#cmp-state").inner_text()
    parting = panel.locator("#cmp-table tr.parting")
    assert parting.count() == 1
    original, edited = parting.locator("td.cmp-item").all()
    # Only the second line differs: marked on both sides, the others not.
    assert [ln.inner_text() for ln in original.locator(".ln.dl").all()] == ["line two"]
    assert edited.locator(".ln.dl").inner_text().startswith("line 2 edited </script>")
    unmarked = [ln.inner_text() for ln in edited.locator(".ln:not(.dl)").all()]
    assert unmarked == ["line one", "line three"]
    # The task both were given is shown aligned, not marked.
    assert panel.locator("#cmp-table tr.same").count() == 1
    # Untrusted text is text: nothing of it ran or became markup.
    assert page.evaluate("window.__pwned") is None
    assert panel.locator("b, img, script").count() == 0
    screenshot(page, "fork-beside-original")
    # Another agent from the list: root/1 said the same things in both.
    page.locator("#cmp-agent").select_option(label="root/1 — the same")
    assert "the same 2 item(s) in both" in page.locator("#cmp-state").inner_text()
    page.keyboard.press("Escape")
    assert not panel.is_visible()


def test_zoom_widens_the_marks_and_keeps_the_point_under_the_cursor(
    page: Any, tmp_path: Path
) -> None:
    db, root = run_script(tmp_path, MARKS_SCRIPT)
    open_trace(page, write_trace(tmp_path, db, root))
    bars = page.locator("#row-1 .bars").bounding_box()
    assert bars is not None

    def narrow_and_central(box: dict[str, float] | None) -> bool:
        # Zoomed in 3x around its middle, such a mark stays whole in the window.
        if box is None or box["width"] <= 3:
            return False
        middle: float = box["x"] + box["width"] / 2
        left: float = bars["x"]
        right: float = left + bars["width"]
        return left < middle - 2 * box["width"] < middle + 2 * box["width"] < right

    marks = page.locator("#rows .m-model, #rows .m-tool, #rows .m-retry").all()
    chosen = next(m for m in marks if narrow_and_central(m.bounding_box()))
    # The same mark through redraws: by its agent and its place in the agent's marks.
    at = (chosen.get_attribute("data-a"), chosen.get_attribute("data-m"))
    mark = page.locator(f'#rows [data-a="{at[0]}"][data-m="{at[1]}"]')
    before = mark.bounding_box()
    assert before is not None
    x, y = before["x"] + before["width"] / 2, before["y"] + before["height"] / 2
    page.mouse.move(x, y)
    page.keyboard.down("Control")
    page.mouse.wheel(0, -500)  # Ctrl+wheel up: zoom in where the pointer is
    page.keyboard.up("Control")
    after = mark.bounding_box()
    assert after is not None
    assert after["width"] > 2 * before["width"]
    # The time under the pointer stayed under it: the mark still holds its x.
    assert after["x"] <= x <= after["x"] + after["width"]
    assert page.locator("#zoom-label").inner_text().startswith("zoom ")
    screenshot(page, "zoomed")
    # The buttons and keys: "0" (or fit) shows the whole trace again, + zooms in.
    page.locator("#rows").focus()
    page.keyboard.press("0")
    whole = mark.bounding_box()
    assert whole is not None and abs(whole["width"] - before["width"]) < 1
    page.locator("#zoom-in").click()
    assert page.locator("#zoom-label").inner_text().startswith("zoom 2.00x")
    page.keyboard.press("+")
    assert page.locator("#zoom-label").inner_text().startswith("zoom 4.00x")
    page.keyboard.press("-")
    assert page.locator("#zoom-label").inner_text().startswith("zoom 2.00x")
    page.locator("#zoom-fit").click()
    assert page.locator("#zoom-label").inner_text() == "whole trace"


def test_search_finds_a_message_in_a_sub_agent_and_shows_it(
    page: Any, example: tuple[Path, str]
) -> None:
    path, root = example
    open_trace(page, path)
    page.keyboard.press("s")
    page.keyboard.type("READING the Coverage")  # case does not matter
    hits = page.locator("#hits .hit")
    # Typed slowly, a part of the text may be searched first: wait for the whole.
    page.locator("#hits .hit mark", has_text="Reading the coverage").wait_for()
    # One message of one sub-agent says it (not its parent nor its siblings).
    assert hits.count() == 1
    assert hits.first.locator(".who").inner_text().startswith(f"{root}.3 · assistant")
    assert hits.first.locator("mark").inner_text() == "Reading the coverage"
    assert "1 hit(s) in 1 agent(s)" in page.locator("#hits-head").inner_text()
    assert "null" not in page.locator("#summary").inner_text()  # no fork, no compare
    page.keyboard.press("Enter")  # jumps to the first hit
    detail = page.locator("#detail")
    assert detail.locator("h2").inner_text() == f"{root}.3"
    assert page.locator("#row-3").get_attribute("aria-selected") == "true"
    found = detail.locator(".msg.found")
    assert found.count() == 1 and found.is_visible()
    assert found.locator("mark").inner_text() == "Reading the coverage"
    # A tool call's arguments are searched too: every agent's read of coverage.xml.
    page.locator("#search").fill('"PATH":"coverage.xml')
    page.locator("#hits .hit", has_text="tool call read_file").wait_for()
    assert page.locator("#hits .hit").count() == 1
    screenshot(page, "search")


def test_search_hits_of_untrusted_text_stay_text(page: Any, tmp_path: Path) -> None:
    db, root = run_script(tmp_path, MARKS_SCRIPT)
    open_trace(page, write_trace(tmp_path, db, root))
    page.locator("#search").fill("not bold")
    page.locator("#hits .hit").first.wait_for()
    assert page.locator("#hits b, #hits img, #hits script").count() == 0
    page.locator("#hits .hit").last.click()
    assert page.locator("#detail .msg.found mark").count() >= 1
    assert page.locator("#detail b, #detail img").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_enter_searches_what_is_typed_now(page: Any, example: tuple[Path, str]) -> None:
    """Enter right after typing (before the box's pause) jumps to a hit of the new
    text, not of the one searched before (it once jumped among those)."""
    path, root = example
    open_trace(page, path)
    search = page.locator("#search")
    search.fill("Planning.")  # said by root.2 only
    page.locator("#hits .hit", has_text=f"{root}.2").wait_for()
    search.fill("Reading the coverage")  # said by root.3 only
    search.press("Enter")
    assert page.locator("#detail h2").inner_text() == f"{root}.3"
    assert page.locator("#hits .hit").count() == 1


def test_ui_links_a_fork_to_its_original(page: Any, tmp_path: Path) -> None:
    db, root, fork = forked_with_edit(tmp_path)
    with ui_server(db) as base:
        page.goto(f"{base}/trace/{fork}?token={UI_TOKEN}")
        page.wait_for_selector("body[data-ready]")
        assert page.locator("#original").get_attribute("href") == f"/trace/{root}"
        page.keyboard.press("c")
        assert page.locator("#compare #cmp-table tr.parting .ln.dl").count() >= 1
        page.keyboard.press("Escape")
        page.locator("#original").click()
        page.wait_for_selector("body[data-ready]")
        assert page.locator("#summary h1").inner_text() == f"fanfold trace {root}"
        assert page.locator("#fork").count() == 0 and page.locator("#open-compare").count() == 0
        page.goto("about:blank")  # close the event stream before the server stops


def test_a_running_tool_calls_progress_is_shown_as_text(page: Any, tmp_path: Path) -> None:
    """Issue 33, item 8: the latest progress of a tool call in flight (the log's
    ``tool_progress`` side table) is on its mark in the detail's table, the server's
    markup shown as text and never run."""
    import trio

    from fanfold.db import ToolProgressRow
    from fanfold.providers.scripted import ScriptedProvider
    from fanfold.runtime import Runtime
    from fanfold.runtime.logging import quiet_logger
    from fanfold.statemachine import RunTool, ToolExecuting
    from fanfold.tools.registry import ToolSet

    db = tmp_path / "running.db"
    call = {"name": "bash", "arguments": {"command": "sleep 30"}}
    script = {"agents": [{"match": {"path": "root"}, "replies": [{"tool_calls": [call]}]}]}

    async def closed_with_a_call_in_flight() -> str:
        tools = ToolSet.default()
        async with Runtime.open(db, ScriptedProvider(script), tools, logger=quiet_logger()) as rt:
            root = await rt.start("go", cwd=tmp_path)
            with trio.fail_after(30):
                while not isinstance(rt.state(root).phase, ToolExecuting):
                    await trio.sleep(0.02)
            return root

    root = trio.run(closed_with_a_call_in_flight)
    hostile = "2/5, <img src=x onerror=window.__pwned=1> half"
    with Store.open(db) as store:
        (number,) = [
            e.call for s in store.events(root) for e in s.effects if isinstance(e, RunTool)
        ]
        store.write_progress([ToolProgressRow(root, number, hostile, 2, time.time())])
    open_trace(page, write_trace(tmp_path, db, root))
    cell = page.locator("#detail td[data-progress]")
    assert cell.count() == 1
    assert cell.text_content() == f"tool bash — progress: {hostile}"
    assert page.locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_approve_and_deny_from_the_page(page: Any, tmp_path: Path) -> None:
    """Issue 35 in the browser, with a runtime holding the tree (as a `fanfold run` in
    another terminal): the list shows the tree's open requests; the trace page shows
    each (the model's arguments and question as text) and the one decided through
    Python with who and the edited arguments; Approve (with edited arguments) and Deny
    (with a reason) write decisions the runtime takes, and the page then shows them
    decided by "ui"."""
    import sqlite3

    from approval_ui_helpers import HOSTILE_ARGUMENT, QUESTION, held_waiting_log

    with held_waiting_log(tmp_path) as (db, root), ui_server(db) as base:
        page.goto(f"{base}/?token={UI_TOKEN}")
        page.wait_for_selector("body[data-ready]")
        assert page.locator("#trees tr.tree.asking td.requests").inner_text() == "3 request(s)"
        page.locator("#trees a").click()
        page.wait_for_selector("body[data-ready]")
        requests = page.locator("#requests")
        assert requests.locator(".request.open").count() == 3
        assert requests.locator("img").count() == 0  # the model's text stays text
        hostile = requests.locator(f'[data-request="{root}.2:2"]')
        assert HOSTILE_ARGUMENT in hostile.locator("textarea").input_value()
        asking = requests.locator(f'[data-request="{root}.3:2"]')
        assert QUESTION in asking.inner_text() and asking.locator("input.answer").count() == 1
        done = requests.locator(f'[data-request="{root}.1:2"]')
        assert "approved with edited arguments by alice" in done.inner_text()
        assert "echo edited" in done.locator("pre.edited").inner_text()

        waiting = requests.locator(f'[data-request="{root}.1:3"]')
        # A reason typed for one request survives the redraw another's decision makes
        # (it was wiped: CI saw the denial go out as "no reason given").
        hostile.locator("input.reason").fill("not <that>")
        waiting.locator("textarea").fill('{"command": "echo one, edited"}')
        waiting.locator("button.approve").click()
        # The runtime takes it; the page hears the change and shows who decided.
        granted = waiting.locator(".decision.grant")
        granted.wait_for(timeout=15_000)
        assert "approved with edited arguments by ui" in granted.inner_text()
        assert "echo one, edited" in waiting.locator("pre.edited").inner_text()
        assert hostile.locator("input.reason").input_value() == "not <that>"
        hostile.locator("button.deny").click()
        denied = hostile.locator(".decision.deny")
        denied.wait_for(timeout=15_000)
        assert "denied by ui" in denied.inner_text()
        assert "reason: not <that>" in hostile.inner_text()
        assert requests.locator(".request.open").count() == 1  # the question still waits
        screenshot(page, "ui-decisions")
        page.goto("about:blank")  # close the event stream before the server stops
        with sqlite3.connect(db) as conn:
            written = conn.execute(
                "SELECT request, kind, arguments, text, decided_by FROM decisions "
                "WHERE decided_by = 'ui' ORDER BY request"
            ).fetchall()
    assert written == [
        (f"{root}.1:3", "grant", '{"command": "echo one, edited"}', "", "ui"),
        (f"{root}.2:2", "deny", None, "not <that>", "ui"),
    ]


def test_approve_all_from_the_page(page: Any, tmp_path: Path) -> None:
    """Issue 35: "Approve all" grants, in one POST, every open approval request the
    page shows (the question is left to be answered); the runtime holding the tree
    takes both and the page shows them approved by "ui"."""
    import sqlite3

    from approval_ui_helpers import held_waiting_log

    with held_waiting_log(tmp_path) as (db, root), ui_server(db) as base:
        page.goto(f"{base}/trace/{root}?token={UI_TOKEN}")
        page.wait_for_selector("body[data-ready]")
        requests = page.locator("#requests")
        button = page.locator("#approve-all")
        assert button.inner_text() == "Approve all 2 open call(s)"
        button.click()
        calls = [f"{root}.1:3", f"{root}.2:2"]
        for call in calls:
            granted = requests.locator(f'[data-request="{call}"] .decision.grant')
            granted.wait_for(timeout=15_000)
            assert "approved by ui" in granted.inner_text()
        assert requests.locator(".request.open").count() == 1  # the question still waits
        assert page.locator("#approve-all").count() == 0  # one open call or fewer: no button
        page.goto("about:blank")  # close the event stream before the server stops
        with sqlite3.connect(db) as conn:
            written = conn.execute(
                "SELECT request, kind, arguments, decided_by FROM decisions "
                "WHERE decided_by = 'ui' ORDER BY request"
            ).fetchall()
    assert written == [(c, "grant", None, "ui") for c in calls]
