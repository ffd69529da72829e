"""The concurrency controller's pure planners, without an API: what it observed of one key
in, the ``Plan`` the Executor carries out (its actions and when to look again) out."""

from __future__ import annotations

from typing import Any

import jsonpatch as rfc6902
import pytest

from coschedule.concurrency.control import Control, parse_control
from coschedule.concurrency.plan import Group, GroupKey
from coschedule.concurrency.runs import Run, parse_run
from coschedule.engines import Kind
from coschedule.reconcile.model import (
    AdmitHeldRun,
    CancelRun,
    MarkWaiting,
    Plan,
    Requeue,
    StartRun,
    WriteControlStatus,
)
from coschedule.reconcile.run_plan import plan_admit, plan_group, plan_status
from tests.concurrency.runs import control, pipeline_run, workflow

Obj = dict[str, Any]
KEY = GroupKey("ci", "ci", "main")
PENDING = {"coschedule.dev/pending-by": "concurrency"}
GROUPED = {"concurrency.coschedule.dev/ci": "main"}
POLICY_MARKS = {"coschedule.dev/held-by": "admission-policy", **PENDING}


def ctl(**spec: Any) -> Control:
    return parse_control(control("ci", {"selector": {}, "strategy": "Cancel", **spec}))


def pr(name: str, second: int, **kw: Any) -> Run:
    obj = pipeline_run(name, labels=dict(GROUPED), created=f"2026-11-23T02:00:{second:02d}Z", **kw)
    return parse_run(Kind.PIPELINE_RUN, obj)


def held(name: str, second: int, **kw: Any) -> Run:
    return pr(name, second, status="PipelineRunPending", annotations=dict(PENDING), **kw)


def at(second: int) -> float:
    """The epoch time of 2026-11-23T02:00:SS (the runs' creation times)."""
    return pr("x", second).created_at


def summary(result: Plan) -> list[tuple[str, str]]:
    """(action type, run) of each action: a group's plan holds run actions only."""
    found = []
    for action in result.actions:
        assert isinstance(action, CancelRun | StartRun | MarkWaiting), action
        found.append((type(action).__name__, action.run.name))
    return found


WAIT = Requeue(21.0, "a waiting run reaches maxWaitSeconds")


@pytest.mark.parametrize(
    ("control", "runs", "now", "actions", "requeue"),
    [
        pytest.param(
            ctl(strategy="GracefullyStop"),
            (pr("old", 1), held("new", 2)),
            at(3),
            [("CancelRun", "old"), ("StartRun", "new")],
            None,
            id="supersede: the older run cancelled, the newest started",
        ),
        pytest.param(
            ctl(strategy="Queue"),
            (pr("a", 0), held("b", 1), held("c", 2)),
            at(3),
            [("MarkWaiting", "b"), ("MarkWaiting", "c")],
            None,
            id="queue full: the held runs are told why they wait",
        ),
        pytest.param(
            ctl(strategy="Queue", maxWaitSeconds=30),
            (pr("a", 0), held("b", 10)),
            at(20),
            [("MarkWaiting", "b")],
            WAIT,
            id="a run waiting towards maxWaitSeconds: a look again a second after it",
        ),
        pytest.param(
            ctl(strategy="Queue", maxWaitSeconds=30),
            (pr("a", 0), held("b", 10)),
            at(40),
            [("CancelRun", "b")],
            None,
            id="at maxWaitSeconds: cancelled, no look again",
        ),
        pytest.param(
            None,
            (held("a", 0), held("b", 1)),
            at(3),
            [("StartRun", "a"), ("StartRun", "b")],
            None,
            id="the control is gone: every held run starts",
        ),
        pytest.param(
            ctl(strategy="Queue"),
            (pr("a", 0, succeeded="True"),),
            at(3),
            [],
            None,
            id="nothing to do",
        ),
    ],
)
def test_a_groups_plan(
    control: Control | None,
    runs: tuple[Run, ...],
    now: float,
    actions: list[tuple[str, str]],
    requeue: Requeue | None,
) -> None:
    result = plan_group(KEY, {KEY: Group(KEY, control, runs)}, now)
    assert summary(result) == actions
    assert result.requeue == requeue
    assert (result.retry, result.warning) == (None, None)


def test_a_groups_actions_are_the_concurrency_planners_own() -> None:
    """The start, cancel and waiting mark carry what their writes and Events say."""
    result = plan_group(
        KEY, {KEY: Group(KEY, ctl(strategy="GracefullyStop"), (pr("old", 1), held("new", 2)))}, 0
    )
    cancel, start = result.actions
    assert isinstance(cancel, CancelRun)
    assert (cancel.value, cancel.control, cancel.key, cancel.why) == (
        "StoppedRunFinally",
        "ci",
        "main",
        "newer run new",
    )
    assert isinstance(start, StartRun)
    queued = plan_group(
        KEY, {KEY: Group(KEY, ctl(strategy="Queue"), (pr("a", 0), held("b", 1)))}, at(3)
    )
    (mark,) = queued.actions
    assert isinstance(mark, MarkWaiting)
    assert mark.why.startswith("waiting: 2nd in queue for key main of ConcurrencyControl ci")


