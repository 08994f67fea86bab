"""The mutation run's test selection follows its rule (``bench/mutation_selection.py``,
tests/README.md, "Mutation testing"): a reducer test file left out of ``[tool.mutmut]`` fails
here instead of letting the core's mutants "survive" tests that kill them."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import BENCH, load_bench

selection_script = load_bench("mutation_selection")
ROOT = BENCH.parent


def test_the_mutmut_selection_is_the_rules_selection() -> None:
    listed = selection_script.listed((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert listed == selection_script.selection(ROOT)


def test_every_reducer_test_file_is_selected() -> None:
    listed = selection_script.listed((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    reducer_files = sorted(f"tests/{path.name}" for path in (ROOT / "tests").glob("test_sm_*.py"))
    assert len(reducer_files) >= 19
    assert [name for name in reducer_files if name not in listed] == []
    # The files issue 34 found missing, and the web tools' (the only ones reaching
    # url_host, domain_problem and link_refusal).
    for name in (
        "test_sm_non_finite_hint",
        "test_sm_root_time_limit",
        "test_sm_roster",
        "test_sm_run_tool_decisions",
        "test_sm_state_copy",
        "test_permissions_confined",
        "test_fork_edits",
        "test_tools_web",
        "test_approvals_reducer",  # issue 35's reducer (ask rules, decisions)
    ):
        assert f"tests/{name}.py" in listed


def _tree(root: Path, files: dict[str, str]) -> None:
    (root / "fanfold" / "statemachine").mkdir(parents=True)
    (root / "tests").mkdir()
    for name in ("__init__", "limits", "transition"):
        (root / "fanfold" / "statemachine" / f"{name}.py").write_text("")
    for name, text in files.items():
        (root / "tests" / name).write_text(text)


def test_the_rule_reads_names_and_imports(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            # A new reducer test file is selected by its name.
            "test_sm_new_rule.py": "from fanfold.statemachine import transition\n",
            # A test of a core module by any other name, by its import (in a function too).
            "test_limits_edge.py": "def test_x():\n    from fanfold.statemachine.limits import L\n",
            # The package's `transition` is the function, not the module.
            "test_other.py": "from fanfold.statemachine import transition\n",
            # A core-named file that runs the runtime reaches the reducer through I/O.
            "test_agents_runtime.py": (
                "from fanfold.statemachine.limits import L\nfrom fanfold import runtime\n"
            ),
            "test_sm_helpers_only.py": "import json\n",
        },
    )
    assert selection_script.selection(tmp_path) == [
        "tests/test_limits_edge.py",
        "tests/test_sm_new_rule.py",
    ]


def test_check_names_a_left_out_file_and_write_restores_it(tmp_path: Path) -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    wanted = selection_script.selection(ROOT)
    short = selection_script.with_list(text, [n for n in wanted if n != "tests/test_sm_roster.py"])
    assert selection_script.listed(short) == [n for n in wanted if n != "tests/test_sm_roster.py"]
    assert selection_script.listed(selection_script.with_list(short, wanted)) == wanted
    # The script as a command: exit 0 on the committed pyproject.toml.
    done = subprocess.run(
        [sys.executable, str(BENCH / "mutation_selection.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout


sample_script = load_bench("mutation_sample")


def test_the_sample_is_stratified_by_file_and_leaves_out_import_time_code() -> None:
    names = [f"fanfold.statemachine.transition.x_f__mutmut_{i}" for i in range(60)]
    names += [f"fanfold.statemachine.permissions.x_g__mutmut_{i}" for i in range(30)]
    names += [f"fanfold.statemachine.table.x__cell__mutmut_{i}" for i in range(9)]
    logic = sample_script.logic_mutants(names)
    assert len(logic) == 90
    sample = sample_script.draw(logic, 4242, 30)
    assert sample == sample_script.draw(logic, 4242, 30) != sample_script.draw(logic, 1, 30)
    for prefix in (3, 12, 30):
        taken = [name for name in sample[:prefix] if ".permissions." in name]
        assert len(taken) == prefix // 3  # permissions is a third of the population
    assert len(set(sample_script.draw(logic, 4242, 500))) == 90


def test_the_wilson_interval_is_the_one_design_reports() -> None:
    low, high = sample_script.wilson(429, 438)
    assert (round(low, 3), round(high, 3)) == (0.961, 0.989)


def test_a_mutant_no_selected_test_reaches_counts_as_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = tmp_path / "sample.txt"
    sample.write_text("a.x_f__mutmut_1\na.x_f__mutmut_2\na.x_f__mutmut_3\na.x_f__mutmut_4\n")
    equivalent = tmp_path / "equivalent.txt"
    equivalent.write_text("a.x_f__mutmut_3 equivalent\n")
    results = (
        "a.x_f__mutmut_1: killed\na.x_f__mutmut_2: no tests\n"
        "a.x_f__mutmut_3: survived\na.x_f__mutmut_4: timeout\n"
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO(results))
    assert sample_script.main(["score", str(sample), str(equivalent)]) == 0
    out = capsys.readouterr().out
    assert "finished 4: 2 detected, 50.0%" in out
    assert "without 1 equivalent: 2 of 3, 66.7%" in out
