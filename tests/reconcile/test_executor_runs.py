"""The one Executor carries out the concurrency controller's plans against the kmock
emulator (real HTTP, merge and JSON patches applied as kube-apiserver does): a run started,
cancelled, marked waiting or admitted without the webhook, a control's status written; each
write before its Event, in the plan's order; a run gone is nothing to do, a stale one fails
the pass; and no write at all without the lead."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from coschedule.concurrency.control import parse_control
from coschedule.concurrency.plan import Group, GroupKey
from coschedule.concurrency.runs import Run, State, parse_run, state_of
from coschedule.engines import Kind
from coschedule.k8s.timefmt import parse_time
from coschedule.kube.client import ApiError, KubeClient
from coschedule.reconcile.executor import Executor, NotLeader
from coschedule.reconcile.model import Action, Plan, WriteControlStatus
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.run_plan import plan_admit, plan_group, plan_status
from tests.concurrency.runs import control, pipeline_run, workflow
from tests.reconcile.apiserver import MiniApi

Obj = dict[str, Any]
KEY = GroupKey("ci", "ci", "main")
GROUPED = {"coschedule.dev/concurrency": "grouped", "concurrency.coschedule.dev/ci": "main"}
PENDING = {"coschedule.dev/pending-by": "concurrency"}
BRANCH = "$(params.branch)"
CLOCK = 1_800_000_000.0  # long after the runs' creation (2026-11-23)


def executor(client: KubeClient, *, leading: bool = True) -> tuple[Executor, ReconcileMetrics]:
    metrics = ReconcileMetrics(CollectorRegistry())
    return Executor(client, metrics, leading=lambda: leading, clock=lambda: CLOCK), metrics


def stored_run(api: MiniApi, name: str, second: int, *, held: bool = True) -> Run:
    obj = pipeline_run(
        name,
        labels=dict(GROUPED),
        annotations=dict(PENDING) if held else None,
        status="PipelineRunPending" if held else None,
        created=f"2026-11-23T02:00:{second:02d}Z",
    )
    return parse_run(Kind.PIPELINE_RUN, api.put("pipelineruns", obj))


def sample(metrics: ReconcileMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def writes(api: MiniApi) -> list[tuple[str, str, str | None]]:
    """Every request but reads, in order: (verb, plural, name)."""
    return [(r[0], r[1], r[3]) for r in api.requests if r[0] in ("PATCH", "POST", "DELETE")]


def events(api: MiniApi) -> list[tuple[str, str]]:
    return [
        (e["involvedObject"]["name"], e["reason"])
        for (plural, _, _), e in api.objects.items()
        if plural == "events"
    ]


def spec(api: MiniApi, kind: str, name: str) -> Obj:
    obj = api.get(kind, "ci", name)
    assert obj is not None
    found: Obj = obj["spec"]
    return found


async def test_a_groups_plan_is_carried_out_write_then_event_in_its_order(
    api: MiniApi, client: KubeClient
) -> None:
    runs = (stored_run(api, "old", 1, held=False), stored_run(api, "new", 2))
    ctl = parse_control(control("ci", {"selector": {}, "strategy": "GracefullyStop"}))
    result = plan_group(KEY, {KEY: Group(KEY, ctl, runs)}, CLOCK)
    assert [type(a).__name__ for a in result.actions] == ["CancelRun", "StartRun"]
    run_executor, metrics = executor(client)
    await run_executor.execute(str(KEY), result.actions, None)
    assert writes(api) == [
        ("PATCH", "pipelineruns", "old"),
        ("POST", "events", None),
        ("PATCH", "pipelineruns", "new"),
        ("POST", "events", None),
    ]
    assert events(api) == [("old", "Cancelled"), ("new", "Started")]
    assert spec(api, "pipelineruns", "old")["status"] == "StoppedRunFinally"
    assert "status" not in spec(api, "pipelineruns", "new")
    new = api.get("pipelineruns", "ci", "new") or {}
    assert "coschedule.dev/pending-by" not in (new["metadata"].get("annotations") or {})
    # Stamped with the wall clock's start (its pods compare it with theirs), not the plan's.
    stamp = parse_time(new["metadata"]["annotations"]["coschedule.dev/run-admitted-at"])
    assert stamp is not None
    assert abs(stamp - time.time()) < 60
    old = api.get("pipelineruns", "ci", "old") or {}
    assert "coschedule.dev/run-admitted-at" not in (old["metadata"].get("annotations") or {})
    cancelled = {"strategy": "GracefullyStop"}
    assert sample(metrics, "coschedule_concurrency_cancellations_total", **cancelled) == 1
    assert sample(metrics, "coschedule_concurrency_starts_total") == 1
    assert sample(metrics, "coschedule_concurrency_start_delay_seconds_count") == 1
    delay = sample(metrics, "coschedule_concurrency_start_delay_seconds_sum")
    assert delay == CLOCK - runs[1].created_at


async def test_a_waiting_mark_is_written_with_one_event_per_change(
    api: MiniApi, client: KubeClient
) -> None:
    running, waiting = stored_run(api, "a", 0, held=False), stored_run(api, "b", 1)
    ctl = parse_control(control("ci", {"selector": {}, "strategy": "Queue"}))
    (mark,) = plan_group(KEY, {KEY: Group(KEY, ctl, (running, waiting))}, CLOCK).actions
    run_executor, _ = executor(client)
    await run_executor.execute(str(KEY), [mark], None)
    stored = api.get("pipelineruns", "ci", "b") or {}
    why = stored["metadata"]["annotations"]["coschedule.dev/waiting"]
    assert why.startswith("waiting: 2nd in queue for key main of ConcurrencyControl ci")
    assert events(api) == [("b", "Waiting")]
    # Planned again from what is stored now: nothing to write.
    marked = parse_run(Kind.PIPELINE_RUN, stored)
    assert plan_group(KEY, {KEY: Group(KEY, ctl, (running, marked))}, CLOCK) == Plan()


async def test_a_controls_status_is_written_to_its_subresource(
    api: MiniApi, client: KubeClient
) -> None:
    obj = api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "Queue"}))
    ctl = parse_control(obj)
    groups = [Group(KEY, ctl, (stored_run(api, "a", 0, held=False), stored_run(api, "b", 1)))]
    run_executor, _ = executor(client)
    await run_executor.execute("ci/ci", plan_status("ci", "ci", ctl, obj, groups).actions, None)
    stored = api.get("concurrencycontrols", "ci", "ci") or {}
    # The emulator keeps a generation, as kube-apiserver does: the status says it is for it.
    assert stored["status"] == {"groups": 1, "running": 1, "pending": 1, "observedGeneration": 1}
    assert [(r[0], r[1], r[3]) for r in api.requests if r[1] == "concurrencycontrols"] == [
        ("PATCH", "concurrencycontrols", "ci")
    ]
    assert plan_status("ci", "ci", ctl, stored, groups) == Plan()
    # A control deleted meanwhile has no status to write: not an error.
    api.remove("concurrencycontrols", "ci", "ci")
    gone = WriteControlStatus("ci", "ci", {"groups": 0, "running": 0, "pending": 0})
    await run_executor.execute("ci/ci", [gone], None)


@pytest.mark.parametrize("kind", [Kind.PIPELINE_RUN, Kind.WORKFLOW])
async def test_a_run_the_policy_held_is_admitted_in_one_json_patch_and_an_event(
    api: MiniApi, client: KubeClient, kind: Kind
) -> None:
    if kind is Kind.PIPELINE_RUN:
        obj, plural = pipeline_run("r1", params={"branch": "main"}), "pipelineruns"
        obj["spec"]["status"] = "PipelineRunPending"
    else:
        obj, plural = workflow("r1", params={"branch": "main"}, suspend=True), "workflows"
    obj["metadata"]["labels"]["coschedule.dev/concurrency"] = "grouped"
    obj["metadata"]["annotations"] = {"coschedule.dev/held-by": "admission-policy", **PENDING}
    stored = api.put(plural, obj)
    # No control of its namespace selects it: started as its author submitted it.
    result = plan_admit(kind, "ci", copy.deepcopy(stored), [])
    run_executor, _ = executor(client)
    await run_executor.execute(f"admit:{kind.value}/ci/r1", result.actions, None)
    assert writes(api) == [("PATCH", plural, "r1"), ("POST", "events", None)]
    assert events(api) == [("r1", "AdmittedWithoutWebhook")]
    after = api.get(plural, "ci", "r1") or {}
    assert state_of(kind, after) is State.RUNNING
    assert "coschedule.dev/held-by" not in (after["metadata"].get("annotations") or {})


def held_pipeline_run(api: MiniApi) -> Obj:
    """A PipelineRun as the admission policy ``coschedule-hold-runs`` stores it."""
    obj = pipeline_run("r1", params={"branch": "main"}, status="PipelineRunPending")
    obj["metadata"]["labels"]["coschedule.dev/concurrency"] = "grouped"
    obj["metadata"]["annotations"] = {"coschedule.dev/held-by": "admission-policy", **PENDING}
    return copy.deepcopy(api.put("pipelineruns", obj))


async def test_a_held_run_the_engine_wrote_since_the_read_is_admitted_at_the_first_try(
    api: MiniApi, client: KubeClient
) -> None:
    """Tekton writes a new pending run's status at once (its Pending condition; Chains adds
    its finalizer): a new resourceVersion, nothing the decision read. The admit read before
    that write is taken as it is (a 422 and a retry on the real stack while it tested the
    version)."""
    stored = held_pipeline_run(api)
    ctl = parse_control(control("ci", {"selector": {}, "strategy": "Queue", "key": BRANCH}))
    result = plan_admit(Kind.PIPELINE_RUN, "ci", stored, [ctl])
    engine_write = {
        "metadata": {"finalizers": ["chains.tekton.dev/pipelinerun"]},
        "status": {"conditions": [{"type": "Succeeded", "status": "Unknown"}]},
    }
    api.edit("pipelineruns", "ci", "r1", engine_write)
    run_executor, _ = executor(client)
    await run_executor.execute("admit:PipelineRun/ci/r1", result.actions, None)
    assert events(api) == [("r1", "AdmittedWithoutWebhook")]
    after = api.get("pipelineruns", "ci", "r1") or {}
    assert after["metadata"]["labels"]["concurrency.coschedule.dev/ci"] == "main"
    assert "coschedule.dev/held-by" not in after["metadata"]["annotations"]
    assert after["status"] == engine_write["status"]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"metadata": {"labels": {"team": "x"}}}, id="a label"),
        pytest.param({"metadata": {"annotations": {"note": "x"}}}, id="an annotation"),
        pytest.param({"spec": {"params": [{"name": "branch", "value": "dev"}]}}, id="a param"),
    ],
)
async def test_a_held_run_whose_decision_inputs_changed_since_the_read_is_not_admitted(
    api: MiniApi, client: KubeClient, change: Obj
) -> None:
    """What a control selects on or keys by changed after the read: the decision may be
    another, so the patch is refused (422) and writes nothing; the retry reads again."""
    stored = held_pipeline_run(api)
    ctl = parse_control(control("ci", {"selector": {}, "strategy": "Queue"}))
    result = plan_admit(Kind.PIPELINE_RUN, "ci", stored, [ctl])
    api.edit("pipelineruns", "ci", "r1", change)
    run_executor, _ = executor(client)
    with pytest.raises(ApiError) as raised:
        await run_executor.execute("admit:PipelineRun/ci/r1", result.actions, None)
    assert raised.value.status == 422
    assert events(api) == []
    after = api.get("pipelineruns", "ci", "r1") or {}
    assert after["metadata"]["annotations"]["coschedule.dev/held-by"] == "admission-policy"


async def test_a_run_gone_is_nothing_to_do_and_the_pass_goes_on(
    api: MiniApi, client: KubeClient
) -> None:
    gone, kept = stored_run(api, "gone", 1), stored_run(api, "kept", 2)
    api.remove("pipelineruns", "ci", "gone")
    ctl = parse_control(control("ci", {"selector": {}, "strategy": "Queue", "maxRunning": 2}))
    actions = plan_group(KEY, {KEY: Group(KEY, ctl, (gone, kept))}, CLOCK).actions
    assert [type(a).__name__ for a in actions] == ["StartRun", "StartRun"]
    run_executor, metrics = executor(client)
    await run_executor.execute(str(KEY), actions, None)
    assert events(api) == [("kept", "Started")]
    assert sample(metrics, "coschedule_concurrency_starts_total") == 1


async def test_a_stale_run_fails_the_pass_and_nothing_after_it_is_written(
    api: MiniApi, client: KubeClient
) -> None:
    first, second = stored_run(api, "a", 1), stored_run(api, "b", 2)
    api.edit("pipelineruns", "ci", "a", {"metadata": {"labels": {"touched": "yes"}}})
    ctl = parse_control(control("ci", {"selector": {}, "strategy": "Queue", "maxRunning": 2}))
    actions = plan_group(KEY, {KEY: Group(KEY, ctl, (first, second))}, CLOCK).actions
    run_executor, _ = executor(client)
    with pytest.raises(ApiError) as raised:
        await run_executor.execute(str(KEY), actions, None)
    assert raised.value.status == 409
    assert writes(api) == [("PATCH", "pipelineruns", "a")]
    assert spec(api, "pipelineruns", "b")["status"] == "PipelineRunPending"


async def test_without_the_lead_nothing_is_written(api: MiniApi, client: KubeClient) -> None:
    run = stored_run(api, "a", 1)
    obj = api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "Queue"}))
    ctl = parse_control(obj)
    actions: list[Action] = [
        *plan_group(KEY, {KEY: Group(KEY, None, (run,))}, CLOCK).actions,
        *plan_status("ci", "ci", ctl, obj, [Group(KEY, ctl, (run,))]).actions,
    ]
    assert len(actions) == 2
    follower, _ = executor(client, leading=False)
    for action in actions:
        with pytest.raises(NotLeader):
            await follower.execute(str(KEY), [action], None)
    assert writes(api) == []
