"""What a command that only an allow *pattern* permits may hold. Pure, no I/O.

An agent whose bash is confined to patterns (``bash(git diff*)``: the built-in
``reviewer``) must not reach another program through a command the pattern matches.
``permissions`` refuses shell control characters (``;``, ``|``, ``$(``...) before a
pattern is tried; this module reads the command as bash would split it into words and
refuses what starts another program, or writes or reads files the agent was not given,
through the words themselves:

- **the shell**: any ``$`` (a variable, ``${...}``, ``$(...)``, ``$'...'``) or
  backtick, even inside double quotes; an unterminated quote; a leading ``NAME=value``
  (an environment variable for the command: ``GIT_EXTERNAL_DIFF=x git diff``); a
  brace expansion (``{a,b}``, ``{1..3}``: it makes words the pattern never saw); a
  comment (``#`` starting a word).
- **git** (a command whose first word is ``git``): every global option before the
  subcommand except a few harmless ones (``-c key=value`` and ``--config-env`` set any
  configuration, ``-C``, ``--git-dir``, ``--work-tree`` leave the directory,
  ``--exec-path`` picks the programs git runs, ``-p`` starts a pager); a subcommand
  that is not one of git's built-in commands (an alias, ``!cmd`` included, or an
  external ``git-foo``) or that runs programs by design (``difftool -x``, ``bisect
  run``, ``submodule foreach``, ``merge-index``, ``for-each-repo``, ``help``...);
  before ``--``, an option that runs a program, writes a file or reads one outside the
  repository (``--ext-diff``, ``--textconv``, ``--output``, ``--no-index``,
  ``--open-files-in-pager``/``-O``, ``--show-signature``, ``--upload-pack``,
  ``--exec``...), in any abbreviation git accepts (``--ext``, ``--out=f``), and an
  unquoted ``*``, ``?`` or ``[`` (the shell would expand it to file names, and a file
  named ``--output=x`` is an option); anywhere, a path that leaves the working
  directory (absolute, ``~``, ``..``): outside a repository ``git diff a b`` reads
  any two files.

The runtime adds what words cannot show: git's own configuration can name programs
(``core.fsmonitor``, ``diff.external``, textconv and filter drivers, hooks), which the
bash tool switches off for a confined agent's commands (``fanfold/tools/git_guard.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

GIT_SAFE_GLOBAL_OPTIONS = frozenset(
    {
        "--no-pager",
        "-P",
        "--no-replace-objects",
        "--literal-pathspecs",
        "--glob-pathspecs",
        "--noglob-pathspecs",
        "--icase-pathspecs",
        "--no-optional-locks",
    }
)
"""git's global options a confined command may give before its subcommand."""

# git 2.39's built-in commands (`git --list-cmds=builtins`) with those that run
# programs by design or reach outside the working directory left out: difftool (-x,
# --extcmd, --tool), credential* (helpers), fsmonitor--daemon, help (man.viewer,
# help.browser), hook (runs hooks), remote-ext (runs a command), remote-fd,
# upload-pack, receive-pack, upload-archive* (server sides), submodule--helper,
# bisect--helper, env--helper, for-each-repo (runs git in other repositories),
# merge-index (runs the program it is given), maintenance (installs timers that run
# later), checkout--worker. Scripts (bisect, submodule, mergetool, filter-branch,
# send-email, instaweb, web--browse...) and aliases are not built-ins.
_GIT_COMMAND_NAMES = """
    add am annotate apply archive blame branch bugreport bundle cat-file check-attr
    check-ignore check-mailmap check-ref-format checkout checkout-index cherry
    cherry-pick clean clone column commit commit-graph commit-tree config count-objects
    describe diagnose diff diff-files diff-index diff-tree fast-export fast-import fetch
    fetch-pack fmt-merge-msg for-each-ref format-patch fsck fsck-objects gc
    get-tar-commit-id grep hash-object index-pack init init-db interpret-trailers log
    ls-files ls-remote ls-tree mailinfo mailsplit merge merge-base merge-file merge-ours
    merge-recursive merge-recursive-ours merge-recursive-theirs merge-subtree merge-tree
    mktag mktree multi-pack-index mv name-rev notes pack-objects pack-redundant
    pack-refs patch-id pickaxe prune prune-packed pull push range-diff read-tree rebase
    reflog remote repack replace rerere reset restore rev-list rev-parse revert rm
    send-pack shortlog show show-branch show-index show-ref sparse-checkout stage stash
    status stripspace switch symbolic-ref tag unpack-file unpack-objects update-index
    update-ref update-server-info var verify-commit verify-pack verify-tag version
    whatchanged worktree write-tree
"""
GIT_COMMANDS = frozenset(_GIT_COMMAND_NAMES.split())
"""The git subcommands a confined command may name (any others are refused)."""

