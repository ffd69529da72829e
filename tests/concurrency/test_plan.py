"""The group plan: who starts, who is cancelled, for every strategy and both engines."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from coschedule.concurrency.control import Control, parse_control
from coschedule.concurrency.plan import (
    CancelRun,
    Group,
    GroupKey,
    MarkWaiting,
    StartRun,
    control_status,
    group_keys,
    next_deadline,
    ordinal,
    plan,
)
from coschedule.concurrency.runs import (
    Run,
    State,
    cancel_patch,
    parse_run,
    start_patch,
    waiting_patch,
)
from coschedule.engines import Kind
from coschedule.k8s.timefmt import micro_time, parse_time
from tests.concurrency.runs import control, pipeline_run, workflow

Obj = dict[str, Any]
PENDING = {"coschedule.dev/pending-by": "concurrency"}
WAITING = "coschedule.dev/waiting"
DATA = "coschedule.dev/waiting-data"
PENDING_BY = "coschedule.dev/pending-by"
ADMITTED = "coschedule.dev/run-admitted-at"


def ctl(name: str = "ci", **spec: Any) -> Control:
    return parse_control(control(name, {"selector": {}, "strategy": "Cancel", **spec}))


def pr(name: str, second: int, *, groups: dict[str, str] | None = None, **kw: Any) -> Run:
    labels = {f"concurrency.coschedule.dev/{c}": v for c, v in (groups or {"ci": "main"}).items()}
    labels.update(kw.pop("labels", {}))
    created = f"2026-11-23T02:00:{second:02d}Z"
    return parse_run(Kind.PIPELINE_RUN, pipeline_run(name, labels=labels, created=created, **kw))


def wf(name: str, second: int, *, groups: dict[str, str] | None = None, **kw: Any) -> Run:
    labels = {f"concurrency.coschedule.dev/{c}": v for c, v in (groups or {"ci": "main"}).items()}
    created = f"2026-11-23T02:00:{second:02d}Z"
    return parse_run(Kind.WORKFLOW, workflow(name, labels=labels, created=created, **kw))


def pending_pr(name: str, second: int, **kw: Any) -> Run:
    return pr(name, second, status="PipelineRunPending", annotations=PENDING, **kw)


def pending_wf(name: str, second: int, **kw: Any) -> Run:
    return wf(name, second, suspend=True, annotations=PENDING, **kw)


KEY = GroupKey("ci", "ci", "main")


def decide(control: Control | None, *runs: Run, key: GroupKey = KEY) -> list[Any]:
    return plan(key, {key: Group(key, control, runs)})


def summary(actions: list[Any]) -> list[tuple[str, str, str]]:
    """Starts and cancels (``waits`` has the rest)."""
    out = []
    for action in actions:
        if isinstance(action, CancelRun):
            out.append(("cancel", action.run.name, action.value))
        elif isinstance(action, StartRun):
            out.append(("start", action.run.name, ""))
        else:
            assert isinstance(action, MarkWaiting)
    return out


def waits(actions: list[Any]) -> dict[str, str]:
    return {a.run.name: a.why for a in actions if isinstance(a, MarkWaiting)}


# ---- states ----------------------------------------------------------------------------


def test_states_per_engine() -> None:
    assert pending_pr("a", 0).state is State.PENDING_BY_US
    assert pr("a", 0, status="PipelineRunPending").state is State.PENDING_BY_AUTHOR
    assert pr("a", 0).state is State.RUNNING
    assert pr("a", 0, status="CancelledRunFinally").state is State.STOPPING
    assert pr("a", 0, succeeded="True").state is State.DONE
    assert pr("a", 0, succeeded="False").state is State.DONE
    assert pr("a", 0, succeeded="Unknown").state is State.RUNNING
    assert pending_wf("w", 0).state is State.PENDING_BY_US
    assert wf("w", 0, suspend=True).state is State.PENDING_BY_AUTHOR
    assert wf("w", 0, shutdown="Stop").state is State.STOPPING
    for phase in ("Succeeded", "Failed", "Error"):
        assert wf("w", 0, phase=phase).state is State.DONE
    assert wf("w", 0, phase="Running").state is State.RUNNING


# ---- Cancel family ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "tekton", "argo"),
    [
        ("Cancel", "Cancelled", "Terminate"),
        ("GracefullyCancel", "CancelledRunFinally", "Stop"),
        ("GracefullyStop", "StoppedRunFinally", "Stop"),
    ],
)
def test_newest_starts_older_unfinished_are_cancelled(
    strategy: str, tekton: str, argo: str
) -> None:
    control = ctl(strategy=strategy)
    runs = (
        pr("done", 0, succeeded="True"),
        pr("running", 1),
        pending_pr("waiting", 2),
        pending_wf("wf-waiting", 3),
        pending_pr("newest", 4),
    )
    assert summary(decide(control, *runs)) == [
        ("cancel", "running", tekton),
        ("cancel", "waiting", tekton),
        ("cancel", "wf-waiting", argo),
        ("start", "newest", ""),
    ]


def test_cancel_event_names_the_newer_run_and_key() -> None:
    (cancel, _) = decide(ctl(), pr("old", 0), pending_pr("new", 1))
    assert isinstance(cancel, CancelRun)
    assert (cancel.control, cancel.newer, cancel.key) == ("ci", "new", "main")


def test_creation_time_then_name_orders_runs() -> None:
    actions = decide(ctl(), pending_pr("b", 5), pending_pr("a", 5), pending_pr("c", 4))
    assert summary(actions) == [
        ("cancel", "c", "Cancelled"),
        ("cancel", "a", "Cancelled"),
        ("start", "b", ""),
    ]


def test_finished_and_stopping_runs_are_never_touched() -> None:
    actions = decide(
        ctl(),
        pr("done", 0, succeeded="False"),
        pr("stopping", 1, status="Cancelled"),
        pending_pr("new", 2),
    )
    assert summary(actions) == [("start", "new", "")]


def test_a_started_newest_run_needs_nothing() -> None:
    assert decide(ctl(), pr("old", 0, status="Cancelled"), pr("new", 1)) == []


def test_author_pending_runs_are_neither_started_nor_cancelled_nor_newer() -> None:
    actions = decide(ctl(), pr("running", 0), pr("held", 5, status="PipelineRunPending"))
    assert actions == []
    actions = decide(ctl(), pr("held", 0, status="PipelineRunPending"), pending_pr("new", 5))
    assert summary(actions) == [("start", "new", "")]


def test_a_newest_finished_run_still_cancels_older_ones() -> None:
    actions = decide(ctl(), pr("old", 0), pr("new", 1, succeeded="True"))
    assert summary(actions) == [("cancel", "old", "Cancelled")]


# ---- priority ---------------------------------------------------------------------------


def prio(name: str, second: int, priority: int | None, **kw: Any) -> Run:
    notes = dict(PENDING)
    if priority is not None:
        notes["priority.coschedule.dev/ci"] = str(priority)
    return pr(name, second, status="PipelineRunPending", annotations=notes, **kw)


def test_a_higher_priority_starts_first_then_order() -> None:
    control = ctl(strategy="Queue", priority="$(labels.priority)")
    runs = (pr("a", 0), prio("b", 1, 0), prio("c", 2, 5), prio("d", 3, 1), prio("e", 4, None))
    actions = decide(control, *runs)
    assert summary(actions) == []  # a runs: nobody starts, nobody is cancelled
    assert [name for name, why in sorted(waits(actions).items(), key=lambda i: i[1])] == [
        "c",  # 2nd in queue
        "d",  # 3rd
        "b",  # 4th (priority 0, older than e)
        "e",  # 5th (no priority: 0)
    ]
    assert waits(actions)["c"].startswith("waiting: 2nd in queue for key main")
    # When a finishes, c goes first.
    done = (pr("a", 0, succeeded="True"), *runs[1:])
    assert summary(decide(control, *done)) == [("start", "c", "")]
    # newest-first orders equal priorities newest first.
    newest = ctl(strategy="Queue", priority="$(labels.priority)", order="newest-first")
    assert summary(decide(newest, prio("b", 1, 0), prio("e", 4, None), prio("x", 5, -1))) == [
        ("start", "e", "")
    ]


def test_a_higher_priority_arrival_never_cancels_a_running_run() -> None:
    control = ctl(strategy="Queue", priority="$(labels.priority)")
    assert summary(decide(control, pr("a", 0), prio("urgent", 1, 100))) == []


def test_overflow_cancels_the_lowest_priority_first() -> None:
    control = ctl(strategy="Queue", priority="$(labels.priority)", maxPending=1)
    runs = (pr("a", 0), prio("low", 1, 0), prio("high", 2, 9))
    assert summary(decide(control, *runs)) == [("cancel", "low", "Cancelled")]


def test_without_a_priority_template_the_annotation_is_ignored() -> None:
    control = ctl(strategy="Queue")
    runs = (prio("b", 1, 0), prio("c", 2, 5))
    assert summary(decide(control, *runs)) == [("start", "b", "")]


# ---- bounded and timed queues ---------------------------------------------------------


def at(second: int) -> float:
    """The epoch time of 2026-11-23T02:00:SS (the runs' creation times)."""
    return pr("x", second).created_at


def test_past_max_pending_the_newest_waiting_run_is_cancelled() -> None:
    control = ctl(strategy="Queue", maxPending=2)
    runs = (pr("a", 0), pending_pr("b", 1), pending_pr("c", 2), pending_wf("d", 3))
    actions = decide(control, *runs)
    assert summary(actions) == [("cancel", "d", "Terminate")]
    (cancel,) = [a for a in actions if isinstance(a, CancelRun)]
    assert cancel.why == "the queue of its key was full (maxPending 2, overflow CancelNewest)"
    assert cancel.strategy.value == "Queue"
    # The ones that stay say why they wait.
    assert set(waits(actions)) == {"b", "c"}


def test_overflow_cancel_oldest_cancels_the_run_that_waited_longest() -> None:
    control = ctl(strategy="Queue", maxPending=1, overflow="CancelOldest")
    runs = (pr("a", 0), pending_pr("b", 1), pending_pr("c", 2), pending_pr("d", 3))
    assert summary(decide(control, *runs)) == [
        ("cancel", "b", "Cancelled"),
        ("cancel", "c", "Cancelled"),
    ]


def test_max_pending_counts_only_runs_that_do_not_start_now() -> None:
    control = ctl(strategy="Queue", maxRunning=2, maxPending=1)
    # b starts (a slot is free), c waits, d overflows.
    runs = (pr("a", 0), pending_pr("b", 1), pending_pr("c", 2), pending_pr("d", 3))
    assert summary(decide(control, *runs)) == [("cancel", "d", "Cancelled"), ("start", "b", "")]


def test_max_pending_zero_keeps_no_run_waiting() -> None:
    control = ctl(strategy="Queue", maxPending=0)
    assert summary(decide(control, pr("a", 0), pending_pr("b", 1))) == [
        ("cancel", "b", "Cancelled")
    ]
    assert summary(decide(control, pending_pr("b", 1))) == [("start", "b", "")]


@pytest.mark.parametrize("strategy", ["Queue", "Replace"])
def test_a_run_waiting_longer_than_max_wait_seconds_is_cancelled(strategy: str) -> None:
    control = ctl(strategy=strategy, maxWaitSeconds=30)
    runs = (pr("a", 0), pending_pr("b", 10))
    # Before its time: it waits.
    assert summary(decide_at(control, at(39), *runs)) == []
    actions = decide_at(control, at(40), *runs)
    assert summary(actions) == [("cancel", "b", "Cancelled")]
    (cancel,) = actions
    assert isinstance(cancel, CancelRun)
    assert cancel.why == "waited longer than maxWaitSeconds 30"
    # A run that can start when its time is up starts instead.
    assert summary(decide_at(control, at(40), pending_pr("b", 10))) == [("start", "b", "")]
    # Without a clock (explain of a file) nothing times out.
    assert summary(decide(control, *runs)) == []


def test_next_deadline_is_the_first_waiting_runs_time() -> None:
    control = ctl(strategy="Queue", maxWaitSeconds=30)
    group = Group(KEY, control, (pr("a", 0), pending_pr("b", 10), pending_pr("c", 5)))
    assert next_deadline(group) == at(35)
    assert next_deadline(Group(KEY, ctl(strategy="Queue"), group.runs)) is None
    assert next_deadline(Group(KEY, control, (pr("a", 0),))) is None


def decide_at(control: Control, now: float, *runs: Run) -> list[Any]:
    return plan(KEY, {KEY: Group(KEY, control, runs)}, now)


# ---- limit plus supersede: Cancel family with maxRunning ----------------------------


@pytest.mark.parametrize(
    ("strategy", "tekton"),
    [("Cancel", "Cancelled"), ("GracefullyCancel", "CancelledRunFinally")],
)
def test_with_max_running_the_newest_n_run_and_an_arrival_cancels_the_oldest_running(
    strategy: str, tekton: str
) -> None:
    control = ctl(strategy=strategy, maxRunning=2)
    # Two run; a third arrives: the oldest running one is superseded, the arrival starts.
    actions = decide(control, pr("a", 0), pr("b", 1), pending_pr("c", 2))
    assert summary(actions) == [("cancel", "a", tekton), ("start", "c", "")]
    (cancel, _) = actions
    assert cancel.why == "newer run c; maxRunning 2 keeps the 2 newest"
    # Below the limit nothing is cancelled.
    assert summary(decide(control, pr("a", 0), pending_pr("b", 1))) == [("start", "b", "")]
    # A burst of four while one runs: the two newest start, the rest are cancelled.
    actions = decide(
        control, pr("a", 0), pending_pr("b", 1), pending_pr("c", 2), pending_pr("d", 3)
    )
    assert summary(actions) == [
        ("cancel", "a", tekton),
        ("cancel", "b", tekton),
        ("start", "c", ""),
        ("start", "d", ""),
    ]
    start = actions[-1]
    assert isinstance(start, StartRun)
    assert start.why == "one of the 2 newest runs of ConcurrencyControl ci, key main"


def test_with_max_running_stopping_done_and_author_pending_runs_are_left_alone() -> None:
    control = ctl(maxRunning=2)
    actions = decide(
        control,
        pr("stopping", 0, status="Cancelled"),
        pr("done", 1, succeeded="True"),
        pr("held", 2, status="PipelineRunPending"),
        pr("running", 3),
    )
    assert actions == []
    # A newer finished run counts among the newest, as with maxRunning 1.
    actions = decide(control, pr("a", 0), pr("b", 1), pr("c", 2, succeeded="True"))
    assert summary(actions) == [("cancel", "a", "Cancelled")]


def test_max_running_one_is_the_plain_cancel_event_text() -> None:
    (cancel, _) = decide(ctl(), pr("old", 0), pending_pr("new", 1))
    assert cancel.why == "newer run new"


def test_cancelling_a_pending_run_drops_our_annotation_and_argo_suspension() -> None:
    run = pending_wf("w", 0)
    patch = cancel_patch(run, "Terminate")
    assert patch == {
        "metadata": {
            "resourceVersion": "1",
            "annotations": {PENDING_BY: None, WAITING: None, DATA: None},
        },
        "spec": {"shutdown": "Terminate", "suspend": False},
    }
    assert cancel_patch(pr("r", 0, rv="9"), "Cancelled") == {
        "metadata": {"resourceVersion": "9"},
        "spec": {"status": "Cancelled"},
    }


def test_start_patches_carry_the_version_they_were_decided_on() -> None:
    assert start_patch(pending_pr("p", 0, rv="7")) == {
        "metadata": {
            "resourceVersion": "7",
            "annotations": {PENDING_BY: None, WAITING: None, DATA: None},
        },
        "spec": {"status": None},
    }
    assert start_patch(pending_wf("w", 0, rv="8"))["spec"] == {"suspend": False}


def test_a_seedable_pipeline_run_started_is_stamped_with_the_time() -> None:
    """A held PipelineRun started by the reconciler gets the run webhook's stamp: its
    placeholder is seeded from the start, and its first pod (Tekton copies the run's
    annotations onto it) waits for that placeholder at any webhook replica. Not a Workflow
    (no placeholder is seeded for one), nor a run whose per-task podTemplate places its
    pods, nor a start without a time."""
    now = 1_795_000_000.25
    stamped = start_patch(pending_pr("p", 0, rv="7"), now)["metadata"]["annotations"]
    assert stamped[ADMITTED] == micro_time(now)
    assert parse_time(stamped[ADMITTED]) == now
    assert {k: v for k, v in stamped.items() if k != ADMITTED} == {
        PENDING_BY: None,
        WAITING: None,
        DATA: None,
    }
    assert ADMITTED not in start_patch(pending_pr("p", 0))["metadata"]["annotations"]
    assert ADMITTED not in start_patch(pending_wf("w", 0), now)["metadata"]["annotations"]
    placed = pipeline_run("p", status="PipelineRunPending", annotations=PENDING)
    placed["spec"]["taskRunSpecs"] = [
        {"pipelineTaskName": "build", "podTemplate": {"nodeSelector": {"pool": "a"}}}
    ]
    assert not parse_run(Kind.PIPELINE_RUN, placed).seedable
    assert (
        ADMITTED
        not in (start_patch(parse_run(Kind.PIPELINE_RUN, placed), now)["metadata"]["annotations"])
    )
    # A per-task podTemplate that places nothing is seeded like any other run.
    placed["spec"]["taskRunSpecs"] = [
        {"pipelineTaskName": "build", "podTemplate": {"securityContext": {"runAsUser": 1}}}
    ]
    assert parse_run(Kind.PIPELINE_RUN, placed).seedable


def test_a_waiting_patch_writes_only_the_reason_on_the_version_decided_on() -> None:
    assert waiting_patch(pending_pr("p", 0, rv="5"), "waiting: 2nd") == {
        "metadata": {"resourceVersion": "5", "annotations": {WAITING: "waiting: 2nd"}}
    }


# ---- Queue -----------------------------------------------------------------------------


def queue(max_running: int = 1) -> Control:
    return ctl(strategy="Queue", maxRunning=max_running)


def test_queue_starts_the_oldest_up_to_max_running() -> None:
    runs = [pending_pr(f"q{i}", i) for i in range(5)]
    assert summary(decide(queue(2), *runs)) == [("start", "q0", ""), ("start", "q1", "")]


def test_queue_counts_running_and_stopping_runs_not_done_or_author_pending() -> None:
    runs = (
        pr("running", 0),
        pr("stopping", 1, status="Cancelled"),
        pr("done", 2, succeeded="True"),
        pr("held", 3, status="PipelineRunPending"),
        pending_pr("next", 4),
        pending_pr("later", 5),
    )
    assert summary(decide(queue(2), *runs)) == []
    assert summary(decide(queue(3), *runs)) == [("start", "next", "")]


def test_queue_never_cancels() -> None:
    runs = [pr(f"r{i}", i) for i in range(4)]
    assert decide(queue(1), *runs) == []


def test_queue_start_reason_says_how_full_the_group_is() -> None:
    (start,) = decide(queue(2), pr("a", 0), pending_pr("b", 1))
    assert isinstance(start, StartRun)
    assert "1 of maxRunning 2 running" in start.why


def test_queue_newest_first_starts_the_newest_waiting_runs() -> None:
    control = ctl(strategy="Queue", maxRunning=3, order="newest-first")
    runs = [pr("running", 0), *(pending_pr(f"q{i}", i + 1) for i in range(4))]
    assert summary(decide(control, *runs)) == [("start", "q2", ""), ("start", "q3", "")]


def test_a_retried_run_keeps_its_place_by_creation_then_name() -> None:
    # Re-created with an older creation time than its name suggests: creation decides, and
    # a tie on creation goes to the name, never to when we happened to see the run.
    runs = (pending_pr("b-retry", 5), pending_pr("a", 5), pending_pr("c", 9))
    assert summary(decide(queue(1), *runs)) == [("start", "a", "")]
    newest = ctl(strategy="Queue", order="newest-first")
    assert summary(decide(newest, *runs)) == [("start", "c", "")]


def test_a_held_run_says_its_place_and_the_run_ahead() -> None:
    prod = {"ci": "prod"}
    waiting = (pending_pr(f"n{i}", i + 1, groups=prod) for i in range(3))
    runs = (pr("deploy-7x2", 0, groups=prod), *waiting)
    assert waits(decide(queue(1), *runs, key=GroupKey("ci", "ci", "prod"))) == {
        "n0": "waiting: 2nd in queue for key prod of ConcurrencyControl ci, behind "
        "deploy-7x2, which is running (1 may run at once)",
        "n1": "waiting: 3rd in queue for key prod of ConcurrencyControl ci, behind "
        "n0, which is waiting (1 may run at once)",
        "n2": "waiting: 4th in queue for key prod of ConcurrencyControl ci, behind "
        "n1, which is waiting (1 may run at once)",
    }


def test_a_held_run_whose_reason_is_written_needs_nothing_until_the_line_moves() -> None:
    why = (
        "waiting: 2nd in queue for key main of ConcurrencyControl ci, behind a, which is "
        "stopping (1 may run at once)"
    )
    (mark,) = decide(queue(1), pr("a", 0, status="Cancelled"), pending_pr("b", 1))
    assert isinstance(mark, MarkWaiting)
    assert mark.why == why
    # The same as data, for a bot or a UI.
    assert orjson.loads(mark.data) == {
        "control": "ci",
        "key": "main",
        "strategy": "Queue",
        "maxRunning": 1,
        "position": 2,
        "ahead": [{"kind": "PipelineRun", "name": "a", "state": "stopping"}],
    }
    notes = {**PENDING, WAITING: why, DATA: mark.data}
    b = pr("b", 1, status="PipelineRunPending", annotations=notes)
    assert decide(queue(1), pr("a", 0, status="Cancelled"), b) == []
    # a is done: b starts (its start patch drops the annotation, no separate write).
    (start,) = decide(queue(1), pr("a", 0, succeeded="True"), b)
    assert isinstance(start, StartRun)
    assert start_patch(start.run)["metadata"]["annotations"][WAITING] is None
    # a newer run joins the front (newest-first): b's place changes, so its reason does.
    newest = ctl(strategy="Queue", order="newest-first")
    c = pending_pr("c", 2)
    assert waits(decide(newest, pr("a", 0, status="Cancelled"), b, c)) == {
        "b": "waiting: 3rd in queue for key main of ConcurrencyControl ci, behind c, which is "
        "waiting (1 may run at once)",
        "c": "waiting: 2nd in queue for key main of ConcurrencyControl ci, behind a, which is "
        "stopping (1 may run at once)",
    }


def test_past_the_tenth_place_a_start_rewrites_no_reason() -> None:
    runs = [pr("running", 0), *(pending_pr(f"w{i:02d}", i + 1) for i in range(14))]
    before = waits(decide(queue(1), *runs))
    assert before["w08"].startswith("waiting: 10th in queue for key main")
    assert before["w09"].startswith("waiting: after the 10th in queue for key main")
    assert before["w09"].endswith("behind w08, which is waiting (1 may run at once)")
    # running is done and w00 starts: the reasons past the 10th place stay as they were.
    done = [pr("running", 0, succeeded="True"), *runs[1:]]
    after = waits(decide(queue(1), *done))
    changed = sorted(n for n in after if after[n] != before.get(n))
    assert changed == [f"w{i:02d}" for i in range(1, 10)]


def test_ordinals() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111, 112)] == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "101st",
        "111th",
        "112th",
    ]


