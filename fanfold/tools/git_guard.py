"""git for a confined agent: the programs a repository's configuration names stay off.

An agent whose bash runs only through allow patterns (``bash(git diff*)``: the built-in
``reviewer``) has its commands checked word by word (``fanfold.statemachine.confined``),
but words cannot show what git's configuration runs: ``core.fsmonitor``,
``diff.external``, a ``diff.<driver>.textconv`` or ``filter.<driver>.clean`` chosen
by ``.gitattributes``, hooks, ``gpg.program``, ``core.sshCommand``, a pager. A cloned
or downloaded repository brings its own ``.git/config`` and ``.gitattributes``. So for
such an agent the bash tool runs the command with:

1. ``guarded_env``: through ``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_n``/
   ``GIT_CONFIG_VALUE_n`` (which win over every configuration file) the keys in
   ``OVERRIDES``: no fsmonitor hook, no hooks at all (``core.hooksPath=/dev/null``),
   ``cat`` as pager, ``true`` as editor, ``false`` as ssh and signing programs, no
   credential helper or askpass, no transport (``protocol.allow=never``); and the
   variables in ``REMOVED`` and ``SET`` (no ``GIT_EXTERNAL_DIFF``,
   ``GIT_ALLOW_PROTOCOL`` empty so no transport whatever the configuration allows,
   ``GIT_OPTIONAL_LOCKS=0`` so ``git status`` does not rewrite the index...);
2. a directory first on ``PATH`` whose ``git`` is ``guard_script``: a POSIX shell
   script (a Python here would cost its start-up on every git call) that reads the
   names of the configured filter, diff and merge drivers (``git config
   --get-regexp``: reading configuration runs nothing; whichever attributes file
   names a driver, its programs are configuration) and adds
   ``filter.<name>.clean``/``smudge``/``process`` empty (no filter),
   ``diff.<name>.textconv`` ``cat`` (the file as it is) and ``merge.<name>.driver``
   ``false`` (a conflict); gives ``git diff`` ``--no-ext-diff`` right after the
   subcommand (``diff.external`` and ``diff.<driver>.command`` have no value meaning
   "none", and ``diff`` is the one command that runs them unasked: the others need
   ``--ext-diff``, which ``confined`` refuses); gives ``diff``, ``status``,
   ``diff-files`` and ``diff-index`` ``--ignore-submodules=dirty`` (a submodule's
   work tree is compared by a git reading the submodule's own configuration, whose
   drivers the script did not read; the commits a submodule is at are still shown,
   and the option beats ``submodule.<name>.ignore``); refuses ``git diff`` outside a
   repository, where it compares any two files on the disk (an implicit
   ``--no-index``); refuses ``git blame`` when ``blame.ignoreRevsFile`` names a file
   outside the repository (git reads it and prints its first line in the error, and
   an empty value does not reset the list); then replaces itself with the real git.
   A configuration key cannot hold a newline (git refuses one), so the script reads
   one key a line.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

OVERRIDES: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("core.editor", "true"),
    ("sequence.editor", "true"),
    ("core.sshCommand", "false"),
    ("core.askPass", ""),
    ("credential.helper", ""),
    ("gpg.program", "false"),
    ("gpg.openpgp.program", "false"),
    ("gpg.x509.program", "false"),
    ("gpg.ssh.program", "false"),
    ("log.showSignature", "false"),
    ("interactive.diffFilter", "cat"),
    ("protocol.allow", "never"),
    ("diff.submodule", "short"),
    ("status.submoduleSummary", "false"),
    ("submodule.recurse", "false"),
    ("core.alternateRefsCommand", "true"),  # advertises no alternate's refs
    ("gpg.ssh.defaultKeyCommand", "false"),
    ("grep.fallbackToNoIndex", "false"),  # git grep outside a repository: any file
)
"""Configuration every guarded git command runs with, whatever the files say."""

REMOVED = (
    "GIT_EXTERNAL_DIFF",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "GIT_PROXY_COMMAND",
    # What `git -c` hands its children; it is read after GIT_CONFIG_COUNT, so it would
    # win over the overrides (seen with git 2.39).
    "GIT_CONFIG_PARAMETERS",
)
"""Variables a guarded command does not get (each names a program)."""

SET = (
    ("GIT_PAGER", "cat"),
    ("PAGER", "cat"),
    ("GIT_EDITOR", "true"),
    ("GIT_SEQUENCE_EDITOR", "true"),
    ("GIT_ALLOW_PROTOCOL", ""),
    ("GIT_NO_LAZY_FETCH", "1"),
    ("GIT_OPTIONAL_LOCKS", "0"),
    ("GIT_TERMINAL_PROMPT", "0"),
)
"""Variables a guarded command gets."""

DRIVER_KEYS = r"^(filter\..+\.(clean|smudge|process)|diff\..+\.textconv|merge\..+\.driver)$"
"""The configuration keys that name a driver's program (an extended regular expression,
as ``git config --get-regexp`` takes it)."""


def guarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with the settings above; configuration given in ``environ``
    (``GIT_CONFIG_COUNT``...) is kept, ours after it (a later entry wins)."""
    env = {k: v for k, v in environ.items() if k not in REMOVED}
    env.update(SET)
    try:
        count = max(0, int(env.get("GIT_CONFIG_COUNT", "0")))
    except ValueError:
        count = 0
    for i, (key, value) in enumerate(OVERRIDES, start=count):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    env["GIT_CONFIG_COUNT"] = str(count + len(OVERRIDES))
    return env


