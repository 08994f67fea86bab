"""``fanfold transcript``: one agent's conversation as text a person reads.

Read from the log alone (the reducer replays it; nothing runs), so it works on any
tree of the database, an imported one too. Every recorded text is anyone's words: it
is escaped for the terminal (``printable``) in every format, the JSON one included
(``ensure_ascii``).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

import click

from fanfold.cli.database import Target, db_option, open_store
from fanfold.cli.errors import CliError

# What a command runs with (rich, the log, the reducer, the runtime, the providers) is
# imported in the functions that use it: `--help` imports none of it (issue 36,
# tests/test_cli_startup.py).
if TYPE_CHECKING:
    from fanfold.replay.transcript import Entry, Transcript

# How each kind of entry is headed, and its style on a terminal.
_HEADINGS = {
    "system": ("system prompt", "magenta"),
    "user": ("user", "bold cyan"),
    "assistant": ("assistant", "bold green"),
    "tool_call": ("tool call", "yellow"),
    "tool_result": ("tool result", "yellow"),
    "usage": ("usage", "dim"),
    "model_error": ("model error", "bold red"),
    "sub_agent": ("sub-agent", "blue"),
    "cancel": ("cancel", "red"),
    "timer": ("timer", "dim"),
    "resumed": ("resumed", "dim"),
    "forked": ("forked from", "blue"),
    "note": ("note", "dim"),
    "edit": ("edit", "bold magenta"),
    "request": ("waits for a person", "bold yellow"),
    "decision": ("decision", "bold yellow"),
    "outcome": ("outcome", "bold"),
}


@click.command(
    name="transcript",
    epilog=(
        "\b\nExamples:\n"
        "  fanfold transcript 3f9a0c61d2b4 --agent root/1\n"
        "  fanfold transcript 3f9a0c61d2b4 --markdown > bug.md\n"
    ),
)
@click.argument("conversation_id")
@click.option(
    "--agent",
    "path",
    default=None,
    help="The agent of CONVERSATION_ID's tree to show: root, root/1, 1/2 or an id "
    "(default: CONVERSATION_ID itself).",
)
@click.option("--markdown", is_flag=True, help="Markdown, for a bug report.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable (texts in full).")
@click.option("--full", is_flag=True, help="Long texts in full instead of cut.")
@db_option
def transcript_command(
    conversation_id: str,
    path: str | None,
    markdown: bool,
    as_json: bool,
    full: bool,
    db: Target | None,
) -> None:
    """Print one agent's conversation: system prompt, messages, tool calls with their
    arguments and results, sub-agent outcomes, model errors and token usage.

    Read from the log (replayed, never re-run): works on any tree in the database,
    imported ones too.
    """
    from fanfold.cli.replay_commands import _errors
    from fanfold.replay.transcript import agent_id, transcript

    if markdown and as_json:
        raise CliError("give one of --markdown and --json")
    with _errors(), open_store(db, read_only=True) as store:
        read = transcript(store, agent_id(store, conversation_id, path))
    if as_json:
        # ensure_ascii: controls and lone surrogates as \\u escapes (valid JSON, safe).
        click.echo(json.dumps(read.to_json(), indent=2, ensure_ascii=True))
    elif markdown:
        click.echo(to_markdown(read, full=full), nl=False)
    else:
        _show(read, full=full)


def _heading(entry: Entry) -> str:
    from fanfold.cli.display import printable

    what = _HEADINGS.get(entry.kind, (entry.kind, ""))[0]
    where = "now" if entry.seq < 0 else f"seq {entry.seq}"
    label = f": {entry.label}" if entry.label else ""
    error = " (error)" if entry.is_error and entry.kind == "tool_result" else ""
    return printable(" ".join(f"{where} · {what}{label}{error}".split()))


def _body(entry: Entry) -> str:
    if entry.kind == "tool_call":
        # Arguments are JSON text: indented to read, as recorded if they are not JSON.
        try:
            return json.dumps(json.loads(entry.text), indent=2, ensure_ascii=False)
        except (ValueError, RecursionError):
            return entry.text
    return entry.text


def _header_lines(read: Transcript) -> list[str]:
    from fanfold.cli.display import printable

    who = f"{read.conversation_id} ({read.path}"
    who += f", sub-agent of {read.parent_id})" if read.parent_id else ")"
    lines = [f"transcript of {who}"]
    if read.agent:
        lines.append(f"agent: {read.agent}")
    if read.model:
        lines.append(f"model: {read.model}")
    if read.task is not None:
        lines.append(f"task: {' '.join(read.task.split())[:300]}")
    if read.forked_from is not None:
        lines.append(f"fork of {read.forked_from}@{read.forked_at_seq}")
    cached = f" ({read.cached_input_tokens} cached)" if read.cached_input_tokens else ""
    lines.append(
        f"phase: {read.phase} · rounds {read.rounds} · tokens: {read.input_tokens} in"
        f"{cached}, {read.output_tokens} out, {read.tree_tokens} with sub-agents"
    )
    if read.diverged_at is not None:
        lines.append(
            f"warning: today's reducer does not reproduce seq {read.diverged_at} "
            "(see `fanfold replay --verify`); what follows is what it computes"
        )
    return [printable(line) for line in lines]


def _show(read: Transcript, *, full: bool) -> None:
    from rich.text import Text

    from fanfold.cli.display import clip
    from fanfold.cli.output import console

    for line in _header_lines(read):
        console.print(Text(line, style="bold"), soft_wrap=True, highlight=False)
    for entry in read.entries:
        style = "bold red" if entry.is_error else _HEADINGS.get(entry.kind, ("", ""))[1]
        console.print(Text(f"── {_heading(entry)}", style=style), soft_wrap=True, highlight=False)
        body = _body(entry)
        if body:
            shown = clip(body, full=full)
            console.print(Text(_indent(shown)), soft_wrap=True, highlight=False)


def _indent(text: str) -> str:
    return "\n".join("   " + line for line in text.split("\n"))


def to_markdown(read: Transcript, *, full: bool = False) -> str:
    """The transcript as Markdown: a heading per entry, every text in a code fence
    (longer than any run of backticks in it, so no text can close it or become
    markup), escaped like the terminal view."""
    from fanfold.cli.display import clip

    header = _header_lines(read)
    out = [f"# {_inline(header[0])}", ""]
    out += [f"- {_inline(line)}" for line in header[1:]]
    for entry in read.entries:
        out += ["", f"### {_inline(_heading(entry))}"]
        body = _body(entry)
        if body:
            shown = clip(body, full=full)
            fence = "`" * max(3, _longest_backticks(shown) + 1)
            out += ["", fence, shown, fence]
    return "\n".join(out) + "\n"


def _longest_backticks(text: str) -> int:
    return max((len(run) for run in re.findall("`+", text)), default=0)


def _inline(text: str) -> str:
    """A heading or list line of Markdown: the characters that would make markup of
    recorded text (an id, a tool name) escaped with a backslash."""
    return re.sub(r"([\\`*_\[\]<>#|!])", r"\\\1", text)
