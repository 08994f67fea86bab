"""A command an allow pattern permits may start no other program (issue 22, item 2):
the pattern's word ends at a word boundary, and the command's words are read as bash
and git would read them (``fanfold/statemachine/confined.py``)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fanfold.agents.builtin import BUILTIN_SOURCES
from fanfold.agents.definitions import parse_definition
from fanfold.statemachine import ToolCall
from fanfold.statemachine.agent_defs import AgentDefinition
from fanfold.statemachine.confined import shell_words
from fanfold.statemachine.permissions import (
    Permissions,
    Rule,
    RuleSet,
    command_matches,
    confines_commands,
    parse_rule,
    refusal,
)


def _builtins() -> list[AgentDefinition]:
    found = []
    for text, source in BUILTIN_SOURCES:
        definition, problems = parse_definition(text, source)
        assert definition is not None, problems
        found.append(definition)
    return found


BUILTINS = _builtins()
REVIEWER = next(d for d in BUILTINS if d.name == "reviewer")


def _permissions(definition: AgentDefinition) -> Permissions:
    return Permissions((definition.rules("/p"),))


def _bash(command: str) -> ToolCall:
    return ToolCall.of("t", "bash", {"command": command})


def _refused(definition: AgentDefinition, command: str) -> str | None:
    return refusal(_permissions(definition), _bash(command), "/p")


def test_a_pattern_ends_at_a_word_boundary() -> None:
    for command in ["git diff", "git diff HEAD", "git diff\tHEAD", "git diff  --stat"]:
        assert command_matches("git diff*", command, any_part=False), command
    for command in ["git difftool", "git diffx", "git diff-tree HEAD", 'git diff"tool"']:
        assert not command_matches("git diff*", command, any_part=False), command
    # "git diff *" (with the space) is the same rule, and matches the bare command too.
    assert command_matches("git diff *", "git diff", any_part=False)
    assert not command_matches("git diff *", "git difftool -x x", any_part=False)
    # A '*' after anything but a letter, digit or '_' matches any text, as before.
    assert command_matches("git diff-*", "git diff-tree HEAD", any_part=False)
    assert command_matches("git log -*", "git log -p", any_part=False)
    assert command_matches("* --version", "python --version", any_part=False)
    # Claude Code's form is read as the same pattern.
    assert parse_rule("Bash(git diff:*)") == Rule("bash", "git diff*")
    # A deny pattern still errs towards refusing: its '*' matches any text.
    assert command_matches("rm*", "rmdir x", any_part=True)


def test_the_reviewer_cannot_run_difftool_or_its_neighbours() -> None:
    # The reproduction of the issue, and the other words "git diff*" used to reach.
    for command in [
        'git difftool -y -x "touch PWNED" HEAD~1 HEAD',
        "git difftool -y --extcmd=\"sh -c 'touch PWNED'\" HEAD~1 HEAD",
        "git diff-tree -p HEAD",
        "git diffx",
    ]:
        assert _refused(REVIEWER, command) is not None, command


@pytest.mark.parametrize(
    "command",
    [
        "git diff",
        "git diff HEAD~1 HEAD -- src/a.py",
        "git diff --stat --no-ext-diff --no-textconv",
        "git diff -- '*.py'",
        "git diff -- *.py",
        "git log --oneline -5 --format='%h %s'",
        "git log -p -S Open",
        "git log --text -p",
        "git show HEAD:README.md",
        "git show 'HEAD^{tree}'",
        "git show HEAD@{1}",
        "git status --short",
        "git status -v",
        "git diff -c HEAD",
        "git log HEAD~1..HEAD",
        "git diff origin/main...HEAD -- src/a.py",
    ],
)
def test_the_reviewer_still_reads_the_history(command: str) -> None:
    assert _refused(REVIEWER, command) is None


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("git diff --ext-diff", "'--ext-diff'"),
        ("git diff --ext", "'--ext-diff' (given as '--ext')"),
        ("git diff --out=x", "'--output' (given as '--out=x')"),
        ("git log -p --output=/tmp/x", "--output"),
        ("git show --textconv HEAD:f", "'--textconv'"),
        ("git log --show-signature", "'--show-signature'"),
        ("git diff --no-index /etc/passwd x", "'--no-index'"),
        ("git diff --help", "'--help'"),
        ("git diff -Ofile", "'-O'"),
        ('git diff "--ext-diff"', "'--ext-diff'"),
        ("git diff --ext\\-diff", "'--ext-diff'"),
        ("git diff {--ext-diff,x}", "brace expansion"),
        # bash makes '}' and '--ext-diff' of it (an empty quoted prefix, then braces
        # whose first item is empty): once read as one harmless word.
        ("git show ''{},--ext-diff}", "brace expansion"),
        ("git show :{},}", "brace expansion"),
        ("git diff $X", "'$'"),
        ('git diff "${X:-y}"', "'$'"),
        ("git diff *", "unquoted"),
        ("git diff 'unterminated", "unterminated"),
        ("git diff # x", "comment"),
        ("git diff /etc/passwd notes.txt", "outside the working directory"),
        ("git diff HEAD -- ../elsewhere", "outside the working directory"),
        ("git log -p ~/x", "outside the working directory"),
        ("git log --ignore-revs-file=/etc/passwd", "outside the working directory"),
        ("git log -S/etc/passwd", "outside the working directory"),
        ("git log -S../x", "outside the working directory"),
    ],
)
def test_options_that_start_programs_are_refused_with_the_reason(command: str, why: str) -> None:
    refused = _refused(REVIEWER, command)
    assert refused is not None and why in refused, refused
    assert "agent 'reviewer'" in refused


def test_git_global_options_aliases_and_program_runners_are_refused() -> None:
    anything = Permissions((RuleSet((Rule("bash", "git *"),), (), "agent 'g'", "/p"),))
    for command in [
        "git -c core.pager=sh diff",
        "git -c alias.x='!touch P' x",
        "git --config-env=core.pager=X log",
        "git -C /etc log",
        "git --git-dir=/elsewhere/.git log",
        "git --exec-path=. diff",
        "git -p log",
        "git st",  # an alias: the repository's configuration decides what it runs
        "git lfs ls-files",  # an external command
        "git bisect run sh -c x",
        "git submodule foreach 'touch x'",
        "git rebase -x 'touch x' HEAD~1",
        "git rebase --exec='touch x' HEAD~1",
        "git merge-index touch -a",
        "git for-each-repo --config=x log",
        "git help diff",
        "git ls-remote --upload-pack='touch x' .",
        "git fetch -u 'touch x' .",
        "git grep -O'touch x' a",
        "git grep --open-files-in-pager=vi a",
        "git cat-file --filters HEAD:f",
        "git archive --remote=x HEAD",
        "git format-patch -o /tmp HEAD~1",
    ]:
        assert refusal(anything, _bash(command), "/p") is not None, command
    by_path = Permissions((RuleSet((Rule("bash", "/usr/bin/git log*"),), (), "", "/p"),))
    assert "not as '/usr/bin/git'" in (refusal(by_path, _bash("/usr/bin/git log"), "/p") or "")
    for command in ["git --no-pager log -1", "git -P status", "git grep -n a -- '*.py'"]:
        assert refusal(anything, _bash(command), "/p") is None, command


def test_words_are_split_as_bash_splits_them() -> None:
    assert shell_words("git log --format='%h %s' \"a b\" c\\ d") == [
        ("git", False),
        ("log", False),
        ("--format=%h %s", False),
        ("a b", False),
        ("c d", False),
    ]
    assert shell_words("ls *.py '*.md'") == [("ls", False), ("*.py", True), ("*.md", False)]
    assert shell_words("git diff -'-e'\\x\"t-diff\"") == [
        ("git", False),
        ("diff", False),
        ("--ext-diff", False),
    ]


def test_only_agents_whose_bash_is_pattern_bound_are_confined() -> None:
    assert confines_commands(_permissions(REVIEWER))
    assert not confines_commands(None)
    assert not confines_commands(Permissions((RuleSet((Rule("bash"),)),)))
    assert not confines_commands(Permissions((RuleSet(None, (Rule("bash", "rm *"),)),)))
    layered = Permissions(
        (RuleSet((Rule("bash"),)), RuleSet((Rule("bash", "git log*"), Rule("read_file"))))
    )
    assert confines_commands(layered)


# ------------------------------------------------------------------ the property

# Ways a command could start another program, each a function of the literal start
# of an allow pattern ("git diff" of "git diff*"): git options and subcommands that
# run programs, the shell's expansions and control characters, environment prefixes.
_PROGRAM = st.sampled_from(["touch PWNED", "sh -c 'touch PWNED'", "./evil", "python3 -c 1"])
_GIT_RUNNERS = st.sampled_from(
    [
        "--ext-diff",
        "--ext",
        "--ext-d",
        "--textconv",
        "--output=PWNED",
        "--out=PWNED",
        "--show-signature",
        "--open-files-in-pager=sh",
        "-O'touch PWNED'",
        "-pO./evil",
        "--no-index",
        "--help",
        "--upload-pack=./evil",
        "--exec=./evil",
        "--filters",
        '"--ext-diff"',
        "'--ext-diff'",
        "--ext\\-diff",
        "--e'xt-diff'",
        "{--ext-diff,HEAD}",
        "{--output=x,HEAD}",
        "*",
        "-*",
        "[-]*",
    ]
)


# Long options that run a program or write a file, as git spells them in full.
_LONG = ["--ext-diff", "--textconv", "--output=PWNED", "--show-signature", "--open-files-in-pager"]


@st.composite
def _disguised_option(draw: st.DrawFn) -> str:
    """One of ``_LONG``, maybe abbreviated (git takes a unique prefix), then cut in
    pieces that are each quoted or escaped as the shell allows: the shell hands git
    the same word."""
    option = draw(st.sampled_from(_LONG))
    name, equals, value = option.partition("=")
    if draw(st.booleans()):
        name = name[: draw(st.integers(5, len(name)))]
        if name == "--text":  # an option of its own (diff -a), not "--textconv"
            name = "--textc"
    text = name + equals + value
    pieces = []
    i = 0
    while i < len(text):
        j = draw(st.integers(i + 1, len(text)))
        piece = text[i:j]
        style = draw(st.sampled_from(["plain", "single", "double", "escaped"]))
        if style == "single":
            piece = f"'{piece}'"
        elif style == "double":
            piece = f'"{piece}"'
        elif style == "escaped":
            piece = "".join("\\" + c for c in piece)
        pieces.append(piece)
        i = j
    return "".join(pieces)


@st.composite
def _program_starting_command(draw: st.DrawFn, prefix: str) -> str:
    program = draw(_PROGRAM)
    kind = draw(st.integers(0, 6))
    before = draw(st.sampled_from(["", " HEAD", " -p", " --stat"]))
    after = draw(st.sampled_from(["", " HEAD~1 HEAD", " -- a.py"]))
    if kind == 0:  # an option of git's that runs a program, writes or reads a file
        option = draw(st.one_of(_GIT_RUNNERS, _disguised_option()))
        return f"{prefix}{before} {option}{after}"
    if kind == 1:  # another subcommand that starts with the same letters
        tail = draw(st.sampled_from(["tool -y -x", "tool -y --extcmd=", "-tree --ext-diff", "x"]))
        return f"{prefix}{tail} '{program}'{after}"
    if kind == 2:  # a shell control character, then the program
        glue = draw(st.sampled_from([";", "&&", "||", "|", "&", "\n", ">", "<", "\r"]))
        return f"{prefix}{before}{glue}{program}"
    if kind == 3:  # an expansion that runs the program
        form = draw(st.sampled_from(["$({})", "`{}`", '"$({})"', "$'{}'", "${{X:-{}}}"]))
        return f"{prefix}{before} {form.format(program)}{after}"
    if kind == 4:  # an environment prefix naming the program
        name = draw(st.sampled_from(["GIT_EXTERNAL_DIFF", "GIT_PAGER", "PAGER", "GIT_SSH"]))
        return f"{name}='{program}' {prefix}{before}"
    if kind == 5:  # a git global option that names a program or configuration
        option = draw(
            st.sampled_from(
                [
                    "-c diff.external='{}'",
                    "-c core.pager='{}'",
                    "-c alias.x='!{}'",
                    "--exec-path=.",
                    "-C ..",
                    "--git-dir=../x/.git",
                    "--config-env=core.pager=X",
                ]
            )
        )
        head, _, rest = prefix.partition(" ")
        return f"{head} {option.format(program)} {rest}{before}"
    # a comment or an unterminated quote hiding the rest of the line
    hider = draw(st.sampled_from(["#", '"', "'"]))
    return f"{prefix}{before} {hider}{program}"


def _literal_start(pattern: str) -> str:
    return pattern.split("*", 1)[0].rstrip()


BUILTIN_PATTERNS = [
    (definition, rule.pattern)
    for definition in BUILTINS
    for rule in (definition.allow or ())
    if rule.tool == "bash" and rule.pattern is not None
]


def test_the_builtins_allow_bash_only_through_patterns() -> None:
    # What the property below covers: every built-in that may run bash at all.
    assert BUILTIN_PATTERNS, "no built-in allows a bash pattern: the property tests nothing"
    for definition in BUILTINS:
        if definition.allow is not None and any(r.tool == "bash" for r in definition.allow):
            assert confines_commands(_permissions(definition)), definition.name


@settings(max_examples=600, deadline=None)
@given(data=st.data())
def test_no_builtin_allow_rule_lets_a_command_start_another_program(data: st.DataObject) -> None:
    definition, pattern = data.draw(st.sampled_from(BUILTIN_PATTERNS))
    command = data.draw(_program_starting_command(_literal_start(pattern)))
    assert _refused(definition, command) is not None, (definition.name, pattern, command)


# ------------------------------------------------------------------ against bash itself


@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet="ab-=\"'\\ \t*?[]{},./#:^@", max_size=24))
@example(text=":{},}")  # found by this test: bash makes ':}' and ':'
@example(text="''{},--x}")
def test_the_words_are_the_words_bash_makes(text: str) -> None:
    """Whenever ``shell_words`` splits a command (it refuses what it cannot), bash
    splits it into the same words: what the checks read is what git gets. (File-name
    expansion is off here, ``-f``: a word holding a pattern is refused before '--'
    and only a path after it.)"""
    import subprocess

    words = shell_words("x " + text)
    if isinstance(words, str):
        return
    done = subprocess.run(
        ["bash", "-f", "-c", "printf '%s\\0' " + text],
        capture_output=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    made = done.stdout.decode().split("\0")[:-1] if text.strip() else []
    assert [word for word, _ in words[1:]] == made, (text, made)