# Long options (without "--") that run a program, write a file anywhere, or read one
# outside the repository. Researched for diff, log, show, status, grep, blame,
# cat-file (what read-only agents use); the network and set-up ones are here too
# because they are cheap to refuse. Any abbreviation of one is refused as well: git
# accepts a unique prefix of a long option ("--ext" for "--ext-diff").
GIT_DANGEROUS_LONG_OPTIONS = frozenset(
    {
        "ext-diff",  # diff/log/show: run diff.external, diff.<driver>.command
        "textconv",  # diff/log/show/grep/blame/cat-file: run diff.<driver>.textconv
        "filters",  # cat-file: run filter.<driver>.smudge
        "output",  # diff/log/show: write the output to any file
        "output-directory",  # format-patch
        "help",  # runs man.viewer, help.browser
        "no-index",  # diff: compare any two files on the disk
        "open-files-in-pager",  # grep -O<program>: run a program
        "show-signature",  # log/show: run gpg.program
        "contents",  # blame: read any file
        "orderfile",  # diff -O<file>: read any file
        "extcmd",  # difftool
        "tool",  # difftool, mergetool
        "exec",  # rebase, archive --remote
        "exec-path",
        "upload-pack",  # fetch, clone, ls-remote: run a program
        "receive-pack",  # push, send-pack
        "remote",  # archive --remote
        "template",  # init, clone: copy hooks
        "config",  # clone --config
        "config-env",
        "git-dir",
        "work-tree",
        "submodule",  # diff --submodule=diff: diff inside a submodule, its drivers
        "ignore-submodules",  # would undo the guard's --ignore-submodules=dirty
        "recurse-submodules",  # grep, ls-files...: into a submodule's configuration
    }
)
"""git long options (without ``--``) a confined command may not give."""

_DANGEROUS_LONG_SORTED = tuple(sorted(GIT_DANGEROUS_LONG_OPTIONS))

# Exact option names that are a prefix of a dangerous one but harmless themselves
# ("--text" is diff -a; git takes an exact name before any abbreviation).
_HARMLESS_EXACT = frozenset({"text"})

# Short options: -O runs a pager program (grep) or reads any file (diff's order file);
# -u names the upload-pack program (clone, fetch, ls-remote, pull, fetch-pack); -x
# a command (rebase); -o an output directory (format-patch). Every letter of a
# cluster is read as an option ("-nO" holds -O), also after one that takes a value
# ("-SOpen" is refused though it searches for "Open": write "-S Open").
# A Mapping: read-only to the type checker (the pure core imports no `types`).
GIT_DANGEROUS_SHORT_OPTIONS: Mapping[str, frozenset[str]] = {
    "": frozenset("O"),
    "clone": frozenset("u"),
    "fetch": frozenset("u"),
    "fetch-pack": frozenset("u"),
    "ls-remote": frozenset("u"),
    "pull": frozenset("u"),
    "rebase": frozenset("x"),
    "format-patch": frozenset("o"),
}
"""git short options a confined command may not give: ``""`` for every subcommand."""

_SHELL_SPECIAL = ";&|<>()\n\r"


def command_problem(command: str) -> str | None:
    """Why ``command``, matched by a bash allow pattern, may still not run (it would
    start another program, or write or read a file it was not given); None if fine."""
    words = shell_words(command)
    if isinstance(words, str):
        return words
    if not words:
        return None
    first = words[0][0]
    if "=" in first and _is_name(first.split("=", 1)[0]):
        return f"'{first}' sets an environment variable for the command"
    if first.endswith("/git"):
        # The runtime guards the git that PATH finds (fanfold/tools/git_guard.py).
        return f"run git as 'git', not as '{first}'"
    if first == "git":
        return git_problem(words)
    return None


