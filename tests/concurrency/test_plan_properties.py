"""Properties of the group plan over generated groups: what it may touch, that Queue and
Replace never exceed maxRunning, that Replace leaves at most one run pending (the newest), and
that carrying the actions out converges (a second look is empty)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from coschedule.concurrency.control import parse_control
from coschedule.concurrency.plan import (
    Action,
    CancelRun,
    Group,
    GroupKey,
    MarkWaiting,
    StartRun,
    expired,
    plan,
)
from coschedule.concurrency.runs import Run, State
from coschedule.engines import SLOTTED, Kind, Order, Overflow, Strategy
from tests.concurrency.runs import control

KEY = GroupKey("ci", "ci", "k")
NOW = 10.0  # runs are created at 1-4: a maxWaitSeconds of 1-12 has passed for some
WAITING = "coschedule.dev/waiting"
DATA = "coschedule.dev/waiting-data"
STATES = [State.PENDING_BY_US, State.PENDING_BY_AUTHOR, State.RUNNING, State.STOPPING, State.DONE]


@st.composite
def groups(draw: st.DrawFn) -> Group:
    strategy = draw(st.sampled_from(list(Strategy)))
    spec: dict[str, object] = {"selector": {}, "strategy": strategy.value}
    spec["maxRunning"] = draw(st.integers(1, 4))
    if strategy is Strategy.QUEUE:
        spec["order"] = draw(st.sampled_from(list(Order)))
        if draw(st.booleans()):
            spec["priority"] = "$(labels.priority)"
        if draw(st.booleans()):
            spec["maxPending"] = draw(st.integers(0, 3))
            spec["overflow"] = draw(st.sampled_from(list(Overflow)))
    if strategy in SLOTTED and draw(st.booleans()):
        spec["maxWaitSeconds"] = draw(st.integers(1, 12))
    ctl = parse_control(control("ci", spec))
    count = draw(st.integers(0, 8))
    runs = []
    for i in range(count):
        runs.append(
            Run(
                kind=draw(st.sampled_from(list(Kind))),
                namespace="ci",
                name=f"r{i}",
                uid=f"u{i}",
                resource_version="1",
                created="",
                labels={"concurrency.coschedule.dev/ci": "k"},
                annotations={"priority.coschedule.dev/ci": str(draw(st.integers(-1, 2)))},
                state=draw(st.sampled_from(STATES)),
                created_at=float(draw(st.integers(1, 4))),  # ties: the name decides
            )
        )
    return Group(KEY, ctl, tuple(runs))


def carry_out(group: Group, actions: list[Action]) -> Group:
    """The runs as the patches leave them."""
    after = {r.ident: r for r in group.runs}
    for action in actions:
        run = action.run
        annotations = {k: v for k, v in run.annotations.items() if k not in (WAITING, DATA)}
        if isinstance(action, MarkWaiting):
            after[run.ident] = dataclasses.replace(
                run, annotations={**annotations, WAITING: action.why, DATA: action.data}
            )
            continue
        state = State.RUNNING if isinstance(action, StartRun) else State.STOPPING
        after[run.ident] = dataclasses.replace(run, state=state, annotations=annotations)
    return dataclasses.replace(group, runs=tuple(after.values()))


@settings(max_examples=300, deadline=None)
@given(groups())
def test_what_a_plan_may_touch(group: Group) -> None:
    actions = plan(KEY, {KEY: group}, NOW)
    starts = [a.run for a in actions if isinstance(a, StartRun)]
    cancels = [a.run for a in actions if isinstance(a, CancelRun)]
    assert all(r.state is State.PENDING_BY_US for r in starts)
    assert all(r.state in (State.RUNNING, State.PENDING_BY_US) for r in cancels)
    marked = [a.run for a in actions if isinstance(a, MarkWaiting)]
    assert not {r.ident for r in starts} & {r.ident for r in cancels}
    # Only a run that stays pending by us is told why it waits.
    assert all(r.state is State.PENDING_BY_US for r in marked)
    assert not {r.ident for r in marked} & ({r.ident for r in starts} | {r.ident for r in cancels})
    assert group.control is not None
    control = group.control
    running = sum(1 for r in group.runs if r.state in (State.RUNNING, State.STOPPING))
    waiting = sorted(
        (r for r in group.runs if r.state is State.PENDING_BY_US), key=lambda r: r.order
    )
    if control.strategy in SLOTTED:
        # Never more than maxRunning running (runs already over it are left to finish).
        assert running + len(starts) <= max(running, control.max_running)
        if control.strategy is Strategy.QUEUE:
            # Queue cancels only runs that wait: past maxPending, or past maxWaitSeconds.
            assert all(r.state is State.PENDING_BY_US for r in cancels)
            for run in cancels:
                assert control.max_pending is not None or expired(control, run, NOW)
            if control.order is Order.NEWEST_FIRST:
                waiting.reverse()
            if control.priority is not None:
                waiting.sort(key=lambda r: -r.priority_of("ci"))
            # In order, no skipping (the actions themselves come oldest first).
            assert {r.ident for r in starts} == {r.ident for r in waiting[: len(starts)]}
            left = [r for r in waiting if r not in starts and r not in cancels]
            if control.max_pending is not None:
                assert len(left) <= control.max_pending
            assert not any(expired(control, r, NOW) for r in left)
        else:
            assert all(r.state is State.PENDING_BY_US for r in cancels)  # running: never
            assert starts == waiting[: len(starts)]  # oldest first, no skipping
            left = [r for r in waiting if r not in starts and r not in cancels]
            assert len(left) <= 1
            if cancels and not left:
                assert expired(control, waiting[-1], NOW)  # the newest timed out
            elif cancels:
                assert left == [waiting[-1]]  # the newest is the one kept
    else:
        # Limit plus supersede: only the maxRunning newest start; a run is cancelled only
        # when maxRunning newer runs exist.
        n = control.max_running
        assert len(starts) <= n
        contenders = sorted(
            (r for r in group.runs if r.state is not State.PENDING_BY_AUTHOR),
            key=lambda r: r.order,
            reverse=True,
        )
        for run in starts:
            assert run in contenders[:n]
        for run in cancels:
            assert run not in contenders[:n]
        # Afterwards at most maxRunning run (stopping ones are on their way out).
        running_after = sum(1 for r in group.runs if r.state is State.RUNNING) - len(
            [r for r in cancels if r.state is State.RUNNING]
        )
        assert running_after + len(starts) <= n


@settings(max_examples=300, deadline=None)
@given(groups())
def test_carrying_out_a_plan_converges(group: Group) -> None:
    actions = plan(KEY, {KEY: group}, NOW)
    after = carry_out(group, actions)
    assert plan(KEY, {KEY: after}, NOW) == []


@settings(max_examples=300, deadline=None)
@given(groups())
def test_after_one_plan_replace_holds_at_most_one_run_pending(group: Group) -> None:
    assert group.control is not None
    after = carry_out(group, plan(KEY, {KEY: group}, NOW))
    pending = [r for r in after.runs if r.state is State.PENDING_BY_US]
    if group.control.strategy is Strategy.REPLACE:
        assert len(pending) <= 1
    if group.control.max_pending is not None:
        assert len(pending) <= group.control.max_pending
    if group.control.strategy in SLOTTED and pending:
        assert not any(expired(group.control, r, NOW) for r in pending)
        # A run is left waiting only when the group is full.
        running = sum(1 for r in after.runs if r.state in (State.RUNNING, State.STOPPING))
        assert running >= group.control.max_running


@settings(max_examples=300, deadline=None)
@given(groups())
def test_every_held_run_says_why_it_waits_and_a_second_look_writes_nothing(group: Group) -> None:
    assert group.control is not None
    after = carry_out(group, plan(KEY, {KEY: group}, NOW))
    for run in after.runs:
        if run.state is State.PENDING_BY_US:
            assert group.control.strategy in SLOTTED  # the others start or cancel at once
            assert run.annotations[WAITING].startswith("waiting: ")
        else:
            assert WAITING not in run.annotations or run.state is State.PENDING_BY_AUTHOR
    # The reconciler restarted, or another replica leads: same runs, same plan: nothing.
    assert plan(KEY, {KEY: after}, NOW) == []
