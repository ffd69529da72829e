"""The reconciler's decision for one group (namespace, control, key): which runs start and
which are cancelled. Pure: observed runs and controls in, actions out.

- ``Cancel``, ``GracefullyCancel``, ``GracefullyStop``: the ``maxRunning`` newest runs
  (creation time, then name; 1 by default) may start; every older run that is running or
  pending by us is cancelled with the strategy's value (limit plus supersede). Finished and
  stopping runs are never touched; runs their authors made pending are never started, never
  cancelled, and never count as "newer" (they may never start).
- ``Queue``: the oldest runs pending by us (the newest with ``order: newest-first``) may start
  while fewer than ``maxRunning`` runs of the group are running (a stopping run still runs);
  nothing is cancelled.
- ``Replace``: as Queue, oldest first, but at most one run stays pending, the newest: older
  runs pending by us that may not start are cancelled (superseded). Running runs are never
  cancelled.
- A run in several groups starts only when every group that holds it lets it, and none
  cancels it. A group whose control is gone, or no longer selects the run, holds nothing:
  its runs pending by us start (never stranded).
- A run that stays pending by us gets why, on itself (annotation ``coschedule.dev/waiting``,
  written only when it changes): its place in the queue of the first group (by control name)
  that holds it back, and the run ahead of it. It is a function of the runs alone, so a
  restart or another replica computes the same text, and planning again writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from coschedule.concurrency.control import Control
from coschedule.concurrency.runs import Run, State
from coschedule.engines import SLOTTED, Order, Overflow, Strategy, run_control
from coschedule.marks import ANNOTATION_WAITING, ANNOTATION_WAITING_DATA


@dataclass(frozen=True, slots=True, order=True)
class GroupKey:
    namespace: str
    control: str
    value: str

    def __str__(self) -> str:
        # Label values and control names hold no "/": the string splits back unambiguously.
        return f"{self.namespace}/{self.control}/{self.value}"

    @classmethod
    def parse(cls, text: str) -> GroupKey:
        namespace, control, value = text.split("/", 2)
        return cls(namespace, control, value)


@dataclass(frozen=True, slots=True)
class Group:
    key: GroupKey
    control: Control | None  # None: the control is gone
    runs: tuple[Run, ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    held: frozenset[str]  # runs (by ident) the group's control holds
    allowed: frozenset[str]  # held runs this group lets start
    # run -> (cancel value, the newer run's name, why when more than "newer run <name>")
    cancels: Mapping[str, tuple[str, str, str]]
    running: int = 0
    waiting: Mapping[str, str] = field(default_factory=dict)  # held back run -> why
    # held back run -> the same as data (JSON: place, the runs ahead and their states)
    waiting_data: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CancelRun:
    run: Run
    value: str
    strategy: Strategy
    control: str
    newer: str
    key: str
    reason: str = ""  # why, when not only "newer run <newer>" (the Event says it)

    @property
    def why(self) -> str:
        return self.reason or f"newer run {self.newer}"


@dataclass(frozen=True, slots=True)
class StartRun:
    run: Run
    control: str
    why: str


@dataclass(frozen=True, slots=True)
class MarkWaiting:
    """Write why the run still waits (it changed): annotations (text and data) and one
    Event (when the text changed)."""

    run: Run
    why: str
    data: str = ""


Action = CancelRun | StartRun | MarkWaiting
VerdictOf = Callable[[GroupKey], Verdict | None]


def held_runs(group: Group) -> list[Run]:
    control = group.control
    if control is None:
        return []
    return [r for r in group.runs if control.holds(r.kind, r.labels)]


def verdict(group: Group, now: float | None = None) -> Verdict:
    control = group.control
    held = held_runs(group)
    names = frozenset(r.ident for r in held)
    if control is None or not held:
        return Verdict(names, frozenset(), {})
    if control.strategy in SLOTTED:
        return _slotted(control, held, names, now)
    contenders = sorted(
        (r for r in held if r.state is not State.PENDING_BY_AUTHOR),
        key=lambda r: r.order,
        reverse=True,
    )
    if not contenders:
        return Verdict(names, frozenset(), {})
    # The maxRunning newest are kept (1 by default: the newest alone); every older one that
    # runs or waits is superseded, so at most maxRunning run and an arrival at the limit
    # cancels the oldest running run.
    kept, older = contenders[: control.max_running], contenders[control.max_running :]
    newest = contenders[0]
    limit = (
        f"newer run {newest.name}; maxRunning {control.max_running} keeps the "
        f"{control.max_running} newest"
        if control.max_running > 1
        else ""
    )
    cancels = {
        r.ident: (run_control(r.kind).cancel_values[control.strategy], newest.name, limit)
        for r in older
        if r.state in (State.RUNNING, State.PENDING_BY_US)
    }
    allowed = frozenset(r.ident for r in kept if r.state is State.PENDING_BY_US)
    running = sum(1 for r in held if r.state is State.RUNNING)
    return Verdict(names, allowed, cancels, running)


def _slotted(
    control: Control, held: Sequence[Run], names: frozenset[str], now: float | None
) -> Verdict:
    """Queue and Replace: runs pending by us start while fewer than ``maxRunning`` run (a
    stopping run still runs). Queue starts them oldest (or newest) first and cancels nothing
    but the runs past ``maxPending`` (``overflow`` says which) and those that waited longer
    than ``maxWaitSeconds``. Replace acts as if the runs had arrived one at a time in
    creation order: the oldest start while slots are free, and of the rest only the newest
    stays pending; the others are cancelled, superseded by it."""
    running = sorted(
        (r for r in held if r.state in (State.RUNNING, State.STOPPING)), key=lambda r: r.order
    )
    waiting = sorted((r for r in held if r.state is State.PENDING_BY_US), key=lambda r: r.order)
    free = max(0, control.max_running - len(running))
    if control.strategy is Strategy.QUEUE and control.order is Order.NEWEST_FIRST:
        waiting.reverse()
    if control.priority is not None:
        # A higher priority starts first; equal ones keep their order (a stable sort).
        waiting.sort(key=lambda r: -r.priority_of(control.name))
    starts = frozenset(r.ident for r in waiting[:free])
    rest = waiting[free:]
    cancels: dict[str, tuple[str, str, str]] = {}
    if control.strategy is Strategy.REPLACE:
        # rest[-1], the newest, stays pending
        cancels = {r.ident: (_held_cancel(r), rest[-1].name, "") for r in rest[:-1]}
    if control.max_wait_seconds is not None and now is not None:
        for r in rest:
            if r.ident not in cancels and expired(control, r, now):
                cancels[r.ident] = (
                    _held_cancel(r),
                    "",
                    f"waited longer than maxWaitSeconds {control.max_wait_seconds}",
                )
    if control.max_pending is not None:
        left = [r for r in rest if r.ident not in cancels]
        # As if the runs had arrived one at a time: past maxPending the arrival is cancelled
        # (CancelNewest) or the run that waited longest (CancelOldest).
        by_age = sorted(
            left, key=lambda r: r.order, reverse=control.overflow is Overflow.CANCEL_NEWEST
        )
        if control.priority is not None:  # the lowest priority overflows first
            by_age.sort(key=lambda r: r.priority_of(control.name))
        reason = (
            f"the queue of its key was full (maxPending {control.max_pending}, overflow "
            f"{control.overflow.value})"
        )
        for r in by_age[: max(0, len(left) - control.max_pending)]:
            cancels[r.ident] = (_held_cancel(r), "", reason)
    # The line as this plan leaves it: the runs that run (those starting now, and those it
    # cancels: they stop), by creation, then the ones still waiting in the order they start.
    after = {r.ident: State.RUNNING for r in waiting if r.ident in starts}
    after.update((ident, State.STOPPING) for ident in cancels)
    ahead = sorted([*running, *(r for r in waiting if r.ident in after)], key=lambda r: r.order)
    line = [*ahead, *(r for r in waiting if r.ident not in after)]
    why = {
        run.ident: _waiting_why(control, run, place, line[place - 1] if place else None, after)
        for place, run in enumerate(line)
        if place >= len(ahead)
    }
    data = {
        run.ident: _waiting_data(control, run, place, line, after)
        for place, run in enumerate(line)
        if place >= len(ahead)
    }
    return Verdict(names, starts, cancels, len(running), why, data)


SHOWN_PLACES = 10  # a waiting run's place is told up to this one


def _held_cancel(run: Run) -> str:
    """The cancel value for a run that never started (Tekton Cancelled, Argo Terminate)."""
    return run_control(run.kind).cancel_values[Strategy.CANCEL]


def expired(control: Control, run: Run, now: float) -> bool:
    """The run waited ``maxWaitSeconds`` since its creation (unknown creation: never)."""
    limit = control.max_wait_seconds
    return limit is not None and run.created_at > 0 and now - run.created_at >= limit


def next_deadline(group: Group) -> float | None:
    """When the first run the group keeps waiting reaches ``maxWaitSeconds`` (the reconciler
    looks at the group again then), or None."""
    control = group.control
    if control is None or control.max_wait_seconds is None:
        return None
    deadlines = [
        r.created_at + control.max_wait_seconds
        for r in held_runs(group)
        if r.state is State.PENDING_BY_US and r.created_at > 0
    ]
    return min(deadlines, default=None)


def _waiting_why(
    control: Control, run: Run, place: int, ahead: Run | None, after: Mapping[str, State]
) -> str:
    key = run.key_of(control.name)
    # Past SHOWN_PLACES the place is not told: a start then rewrites at most that many
    # reasons, not one per waiting run (the run ahead still changes only when it starts).
    where = ordinal(place + 1) if place < SHOWN_PLACES else f"after the {ordinal(SHOWN_PLACES)}"
    text = f"waiting: {where} in queue for key {key} of ConcurrencyControl {control.name}"
    if ahead is not None:
        state = after.get(ahead.ident, ahead.state)
        said = "waiting" if state is State.PENDING_BY_US else state.value
        text += f", behind {ahead.name}, which is {said}"
    text += f" ({control.max_running} may run at once)"
    if control.strategy is Strategy.REPLACE:
        text += "; a newer run of the key replaces it"
    return text


def _waiting_data(
    control: Control, run: Run, place: int, line: Sequence[Run], after: Mapping[str, State]
) -> str:
    """The reason as data (annotation ``coschedule.dev/waiting-data``, JSON with sorted keys):
    the control, the key, the 1-based position and the runs ahead with their states, up to
    the 10th place; past it ``position`` is null, ``after`` is 10 and only the run right
    ahead is listed (so a start rewrites at most ten, as for the text)."""

    def entry(r: Run) -> dict[str, str]:
        state = after.get(r.ident, r.state)
        said = "waiting" if state is State.PENDING_BY_US else state.value
        return {"kind": r.kind.value, "name": r.name, "state": said}

    shown = place < SHOWN_PLACES
    out: dict[str, Any] = {
        "control": control.name,
        "key": run.key_of(control.name),
        "strategy": control.strategy.value,
        "maxRunning": control.max_running,
        "position": place + 1 if shown else None,
        "ahead": [entry(r) for r in (line[:place] if shown else line[place - 1 : place])],
    }
    if not shown:
        out["after"] = SHOWN_PLACES
    if control.priority is not None:
        out["priority"] = run.priority_of(control.name)
    if control.strategy is Strategy.REPLACE:
        out["replacedByNewer"] = True
    return orjson.dumps(out, option=orjson.OPT_SORT_KEYS).decode()


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def plan(key: GroupKey, groups: Mapping[GroupKey, Group], now: float | None = None) -> list[Action]:
    """Actions for group ``key``; ``groups`` holds it and every other group its runs are in
    (a group missing from it counts as holding nothing). ``now`` (epoch seconds) cancels the
    runs past ``maxWaitSeconds``; None: no run has waited too long."""
    group = groups[key]
    of = verdicts_of(groups, now)
    mine = of(key)
    assert mine is not None
    control = group.control
    actions: list[Action] = []
    for run in sorted(group.runs, key=lambda r: r.order):
        if run.ident in mine.cancels and control is not None:
            value, newer, reason = mine.cancels[run.ident]
            actions.append(
                CancelRun(
                    run,
                    value,
                    control.strategy,
                    control.name,
                    newer,
                    run.key_of(key.control),
                    reason,
                )
            )
    for run in sorted(group.runs, key=lambda r: r.order):
        if run.state is not State.PENDING_BY_US or run.ident in mine.cancels:
            continue
        if run.ident in mine.held and run.ident not in mine.allowed:
            continue
        if _blocked_elsewhere(run, key, of):
            continue
        if run.ident in mine.held and control is not None:
            why = _why(control, run, mine)
        else:
            why = (
                f"ConcurrencyControl {key.control} no longer exists"
                if control is None
                else f"ConcurrencyControl {key.control} no longer selects it"
            )
        actions.append(StartRun(run, key.control, why))
    started = {a.run.ident for a in actions if isinstance(a, StartRun)}
    for run in sorted(group.runs, key=lambda r: r.order):
        if run.state is not State.PENDING_BY_US or run.ident in mine.cancels:
            continue
        if run.ident in started:
            continue
        waits = _waiting_of(run, of)
        if waits is not None and waits != (
            run.annotations.get(ANNOTATION_WAITING),
            run.annotations.get(ANNOTATION_WAITING_DATA),
        ):
            actions.append(MarkWaiting(run, *waits))
    return actions


def verdicts_of(groups: Mapping[GroupKey, Group], now: float | None = None) -> VerdictOf:
    """Each group's verdict, computed once when first asked; None for a group not observed."""
    verdicts: dict[GroupKey, Verdict] = {}

    def of(k: GroupKey) -> Verdict | None:
        if k not in verdicts:
            g = groups.get(k)
            if g is None:
                return None
            verdicts[k] = verdict(g, now)
        return verdicts[k]

    return of


