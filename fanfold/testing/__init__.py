"""Property-test fanfold's reducer: Hypothesis strategies and invariant checks.

Use this package to test the reducer, or a rule you add to it (a reducer of your own
wrapping ``fanfold.statemachine.transition``)::

    from hypothesis import given

    from fanfold import testing


    @given(testing.event_sequences(transition=my_transition))
    def test_my_rule_keeps_every_invariant(trace: testing.Trace) -> None:
        testing.check_trace(trace)

Every strategy and every check that runs a reducer takes the reducer under test as
``transition=`` (fanfold's by default): the strategies draw only events it accepts,
from the states it reaches, and drop (and count, ``refused_draws``) those it refuses;
if it refuses everything they can draw in a state that has not ended, they raise
``NothingAccepted`` naming the state instead of spinning.

Strategies (all generate values the reducer under test can be fed):

- ``limits()``, ``conversation_created()``: small limits, so that queues, retries,
  grace rounds and budgets are reached in a few steps;
- ``model_replies(state)``, ``model_errors()``, ``child_outcomes()``: the pieces of
  events;
- ``each_plausible_event(state, seed)``: one of each kind of plausible event, without
  Hypothesis (for seeded walks);
- ``plausible_events(state)``: an event that could really arrive next (a reply to
  the call in flight, a result of the running tool, an outcome of a running child,
  a timer that is set, a cancel, a restart notice, a late result of an earlier call
  or of a written-off child);
- ``stale_events(state)`` (when ``has_stale_events(state)``): late results the reducer
  must absorb without effects;
- ``rejections(state)`` / ``rejected_events(state)``: events it must refuse, each
  with the exception expected;
- ``event_sequences()``: a ``Trace`` of accepted events from ``start`` (its repr is
  runnable Python, ready to paste into a regression test);
- ``conversations()``, ``terminal_conversations()``: reachable states (sub-agents still
  at work, children being cancelled and written off, come often).

To drive a state step by step instead, draw ``plausible_events(state)`` with
``st.data()`` and check each step with ``check_transition``.

Checks (each raises ``AssertionError`` naming the broken invariant):

- ``check_invariants(state)``: what holds in every reachable state;
- ``check_start(created, state, effects)``: what ``start`` must produce;
- ``check_transition(before, event, after, effects)``: what holds for every step;
- ``check_rejections(state)``: every event of ``rejections(state)`` is refused;
- ``check_late_events(state)``: every event of ``late_events(state)`` is absorbed;
- ``check_trace(trace)``: all of the above over a whole trace (the recipe);
- ``check_table()`` / ``table_report()``: which (phase, event type) cells the reducer
  handles and which it refuses, against the documented table (DESIGN.md).

The checks take tool call ids to be unique within one model reply (providers
guarantee it, and reject requests that break it); ``live_numbers(state)`` and
``state.children`` expose the bookkeeping they rely on.

The package's modules: ``strategies`` (the generators, ``Trace``), ``invariants``
(``check_invariants``, ``check_start``), ``delegation`` (the sub-agents' step checks),
``checks`` (``check_transition``, rejections, late events, ``check_trace``) and
``table`` (the observed transition table); each imports only those before it. Every
name above is importable from ``fanfold.testing`` itself.

This package imports Hypothesis (a dependency of fanfold); ``fanfold.statemachine``
never imports it.
"""

from __future__ import annotations

from fanfold.testing.checks import (
    Rejected,
    check_late_events,
    check_rejections,
    check_trace,
    check_transition,
    late_events,
    rejected_events,
    rejections,
)
from fanfold.testing.checks import (
    expected_backoff as expected_backoff,
)
from fanfold.testing.invariants import (
    ExpectedChild as ExpectedChild,
)
from fanfold.testing.invariants import (
    check_invariants,
    check_start,
)
from fanfold.testing.strategies import (
    ASKING_TOOLS as ASKING_TOOLS,
)
from fanfold.testing.strategies import (
    ORDINARY_TOOLS,
    NothingAccepted,
    Reducer,
    Step,
    Trace,
    child_outcomes,
    conversation_created,
    conversations,
    each_plausible_event,
    event_sequences,
    has_stale_events,
    limits,
    live_numbers,
    model_errors,
    model_replies,
    plausible_events,
    refused_draws,
    stale_events,
    terminal_conversations,
)
from fanfold.testing.strategies import (
    Effects as Effects,
)
from fanfold.testing.table import (
    TableReport,
    TableStep,
    check_table,
    observe_step,
    table_report,
)

__all__ = [
    "ORDINARY_TOOLS",
    "NothingAccepted",
    "Reducer",
    "Rejected",
    "Step",
    "TableReport",
    "TableStep",
    "Trace",
    "check_invariants",
    "check_late_events",
    "check_rejections",
    "check_start",
    "check_table",
    "check_trace",
    "check_transition",
    "child_outcomes",
    "conversation_created",
    "conversations",
    "each_plausible_event",
    "event_sequences",
    "has_stale_events",
    "late_events",
    "limits",
    "live_numbers",
    "model_errors",
    "model_replies",
    "observe_step",
    "plausible_events",
    "refused_draws",
    "rejected_events",
    "rejections",
    "stale_events",
    "table_report",
    "terminal_conversations",
]
