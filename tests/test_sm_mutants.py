"""The property tests catch real bugs: each mutant below breaks the reducer the way a
plausible refactoring would, and a short, derandomized Hypothesis run of the checks in
``fanfold.testing`` (or of the in-memory tree) must fail on it, naming the invariant.

Mutants are installed by monkeypatching helpers of ``fanfold.statemachine.transition``
(``transition`` looks them up at call time), so the real reducer is never edited.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from sm_support import World, first_reply, random_run

from fanfold import testing
from fanfold.statemachine import (
    CancelRequested,
    ChildFailed,
    Children,
    ChildSucceeded,
    Conversation,
    EndCompleted,
    EndFailed,
    ErrorKind,
    IllegalTransition,
    Limits,
    NotifyParent,
    SpawnSubAgent,
    ToolCall,
    UserMessaged,
    control_tools,
    start,
    transition,
)
from fanfold.statemachine import children as children_module
from fanfold.testing import checks, delegation, strategies, table

TM = importlib.import_module("fanfold.statemachine.transition")

Patch = Callable[[pytest.MonkeyPatch], None]

BOUNDED = settings(
    max_examples=300,  # about two seconds per mutant at worst, most are caught at once
    derandomize=True,  # the same examples every run: a caught mutant stays caught
    database=None,  # never replay a mutant's failure in the real tests
    phases=[Phase.generate],  # no shrinking: we only need to see it fail
    deadline=None,
)


# --------------------------------------------------------------------------- detectors


def every_step_checked(sub_agent: bool | None = None, budget: settings = BOUNDED) -> None:
    @budget
    @given(testing.event_sequences(sub_agent=sub_agent))
    def run(trace: testing.Trace) -> None:
        testing.check_start(trace.created, *trace.start())
        for before, event, after, effects in trace.steps():
            testing.check_transition(before, event, after, effects)

    run()


def rejections_raise(budget: settings = BOUNDED) -> None:
    @budget
    @given(testing.conversations(sub_agent=False))
    def run(state: Conversation) -> None:
        for rejected in testing.rejections(state):
            try:
                transition(state, rejected.event)
            except rejected.error:
                continue
            raise AssertionError(f"invariant 'rejected' broken: {rejected.event} was accepted")

    run()


def terminals_absorb(budget: settings = BOUNDED) -> None:
    @budget
    @given(testing.terminal_conversations())
    def run(state: Conversation) -> None:
        after, effects = transition(state, CancelRequested())
        testing.check_transition(state, CancelRequested(), after, effects)

    run()


def whole_tree(budget: settings = BOUNDED) -> None:
    @budget
    @given(testing.limits(), st.data())
    def run(limits: Limits, data: st.DataObject) -> None:
        limits = attrs.evolve(limits, max_tokens=None, max_depth=1)
        world = World.with_root(limits, checked=False)
        world.apply("root", UserMessaged("go"))
        world.reply(("root", 0), first_reply(data))
        random_run(world, data, 30)
        world.drain()
        world.check_quiet()

    run()


# --------------------------------------------------------------------------- mutants


def _wrap(monkeypatch: pytest.MonkeyPatch, name: str, make: Callable[[Any], Any]) -> None:
    monkeypatch.setattr(TM, name, make(getattr(TM, name)))


def overshoot_max_concurrent(monkeypatch: pytest.MonkeyPatch) -> None:
    """_start_queued starts one child too many (an off-by-one in the limit check)."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, children: Children) -> Any:
            more = attrs.evolve(state.limits, max_concurrent=state.limits.max_concurrent + 1)
            new, children, effects = original(state.evolve(limits=more), children)
            return new.evolve(limits=state.limits), children, effects

        return mutant

    _wrap(monkeypatch, "_start_queued", make)


