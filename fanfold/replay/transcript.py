"""One agent's conversation as a person reads it, from the log alone.

``transcript(store, id)`` replays the conversation's recorded log through the reducer
(nothing runs) and returns its entries in order: the system prompt, then each message
the model saw the step it entered the history, and beside them what the history does
not hold (usage of each model call, model errors, sub-agent outcomes, cancellations,
timers, restarts). The texts are returned as recorded: a view escapes them.

``agent_id(store, tree, path)`` names a conversation of a tree by its place in it
(``root``, ``root/1``, ``1/2``) or by its id.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from fanfold.db import Store, UnknownConversation
from fanfold.replay.lineage import lineage
from fanfold.replay.report import ReplayStep
from fanfold.replay.stepping import steps
from fanfold.statemachine import (
    ApprovalDenied,
    ApprovalGranted,
    AssistantMessage,
    CancelRequested,
    ChildFailed,
    ChildSucceeded,
    Completed,
    Conversation,
    ConversationCreated,
    ConversationForked,
    DecisionEdit,
    Edit,
    Error,
    Failed,
    ForkEdited,
    LimitsEdit,
    Message,
    ModelFailed,
    ModelReplied,
    ReplyEdit,
    RuntimeResumed,
    SubAgentFinished,
    SystemPromptEdit,
    TaskEdit,
    TimerFired,
    ToolExecuting,
    ToolResultEdit,
    ToolResultMessage,
    UserAnswered,
    UserMessage,
)
from fanfold.statemachine.state import tree_path


def agent_id(store: Store, tree: str, path: str | None) -> str:
    """The id of the conversation at ``path`` in the tree of ``tree`` (any of its
    conversations): ``None`` or ``root`` is the root, ``root/1/2`` or ``1/2`` a
    sub-agent by its place, and an id of that tree itself. Raises UnknownConversation
    for an unknown ``tree``, LookupError for a ``path`` not in it."""
    root = store.conversation(tree).root_id
    if path is None:
        return tree
    if path in ("root", "/"):
        return root
    trimmed = path.removeprefix("root").strip("/")
    by_place = root + "".join(f".{part}" for part in trimmed.split("/")) if trimmed else root
    for candidate in (by_place, path):
        try:
            row = store.conversation(candidate)
        except UnknownConversation:
            continue
        if row.root_id == root:
            return candidate
    raise LookupError(f"no agent {path!r} in the tree of {root!r}")


@attrs.frozen
class Entry:
    """One thing the transcript says. ``kind``: ``system``, ``user``, ``assistant``,
    ``tool_call``, ``tool_result``, ``usage``, ``model_error``, ``sub_agent``,
    ``cancel``, ``timer``, ``resumed``, ``forked``, ``note``, ``outcome``. ``text``
    is recorded text (the model's, a tool's, a user's); ``label`` a short heading
    (a tool's name and call id...); ``seq`` the step it came with."""

    seq: int
    kind: str
    text: str = ""
    label: str = ""
    is_error: bool = False

    def to_json(self) -> dict[str, object]:
        return attrs.asdict(self)


@attrs.frozen
class Transcript:
    """A conversation's transcript: who it is, its entries, and where it ended."""

    conversation_id: str
    root_id: str
    path: str
    parent_id: str | None
    task: str | None
    model: str | None
    agent: str | None
    phase: str
    rounds: int
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    tree_tokens: int
    forked_from: str | None
    forked_at_seq: int | None
    entries: tuple[Entry, ...]
    diverged_at: int | None = None  # the first seq today's reducer does not reproduce

    def to_json(self) -> dict[str, object]:
        fields = attrs.asdict(self, recurse=False)
        fields["entries"] = [e.to_json() for e in self.entries]
        return fields


def transcript(store: Store, conversation_id: str) -> Transcript:
    """Replay ``conversation_id``'s log and read it as a transcript (see the module).

    Raises UnknownConversation, and LogCorrupt where a damaged log breaks."""
    row = store.conversation(conversation_id)
    entries: list[Entry] = []
    last: Conversation | None = None
    diverged: int | None = None
    for step in steps(store, conversation_id):
        if not step.matches and diverged is None:
            diverged = step.seq
        entries.extend(_entries(step))
        last = step.after_state
    assert last is not None  # seq 0 always exists for a stored conversation
    entries.extend(_ending(last))
    source = lineage(store, row)
    return Transcript(
        conversation_id=conversation_id,
        root_id=row.root_id,
        path=tree_path(conversation_id, row.root_id),
        parent_id=row.parent_id,
        task=last.task,
        model=last.model,
        agent=last.agent,
        phase=type(last.phase).__name__,
        rounds=last.rounds,
        input_tokens=last.usage_input,
        output_tokens=last.usage_output,
        cached_input_tokens=last.usage_cached,
        tree_tokens=last.tokens_spent,
        forked_from=None if source is None else source.source_id,
        forked_at_seq=None if source is None else source.seq,
        entries=tuple(entries),
        diverged_at=diverged,
    )


def _entries(step: ReplayStep) -> Iterator[Entry]:
    seq, event, after = step.seq, step.event, step.after_state
    before = step.before_state
    match event:
        case ConversationCreated():
            yield _system(seq, after)
        case ConversationForked(source_id=source, source_seq=at):
            yield Entry(seq, "forked", label=f"{source}@{at}")
            yield _system(seq, after)
        case ModelReplied(call=call, reply=reply):
            usage = reply.usage
            text = (
                f"{usage.input_tokens} input tokens"
                + (f" ({usage.cached_input_tokens} cached)" if usage.cached_input_tokens else "")
                + f", {usage.output_tokens} output tokens, stop reason {reply.stop_reason}"
                + (f": {reply.stop_details}" if reply.stop_details else "")
            )
            yield Entry(seq, "usage", text, label=f"model call {call}")
        case ModelFailed(call=call, error=error):
            yield Entry(
                seq,
                "model_error",
                error.message,
                label=f"model call {call}: {error.kind}",
                is_error=True,
            )
        case SubAgentFinished(child_id=child, outcome=ChildSucceeded(result=result)):
            yield Entry(seq, "sub_agent", result, label=f"{child} completed")
        case SubAgentFinished(
            child_id=child, outcome=ChildFailed(error=error, kind=kind, reason=r)
        ):
            how = f"{child} failed ({kind}" + (f", cancelled by {r}" if r is not None else "") + ")"
            yield Entry(seq, "sub_agent", error, label=how, is_error=True)
        case CancelRequested(reason=reason):
            yield Entry(seq, "cancel", label=f"cancel requested by {reason}")
        case TimerFired(timer=timer):
            yield Entry(seq, "timer", label=f"timer {timer} fired")
        case RuntimeResumed(forked=True):
            yield Entry(seq, "resumed", label="the fork went on (no restart: forked here)")
        case RuntimeResumed():
            yield Entry(seq, "resumed", label="the runtime resumed the conversation")
        case ForkEdited(edit=edit):
            yield _edit_entry(seq, edit)
        case ApprovalGranted(call=call, arguments_json=arguments, by=by):
            edited = " with edited arguments" if arguments is not None else ""
            label = f"call {call} approved{edited}" + (f" by {by}" if by else "")
            yield Entry(seq, "decision", arguments or "", label=label)
        case ApprovalDenied(call=call, reason=reason, by=by):
            label = f"call {call} denied" + (f" by {by}" if by else "")
            yield Entry(seq, "decision", reason, label=label, is_error=True)
        case UserAnswered(call=call, text=text, by=by):
            label = f"call {call} answered" + (f" by {by}" if by else "")
            yield Entry(seq, "decision", text, label=label)
    old = () if before is None else before.history
    new = after.history
    # The reducer appends to the history (the earlier messages are the same objects),
    # so the new messages are its tail; if a step ever rewrote it, say so and show all.
    if new[: len(old)] != old:
        yield Entry(seq, "note", label="the history was rewritten at this step")
        old = ()
    for message in new[len(old) :]:
        yield from _message(seq, message)
    asked = after.phase
    if (
        isinstance(asked, ToolExecuting)
        and asked.asking is not None
        and not isinstance(event, RuntimeResumed | ForkEdited)
        and not (
            before is not None
            and isinstance(before.phase, ToolExecuting)
            and before.phase.asking is not None
            and before.phase.call == asked.call
        )
    ):
        # The step opened a request (issue 35): the call waits for a decision.
        what = "a question (ask_user)" if asked.asking.question else asked.asking.rule
        yield Entry(seq, "request", label=f"call {asked.call} ({asked.current.name}): {what}")


def _edit_entry(seq: int, edit: Edit) -> Entry:
    """A fork edit: what the user changed (the edited reply and result also appear as
    messages of the history, below)."""
    match edit:
        case SystemPromptEdit(system_prompt=text):
            return Entry(seq, "edit", text, label="the system prompt replaced")
        case TaskEdit(task=task):
            return Entry(seq, "edit", task, label="the task replaced")
        case ReplyEdit():
            return Entry(seq, "edit", label="the awaited model reply given by the user")
        case ToolResultEdit(result=result):
            return Entry(
                seq, "edit", label=f"the result of {result.tool_call_id} given by the user"
            )
        case DecisionEdit(decision=decision):
            what = {"ApprovalGranted": "approved", "ApprovalDenied": "denied"}
            return Entry(
                seq,
                "edit",
                getattr(decision, "reason", getattr(decision, "text", "")) or "",
                label=f"call {decision.call} {what.get(type(decision).__name__, 'answered')} "
                "in this fork",
            )
        case LimitsEdit(limits=limits):
            text = "\n".join(
                f"{field.name} = {getattr(limits, field.name)!r}"
                for field in attrs.fields(type(limits))
            )
            return Entry(seq, "edit", text, label="the limits replaced")
    return Entry(seq, "edit")  # pragma: no cover - the edits are exhausted


def _system(seq: int, state: Conversation) -> Entry:
    return Entry(seq, "system", state.system_prompt, label="" if state.system_prompt else "(empty)")


def _message(seq: int, message: Message) -> Iterator[Entry]:
    match message:
        case UserMessage(text=text):
            yield Entry(seq, "user", text)
        case AssistantMessage(text=text, tool_calls=calls, truncated=truncated):
            if text or not calls:
                yield Entry(seq, "assistant", text, label="cut off" if truncated else "")
            for call in calls:
                yield Entry(seq, "tool_call", call.arguments_json, label=f"{call.name} {call.id}")
        case ToolResultMessage(result=result):
            yield Entry(
                seq,
                "tool_result",
                result.content,
                label=f"{result.name} {result.tool_call_id}",
                is_error=result.is_error,
            )


def _ending(state: Conversation) -> Iterator[Entry]:
    seq = -1  # not a step: where the conversation is now
    match state.phase:
        case ToolExecuting(current=current, results=results):
            for result in results:
                yield Entry(
                    seq,
                    "tool_result",
                    result.content,
                    label=f"{result.name} {result.tool_call_id} (not yet in the history)",
                    is_error=result.is_error,
                )
            yield Entry(seq, "note", label=f"tool {current.name} {current.id} is running")
        case Completed(result=result):
            yield Entry(seq, "outcome", result, label="completed")
        case Failed(error=error, kind=kind, reason=reason):
            how = f"failed ({kind}" + (f", cancelled by {reason}" if reason else "") + ")"
            yield Entry(seq, "outcome", error, label=how, is_error=True)
        case Error(error=error, kind=kind):
            yield Entry(seq, "outcome", error, label=f"error ({kind})", is_error=True)