def guard_script(real_git: str) -> str:
    """The ``git`` a confined command finds first on its ``PATH``."""
    git = shlex.quote(real_git)
    return f"""#!/bin/sh
# fanfold: git for a confined agent (fanfold/tools/git_guard.py). Switches off the
# programs the configuration names for drivers, then runs {real_git}.
set -f
keys=$({git} config --name-only --get-regexp {shlex.quote(DRIVER_KEYS)} 2>/dev/null)
i=${{GIT_CONFIG_COUNT:-0}}
IFS='
'
for key in $keys; do
    case $key in
        *.textconv) value=cat ;;
        *.driver) value=false ;;
        *) value= ;;
    esac
    export "GIT_CONFIG_KEY_$i=$key" "GIT_CONFIG_VALUE_$i=$value"
    i=$((i + 1))
done
export GIT_CONFIG_COUNT=$i
# After the subcommand (rotating the arguments once): "diff" gets --no-ext-diff;
# what looks at the work tree does not look into submodules' work trees, where
# their own configuration's filters would run.
found=
for arg do
    shift
    set -- "$@" "$arg"
    if [ -z "$found" ]; then
        case $arg in
            -*) ;;
            diff) found=1; set -- "$@" --no-ext-diff --ignore-submodules=dirty
                if ! {git} rev-parse --git-dir >/dev/null 2>&1; then
                    echo "fanfold: git diff outside a repository compares any two files" \
                        "(an implicit --no-index); refused for this agent" >&2
                    exit 128
                fi ;;
            status|diff-files|diff-index) found=1; set -- "$@" --ignore-submodules=dirty ;;
            blame|annotate|pickaxe) found=1
                # blame.ignoreRevsFile names a file git reads, and an empty value does
                # not reset the list: a file outside the repository is refused.
                for revs in $({git} config --get-all blame.ignoreRevsFile 2>/dev/null); do
                    case $revs in
                        /*|~*|..|../*|*/..|*/../*)
                            echo "fanfold: blame.ignoreRevsFile names $revs, outside the" \
                                "repository; refused for this agent" >&2
                            exit 128 ;;
                    esac
                done ;;
            *) found=1 ;;
        esac
    fi
done
exec {git} "$@"
"""