def shares_forget_the_spending(monkeypatch: pytest.MonkeyPatch) -> None:
    """Children's token shares are split from the whole budget, as if nothing had been
    spent or set aside yet: together they can exceed what is left."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, children: Children) -> Any:
            fresh = state.evolve(usage_input=0, usage_output=0, usage_children=0)
            unreserved = attrs.evolve(
                children, pending=tuple(attrs.evolve(p, budget=None) for p in children.pending)
            )
            new, started, effects = original(fresh, unreserved)
            kept = {p.spec.id: p.budget for p in children.pending}
            started = attrs.evolve(
                started,
                pending=tuple(
                    p
                    if p.spec.id not in kept or kept[p.spec.id] is None
                    else attrs.evolve(p, budget=kept[p.spec.id])
                    for p in started.pending
                ),
            )
            return (
                new.evolve(
                    usage_input=state.usage_input,
                    usage_output=state.usage_output,
                    usage_children=state.usage_children,
                ),
                started,
                effects,
            )

        return mutant

    _wrap(monkeypatch, "_start_queued", make)


def absorb_duplicate_outcomes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second outcome for a finished child is silently dropped instead of raising."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, event: Any) -> Any:
            children = state.children
            if children is not None and children.is_finished(event.child_id):
                return state, ()
            return original(state, event)

        return mutant

    _wrap(monkeypatch, "_on_child_finished", make)


def lose_an_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """Children.finish forgets to record the outcome it moves out of pending."""

    def finish(self: Children, child_id: str, outcome: Any) -> Children:
        return attrs.evolve(self, pending=tuple(p for p in self.pending if p.spec.id != child_id))

    monkeypatch.setattr(children_module.Children, "finish", finish)


def drop_early_finishers(monkeypatch: pytest.MonkeyPatch) -> None:
    """An outcome arriving while the parent still runs tools is dropped."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, event: Any) -> Any:
            if type(state.phase).__name__ == "ToolExecuting":
                return state, ()
            return original(state, event)

        return mutant

    _wrap(monkeypatch, "_on_child_finished", make)


def forget_notify_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """_apply_ending stops telling the parent."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, ending: Any, *rest: Any, **more: Any) -> Any:
            new, out = original(state, ending, *rest, **more)
            return new, tuple(e for e in out if not isinstance(e, NotifyParent))

        return mutant

    _wrap(monkeypatch, "_apply_ending", make)


def renotify_when_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel reaching an ended sub-agent notifies the parent a second time."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, event: Any) -> Any:
            if isinstance(event, CancelRequested):
                outcome = ChildFailed("cancelled", event.reason.error_kind, event.reason)
                return state, (NotifyParent(state.parent_id or "", state.id, outcome),)
            return original(state, event)

        return mutant

    _wrap(monkeypatch, "_in_terminal_phase", make)


def retry_once_too_often(monkeypatch: pytest.MonkeyPatch) -> None:
    """_on_model_failed compares attempts with <= instead of <."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, phase: Any, error: Any) -> Any:
            more = attrs.evolve(state.limits, max_attempts=state.limits.max_attempts + 1)
            new, effects = original(state.evolve(limits=more), phase, error)
            return new.evolve(limits=state.limits), effects

        return mutant

    _wrap(monkeypatch, "_on_model_failed", make)


def uncapped_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """_backoff forgets the retry_cap."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, attempt: int, error: Any, timer: int) -> Any:
            wide = attrs.evolve(state.limits, retry_cap=1e9)
            return original(state.evolve(limits=wide), attempt, error, timer)

        return mutant

    _wrap(monkeypatch, "_backoff", make)


def no_results_on_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelling ends the conversation without flushing the round's tool results."""

    def make(original: Any) -> Any:
        def mutant(*args: Any) -> Any:
            helpers = vars(TM)
            flush = helpers["_round_history"]
            helpers["_round_history"] = lambda state, results, children, history=None: (
                state.history if history is None else history
            )
            try:
                return original(*args)
            finally:
                helpers["_round_history"] = flush

        return mutant

    _wrap(monkeypatch, "_stop_children", make)


