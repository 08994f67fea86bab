"""The kill -9 campaign of bench/kill9_campaign.py: its detectors, and a 2-point run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from bench_scripts import load_bench

from fanfold.providers.scripted import ScriptedProvider
from fanfold.runtime import Runtime
from fanfold.runtime.logging import quiet_logger
from fanfold.tools.registry import ToolSet

ROOT = Path(__file__).parent.parent
CAMPAIGN = ROOT / "bench" / "kill9_campaign.py"


k9 = load_bench("kill9_campaign")


def test_judge_finds_lost_duplicated_and_stray_outcomes() -> None:
    kids = ["r.1", "r.2", "r.3", "r.4"]
    found = k9.judge(
        kids,
        Counter({"r.1": 1, "r.2": 2, "r.9": 1}),  # r.3, r.4 never delivered
        Counter({"r.1": 1, "r.2": 1, "r.3": 1, "r.4": 2}),
        written_off=["r.3"],  # given up on: its failure is listed without an event
        ended=True,
    )
    assert found == {
        "lost": ["r.4"],
        "duplicated": ["r.2", "r.4"],
        "stray": ["r.9"],
        "written_off": ["r.3"],
    }
    # Delivered but missing from the fan-in is lost too.
    assert k9.judge(["r.1"], Counter({"r.1": 1}), Counter(), written_off=[], ended=True)[
        "lost"
    ] == ["r.1"]
    # While the parent still runs, missing outcomes may still come: nothing is lost yet.
    assert k9.judge(kids, Counter(), Counter(), written_off=[], ended=False)["lost"] == []


def test_double_executions_are_tokens_written_twice(tmp_path: Path) -> None:
    (tmp_path / "markers.txt").write_text("p.c1:b1\np.c2:b1\np.c1:b1\np.c2:b2\np.c1:b1\n")
    assert k9.double_executions(tmp_path) == {"p.c1:b1": 3}
    assert k9.double_executions(tmp_path / "absent") == {}


def test_mcp_calls_count_twice_unless_idempotent_and_resent_once_per_crash(
    tmp_path: Path,
) -> None:
    # The MCP server appends each call's token to `count` (and writes other lines there
    # too: the slow tool's `cancelled` file is separate, tokens have a colon).
    (tmp_path / "count").write_text(
        "p.c1:once:1\np.c1:once:1\np.c1:once:2\n"
        "p.c2:again:1\np.c2:again:1\np.c2:again:2\np.c2:again:2\np.c2:again:2\n"
    )
    # A non-idempotent call received twice is a double execution whatever happened; an
    # idempotent one may be re-sent once per crash of its point.
    assert k9.double_executions(tmp_path, crashes=0) == {
        "p.c1:once:1": 2,
        "p.c2:again:1": 2,
        "p.c2:again:2": 3,
    }
    assert k9.double_executions(tmp_path, crashes=1) == {"p.c1:once:1": 2, "p.c2:again:2": 3}
    assert k9.double_executions(tmp_path, crashes=2) == {"p.c1:once:1": 2}
    summary = k9.mcp_summary(tmp_path, ["mcp__once__count"])
    assert summary == {"received": 4, "resent": 3, "interrupted": 1}


def test_survivors_are_found_by_tag_or_working_directory_and_killed(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    tag = "k9-test-p00001"
    started = [
        # Named after the point (its cwd elsewhere), as the script's commands do.
        subprocess.Popen(["bash", "-c", f"exec -a {tag}.bg sleep 30"], cwd=tmp_path),
        # Unnamed, but in the point's working directory.
        subprocess.Popen(["sleep", "30"], cwd=workdir),
        # Another point's (p000012 is not p00001): not ours.
        subprocess.Popen(["bash", "-c", f"exec -a {tag}2.bg sleep 30"], cwd=tmp_path),
    ]
    try:
        ours = {p.pid for p in started[:2]}
        for _ in range(200):  # exec -a takes effect a moment after the fork
            found = {s["pid"] for s in k9.survivors(tag, workdir)}
            if found == ours:
                break
            time.sleep(0.01)
        assert found == ours
        reaped = k9.reap_survivors(tag, workdir, 0.0)
        assert {s["pid"] for s in reaped} == ours
        for process in started[:2]:
            assert process.wait(timeout=10) == -9
        assert started[2].poll() is None
    finally:
        for process in started:
            process.kill()
            process.wait()


async def test_audit_of_a_finished_tree_lists_each_outcome_once(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    child = [{"tool_calls": [{"name": "submit_result", "arguments": {"result": "{{task}}"}}]}]
    provider = ScriptedProvider(
        {
            "agents": [
                {
                    "match": {"path": "root"},
                    "replies": [
                        {
                            "tool_calls": [
                                {
                                    "name": "spawn_agents",
                                    "arguments": {"tasks": [{"task": "a"}, {"task": "b"}]},
                                }
                            ]
                        },
                        {"text": "done"},
                    ],
                },
                {"match": {"depth": 1}, "replies": child},
            ]
        }
    )
    async with Runtime.open(db, provider, ToolSet.default(), logger=quiet_logger()) as runtime:
        root = await runtime.start("audit me", cwd=tmp_path)
        await runtime.wait(root)
    found = k9.audit(db)
    assert found["root"] == root
    assert found["root_phase"] == "Idle"
    assert found["conversations"] == 3
    for key in ("unfinished", "lost", "duplicated", "stray", "written_off"):
        assert found[key] == [], key
    assert k9.phases_at_kill(db, interrupted=False) == ["done"]


@pytest.mark.slow
def test_a_two_point_campaign_reports_zero_lost_duplicated_verify_and_double(
    tmp_path: Path,
) -> None:
    out = tmp_path / "report.json"
    # A fixed window skips the calibration run; seed 7 kills both runs 0.2 s into their
    # work (and no resume: that keeps it short).
    command = [sys.executable, str(CAMPAIGN), "--points", "2", "--jobs", "2", "--seed", "7"]
    command += ["--window", "1.5", "--grace", "0.2", "--json", str(out), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    report = json.loads(out.read_text())
    totals = report["totals"]
    assert report["campaign"]["points"] == 2
    assert [p["point"] for p in report["points"]] == [0, 1]
    assert totals["points"] == 2
    assert totals["kills"] >= 2, report["points"]
    for key in ("lost", "duplicated", "verify_failures", "double_executions"):
        assert totals[key] == 0, (key, report["points"])
    for key in ("unfinished", "resume_failures", "run_failures"):
        assert totals[key] == 0, (key, report["points"])
    for point in report["points"]:
        if point["root"] is not None:  # (None: killed before its log had a tree)
            assert point["root_phase"] == "Idle"
            assert point["verify_exit"] == 0
        for kill in point["kills"]:
            assert kill["process"] in ("run", "resume")
            assert kill["phases"][0] in k9.PHASES
    # Processes left running are counted, listed, and killed by the campaign.
    listed = [p for point in report["points"] for p in point["left_running"]]
    assert totals["processes_left_running"] == len(listed)
    for point in report["points"]:
        assert k9.survivors(point["tag"], tmp_path / "nowhere") == []
    # Every process a bash command started dies with its call, its supervisor or
    # fanfold itself (the per-call supervisor): none is left for the campaign to find.
    assert totals["processes_left_running"] == 0, listed
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_a_two_point_mcp_campaign_kills_with_mcp_servers_running(tmp_path: Path) -> None:
    """The MCP workload: agents call tools of two real stdio MCP servers (one tool
    idempotent, one not); kills land while the servers run. Nothing lost or run twice,
    no server left behind."""
    pytest.importorskip("mcp", reason="the MCP workload needs the mcp extra: pip install '.[mcp]'")
    out = tmp_path / "report.json"
    command = [sys.executable, str(CAMPAIGN), "--workload", "mcp", "--points", "2"]
    command += ["--jobs", "2", "--seed", "7", "--window", "2.5", "--grace", "0.5"]
    command += ["--json", str(out), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    report = json.loads(out.read_text())
    totals = report["totals"]
    assert report["campaign"]["workload"] == "mcp"
    assert report["campaign"]["script"].endswith("kill9_mcp_script.json")
    assert totals["kills"] >= 2, report["points"]
    for key in k9.GOAL:
        assert totals[key] == 0, (key, report["points"])
    for key in ("unfinished", "resume_failures", "run_failures"):
        assert totals[key] == 0, (key, report["points"])
    # The trees did call the servers (in the killed run or the resume): each of the
    # eight `count` calls of a finished tree reached a server, unless it was in flight
    # at a kill before the server got it (then it is recorded as interrupted).
    for point in report["points"]:
        if point["root"] is not None:
            assert point["root_phase"] == "Idle"
            mcp = point["mcp"]
            assert 8 - mcp["interrupted"] <= mcp["received"] <= 8, point
    assert done.returncode == 0, done.stderr
