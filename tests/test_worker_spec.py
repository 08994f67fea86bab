"""What a detached tree carries (``TreeSpec``), ``fanfold wait`` on a log, and the one-line
errors of ``run --detach``: no worker, no DBOS runtime needed (issue 25)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from runtime_helpers import reply, spawn, submit

from fanfold.cli import cli
from fanfold.cli.worker_commands import scrubbed
from fanfold.worker.spec import SpecError, TreeSpec


def test_a_spec_survives_the_queue_as_plain_data() -> None:
    spec = TreeSpec(
        "abc123", "do it", "/srv/x", system_prompt="be brief",
        limits=(("max_depth", 2), ("max_rounds", 5)), context_modes=("task_only", "full"),
    )  # fmt: skip
    data = json.loads(json.dumps(spec.to_input()))  # only JSON's types
    assert TreeSpec.from_input(data) == spec
    limits = spec.make_limits()
    assert (limits.max_depth, limits.max_rounds) == (2, 5)


def test_a_detached_tree_carries_runs_timeout(tmp_path: Path, monkeypatch: Any) -> None:
    # ``run --detach --timeout`` used to drop the time limit without a word.
    pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
    import fanfold.worker.client

    queued: list[TreeSpec] = []

    def enqueue(_url: str, spec: TreeSpec) -> str:
        queued.append(spec)
        return "id1"

    monkeypatch.setattr(fanfold.worker.client, "enqueue_tree", enqueue)
    url = "postgresql://u@127.0.0.1:1/q"
    done = CliRunner().invoke(cli, ["run", "--detach", "--dbos-db", url, "--timeout", "7.5", "x"])
    assert done.exit_code == 0, done.output
    [spec] = queued
    assert spec.timeout == 7.5
    assert TreeSpec.from_input(json.loads(json.dumps(spec.to_input()))) == spec
    # Without one, the input is what it always was (a worker of before reads it alike).
    assert "timeout" not in TreeSpec("abc", "t", "/x").to_input()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"version": 3}, "version"),
        ({"root_id": "../../etc"}, "root_id"),
        ({"root_id": 7}, "root_id"),
        ({"task": "  "}, "task"),
        ({"task": ["x"]}, "task"),
        ({"cwd": None}, "cwd"),
        ({"system_prompt": {"a": 1}}, "system_prompt"),
        ({"limits": {"max_rounds": "5"}}, "limits"),
        ({"limits": {"max_rounds": True}}, "limits"),
        ({"limits": {"__class__": 1}}, "limits"),
        ({"limits": {"max_rounds": -1}}, "limits"),
        ({"context_modes": "full"}, "context_modes"),
        ({"timeout": True}, "timeout"),
        ({"timeout": "5"}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1.5}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": 1e12}, "timeout"),
    ],
)
def test_a_malformed_input_from_the_queue_is_refused_naming_the_field(
    change: dict[str, Any], named: str
) -> None:
    data = {**TreeSpec("abc", "t", "/x").to_input(), **change}
    with pytest.raises(SpecError, match=named):
        TreeSpec.from_input(data)


def test_an_input_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(SpecError):
        TreeSpec.from_input(["abc", "t"])


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "agents": [
                    {
                        "match": {"path": "root"},
                        "replies": [reply("", spawn("count")), reply("got {{last_tool_result}}")],
                    },
                    {"match": {"depth": 1}, "replies": [reply("", submit("3"))]},
                ]
            }
        )
    )
    return script


def test_wait_prints_a_finished_trees_answer_times_out_and_refuses_a_sub_agent(
    tmp_path: Path,
) -> None:
    from fanfold.db import Store

    db = tmp_path / "log.db"
    ran = CliRunner().invoke(
        cli, ["run", "--no-live", "--db", str(db), "--script", str(_script(tmp_path)), "go"]
    )
    assert ran.exit_code == 0, ran.output
    with Store.open(db, read_only=True) as store:
        (root,) = store.list_roots()
        (child,) = store.children(root.id)
    waited = CliRunner().invoke(cli, ["wait", root.id, "--db", str(db)])
    assert waited.exit_code == 0, waited.output
    assert "got " in waited.output and f"conversation: {root.id}" in waited.output
    # Not in the log, and no queue it could be on (issue 32.11: this waited until the
    # timeout, or for ever): one line at once.
    missing = CliRunner().invoke(cli, ["wait", "f00f00f00f00", "--db", str(db), "--timeout", "30"])
    assert missing.exit_code == 2
    assert f"f00f00f00f00 is not in the log {db}, and no queue is given" in missing.output
    assert "Traceback" not in missing.output
    sub = CliRunner().invoke(cli, ["wait", child.id, "--db", str(db)])
    assert sub.exit_code == 2
    assert f"fanfold wait {root.id}" in sub.output


def test_detach_says_in_one_line_what_it_needs(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("FANFOLD_DBOS_DB", raising=False)
    monkeypatch.delenv("FANFOLD_DB", raising=False)
    db = str(tmp_path / "log.db")
    no_queue = CliRunner().invoke(cli, ["run", "--detach", "--db", db, "x"])
    assert no_queue.exit_code == 2
    assert "--dbos-db" in no_queue.output and "Traceback" not in no_queue.output
    url = "postgresql://u:pw@127.0.0.1:1/q"
    worker_owned = CliRunner().invoke(
        cli, ["run", "--detach", "--dbos-db", url, "--script", "s.json", "--model", "m", "x"]
    )
    assert worker_owned.exit_code == 2
    assert "--script, --model belong to the workers" in worker_owned.output


def test_detach_to_an_unreachable_queue_never_shows_the_password(tmp_path: Path) -> None:
    pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    secret = "s3cr%21t-pw"
    url = f"postgresql://fanfold:{secret}@127.0.0.1:{port}/queue?connect_timeout=2"
    done = CliRunner().invoke(cli, ["run", "--detach", "--dbos-db", url, "x"])
    assert done.exit_code == 2, done.output
    assert "could not queue the tree" in done.output
    assert secret not in done.output and "s3cr!t-pw" not in done.output
    assert len(done.output.strip().splitlines()) == 1


def test_scrubbed_cuts_the_password_in_either_spelling() -> None:
    url = "postgresql://me:p%40ss@h/db"
    assert scrubbed("failed for p@ss and p%40ss", url) == "failed for *** and ***"
    assert scrubbed("nothing here", "postgresql://h/db") == "nothing here"


def test_the_queue_is_the_logs_own_database_unless_given() -> None:
    from fanfold.cli.errors import CliError
    from fanfold.cli.worker_commands import system_url
    from fanfold.db import DatabaseUrl

    log = DatabaseUrl("postgresql://me:pw@db/agents")
    assert system_url(None, log) == "postgresql://me:pw@db/agents"
    assert system_url("postgresql://q/queue", log) == "postgresql://q/queue"
    with pytest.raises(CliError, match="--dbos-db"):
        system_url(None, Path("log.db"))
    with pytest.raises(CliError, match="postgresql://"):
        system_url("sqlite:///x", Path("log.db"))


def test_a_stopped_workers_line_names_the_error_inside_a_nursery_group() -> None:
    from fanfold.cli.worker_commands import _first_line
    from fanfold.db.errors import LogUnavailable

    group = ExceptionGroup(
        "Exceptions from Trio nursery",
        [ExceptionGroup("inner", [LogUnavailable("the connection was lost\nmore")])],
    )
    assert _first_line(group) == "LogUnavailable: the connection was lost"


def test_what_a_workflow_step_raises_survives_dboss_pickling() -> None:
    # DBOS pickles what a step raises and reads it back when the workflow's result is
    # asked for or the step replayed: an UntrustedTree raised as it is was recorded and
    # then could not be read (its constructor takes two arguments).
    import pickle

    pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
    from fanfold.db import SequenceError
    from fanfold.db.provenance import UntrustedTree
    from fanfold.worker.dbos_worker import DroppedTree, StepFailed, step_error

    untrusted = UntrustedTree("abc", "imported")
    with pytest.raises(TypeError):
        pickle.loads(pickle.dumps(untrusted))
    for exc in (untrusted, SequenceError("abc.1", 3, 4), ValueError("plain")):
        raised = step_error(exc)
        back = pickle.loads(pickle.dumps(raised))
        assert isinstance(back, StepFailed)
        assert str(back) == f"{type(exc).__name__}: {exc}"
    dropped = DroppedTree("tree 'abc' was dropped")
    assert step_error(dropped) is dropped
    interrupt = KeyboardInterrupt()
    assert step_error(interrupt) is interrupt


def test_a_wide_fan_out_can_be_asked_for_on_the_command_line(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # A spawn_agents call gives at most 10 tasks by default, and neither `run` nor a
    # detached tree could raise it: a fan-out big enough to be placed in chunks took a
    # model a hundred calls in one reply.
    tasks = [f"part {i}" for i in range(12)]
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            {
                "agents": [
                    {
                        "match": {"path": "root"},
                        "replies": [reply("", spawn(*tasks)), reply("{{last_tool_result}}")],
                    },
                    {"match": {"depth": 1}, "replies": [reply("", submit("ok"))]},
                ]
            }
        )
    )
    monkeypatch.setenv("FANFOLD_KEY_FILE", str(tmp_path / "key"))
    db = str(tmp_path / "log.db")
    base = ["run", "--no-live", "--script", str(script), "--db", db, "--max-concurrent", "12"]
    refused = CliRunner().invoke(cli, [*base, "go"])
    assert "at most 10" in refused.output, refused.output
    done = CliRunner().invoke(cli, [*base, "--max-tasks-per-call", "12", "go"])
    assert done.exit_code == 0, done.output
    assert done.output.count("ok") >= 12, done.output
    spec = TreeSpec("abc", "t", "/x", limits=(("max_tasks_per_call", 12),))
    assert TreeSpec.from_input(json.loads(json.dumps(spec.to_input()))) == spec
    assert spec.make_limits().max_tasks_per_call == 12


def test_every_password_scrubber_is_the_one_of_the_log_targets() -> None:
    # The CLI's, the log's and the workers' placer cut the same forms: the user part's
    # password as written, decoded and encoded, and a ``password=`` query.
    from fanfold.db.targets import without_password

    url = "postgresql://u:p%40ss@h/db?password=q%2Fw"
    said = "p%40ss p@ss q/w q%2Fw kept"
    assert without_password(said, url) == "*** *** *** *** kept"
    assert scrubbed(said, url) == without_password(said, url)


def test_a_trees_folder_must_be_an_existing_folder_inside_an_allowed_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "homex").mkdir()  # shares the name's beginning, not the folder
    (home / "out").symlink_to(tmp_path / "outside")  # inside by name, outside in fact
    (tmp_path / "in").symlink_to(home / "sub")  # outside by name, inside in fact
    allowed = (os.path.realpath(home),)

    def admitted(cwd: str) -> str:
        return TreeSpec("t1", "task", cwd).admitted_cwd(allowed)

    assert admitted(str(home)) == os.path.realpath(home)
    assert admitted(str(tmp_path / "in")) == os.path.realpath(home / "sub")
    for cwd, reason in [
        ("sub", "an absolute path"),
        (str(home / "missing"), "is not a folder"),
        (str(home) + "\0", "NUL"),
        (str(home / "out"), "outside the folders"),
        (str(tmp_path), "outside the folders"),
        (str(home) + "x", "outside the folders"),
        ("/", "outside the folders"),
    ]:
        with pytest.raises(SpecError, match=reason):
            admitted(cwd)


def test_dbos_refuses_a_pickled_row_once_fanfold_refuses_pickle(tmp_path: Path) -> None:
    pytest.importorskip("dbos", reason="needs the postgres extra: pip install '.[postgres]'")
    import base64
    import pickle

    from dbos._serialization import deserialize_args, deserialize_exception, deserialize_value

    from fanfold.worker.serialization import (
        SERIALIZER,
        PickleRefused,
        check_pickle_refused,
        refuse_pickle,
    )

    proof = tmp_path / "proof"

    class Proof:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(proof), "w"))

    refuse_pickle()
    assert check_pickle_refused() is None
    row = base64.b64encode(pickle.dumps(Proof())).decode()
    for decode in (deserialize_args, deserialize_value, deserialize_exception):
        with pytest.raises(PickleRefused):
            decode(row, "py_pickle", SERIALIZER)
    assert not proof.exists()
    # What fanfold writes is JSON, read back as it was written.
    text = SERIALIZER.serialize({"version": 1, "cwd": "/x"})
    assert SERIALIZER.deserialize(text) == {"version": 1, "cwd": "/x"}