def waiting_why(run: Run, groups: Mapping[GroupKey, Group], now: float | None = None) -> str | None:
    """Why a run pending by us waits (what its annotation should say), or None when it does
    not wait (it starts, or is cancelled, on the next look)."""
    if run.state is not State.PENDING_BY_US:
        return None
    waits = _waiting_of(run, verdicts_of(groups, now))
    return waits[0] if waits is not None else None


def waiting_data(
    run: Run, groups: Mapping[GroupKey, Group], now: float | None = None
) -> dict[str, Any] | None:
    """The same as data (what the ``coschedule.dev/waiting-data`` annotation should hold)."""
    if run.state is not State.PENDING_BY_US:
        return None
    waits = _waiting_of(run, verdicts_of(groups, now))
    return orjson.loads(waits[1]) if waits is not None else None


def _waiting_of(run: Run, of: VerdictOf) -> tuple[str, str] | None:
    """Why the run waits, as text and as data: from the first of its groups (by control
    name) that holds it back, so that every group's plan computes the same."""
    for control, value in sorted(run.groups().items()):
        theirs = of(GroupKey(run.namespace, control, value))
        if theirs is not None and run.ident in theirs.waiting:
            return theirs.waiting[run.ident], theirs.waiting_data[run.ident]
    return None


def _blocked_elsewhere(run: Run, key: GroupKey, of: VerdictOf) -> bool:
    for control, value in run.groups().items():
        other = GroupKey(run.namespace, control, value)
        if other == key:
            continue
        theirs = of(other)
        if theirs is None or run.ident not in theirs.held:
            continue
        if run.ident in theirs.cancels or run.ident not in theirs.allowed:
            return True
    return False