# ---- Replace ---------------------------------------------------------------------------


def replace(max_running: int = 1) -> Control:
    return ctl(strategy="Replace", maxRunning=max_running)


def test_replace_keeps_only_the_newest_pending_run() -> None:
    runs = (
        pr("running", 0),
        pending_pr("old", 1),
        pending_wf("older-wf", 2),
        pending_pr("newest", 3),
    )
    actions = decide(replace(), *runs)
    assert summary(actions) == [
        ("cancel", "old", "Cancelled"),
        ("cancel", "older-wf", "Terminate"),
    ]
    assert all(a.newer == "newest" for a in actions if isinstance(a, CancelRun))
    assert waits(actions) == {
        # The runs it cancels count as running until they are done.
        "newest": "waiting: 4th in queue for key main of ConcurrencyControl ci, behind older-wf, "
        "which is stopping (1 may run at once); a newer run of the key replaces it"
    }


def test_replace_starts_the_oldest_while_slots_are_free_as_if_they_came_one_by_one() -> None:
    runs = (pr("running", 0), *(pending_pr(f"p{i}", i + 1) for i in range(4)))
    assert summary(decide(replace(2), *runs)) == [
        ("cancel", "p1", "Cancelled"),
        ("cancel", "p2", "Cancelled"),
        ("start", "p0", ""),
    ]