def shell_words(command: str) -> list[tuple[str, bool]] | str:
    """``command`` split into words as bash splits a simple command, each with whether
    it held an unquoted ``*``, ``?`` or ``[`` (a file-name pattern); or why it cannot
    be split without running something (an expansion, a control character)."""
    words: list[tuple[str, bool]] = []
    word: list[str] = []
    started = globbed = False
    braces: list[str] = []  # unquoted characters of the word, for brace expansion
    quote = ""
    i = 0
    n = len(command)

    def finish() -> str | None:
        nonlocal word, started, globbed, braces
        if started:
            if _brace_expansion("".join(braces)):
                return f"'{''.join(word)}' is a brace expansion"
            words.append(("".join(word), globbed))
        word, started, globbed, braces = [], False, False, []
        return None

    while i < n:
        c = command[i]
        if quote == "'":
            if c == "'":
                quote = ""
            else:
                word.append(c)
            i += 1
            continue
        if c in "$`":
            return f"'{c}' expands to text the pattern never saw"
        if quote == '"':
            if c == '"':
                quote = ""
            elif c == "\\" and i + 1 < n and command[i + 1] in '"\\':
                word.append(command[i + 1])
                i += 1
            else:
                word.append(c)
            i += 1
            continue
        if c in " \t":
            if (why := finish()) is not None:
                return why
            i += 1
            continue
        if c in _SHELL_SPECIAL:
            return f"{c!r} is a shell control character"
        if c == "#" and not started:
            return "'#' starts a comment"
        started = True
        if c in "'\"":
            quote = c
        elif c == "\\":
            if i + 1 >= n:
                return "a command may not end with a backslash"
            word.append(command[i + 1])
            braces.append("_")
            i += 1
        else:
            word.append(c)
            braces.append(c)
            globbed = globbed or c in "*?["
        i += 1
    if quote:
        return f"an unterminated {quote} quote"
    if (why := finish()) is not None:
        return why
    return words


def git_problem(words: list[tuple[str, bool]]) -> str | None:
    """Why a ``git`` command (its words) may not run for a confined agent."""
    i = 1
    while i < len(words) and words[i][0].startswith("-"):
        option = words[i][0]
        if option not in GIT_SAFE_GLOBAL_OPTIONS:
            return f"git's global option '{option}' is not allowed here"
        i += 1
    if i == len(words):
        return None
    subcommand = words[i][0]
    if subcommand not in GIT_COMMANDS:
        return (
            f"'git {subcommand}' is not one of git's built-in commands that run no "
            "other program (aliases and external commands are refused)"
        )
    after_dashes = False
    for text, globbed in words[i + 1 :]:
        if after_dashes:
            if _leaves(text):
                return f"'{text}' is a path outside the working directory"
            continue
        if text == "--":
            after_dashes = True
            continue
        if globbed:
            return f"'{text}' holds an unquoted * ? or [ before '--'; quote it"
        if _leaves(text) or _leaves(_option_value(text)):
            return f"'{text}' is a path outside the working directory"
        if text.startswith("--"):
            name = text[2:].split("=", 1)[0]
            if name and name not in _HARMLESS_EXACT:
                # Sorted, not the set's order: the message is part of the log, and a
                # set of strings iterates in an order that changes between processes.
                for dangerous in _DANGEROUS_LONG_SORTED:
                    if dangerous.startswith(name):
                        given = "" if name == dangerous else f" (given as '{text}')"
                        return f"git's option '--{dangerous}'{given} is not allowed here"
        elif text.startswith("-") and len(text) > 1:
            refused = GIT_DANGEROUS_SHORT_OPTIONS[""] | GIT_DANGEROUS_SHORT_OPTIONS.get(
                subcommand, frozenset()
            )
            for flag in text[1:]:
                if flag in refused:
                    return f"git's option '-{flag}' (in '{text}') is not allowed here"
    return None


def _option_value(word: str) -> str:
    """The value an option word carries: after ``=`` in ``--name=value``, after the
    letter in ``-Xvalue`` (``-S/etc/x``, ``--ignore-revs-file=/etc/x`` read a file);
    empty for any other word."""
    if word.startswith("--"):
        return word.partition("=")[2]
    if word.startswith("-") and len(word) > 2:
        return word[2:]
    return ""


def _leaves(word: str) -> bool:
    """Whether a word is a path that leaves the working directory: absolute, from a
    home directory, or through ``..`` (``HEAD~1..HEAD`` is a range, not a path)."""
    if word.startswith(("/", "~")):
        return True
    parts = word.split("/")
    return ".." in parts and (len(parts) > 1 or word == "..")


def _is_name(text: str) -> bool:
    return bool(text) and not text[0].isdigit() and all(c.isalnum() or c == "_" for c in text)


def _brace_expansion(unquoted: str) -> bool:
    """Whether a word's unquoted characters may hold a brace expansion: a ``{``, then
    a ``,`` or ``..``, then a ``}``, anywhere after it.

    Wider than bash on purpose: bash's own rules are subtle (``:{},}`` makes ``:}``
    and ``:``; ``''{},--ext-diff}`` makes ``}`` and ``--ext-diff``, an option no
    check saw; a ``}`` right after the ``{`` is a plain character), and a word that
    only might expand is refused, never read as one word it is not."""
    start = unquoted.find("{")
    if start == -1:
        return False
    end = unquoted.rfind("}")
    inner = unquoted[start + 1 : end]
    return end > start and ("," in inner or ".." in inner)