def stored_control(**extra: Any) -> Obj:
    obj = control("ci", {"selector": {}, "strategy": "Queue"})
    obj["metadata"].update(extra.pop("metadata", {}))
    obj.update(extra)
    return obj


GROUPS = (
    Group(KEY, ctl(strategy="Queue"), (pr("a", 0), held("b", 1), held("c", 2))),
    Group(GroupKey("ci", "ci", "other"), ctl(strategy="Queue"), (held("x", 9),)),
)
COUNTS = {"groups": 2, "running": 1, "pending": 3}


@pytest.mark.parametrize(
    ("control", "stored", "expected"),
    [
        pytest.param(
            ctl(strategy="Queue"),
            stored_control(metadata={"generation": 3}),
            Plan((WriteControlStatus("ci", "ci", {**COUNTS, "observedGeneration": 3}),)),
            id="new counts and the generation they are for: written",
        ),
        pytest.param(
            ctl(strategy="Queue"),
            stored_control(),
            Plan((WriteControlStatus("ci", "ci", COUNTS),)),
            id="no generation stored: the counts only",
        ),
        pytest.param(
            ctl(strategy="Queue"),
            stored_control(metadata={"generation": 3}, status={**COUNTS, "observedGeneration": 3}),
            Plan(),
            id="the status says so already: nothing",
        ),
        pytest.param(
            ctl(strategy="Queue"),
            stored_control(metadata={"generation": 4}, status={**COUNTS, "observedGeneration": 3}),
            Plan((WriteControlStatus("ci", "ci", {**COUNTS, "observedGeneration": 4}),)),
            id="a new generation: written again",
        ),
        pytest.param(None, stored_control(), Plan(), id="the control is gone: nothing"),
        pytest.param(ctl(strategy="Queue"), None, Plan(), id="not in the cache: nothing"),
    ],
)
def test_a_controls_status_plan(
    control: Control | None, stored: Obj | None, expected: Plan
) -> None:
    assert plan_status("ci", "ci", control, stored, GROUPS) == expected


def policy_held(kind: Kind, name: str) -> Obj:
    """A run as the admission policy ``coschedule-hold-runs`` stores it."""
    if kind is Kind.PIPELINE_RUN:
        run = pipeline_run(name, params={"branch": "main"}, status="PipelineRunPending", rv="7")
    else:
        run = workflow(name, params={"branch": "main"}, suspend=True, rv="7")
    run["metadata"]["labels"]["coschedule.dev/concurrency"] = "grouped"
    run["metadata"]["annotations"] = dict(POLICY_MARKS)
    run["metadata"]["generation"] = 2
    return run


CI = parse_control(control("ci", {"selector": {}, "strategy": "Queue", "key": "$(params.branch)"}))
DEPLOYS = parse_control(
    control("deploys", {"selector": {"matchLabels": {"team": "x"}}, "strategy": "Queue"})
)


@pytest.mark.parametrize("kind", [Kind.PIPELINE_RUN, Kind.WORKFLOW])
@pytest.mark.parametrize(
    ("controls", "outcome", "named"),
    [
        pytest.param(
            [CI], "already pending by coschedule (reinvocation): nothing to add", "ci", id="held"
        ),
        pytest.param(
            [DEPLOYS],
            "held by the admission policy, started again: no ConcurrencyControl selects it",
            "none",
            id="released",
        ),
    ],
)
def test_a_policy_held_run_is_admitted_in_one_conditional_patch(
    kind: Kind, controls: list[Control], outcome: str, named: str
) -> None:
    stored = policy_held(kind, "r1")
    result = plan_admit(kind, "ci", stored, controls)
    (action,) = result.actions
    assert isinstance(action, AdmitHeldRun)
    assert (action.run.kind, action.run.namespace, action.run.name) == (kind, "ci", "r1")
    # First tests of what the decision read: a run whose labels, annotations or spec (its
    # generation) changed since (or another run of the name) is not decided on (422); its
    # version is not tested, so the engine's status writes meanwhile cost nothing.
    meta = stored["metadata"]
    assert action.ops[:4] == (
        {"op": "test", "path": "/metadata/uid", "value": meta["uid"]},
        {"op": "test", "path": "/metadata/labels", "value": meta["labels"]},
        {"op": "test", "path": "/metadata/annotations", "value": meta["annotations"]},
        {"op": "test", "path": "/metadata/generation", "value": 2},
    )
    assert all(op["op"] != "test" for op in action.ops[4:])
    assert len(action.ops) > 4
    assert action.message == (
        "created while the coschedule webhook was unreachable and held by the admission "
        f"policy; decided by the reconciler: {outcome} (ConcurrencyControls: {named})"
    )