def test_replace_never_cancels_running_stopping_done_or_author_pending_runs() -> None:
    runs = (
        pr("running", 0),
        pr("stopping", 1, status="Cancelled"),
        pr("done", 2, succeeded="True"),
        pr("authors", 3, status="PipelineRunPending"),
        pending_pr("mine", 4),
    )
    assert summary(decide(replace(2), *runs)) == []
    assert summary(decide(replace(3), *runs)) == [("start", "mine", "")]


def test_replace_start_reason_says_how_full_the_group_is() -> None:
    (start,) = decide(replace(2), pr("a", 0), pending_pr("b", 1))
    assert isinstance(start, StartRun)
    assert "1 of maxRunning 2 running" in start.why


# ---- never stranded --------------------------------------------------------------------


def test_a_deleted_control_releases_its_pending_runs() -> None:
    actions = decide(
        None, pending_pr("a", 0), pending_wf("b", 1), pr("c", 2, status="PipelineRunPending")
    )
    assert summary(actions) == [("start", "a", ""), ("start", "b", "")]
    assert all("no longer exists" in a.why for a in actions)


def test_a_control_that_stops_matching_releases_its_runs() -> None:
    narrowed = parse_control(
        control("ci", {"selector": {"matchLabels": {"app": "other"}}, "strategy": "Queue"})
    )
    actions = decide(narrowed, pending_pr("a", 0), pending_pr("b", 1))
    assert summary(actions) == [("start", "a", ""), ("start", "b", "")]
    assert "no longer selects it" in actions[0].why


