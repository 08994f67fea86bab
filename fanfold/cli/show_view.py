"""What ``fanfold show`` prints (and ``diff``, ``ui`` reuse): a tree's nodes read from
the log (``ShowNode``), their costs, the children not run, as rich trees or JSON.

In a module of its own, not ``show_commands``: ``ls --help`` and ``show --help``
import ``show_commands`` for its options, and these classes are attrs classes (attrs
and their generated methods: 0.09 G instructions of each of those, issue 36)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import attrs

from fanfold.cli.text import printable, short

if TYPE_CHECKING:
    from rich.text import Text
    from rich.tree import Tree

    from fanfold.db import Store
    from fanfold.providers.config import Config
    from fanfold.replay.render import Refusal
    from fanfold.statemachine import Conversation, ToolCall


@attrs.frozen
class NotRun:
    """A task of a sequential ``spawn_agents`` call that was never started."""

    id: str
    task: str
    error: str


@attrs.frozen
class ForkedFrom:
    """Where a fork began: its source and seq, and what the source had spent there
    (its own tokens, and with its sub-agents'), which the fork's state still counts."""

    id: str
    seq: int
    tokens: int
    tree_tokens: int


@attrs.frozen
class Queued:
    """A child its parent accepted that has not started yet (a tree shown while it
    runs, or stopped): ``waiting_for`` a free slot, the earlier step of its
    sequential call, or the summary of its parent's conversation."""

    id: str
    task: str
    waiting_for: str


def queued_children(state: Conversation) -> list[Queued]:
    """The children ``state`` has accepted but not started, with what each waits for."""
    from fanfold.statemachine.modes import may_start

    children = state.children
    if children is None:
        return []
    pending = list(children.pending)
    summary = children.summary
    queued = []
    for child in pending:
        if child.started:
            continue
        if not may_start(child, pending):
            waiting = "an earlier step of its sequence"
        elif child.spec.context == "summary" and (summary is None or summary.text is None):
            waiting = "the summary of its parent's conversation"
        else:
            waiting = "a free slot"
        queued.append(Queued(child.spec.id, child.spec.task, waiting))
    return queued


@attrs.frozen
class ShowNode:
    """One conversation of `fanfold show`, with its children. ``cost``: what its own
    model calls cost at its profile's prices (None without prices)."""

    state: Conversation
    task: str
    status: str
    duration: float
    children: tuple[ShowNode, ...]
    cost: float | None = None
    mode: str | None = None  # the execution mode of the spawn_agents call that made it
    # Tasks of a sequential call it made that never ran (a step before them failed):
    # they have no conversation, only an entry in the call's fan-in result.
    not_run: tuple[NotRun, ...] = ()
    # Children it accepted that have not started (the tree runs, or was stopped).
    queued: tuple[Queued, ...] = ()
    # The model and profile its calls went to, when known (see _show_node).
    model: str | None = None
    profile: str | None = None
    # A fork: where it began. Its state holds its source's history and counts, but
    # not the source's children (issue 22.9): the counts shown are its own, since then.
    forked: ForkedFrom | None = None

    @property
    def context(self) -> str | None:
        """A sub-agent's context mode: ``task_only`` when its history starts with its
        task, ``summary`` when with the summary of its parent's conversation and then
        its task, ``full`` when with its parent's conversation."""
        from fanfold.statemachine import UserMessage
        from fanfold.statemachine.delegation import SUMMARY_HEADER

        state = self.state
        if not state.is_sub_agent:
            return None
        history = state.history
        if not history or history[0] == UserMessage(self.task):
            return "task_only"
        first = history[0]
        if (
            isinstance(first, UserMessage)
            and first.text.startswith(SUMMARY_HEADER)
            and history[1:2] == (UserMessage(self.task),)
        ):
            return "summary"
        return "full"

    def tree_cost(self) -> float | None:
        """The cost of this conversation and every one below it; None unless every
        one of them has prices."""
        costs = [self.cost, *(child.tree_cost() for child in self.children)]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    def outcome(self) -> str:
        """A sub-agent's result or error; a root's answer (its last text) or error."""
        from fanfold.cli.display import last_answer
        from fanfold.statemachine import Completed, Error, Failed, Idle

        match self.state.phase:
            case Completed(result=result):
                return result
            case Failed(error=error) | Error(error=error):
                return error
            case Idle():
                return last_answer(self.state)
        return ""

    def failure(self) -> tuple[str, str | None] | None:
        """The typed kind of a failure (``submitted_error``, ``timed_out``...) and, for
        a cancelled sub-agent, who asked (``user``, ``parent``, ``timeout``, ``limit``).

        The error text is the model's or the runtime's words; the kind says what
        happened (a sub-agent that submitted "timed out" did not time out).
        """
        from fanfold.statemachine import Error, Failed

        match self.state.phase:
            case Failed(kind=kind, reason=reason):
                return kind.value, reason.value if reason is not None else None
            case Error(kind=kind):
                return kind.value, None
        return None

    def refusal(self) -> Refusal | None:
        """The category and explanation of a model's refusal, if it ended this one."""
        from fanfold.cli.display import model_refusal
        from fanfold.statemachine import Error, Failed

        match self.state.phase:
            case Failed(error=error, kind=kind) | Error(error=error, kind=kind):
                return model_refusal(kind, error)
        return None

    def to_json(self) -> dict[str, Any]:
        from fanfold.cli.display import tool_call_count
        from fanfold.statemachine import Completed

        state = self.state
        return {
            "id": state.id,
            "task": self.task,
            "phase": type(state.phase).__name__,
            "status": self.status,
            "duration": self.duration,
            "rounds": state.rounds,
            "max_rounds": state.limits.max_rounds,
            "tool_calls": tool_call_count(state),
            "tokens": state.usage.total,
            "input_tokens": state.usage_input,
            "cached_input_tokens": state.usage_cached,
            "output_tokens": state.usage_output,
            "cost": self.cost,
            "tree_cost": self.tree_cost(),
            "model": self.model,
            "profile": self.profile,
            "tree_tokens": state.tokens_spent,
            # A fork's counts above are its own, since the fork; here what its source
            # had spent then (null: not a fork).
            "source_spent": (
                None
                if self.forked is None
                else {"tokens": self.forked.tokens, "tree_tokens": self.forked.tree_tokens}
            ),
            "max_tokens": state.limits.max_tokens,
            "outcome": self.outcome(),
            # False: a sub-agent ended with plain text and never called submit_result.
            "submitted": (state.submitted if isinstance(state.phase, Completed) else None),
            # True: the answer or result is a reply cut off at the output token limit.
            "truncated": state.truncated,
            "failure": (
                None
                if (failure := self.failure()) is None
                else {"kind": failure[0], "reason": failure[1]}
            ),
            # A refusal read: the category the provider gave (or null) and the
            # explanation; `outcome` keeps the error text as recorded.
            "refusal": (
                None if (said := self.refusal()) is None else attrs.asdict(said, recurse=False)
            ),
            # Agent definitions and permissions (issue 12): the agent it was spawned
            # as, the tools it was offered, the calls its permissions refused.
            "agent": state.agent,
            "parent": state.parent_id,
            "mode": self.mode,
            "context": self.context,
            "tools": [t.name for t in state.tools],
            "refused_calls": state.refused_calls,
            # MCP servers' tools it called (issue 23): server, tool, error or not.
            "mcp_calls": mcp_calls(state),
            "children": [c.to_json() for c in self.children],
            "not_run": [attrs.asdict(n) for n in self.not_run],
            # The conversation and seq it was forked from, as `ls --json` names them.
            "forked_from": None if self.forked is None else self.forked.id,
            "forked_at_seq": None if self.forked is None else self.forked.seq,
            "queued": [attrs.asdict(q) for q in self.queued],
        }

    def label(self) -> Text:
        from rich.text import Text

        from fanfold.cli.display import CUT_OFF_NOTE, status_of, tool_call_count
        from fanfold.statemachine import Completed, Idle

        state = self.state
        symbol, style = status_of(state)
        kind = "Sub-agent" if state.is_sub_agent else "Agent"
        if state.agent is not None:
            kind += f" [{printable(state.agent)}]"
        how = [m for m in (self.mode, self.context) if m not in (None, "parallel", "task_only")]
        if how:
            kind += f" ({', '.join(how)})"
        # Task and outcome are model text: plain Text (never markup), printable only.
        line = Text.assemble(
            (symbol or "…", style),
            f' {kind} {printable(state.id)}: "{short(self.task)}" ',
            (
                f"({type(state.phase).__name__}, {self.duration}s, "
                + (f"model {short(self.model)}, " if self.model else "")
                + f"rounds {state.rounds}/"
                f"{state.limits.max_rounds}, {_count(tool_call_count(state), 'tool call')}, "
                f"{_tokens(state)}"
                + (f", {_money(self.cost)}" if self.cost is not None else "")
                + ")",
                "dim",
            ),
        )
        if self.forked is not None:
            source = self.forked
            line.append(f"\n  fork of {printable(source.id)}@{source.seq}", "blue")
            line.append(
                f"; the source had spent {source.tokens} tokens "
                f"({source.tree_tokens} in its tree) by then, not counted here",
                "dim",
            )
        servers = Counter(call["server"] for call in mcp_calls(state))
        if servers:
            shown = ", ".join(f"{printable(name)} ({n})" for name, n in sorted(servers.items()))
            line.append(f" MCP: {shown}", "cyan")
        failure = self.failure()
        if failure is not None:
            # The typed kind apart from the text, which is the model's own words: a
            # sub-agent that submitted "timed out" did not time out.
            kind_text, reason = failure
            said = self.refusal()
            kind_text = kind_text if said is None else said.headline
            line.append(f"\n  {kind_text}" + (f" (cancelled by {reason})" if reason else ""), "red")
        if state.refused_calls:
            plural = "s" if state.refused_calls != 1 else ""
            line.append(
                f"\n  {state.refused_calls} tool call{plural} refused by its permissions",
                "yellow",
            )
        if isinstance(state.phase, Completed) and not state.submitted:
            note = "completed without submit_result (its last text is the result)"
            line.append("\n  " + note, "yellow")
        if state.truncated:
            line.append("\n  " + CUT_OFF_NOTE, "yellow")
        if self.outcome() and not isinstance(state.phase, Idle):  # answers: below
            said = self.refusal()
            line.append(" → " if failure is not None else "\n  → ")
            line.append(short(self.outcome() if said is None else said.explanation, 200))
        return line


def _tokens(state: Conversation) -> str:
    """``120 tokens``; with sub-agents ``120 tokens, 900 with sub-agents``; and the
    budget when there is one (it covers the whole tree)."""
    text = f"{state.usage.total} tokens"
    if state.usage_cached:
        text += f" ({state.usage_cached} input from the prompt cache)"
    if state.usage_children:
        text += f", {state.tokens_spent} with sub-agents"
    if state.limits.max_tokens is not None:
        text += f" of a {state.limits.max_tokens} budget"
    return text


def _show_node(store: Store, conversation_id: str, config: Config | None = None) -> ShowNode:
    from fanfold.statemachine import spawn_order

    row = store.conversation(conversation_id)
    assert row is not None
    state = store.load_state(conversation_id)
    inherited = 0
    forked = None
    source = None
    if row.forked_from is not None or row.forked_at_seq is not None:
        # Only a fork's row names a source (as in ls): a tree started here is shown
        # without fanfold.replay, whose package imports every replay module (issue 36).
        from fanfold.replay.lineage import lineage

        source = lineage(store, row)
    base = _fork_base(store, conversation_id) if source is not None else None
    if base is not None and source is not None:
        # The fork's history begins with its source's, fan-in results of the source's
        # children included; its counts include the source's spend. Only what came
        # after the fork is its own.
        inherited = len(base.history)
        forked = ForkedFrom(source.source_id, source.seq, base.usage.total, base.tokens_spent)
        state = _since(state, base)
    cost = None
    # The model its calls asked for: the configured one (the profile's, as the router
    # resolved it), never a name a server put in its replies (llama-server answers
    # with whatever it loaded); without the configuration, the one its state names.
    model, profile_name = state.model, None
    if config is not None:
        # The profile its calls went to, chosen as the router chose it.
        profile, model = config.resolve(state.model, state.depth)
        profile_name = profile.name
        prices = profile.prices
        if prices is not None:
            cost = prices.cost(state.usage_input, state.usage_cached, state.usage_output)
    modes = delegation_modes(state)
    stored = store.children(conversation_id)
    started = {c.id for c in stored}
    return ShowNode(
        # The state's task is the exact text; the row's is a copy made storable.
        state=state,
        task=state.task if state.task is not None else row.task or "",
        status=row.status,
        duration=round(row.updated_at - row.created_at, 2),
        children=tuple(
            attrs.evolve(_show_node(store, c.id, config), mode=modes.get(c.id))
            for c in sorted(stored, key=lambda c: spawn_order(c.id))
        ),
        cost=cost,
        model=model,
        profile=profile_name,
        not_run=tuple(n for n in never_run(state, inherited) if n.id not in started),
        queued=tuple(queued_children(state)),
        forked=forked,
    )


def _fork_base(store: Store, conversation_id: str) -> Conversation | None:
    """The state a fork started from (its seq 0 holds it), or None if that is not a
    ``ConversationForked``."""
    from fanfold.statemachine import ConversationForked

    # events() reads the whole log; the fork's first event is what is needed, and
    # show reads the log anyway (load_state), so this at most doubles its reading.
    first = store.events(conversation_id)[0].event
    return first.state if isinstance(first, ConversationForked) else None


def _since(state: Conversation, base: Conversation) -> Conversation:
    """``state`` for show: its token counts less those of ``base`` (where it was
    forked), so that a fork does not show its source's spend as its own."""
    return attrs.evolve(
        state,
        usage_input=max(0, state.usage_input - base.usage_input),
        usage_output=max(0, state.usage_output - base.usage_output),
        usage_cached=max(0, state.usage_cached - base.usage_cached),
        usage_children=max(0, state.usage_children - base.usage_children),
    )


def never_run(state: Conversation, inherited: int = 0) -> list[NotRun]:
    """The failed children of its spawn_agents calls, from their fan-in results in the
    history; the caller keeps those that never started (no conversation of theirs
    exists): a sequential call's steps after a failure (``not_run``), children
    cancelled or out of token budget before their turn, children whose summary
    (context mode ``summary``) could not be made. The first ``inherited`` messages
    are left out: a fork's history begins with its source's, whose children are the
    source's, not the fork's."""
    return [
        NotRun(str(entry.get("agent_id")), str(entry.get("task", "")), str(entry.get("error", "")))
        for _, entry in _fan_in_entries(state, inherited)
        if entry.get("status") == "failed"
    ]


def _fan_in_entries(state: Conversation, start: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """(spawn call id, entry) for every child entry of the spawn_agents fan-in results
    in the history (from message ``start``); a result that is not the fan-in's JSON (an
    error result) has none."""
    from fanfold.statemachine import ToolResultMessage

    for message in state.history[start:]:
        if not (isinstance(message, ToolResultMessage) and message.result.name == "spawn_agents"):
            continue
        try:
            entries = json.loads(message.result.content).get("sub_agent_results", [])
        except (ValueError, AttributeError, RecursionError):  # an imported log's text
            continue
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict):
                yield message.result.tool_call_id, entry


def delegation_modes(state: Conversation) -> dict[str, str]:
    """Child id -> the execution mode of the spawn_agents call that made it: read from
    the calls and their fan-in results in the history, and the children still pending."""
    from fanfold.statemachine import AssistantMessage

    by_call = {
        call.id: _call_mode(call)
        for message in state.history
        if isinstance(message, AssistantMessage)
        for call in message.tool_calls
        if call.name == "spawn_agents"
    }
    modes: dict[str, str] = {}
    for call_id, entry in _fan_in_entries(state):
        mode = by_call.get(call_id)
        if mode is not None:
            modes[str(entry.get("agent_id"))] = mode
    children = state.children
    if children is not None:
        for pending in children.pending:
            spec = pending.spec
            modes[spec.id] = "parallel" if spec.mode is None else spec.mode.mode.value
    return modes


def _call_mode(call: ToolCall) -> str:
    try:
        arguments = call.arguments()
    except ValueError:
        return "parallel"
    if not isinstance(arguments, dict):
        return "parallel"
    mode = arguments.get("mode")
    if mode in ("sequential", "race"):
        return str(mode)
    return "race" if arguments.get("quorum") is not None else "parallel"


def _trusted_config(store: Store, root_id: str) -> Config | None:
    """The configuration tree ``root_id`` recorded, for its prices, if the tree is this
    user's own (its provenance mark verifies with the user's existing key). A log from
    elsewhere names files of its choosing: show never reads those."""
    from fanfold.db.provenance import UserKey, refusal

    record = store.tree_record(root_id)
    key = UserKey.existing()
    if record is None or key is None:
        return None
    if refusal(record, key, store.instance_id, root_id) is not None:
        return None
    if _scripted(record.provider):
        return None  # what recorded_config says of it, without importing the providers
    from fanfold.cli.recorded import recorded_config

    return recorded_config(record.provider)


def _scripted(recorded: str | None) -> bool:
    """Whether a recorded provider description is a scripted one (the demo's): it has
    no profiles, so no prices."""
    try:
        data = json.loads(recorded) if recorded is not None else None
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("kind") == "script"


def _money(amount: float) -> str:
    if not math.isfinite(amount):
        return "unknown"
    return f"${amount:.4f}" if amount < 1 else f"${amount:.2f}"


def finite_json(value: Any) -> Any:
    """``value`` (JSON-able data) with every NaN or infinite float replaced by None
    (``null``): ``json.dumps(..., allow_nan=False)`` can then write it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(item) for item in value]
    return value


def _add_nodes(tree: Tree, nodes: tuple[ShowNode, ...]) -> None:
    for node in nodes:
        branch = tree.add(node.label())
        _add_nodes(branch, node.children)
        _add_not_run(branch, node)


def _add_not_run(tree: Tree, node: ShowNode) -> None:
    from rich.text import Text

    for waiting in node.queued:
        tree.add(
            Text.assemble(
                ("…", "dim"),
                f' queued {printable(waiting.id)}: "{short(waiting.task)}" ',
                (f"(waiting for {waiting.waiting_for})", "dim"),
            )
        )
    for task in node.not_run:
        # Model text (the task, the error): plain Text, printable only.
        tree.add(
            Text.assemble(
                ("∅", "dim"),
                f' never started {printable(task.id)}: "{short(task.task)}" ',
                (f"({short(task.error, 120)})", "dim"),
            )
        )


def _count(number: int, noun: str) -> str:
    """``1 tool call``, ``2 tool calls``."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def mcp_calls(state: Conversation) -> list[dict[str, Any]]:
    """The MCP tool calls of a conversation, in order: server, tool, and whether its
    result was an error (None while it has none)."""
    from fanfold.statemachine import AssistantMessage, ToolResultMessage
    from fanfold.statemachine.permissions import mcp_server_of

    errors = {
        m.result.tool_call_id: m.result.is_error
        for m in state.history
        if isinstance(m, ToolResultMessage)
    }
    out = []
    for message in state.history:
        if isinstance(message, AssistantMessage):
            for call in message.tool_calls:
                server = mcp_server_of(call.name)
                if server is not None:
                    tool = call.name[len(f"mcp__{server}__") :]
                    out.append({"server": server, "tool": tool, "error": errors.get(call.id)})
    return out
