"""Properties of the group plan over generated groups: what it may touch, that Queue and
Replace never exceed maxRunning, that Replace leaves at most one run pending (the newest), and
that carrying the actions out converges (a second look is empty)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from coschedule.concurrency.control import parse_control
from coschedule.concurrency.plan import (
    Action,
    CancelRun,
    Group,
    GroupKey,
    MarkWaiting,
    StartRun,
    control_status,
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


# ---- random interleavings: arrivals, completions, deletions, leader changes, control edits


CONTROL_SPECS: list[dict[str, object]] = [
    {"selector": {}, "strategy": "Queue", "maxRunning": 1},
    {"selector": {}, "strategy": "Queue", "maxRunning": 2, "order": "newest-first"},
    {"selector": {}, "strategy": "Queue", "maxPending": 1, "overflow": "CancelOldest"},
    {"selector": {}, "strategy": "Queue", "maxWaitSeconds": 5, "priority": "$(labels.p)"},
    {"selector": {}, "strategy": "Replace", "maxRunning": 1},
    {"selector": {}, "strategy": "GracefullyCancel", "maxRunning": 2},
    {"selector": {"matchLabels": {"other": "x"}}, "strategy": "Queue"},  # selects nothing
]


class Interleavings(RuleBasedStateMachine):
    """A namespace's runs of one group and the reconciler's plans, carried out as the API
    server would: each patch carries the version it was decided on, so a plan made on a
    stale view (a lagging cache, a replica that lost the lease) fails on any run that changed
    since (409) and is simply made again later. After every step the group is settled by a
    fresh leader, and then: no slot is leaked, no finished run is counted, no run is left
    pending by coschedule with nothing to wait for, and no run is started twice."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[str, Run] = {}
        self.versions: dict[str, int] = {}
        self.control: dict[str, object] | None = CONTROL_SPECS[0]
        self.stale: dict[str, Run] | None = None
        self.now = 100.0
        self.count = 0
        self.starts: dict[str, int] = {}

    def _group(self, runs: dict[str, Run]) -> Group:
        ctl = parse_control(control("ci", self.control)) if self.control is not None else None
        return Group(KEY, ctl, tuple(sorted(runs.values(), key=lambda r: r.ident)))

    def _put(self, run: Run) -> None:
        self.versions[run.ident] = self.versions.get(run.ident, 0) + 1
        self.runs[run.ident] = dataclasses.replace(
            run, resource_version=str(self.versions[run.ident])
        )

    def _carry_out(self, view: dict[str, Run]) -> int:
        """Plan on ``view`` and apply what the API server accepts; the number applied."""
        applied = 0
        for action in plan(KEY, {KEY: self._group(view)}, self.now):
            current = self.runs.get(action.run.ident)
            if current is None or current.resource_version != action.run.resource_version:
                continue  # 404 or 409: decided on a stale view
            (after,) = carry_out(Group(KEY, None, (current,)), [action]).runs
            if isinstance(action, StartRun):
                self.starts[after.ident] = self.starts.get(after.ident, 0) + 1
            self._put(after)
            applied += 1
        return applied

    @rule(kind=st.sampled_from(list(Kind)), priority=st.integers(0, 2))
    def arrive(self, kind: Kind, priority: int) -> None:
        self.count += 1
        self.now += 1
        annotations = {"coschedule.dev/pending-by": "concurrency"}
        ctl = self._group({}).control
        if ctl is not None and ctl.priority is not None:
            annotations["priority.coschedule.dev/ci"] = str(priority)
        self._put(
            Run(
                kind=kind,
                namespace="ci",
                name=f"r{self.count}",
                uid=f"u{self.count}",
                resource_version="0",
                created="",
                labels={"concurrency.coschedule.dev/ci": "k", "p": str(priority)},
                annotations=annotations,
                state=State.PENDING_BY_US,
                created_at=self.now,
            )
        )

    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """The engine ends a run that runs or stops (a cancelled one too)."""
        live = sorted(i for i, r in self.runs.items() if r.state in (State.RUNNING, State.STOPPING))
        if live:
            ident = data.draw(st.sampled_from(live))
            self._put(dataclasses.replace(self.runs[ident], state=State.DONE))

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        if self.runs:
            del self.runs[data.draw(st.sampled_from(sorted(self.runs)))]

    @rule()
    def old_view(self) -> None:
        """A replica's cache, or a leader about to lose the lease, keeps this view."""
        self.stale = dict(self.runs)

    @rule()
    def stale_leader_acts(self) -> None:
        if self.stale is not None:
            self._carry_out(self.stale)

    @rule(spec=st.sampled_from([*CONTROL_SPECS, None]))
    def edit_control(self, spec: dict[str, object] | None) -> None:
        self.control = spec

    @rule(seconds=st.integers(1, 10))
    def time_passes(self, seconds: int) -> None:
        self.now += seconds

    @invariant()
    def a_fresh_leader_settles_the_group_leak_free(self) -> None:
        for _ in range(20):
            if not self._carry_out(dict(self.runs)):
                break
        else:
            raise AssertionError("the plans never settle")
        group = self._group(self.runs)
        assert plan(KEY, {KEY: group}, self.now) == []
        assert all(count == 1 for count in self.starts.values()), self.starts
        ctl = group.control
        held = [r for r in group.runs if ctl is not None and ctl.holds(r.kind, r.labels)]
        pending = [r for r in group.runs if r.state is State.PENDING_BY_US]
        running = [r for r in held if r.state in (State.RUNNING, State.STOPPING)]
        # No pending run never removed: only a slotted control that holds it keeps it.
        if ctl is None or ctl.strategy not in SLOTTED:
            assert not pending
        else:
            assert all(r in held for r in pending)
            # No slot leak: a run waits only while the group is full.
            if pending:
                assert len(running) >= ctl.max_running
            if ctl.max_pending is not None:
                assert len(pending) <= ctl.max_pending
            assert not any(expired(ctl, r, self.now) for r in pending)
        # No terminated run counted.
        if ctl is not None:
            status = control_status(ctl, [group])
            assert status["running"] == len(running)
            assert status["pending"] == len(pending)


Interleavings.TestCase.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)
test_random_interleavings_leak_nothing = Interleavings.TestCase