def test_a_control_whose_kinds_no_longer_include_the_run_releases_it() -> None:
    only_wf = ctl(strategy="Queue", kinds=["Workflow"])
    actions = decide(only_wf, pr("running-wf-less", 0), pending_pr("a", 1))
    assert summary(actions) == [("start", "a", "")]


# ---- several groups --------------------------------------------------------------------


def test_a_run_in_two_groups_starts_only_when_both_let_it() -> None:
    both = {"ci": "main", "env": "prod"}
    a = pending_pr("a", 0, groups=both)
    blocker = pr("deploying", 0, groups={"env": "prod"})
    ci_key, env_key = GroupKey("ci", "ci", "main"), GroupKey("ci", "env", "prod")
    groups = {
        ci_key: Group(ci_key, ctl(), (a,)),
        env_key: Group(env_key, ctl("env", strategy="Queue"), (a, blocker)),
    }
    # ci lets it; env is full: both plans say so with the same words (none undoes the other).
    why = (
        "waiting: 2nd in queue for key prod of ConcurrencyControl env, behind deploying, "
        "which is running (1 may run at once)"
    )
    (mark,) = plan(ci_key, groups)
    assert isinstance(mark, MarkWaiting)
    assert plan(ci_key, groups) == plan(env_key, groups) == [MarkWaiting(a, why, mark.data)]
    marked = dataclasses.replace(a, annotations={**a.annotations, WAITING: why, DATA: mark.data})
    groups = {k: dataclasses.replace(g, runs=(marked, *g.runs[1:])) for k, g in groups.items()}
    assert plan(ci_key, groups) == plan(env_key, groups) == []
    finished = pr("deploying", 0, groups={"env": "prod"}, succeeded="True")
    groups[env_key] = Group(env_key, groups[env_key].control, (a, finished))
    assert summary(plan(ci_key, groups)) == [("start", "a", "")]
    assert summary(plan(env_key, groups)) == [("start", "a", "")]


