"""Watching a turn of ``run`` or ``send`` live, and printing its result."""

from __future__ import annotations

import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import trio
from rich.live import Live
from rich.text import Text

from fanfold.cli.display import (
    CUT_OFF_NOTE,
    TreeView,
    clip,
    model_refusal,
    printable,
    write_text,
)
from fanfold.cli.display import last_answer as last_answer
from fanfold.cli.output import console, hint, quietly, say
from fanfold.cli.signals import Interruption
from fanfold.runtime import Runtime
from fanfold.statemachine import Conversation, Error


@attrs.define
class People:
    """How a watched turn meets requests for a person's decision (issue 35).

    ``no_wait``: never ask here; stop once the tree can go on only after a decision
    (``blocked`` then holds its id: the caller exits with ``EXIT_WAITING``). Without
    a terminal the same happens; in one, each request is asked y / n / edit."""

    no_wait: bool = False
    blocked: list[str] = attrs.field(factory=list)


async def watch(
    runtime: Runtime,
    conversation_id: str,
    view: TreeView,
    live: bool,
    signals: AsyncIterator[int],
    people: People | None = None,
) -> Interruption | None:
    """Wait for the turn, cancelling it on the first stop signal; a second stops at once."""
    from fanfold.cli.approvals import prompt_decisions, wait_or_blocked

    interruption: Interruption | None = None
    people = people if people is not None else People()
    display = None
    if live and console.is_terminal:
        display = Live(get_renderable=view.render, console=console, refresh_per_second=8)
    # A person answers here only in a terminal (its input too), and not --no-wait.
    interactive = display is not None and sys.stdin.isatty() and not people.no_wait

    finished = False

    async def until_rest() -> None:
        nonlocal finished
        try:
            if interactive:
                await runtime.wait(conversation_id)
            else:
                people.blocked = await wait_or_blocked(runtime, [conversation_id])
        finally:
            finished = True

    def stop_display() -> None:
        if display is not None:
            quietly(display.stop)

    def start_display() -> None:
        # Not once the turn is over: the display is stopped for good then.
        if display is not None and not finished:
            display.start()

    async with trio.open_nursery() as nursery:
        if interactive:
            nursery.start_soon(prompt_decisions, runtime, stop_display, start_display)

        async def on_signal() -> None:
            nonlocal interruption
            async for signum in signals:
                if signum == signal.SIGHUP and display is not None:
                    quietly(display.stop)  # the terminal is gone: stop drawing on it
                if interruption is not None and signum == signal.SIGHUP:
                    # A hang-up often comes twice (the shell's and the kernel's); no one
                    # asked to force anything: let the clean cancel finish.
                    continue
                if interruption is not None:
                    # Leaving the runtime cancels its tasks (bash commands are killed);
                    # what was not recorded is left `running` for `fanfold resume`.
                    interruption = attrs.evolve(interruption, forced=True)
                    say(f"[red]{Interruption(signum).name} again: stopping now[/red]")
                    nursery.cancel_scope.cancel()
                    return
                interruption = Interruption(signum)
                await runtime.cancel(conversation_id)
                say(f"[yellow]{interruption.name}: cancelling (again to force)…[/yellow]")

        nursery.start_soon(on_signal)
        if display is not None:
            display.start()
            try:
                await until_rest()
            finally:
                quietly(display.stop)
        else:
            await until_rest()
            say(view.render(), to=console)
        nursery.cancel_scope.cancel()
    return interruption


def print_result(
    conversation_id: str, state: Conversation, interruption: Interruption | None, *, db: Path | str
) -> None:
    try:
        match state.phase:
            case _ if interruption is not None and interruption.forced:
                console.print(
                    f"[red]stopped by {interruption.name} before the cancel finished[/red]"
                )
                hint(f"finish the cancel with: fanfold resume --db {db}", to=console)
            case Error():
                print_outcome(conversation_id, state)
            case _ if interruption is not None:
                console.print(
                    f"[yellow]cancelled by {interruption.name}: the turn and every "
                    "sub-agent still running were stopped and recorded[/yellow]"
                )
            case _:
                print_outcome(conversation_id, state)
        hint(f"conversation: {conversation_id}  database: {db}", to=console)
        hint(f"inspect it with: fanfold show {conversation_id} --db {db}", to=console, style="dim")
    except (OSError, SystemExit):  # the output went away (see quietly)
        if interruption is None:
            raise
    if interruption is not None:
        # The shell's convention for a command stopped by a signal (128 + its number:
        # 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP): a script running
        # `fanfold run` must not take a cancelled turn for a finished one.
        raise SystemExit(interruption.exit_code)
    if isinstance(state.phase, Error):
        raise SystemExit(1)


def print_outcome(conversation_id: str, state: Conversation, *, title: str = "answer") -> None:
    """A root's latest turn as it ended: its error (typed; a refusal as its category
    and explanation), else its answer under a ``title`` rule, cut unless short."""
    match state.phase:
        case Error(error=error, kind=kind):
            # Model and tool text: printed as plain text, never as markup or escapes.
            said = model_refusal(kind, error)
            head, text = (
                (f"error ({kind}): ", error)
                if said is None
                else (f"{said.headline}: ", said.explanation)
            )
            console.print(Text.assemble((head, "red"), printable(text)), highlight=False)
        case _:
            answer = last_answer(state)
            console.rule(Text(title))
            more = f"`fanfold show {printable(conversation_id)} --full` shows all of it"
            write_text(console, clip(answer, hint=more) or "(no text)")
            if state.truncated:
                hint(f"the answer was {CUT_OFF_NOTE}", to=console, style="yellow")