def results_out_of_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """_round_history appends the round's results in reverse order."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, results: Any, children: Any, *rest: Any) -> Any:
            history = original(state, results, children, *rest)
            before = rest[0] if rest and rest[0] is not None else state.history
            added = history[len(before) :]
            return (*before, *reversed(added))

        return mutant

    _wrap(monkeypatch, "_round_history", make)


def cancel_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel treats running children as if they never started: no CancelSubAgents,
    no waiting for acknowledgements."""

    def make(original: Any) -> Any:
        def mutant(state: Any, results: Any, children: Children, *rest: Any) -> Any:
            never = tuple(attrs.evolve(p, started=False) for p in children.pending)
            return original(state, results, attrs.evolve(children, pending=never), *rest)

        return mutant

    _wrap(monkeypatch, "_stop_children", make)


def spawn_beyond_max_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    """The depth rule is lost: every conversation may spawn."""
    monkeypatch.setattr(control_tools, "can_spawn", lambda depth, limits: True)
    monkeypatch.setattr(TM, "can_spawn", lambda depth, limits: True)


def absorb_never_issued_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """_current_or_stale treats a number never issued as merely stale."""
    monkeypatch.setattr(
        TM, "_current_or_stale", lambda state, event, number, current: number == current
    )


def resume_forgets_the_model_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """RuntimeResumed does not repeat the model call that was in flight."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, event: Any) -> Any:
            new, effects = original(state, event)
            return new, tuple(e for e in effects if type(e).__name__ != "CallModel")

        return mutant

    _wrap(monkeypatch, "_on_resume", make)


def uncapped_task_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's max_iterations is taken as asked, not capped by the parent's round
    limit (the bug of issue 10, item 9: a task asking for 1000 rounds got them)."""

    def make(original: Any) -> Any:
        def mutant(request: Any, limits: Limits) -> Any:
            timeout, _ = original(request, limits)
            return timeout, request.max_iterations or limits.max_rounds

        return mutant

    _wrap(monkeypatch, "_task_limits", make)