def test_a_cancel_from_one_group_wins_over_a_start_from_another() -> None:
    both = {"ci": "main", "env": "prod"}
    old = pending_pr("old", 0, groups=both)
    new = pending_pr("new", 1, groups={"ci": "main"})
    ci_key, env_key = GroupKey("ci", "ci", "main"), GroupKey("ci", "env", "prod")
    groups = {
        ci_key: Group(ci_key, ctl(), (old, new)),
        env_key: Group(env_key, ctl("env", strategy="Queue"), (old,)),
    }
    assert summary(plan(env_key, groups)) == []
    assert summary(plan(ci_key, groups)) == [("cancel", "old", "Cancelled"), ("start", "new", "")]


def test_a_group_missing_from_the_observation_holds_nothing() -> None:
    a = pending_pr("a", 0, groups={"ci": "main", "gone": "x"})
    assert summary(decide(ctl(), a)) == [("start", "a", "")]


def test_a_pipeline_run_and_a_workflow_may_share_a_name() -> None:
    actions = decide(ctl(), pending_pr("same", 0), pending_wf("same", 1))
    assert summary(actions) == [("cancel", "same", "Cancelled"), ("start", "same", "")]
    assert actions[0].run.kind is Kind.PIPELINE_RUN
    assert actions[1].run.kind is Kind.WORKFLOW


def test_group_keys_round_trip() -> None:
    run = pr("r", 0, groups={"ci": "main", "env": ""})
    keys = group_keys(run)
    assert keys == [GroupKey("ci", "ci", "main"), GroupKey("ci", "env", "")]
    assert [GroupKey.parse(str(k)) for k in keys] == keys


def test_control_status_counts_what_the_control_holds() -> None:
    control = ctl(strategy="Queue", maxRunning=2)
    main = Group(
        KEY,
        control,
        (
            pr("running", 0),
            pr("stopping", 1, status="Cancelled"),
            pending_pr("waiting", 2),
            pr("held", 3, status="PipelineRunPending"),
            pr("other-kind-of-run", 4, labels={"x": "y"}, succeeded="True"),
        ),
    )
    done = GroupKey("ci", "ci", "old")
    finished = Group(done, control, (pr("done", 0, groups={"ci": "old"}, succeeded="True"),))
    assert control_status(control, [main, finished]) == {"groups": 1, "running": 2, "pending": 1}