def _why(control: Control, run: Run, mine: Verdict) -> str:
    if control.strategy in SLOTTED:
        return (
            f"a slot is free in ConcurrencyControl {control.name} "
            f"({mine.running} of maxRunning {control.max_running} running), "
            f"key {run.key_of(control.name)}"
        )
    newest = "newest run" if control.max_running == 1 else f"{control.max_running} newest runs"
    one = "one of the " if control.max_running > 1 else ""
    return f"{one}{newest} of ConcurrencyControl {control.name}, key {run.key_of(control.name)}"


def group_keys(run: Run) -> list[GroupKey]:
    return [GroupKey(run.namespace, c, v) for c, v in sorted(run.groups().items())]


def pending_by_us(runs: Sequence[Run]) -> int:
    return sum(1 for r in runs if r.state is State.PENDING_BY_US)


def control_status(control: Control, groups: Sequence[Group]) -> dict[str, int]:
    """What ``kubectl get concurrencycontrol`` shows: runs running and pending by us among
    those the control holds, and how many groups still have an unfinished run."""
    running = pending = active = 0
    for group in groups:
        held = [r for r in group.runs if control.holds(r.kind, r.labels)]
        running += sum(1 for r in held if r.state in (State.RUNNING, State.STOPPING))
        pending += sum(1 for r in held if r.state is State.PENDING_BY_US)
        active += any(r.state is not State.DONE for r in held)
    return {"groups": active, "running": running, "pending": pending}