@pytest.mark.parametrize(
    ("missing", "tested"),
    [
        pytest.param("labels", ["annotations", "generation"], id="no labels map"),
        pytest.param("generation", ["labels", "annotations"], id="no generation"),
    ],
)
def test_a_held_run_lacking_a_tested_part_is_held_to_its_version_too(
    missing: str, tested: list[str]
) -> None:
    """A part of the run it lacks cannot be tested as absent: the version is tested then."""
    stored = policy_held(Kind.PIPELINE_RUN, "r1")
    del stored["metadata"][missing]
    (action,) = plan_admit(Kind.PIPELINE_RUN, "ci", stored, [CI]).actions
    assert isinstance(action, AdmitHeldRun)
    tests = [op for op in action.ops if op["op"] == "test"]
    assert [op["path"] for op in tests] == [
        "/metadata/uid",
        *(f"/metadata/{part}" for part in tested),
        "/metadata/resourceVersion",
    ]
    assert tests[-1]["value"] == "7"


@pytest.mark.parametrize(
    "stored",
    [
        pytest.param(None, id="gone"),
        pytest.param(pipeline_run("r1", status="PipelineRunPending"), id="not held by the policy"),
        pytest.param(
            pipeline_run("r1", annotations=dict(PENDING), status="PipelineRunPending"),
            id="decided already",
        ),
    ],
)
def test_a_run_not_held_by_the_policy_is_left_alone(stored: Obj | None) -> None:
    assert plan_admit(Kind.PIPELINE_RUN, "ci", stored, [CI]) == Plan()


STAMP_PATH = "/metadata/annotations/coschedule.dev~1run-admitted-at"
NOW = 1_795_000_000.25  # 2026-11-18T11:06:40.250000Z


def stamps(result: Plan) -> list[Any]:
    (action,) = result.actions
    assert isinstance(action, AdmitHeldRun)
    return [op["value"] for op in action.ops if op["path"] == STAMP_PATH]


def test_a_held_pipeline_run_started_by_the_admit_is_stamped_with_the_time() -> None:
    """Started by the reconciler's patch (no control selects it), a seedable PipelineRun is
    stamped as a run the reconciler starts is: its seed counts from now, and its first pod
    waits for that placeholder."""
    stored = policy_held(Kind.PIPELINE_RUN, "r1")
    result = plan_admit(Kind.PIPELINE_RUN, "ci", stored, [DEPLOYS], NOW)
    assert stamps(result) == ["2026-11-18T11:06:40.250000Z"]
    (action,) = result.actions
    assert isinstance(action, AdmitHeldRun)
    # The patch applies to the run as stored and leaves it started and stamped.
    after = rfc6902.apply_patch(stored, [dict(op) for op in action.ops])
    assert "status" not in after["spec"]
    assert after["metadata"]["annotations"] == {
        "coschedule.dev/run-admitted-at": "2026-11-18T11:06:40.250000Z"
    }


def test_a_held_run_not_started_by_the_admit_or_not_seedable_is_not_stamped() -> None:
    # Without the time (as before): no stamp.
    assert (
        stamps(plan_admit(Kind.PIPELINE_RUN, "ci", policy_held(Kind.PIPELINE_RUN, "r1"), [DEPLOYS]))
        == []
    )
    # Grouped and left pending: the reconciler's start stamps it (start_patch), not the admit.
    assert (
        stamps(plan_admit(Kind.PIPELINE_RUN, "ci", policy_held(Kind.PIPELINE_RUN, "r1"), [CI], NOW))
        == []
    )
    # Another engine's run: no placeholder is seeded for it.
    assert (
        stamps(plan_admit(Kind.WORKFLOW, "ci", policy_held(Kind.WORKFLOW, "r1"), [DEPLOYS], NOW))
        == []
    )
    # Its author's pending state, not the policy's: it stays pending, so it is not started.
    authored = policy_held(Kind.PIPELINE_RUN, "r1")
    del authored["metadata"]["annotations"]["coschedule.dev/pending-by"]
    assert stamps(plan_admit(Kind.PIPELINE_RUN, "ci", authored, [DEPLOYS], NOW)) == []
    # A per-task podTemplate that places its pods: the seed waits for the first pod.
    placed = policy_held(Kind.PIPELINE_RUN, "r1")
    placed["spec"]["taskRunSpecs"] = [
        {"pipelineTaskName": "build", "podTemplate": {"nodeSelector": {"pool": "big"}}}
    ]
    assert stamps(plan_admit(Kind.PIPELINE_RUN, "ci", placed, [DEPLOYS], NOW)) == []
