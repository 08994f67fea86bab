"""A Hypothesis state machine driving a parent and its children (and grandchildren)
through random spawns, results, failures, cancels, timeouts, retries, tool results,
restarts and stale or bogus events, with the invariants checked after every step."""

from __future__ import annotations

from collections import Counter

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from sm_support import Effects, World, spawn

from fanfold import testing
from fanfold.statemachine import (
    CancelReason,
    CancelRequested,
    Error,
    Event,
    Idle,
    Limits,
    ModelError,
    ModelReply,
    SubAgentFinished,
    UserMessaged,
    transition,
)


class CountingWorld(World):
    """A World that also counts the outcomes each parent accepted, per child."""

    accepted: Counter[str]

    def __init__(self, *, checked: bool = True) -> None:
        super().__init__(checked=checked)
        self.accepted = Counter()

    def apply(self, cid: str, event: Event) -> Effects:
        before = self.convs[cid]
        effects = super().apply(cid, event)
        if isinstance(event, SubAgentFinished) and event.child_id not in before.written_off:
            self.accepted[event.child_id] += 1
        return effects


class ConversationTree(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._world: CountingWorld | None = None

    @property
    def world(self) -> CountingWorld:
        assert self._world is not None
        return self._world

    # ------------------------------------------------------------------ setup

    @initialize(limits=testing.limits(), tasks=st.integers(1, 5), depth=st.integers(1, 2))
    def a_parent_spawns_children(self, limits: Limits, tasks: int, depth: int) -> None:
        limits = attrs.evolve(limits, max_depth=depth, max_tokens=None)
        world = CountingWorld.with_root(limits)
        assert isinstance(world, CountingWorld)
        self._world = world
        world.apply("root", UserMessaged("review the project"))
        first = spawn("first", *[f"part {i}" for i in range(tasks)])
        world.reply(("root", 0), ModelReply("delegating", (first,)))

    # ------------------------------------------------------------------ rules

    def _live(self) -> list[str]:
        return sorted(c for c, s in self.world.convs.items() if not s.is_terminal)

    @precondition(lambda self: bool(self.world.models))
    @rule(data=st.data())
    def a_model_replies(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.world.models)))
        self.world.reply(key, data.draw(testing.model_replies(self.world.convs[key[0]])))

    @precondition(lambda self: bool(self.world.models))
    @rule(data=st.data(), error=testing.model_errors())
    def a_model_call_fails(self, data: st.DataObject, error: ModelError) -> None:
        self.world.fail(data.draw(st.sampled_from(sorted(self.world.models))), error)

    @precondition(lambda self: bool(self.world.tools))
    @rule(data=st.data(), is_error=st.booleans())
    def a_tool_finishes(self, data: st.DataObject, is_error: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.world.tools)))
        self.world.finish_tool(key, "output", is_error)

    @precondition(lambda self: bool(self.world.timers))
    @rule(data=st.data())
    def a_timer_fires(self, data: st.DataObject) -> None:
        """Retry backoffs, children's deadlines, cancel grace, own time limits."""
        self.world.fire(data.draw(st.sampled_from(sorted(self.world.timers))))

    @precondition(lambda self: any(isinstance(e, SubAgentFinished) for _, e in self.world.mail))
    @rule(data=st.data())
    def a_child_reports_to_its_parent(self, data: st.DataObject) -> None:
        reports = [i for i, (_, e) in enumerate(self.world.mail) if isinstance(e, SubAgentFinished)]
        self.world.deliver_mail(data.draw(st.sampled_from(reports)))

    @precondition(lambda self: any(isinstance(e, CancelRequested) for _, e in self.world.mail))
    @rule(data=st.data())
    def a_cancel_reaches_a_child(self, data: st.DataObject) -> None:
        cancels = [i for i, (_, e) in enumerate(self.world.mail) if isinstance(e, CancelRequested)]
        self.world.deliver_mail(data.draw(st.sampled_from(cancels)))

    @precondition(lambda self: bool(self.world.late))
    @rule(data=st.data())
    def a_late_result_arrives(self, data: st.DataObject) -> None:
        """A result of a call or timer that was aborted: must be absorbed."""
        index = data.draw(st.integers(0, len(self.world.late) - 1))
        cid, _ = self.world.late[index]
        before = self.world.convs[cid]
        self.world.deliver_late(index)
        assert self.world.convs[cid] == before

    @rule()
    def the_user_cancels(self) -> None:
        self.world.apply("root", CancelRequested(CancelReason.USER))

    @rule(data=st.data(), reason=st.sampled_from(list(CancelReason)))
    def something_cancels_a_conversation(self, data: st.DataObject, reason: CancelReason) -> None:
        """A limit, a time limit or a parent, delivered by the runtime directly."""
        self.world.apply(data.draw(st.sampled_from(self._live())), CancelRequested(reason))

    @precondition(lambda self: isinstance(self.world.root.phase, Idle | Error))
    @rule(text=st.sampled_from(["and now?", "again"]))
    def the_user_sends_a_message(self, text: str) -> None:
        self.world.apply("root", UserMessaged(text))

    @rule(data=st.data())
    def the_runtime_restarts(self, data: st.DataObject) -> None:
        self.world.restart(data.draw(st.sampled_from(self._live())))

    @rule(data=st.data())
    def a_bogus_outcome_is_rejected_and_changes_nothing(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.world.convs)))
        state = self.world.convs[cid]
        bogus = [r for r in testing.rejections(state) if isinstance(r.event, SubAgentFinished)]
        rejected = data.draw(st.sampled_from(bogus))
        with pytest.raises(rejected.error):
            transition(state, rejected.event)
        assert self.world.convs[cid] is state

    @rule(data=st.data())
    def a_stale_event_is_absorbed(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.world.convs)))
        state = self.world.convs[cid]
        if testing.has_stale_events(state):
            event = data.draw(testing.stale_events(state))
            assert transition(state, event) == (state, ())

    # ------------------------------------------------------------------ invariants

    @invariant()
    def every_conversation_keeps_its_invariants(self) -> None:
        # check_invariants on each conversation, a terminal one never changes again,
        # NotifyParent once per ended child, live children within max_concurrent.
        self.world.check()

    @invariant()
    def fan_in_conservation(self) -> None:
        for state in self.world.convs.values():
            children = state.children
            if children is None:
                continue
            ids = [*children.pending_ids(), *(f.spec.id for f in children.finished)]
            first = state.spawned - len(ids) + 1
            assert sorted(ids) == sorted(f"{state.id}.{k}" for k in range(first, first + len(ids)))
            assert children.running <= state.limits.max_concurrent

    @invariant()
    def a_childs_outcome_is_accepted_at_most_once(self) -> None:
        assert all(n == 1 for n in self.world.accepted.values()), self.world.accepted

    @invariant()
    def depth_is_limited(self) -> None:
        for state in self.world.convs.values():
            assert state.depth <= state.limits.max_depth

    @invariant()
    def terminal_conversations_notified_their_parent_once(self) -> None:
        for cid, state in self.world.convs.items():
            assert self.world.notices[cid] == (1 if state.is_terminal else 0)

    def teardown(self) -> None:
        if self._world is None:
            return
        self.world.drain()
        self.world.check()
        self.world.check_quiet()


# Each example is up to 40 steps of a whole tree: half the profile's examples keep
# CI within its time budget.
ConversationTree.TestCase.settings = settings(
    max_examples=max(10, settings().max_examples // 2), stateful_step_count=40
)
TestConversationTree = ConversationTree.TestCase