def cwd_not_confined(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's cwd is taken as given, absolute or with '..' (issue 10, item 3)."""
    original = control_tools.relative_cwd
    monkeypatch.setattr(
        control_tools,
        "relative_cwd",
        lambda cwd: cwd if isinstance(cwd, str) else original(cwd),
    )

    def join(parent: str, cwd: str | None) -> str:
        if cwd is None:
            return parent
        return cwd if cwd.startswith("/") else parent.rstrip("/") + "/" + cwd

    monkeypatch.setattr(TM, "join_cwd", join)


# The survivors of the mutation run (tests/README.md, "Mutation testing"), each as the bug it
# stands for, and the invariant of fanfold.testing that now catches it.

_TASK_FIELDS = {"task", "cwd", "timeout", "max_iterations", "model"}


def unknown_task_fields_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's unknown fields are ignored instead of refusing the task."""

    def make(original: Any) -> Any:
        def mutant(entry: Any, *modes: Any) -> Any:
            if isinstance(entry, dict):
                entry = {k: v for k, v in entry.items() if k in _TASK_FIELDS}
            return original(entry, *modes)

        return mutant

    _wrap(monkeypatch, "parse_task", make)


def one_round_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The boundary moves: ``max_iterations`` of 1 is refused (``<= 1`` for ``< 1``)."""

    def make(original: Any) -> Any:
        def mutant(entry: Any, *modes: Any) -> Any:
            if isinstance(entry, dict) and entry.get("max_iterations") == 1:
                return "'max_iterations' must be an integer >= 1"
            return original(entry, *modes)

        return mutant

    _wrap(monkeypatch, "parse_task", make)


def non_object_submitted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Valid JSON that is no object (``[...]``, ``"x"``, ``7``) is taken as a result."""

    def make(original: Any) -> Any:
        def mutant(call: ToolCall) -> Any:
            try:
                value = call.arguments()
            except ValueError:
                return original(call)
            if isinstance(value, dict):
                return original(call)
            return EndCompleted(call.arguments_json)

        return mutant

    _wrap(monkeypatch, "_submission", make)


def start_forgets_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """``start`` drops the model it was created with."""
    original = start

    def mutant(created: Any) -> Any:
        state, effects = original(created)
        return state.evolve(model=None), effects

    # Every module of fanfold.testing that runs ``start`` holds its own name for it.
    for module in (strategies, delegation, checks, table):
        monkeypatch.setattr(module, "start", mutant)


def child_created_without_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """``SpawnSubAgent.created_event`` forgets a field (the model)."""
    original = SpawnSubAgent.created_event

    def mutant(self: SpawnSubAgent, workdir: Any = None) -> Any:
        return attrs.evolve(original(self, workdir), model=None)

    monkeypatch.setattr(SpawnSubAgent, "created_event", mutant)


def written_off_for_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child written off at its deadline is not charged its share."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, children: Children, pending: Any) -> Any:
            return original(state, children, attrs.evolve(pending, budget=None))

        return mutant

    _wrap(monkeypatch, "_child_deadline", make)


def jitter_ignores_the_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every retry of a conversation gets the same jitter."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, attempt: int, error: Any, timer: int) -> Any:
            return original(state, attempt, error, 0)

        return mutant

    _wrap(monkeypatch, "_backoff", make)


def hint_of_zero_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``retry_after`` of 0 is taken for no hint (``> 0`` for ``>= 0``)."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, attempt: int, error: Any, timer: int) -> Any:
            if error.retry_after == 0:
                error = attrs.evolve(error, retry_after=None)
            return original(state, attempt, error, timer)

        return mutant

    _wrap(monkeypatch, "_backoff", make)


def backstop_ignores_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's backstop counts the levels from the root, not from the parent."""
    monkeypatch.setattr(
        TM,
        "_backstop_grace",
        lambda state: state.limits.cancel_grace * max(1, state.limits.max_depth),
    )


def budget_ending_without_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sub-agent out of tokens ends ``budget_exhausted`` with no reason."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, ending: Any, *rest: Any, **more: Any) -> Any:
            if isinstance(ending, EndFailed) and ending.kind is ErrorKind.BUDGET_EXHAUSTED:
                ending = attrs.evolve(ending, reason=None)
            return original(state, ending, *rest, **more)

        return mutant

    _wrap(monkeypatch, "_apply_ending", make)


def fan_in_in_finish_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fan-in lists children in the order they finished, not were spawned."""
    monkeypatch.setattr(children_module, "spawn_order", lambda child_id: (0, ""))


def exact_budget_not_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spending exactly the token budget does not count as spent (``>`` for ``>=``)."""

    def make(original: Any) -> Any:
        def mutant(state: Conversation, phase: Any, event: Any) -> Any:
            budget = state.limits.max_tokens
            if budget is None:
                return original(state, phase, event)
            more = attrs.evolve(state.limits, max_tokens=budget + 1)
            new, effects = original(state.evolve(limits=more), phase, event)
            return new.evolve(limits=state.limits), effects

        return mutant

    _wrap(monkeypatch, "_on_model_replied", make)


@attrs.frozen
class Mutant:
    patch: Patch
    detector: Callable[[], None]
    caught_by: str  # a regex the failure message must match

    def __str__(self) -> str:
        return self.patch.__name__


MUTANTS = [
    # The mutant also hands the raised limit down to the children it starts.
    Mutant(
        overshoot_max_concurrent,
        every_step_checked,
        "concurrency limit|never exceeds its parent's limits",
    ),
    Mutant(shares_forget_the_spending, every_step_checked, "more than the budget"),
    Mutant(absorb_duplicate_outcomes, rejections_raise, "SubAgentFinished.*was accepted"),
    # Caught by whichever bookkeeping invariant the lost outcome trips first.
    Mutant(
        lose_an_outcome,
        every_step_checked,
        "fan-in|outcome|tools run in order|every tool done|rejected tasks",
    ),
    Mutant(drop_early_finishers, every_step_checked, "an accepted outcome is recorded"),
    Mutant(drop_early_finishers, whole_tree, "still waits|for Child"),
    Mutant(
        forget_notify_parent,
        lambda: every_step_checked(sub_agent=True),
        # A sub-agent refused its directory at start would not notify either.
        "notifies the parent once|never works outside its parent's directory",
    ),
    Mutant(renotify_when_ended, terminals_absorb, "terminal phases are terminal"),
    Mutant(retry_once_too_often, every_step_checked, "retries bounded"),
    Mutant(uncapped_backoff, every_step_checked, "backoff capped|timers run as long"),
    Mutant(no_results_on_cancel, every_step_checked, "history valid|without results"),
    Mutant(results_out_of_order, every_step_checked, "history valid"),
    # Either check names this bug, whichever generated run meets it first: a running
    # child dropped without a cancel, or a running child no longer counted as running.
    Mutant(
        cancel_without_waiting,
        every_step_checked,
        "dropped without an AbortCall|spawned children are running",
    ),
    Mutant(cancel_without_waiting, whole_tree, "left .* running|unknown agent"),
    Mutant(spawn_beyond_max_depth, every_step_checked, "depth limit"),
    Mutant(absorb_never_issued_numbers, rejections_raise, "was accepted"),
    Mutant(
        uncapped_task_limits,
        every_step_checked,
        "never exceeds its parent's limits|max_rounds within the parent's",
    ),
    Mutant(cwd_not_confined, every_step_checked, "inside its parent's cwd|not inside the parent's"),
    Mutant(resume_forgets_the_model_call, every_step_checked, "re-issues everything|fresh numbers"),
    Mutant(unknown_task_fields_dropped, every_step_checked, "accepts exactly its valid tasks"),
    Mutant(one_round_refused, every_step_checked, "accepts exactly its valid tasks"),
    Mutant(non_object_submitted, lambda: every_step_checked(sub_agent=True), "submission"),
    Mutant(start_forgets_the_model, every_step_checked, "starts as created"),
    Mutant(child_created_without_its_model, every_step_checked, "field by field"),
    Mutant(written_off_for_free, every_step_checked, "charged once"),
    Mutant(jitter_ignores_the_timer, every_step_checked, "timers run as long"),
    Mutant(hint_of_zero_ignored, every_step_checked, "timers run as long"),
    Mutant(
        backstop_ignores_depth, lambda: every_step_checked(sub_agent=True), "timers run as long"
    ),
    Mutant(
        budget_ending_without_reason,
        lambda: every_step_checked(sub_agent=True),
        "reason fits its kind",
    ),
    Mutant(fan_in_in_finish_order, every_step_checked, "in spawn order"),
    Mutant(exact_budget_not_spent, every_step_checked, "token budget is spent"),
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=str)
def test_the_checks_catch_the_mutant(mutant: Mutant, monkeypatch: pytest.MonkeyPatch) -> None:
    mutant.patch(monkeypatch)
    with pytest.raises((AssertionError, IllegalTransition)) as caught:
        mutant.detector()
    assert re.search(mutant.caught_by, str(caught.value)), str(caught.value)[:2000]


@pytest.mark.parametrize("detector", [rejections_raise, terminals_absorb, whole_tree])
def test_the_detectors_pass_on_the_real_reducer(detector: Callable[[settings], None]) -> None:
    # A sanity check that they fail only because of the mutants; the real properties
    # (test_sm_properties) run the same checks with the profile's example count.
    detector(settings(BOUNDED, max_examples=50))


def test_the_step_detector_passes_on_the_real_reducer() -> None:
    every_step_checked(budget=settings(BOUNDED, max_examples=50))


def test_mutants_leave_the_real_reducer_alone() -> None:
    # monkeypatch undid every mutant: the module's helpers are the originals again.
    assert TM._start_queued.__module__ == "fanfold.statemachine.transition"
    assert children_module.Children.finish.__qualname__ == "Children.finish"
    assert control_tools.can_spawn(1, Limits()) is False
    _ = ChildSucceeded
