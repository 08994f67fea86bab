"""fanfold's pure core: the conversation and sub-agent lifecycle as a reducer.

Rules of this package:

- Nothing here does I/O, reads a clock or draws randomness. It imports no trio, httpx,
  sqlite_utils, structlog, time, random, uuid or os (``tests/test_import_rules.py``
  checks). Ids, times and jitter seeds arrive inside events.
- ``start(created)`` makes a conversation; ``transition(state, event)`` returns the next
  state and a tuple of effects, or raises ``IllegalTransition`` and changes nothing.
- States, events and effects are frozen attrs classes holding immutable data.
- Events are past-tense facts (``ModelReplied``); effects are commands (``CallModel``).
"""

import sys
import types
from typing import TYPE_CHECKING, Any

from fanfold.statemachine.children import (
    ChildFailed,
    ChildOutcome,
    Children,
    ChildSpec,
    ChildSucceeded,
    FinishedChild,
    PendingChild,
    RejectedTask,
    Roster,
    Summary,
    fan_in_result,
    spawn_order,
)
from fanfold.statemachine.control_tools import (
    CONTROL_TOOLS,
    SPAWN_AGENTS,
    SUB_AGENT_PROMPT,
    SUBMIT_ERROR,
    SUBMIT_RESULT,
    offered_tools,
)
from fanfold.statemachine.effects import (
    ALL_EFFECTS,
    AbortCall,
    AskUser,
    CallModel,
    CancelSubAgents,
    Effect,
    NotifyParent,
    RequestApproval,
    RunTool,
    ScheduleRetry,
    SpawnSubAgent,
    StartTimer,
    TurnFinished,
    TurnOutcome,
)
from fanfold.statemachine.errors import (
    CancelReason,
    DuplicateChildOutcome,
    ErrorKind,
    IllegalTransition,
    UnknownCall,
    UnknownChild,
)
from fanfold.statemachine.events import (
    ALL_EVENTS,
    ApprovalDenied,
    ApprovalGranted,
    CancelRequested,
    ConversationCreated,
    ConversationForked,
    DecisionEdit,
    Edit,
    Event,
    ForkEdited,
    LimitsEdit,
    ModelFailed,
    ModelReplied,
    ReplyEdit,
    RuntimeResumed,
    SubAgentFinished,
    SystemPromptEdit,
    TaskEdit,
    TimerFired,
    ToolFinished,
    ToolResultEdit,
    ToolsChanged,
    UserAnswered,
    UserMessaged,
    WorkingDirectory,
)
from fanfold.statemachine.limits import Limits
from fanfold.statemachine.messages import (
    STOP_MAX_TOKENS,
    STOP_REFUSAL,
    AssistantMessage,
    Message,
    ModelError,
    ModelReply,
    ModelRequest,
    ToolCall,
    ToolResult,
    ToolResultMessage,
    ToolSpec,
    Usage,
    UserMessage,
    canonical_json,
)
from fanfold.statemachine.phases import (
    ALL_PHASES,
    TERMINAL_PHASES,
    Asking,
    AwaitingRetry,
    AwaitingSubAgents,
    CancellingSubAgents,
    Completed,
    EndCompleted,
    EndFailed,
    EndIdle,
    Ending,
    Error,
    Failed,
    Idle,
    LlmRequesting,
    Phase,
    ToolExecuting,
)
from fanfold.statemachine.state import WORDING, Conversation

# The reducer's functions (``transition.py``, a third of this package's source) are
# imported when first named (``__getattr__``): reading a log's states and showing them
# (``fanfold show``) needs the types only (issue 36).
if TYPE_CHECKING:
    from fanfold.statemachine.transition import (
        Transition,
        fold,
        model_request,
        start,
        transition,
    )

_FROM_TRANSITION = frozenset({"Transition", "fold", "model_request", "start", "transition"})

__all__ = [
    "ALL_EFFECTS",
    "ALL_EVENTS",
    "ALL_PHASES",
    "CONTROL_TOOLS",
    "SPAWN_AGENTS",
    "STOP_MAX_TOKENS",
    "STOP_REFUSAL",
    "SUBMIT_ERROR",
    "SUBMIT_RESULT",
    "SUB_AGENT_PROMPT",
    "TERMINAL_PHASES",
    "WORDING",
    "AbortCall",
    "ApprovalDenied",
    "ApprovalGranted",
    "AskUser",
    "Asking",
    "AssistantMessage",
    "AwaitingRetry",
    "AwaitingSubAgents",
    "CallModel",
    "CancelReason",
    "CancelRequested",
    "CancelSubAgents",
    "CancellingSubAgents",
    "ChildFailed",
    "ChildOutcome",
    "ChildSpec",
    "ChildSucceeded",
    "Children",
    "Completed",
    "Conversation",
    "ConversationCreated",
    "ConversationForked",
    "DecisionEdit",
    "DuplicateChildOutcome",
    "Edit",
    "Effect",
    "EndCompleted",
    "EndFailed",
    "EndIdle",
    "Ending",
    "Error",
    "ErrorKind",
    "Event",
    "Failed",
    "FinishedChild",
    "ForkEdited",
    "Idle",
    "IllegalTransition",
    "Limits",
    "LimitsEdit",
    "LlmRequesting",
    "Message",
    "ModelError",
    "ModelFailed",
    "ModelReplied",
    "ModelReply",
    "ModelRequest",
    "NotifyParent",
    "PendingChild",
    "Phase",
    "RejectedTask",
    "ReplyEdit",
    "RequestApproval",
    "Roster",
    "RunTool",
    "RuntimeResumed",
    "ScheduleRetry",
    "SpawnSubAgent",
    "StartTimer",
    "SubAgentFinished",
    "Summary",
    "SystemPromptEdit",
    "TaskEdit",
    "TimerFired",
    "ToolCall",
    "ToolExecuting",
    "ToolFinished",
    "ToolResult",
    "ToolResultEdit",
    "ToolResultMessage",
    "ToolSpec",
    "ToolsChanged",
    "Transition",
    "TurnFinished",
    "TurnOutcome",
    "UnknownCall",
    "UnknownChild",
    "Usage",
    "UserAnswered",
    "UserMessage",
    "UserMessaged",
    "WorkingDirectory",
    "canonical_json",
    "fan_in_result",
    "fold",
    "model_request",
    "offered_tools",
    "spawn_order",
    "start",
    "transition",
]


def __getattr__(name: str) -> Any:
    if name not in _FROM_TRANSITION:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # The submodule, from sys.modules: as an attribute of this package its name is the
    # function's (``_Package``).
    import fanfold.statemachine.transition  # noqa: F401

    value = getattr(sys.modules[f"{__name__}.transition"], name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """``fanfold.statemachine`` itself. Its ``transition`` is the reducer's function,
    as it always was, although its module has that name too: the import system binds
    a submodule on its package when it is first imported (``fanfold.trace`` imports
    ``fanfold.statemachine.transition``), which here would put the module in the
    function's place."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "transition" and isinstance(value, types.ModuleType):
            value = value.transition
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
