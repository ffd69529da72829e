"""Run concurrency control's API layer against the kmock emulator: watches with the label
selector, patches with a resourceVersion precondition, Events, metrics, a missing CRD."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from prometheus_client import CollectorRegistry

from coschedule.concurrency.plan import GroupKey
from coschedule.engines import Kind
from coschedule.k8s.timefmt import parse_time
from coschedule.kube.client import Credentials, KubeClient
from coschedule.kube.controls_cache import ControlCache
from coschedule.reconcile.concurrency import ConcurrencyController
from coschedule.reconcile.manager import Manager
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from tests.concurrency.runs import control, pipeline_run, workflow
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually

Obj = dict[str, Any]
PENDING = {"coschedule.dev/pending-by": "concurrency"}
ADMITTED = "coschedule.dev/run-admitted-at"


def grouped(obj: Obj, control_name: str, value: str, *, ours: bool = True) -> Obj:
    obj = copy.deepcopy(obj)
    obj["metadata"]["labels"].update(
        {
            "coschedule.dev/concurrency": "grouped",
            f"concurrency.coschedule.dev/{control_name}": value,
        }
    )
    if ours:
        obj["metadata"]["annotations"] = dict(PENDING)
    return obj


def pending_pr(name: str, second: int, *, control_name: str = "ci", value: str = "main") -> Obj:
    return grouped(
        pipeline_run(name, status="PipelineRunPending", created=f"2026-11-23T02:00:{second:02d}Z"),
        control_name,
        value,
    )


def pending_wf(name: str, second: int, *, control_name: str = "ci", value: str = "main") -> Obj:
    return grouped(
        workflow(name, suspend=True, created=f"2026-11-23T02:00:{second:02d}Z"), control_name, value
    )


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def managed(client: KubeClient, **options: Any) -> tuple[Manager, ConcurrencyController]:
    manager = Manager(ReconcileMetrics())
    made = ConcurrencyController(client, manager.metrics, leading=manager.is_leading, **options)
    manager.add(made)
    return manager, made


@pytest.fixture
async def manager(client: KubeClient) -> AsyncIterator[Manager]:
    made, _ = managed(client, discovery_retry=0.1, retry_base=0.01)
    made.start_informers()
    yield made
    await made.stop()


@pytest.fixture
def controller(manager: Manager) -> ConcurrencyController:
    [made] = manager.controllers
    assert isinstance(made, ConcurrencyController)
    return made


def control_status(api: MiniApi, name: str = "ci") -> Obj:
    stored = api.get("concurrencycontrols", "ci", name) or {}
    found: Obj = stored.get("status") or {}
    return found


def pr_spec(api: MiniApi, name: str) -> Obj:
    obj = api.get("pipelineruns", "ci", name)
    assert obj is not None
    spec: Obj = obj["spec"]
    return spec


async def test_newest_starts_and_older_is_cancelled_with_events(
    api: MiniApi, controller: ConcurrencyController, manager: Manager
) -> None:
    api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "GracefullyStop"}))
    api.put("pipelineruns", pending_pr("old", 1))
    api.put("pipelineruns", pending_pr("new", 2))
    api.put("workflows", pending_wf("wf-old", 0))
    manager.start_leading()
    await eventually(lambda: "status" not in pr_spec(api, "new"))
    await eventually(lambda: pr_spec(api, "old").get("status") == "StoppedRunFinally")
    wf = api.get("workflows", "ci", "wf-old")
    assert wf is not None
    await eventually(lambda: (api.get("workflows", "ci", "wf-old") or {})["spec"].get("shutdown"))
    wf = api.get("workflows", "ci", "wf-old")
    assert wf is not None
    assert wf["spec"]["shutdown"] == "Stop"
    assert wf["spec"]["suspend"] is False
    for name in ("old", "new"):
        obj = api.get("pipelineruns", "ci", name)
        assert obj is not None
        assert "coschedule.dev/pending-by" not in (obj["metadata"].get("annotations") or {})
    await eventually(lambda: len([k for k in api.objects if k[0] == "events"]) == 3)
    events = {
        e["involvedObject"]["name"]: e for (p, _, _), e in api.objects.items() if p == "events"
    }
    assert events["old"]["reason"] == "Cancelled"
    assert events["old"]["message"] == (
        "cancelled by ConcurrencyControl ci: newer run new, key main"
    )
    assert events["old"]["involvedObject"]["kind"] == "PipelineRun"
    assert events["old"]["involvedObject"]["uid"] == "uid-old"
    assert events["new"]["reason"] == "Started"
    assert events["wf-old"]["involvedObject"]["apiVersion"] == "argoproj.io/v1alpha1"
    registry = controller.metrics.registry
    assert (
        sample(registry, "coschedule_concurrency_cancellations_total", strategy="GracefullyStop")
        == 2
    )
    assert sample(registry, "coschedule_concurrency_start_delay_seconds_count") == 1
    await eventually(lambda: sample(registry, "coschedule_concurrency_pending_runs") == 0)


async def test_a_started_pipeline_run_is_stamped_unless_its_tasks_place_their_pods(
    api: MiniApi, manager: Manager
) -> None:
    """Through the watch's slim runs: a held PipelineRun started by the reconciler gets the
    stamp its first pod reads (its placeholder is seeded from the start); one whose
    ``taskRunSpecs`` podTemplate places its pods is not seeded, so not stamped."""
    api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "Queue"}))
    plain = pending_pr("plain", 1)
    placed = pending_pr("placed", 2, value="other")
    placed["spec"]["taskRunSpecs"] = [
        {"pipelineTaskName": "build", "podTemplate": {"nodeSelector": {"pool": "a"}}}
    ]
    api.put("pipelineruns", plain)
    api.put("pipelineruns", placed)
    before = time.time()
    manager.start_leading()
    await eventually(lambda: "status" not in pr_spec(api, "plain"))
    await eventually(lambda: "status" not in pr_spec(api, "placed"))
    after = time.time()

    def annotations(name: str) -> dict[str, str]:
        stored = api.get("pipelineruns", "ci", name) or {}
        return dict(stored["metadata"].get("annotations") or {})

    stamp = parse_time(annotations("plain").get(ADMITTED))
    assert stamp is not None
    assert before - 0.001 <= stamp <= after + 0.001
    assert ADMITTED not in annotations("placed")


async def test_a_run_the_policy_held_and_the_admit_started_is_stamped(
    api: MiniApi, manager: Manager
) -> None:
    """A PipelineRun held by the admission policy during a webhook outage, which no control
    selects, is started by the reconciler's admit with the stamp its first pod reads, as one
    the reconciler starts from a queue is."""
    api.put(
        "concurrencycontrols",
        control("deploys", {"selector": {"matchLabels": {"team": "x"}}, "strategy": "Queue"}),
    )
    held = pending_pr("held", 1)
    held["metadata"]["annotations"]["coschedule.dev/held-by"] = "admission-policy"
    del held["metadata"]["labels"]["concurrency.coschedule.dev/ci"]
    api.put("pipelineruns", held)
    before = time.time()
    manager.start_leading()
    await eventually(lambda: "status" not in pr_spec(api, "held"))
    after = time.time()
    stored = api.get("pipelineruns", "ci", "held") or {}
    annotations = stored["metadata"].get("annotations") or {}
    assert "coschedule.dev/held-by" not in annotations
    stamp = parse_time(annotations.get(ADMITTED))
    assert stamp is not None
    assert before - 0.001 <= stamp <= after + 0.001


async def test_runs_are_watched_through_the_grouped_label_only(
    api: MiniApi, controller: ConcurrencyController
) -> None:
    await controller.wait_synced()
    for verb in ("GET", "WATCH"):
        for _, _, query in api.calls(verb, "pipelineruns") + api.calls(verb, "workflows"):
            assert query.get("labelSelector") == "coschedule.dev/concurrency", query


async def test_a_stale_decision_meets_409_changes_nothing_and_is_retried_with_backoff(
    api: MiniApi,
    controller: ConcurrencyController,
    manager: Manager,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "Queue"}))
    api.put("pipelineruns", pending_pr("a", 1))
    await controller.wait_synced()
    await eventually(lambda: controller.known_groups())
    # Someone else changes the run; our watch has not told us yet.
    api.muted = True
    api.edit("pipelineruns", "ci", "a", {"metadata": {"labels": {"touched": "yes"}}})
    monkeypatch.setattr(controller.executor, "leading", lambda: True)  # one reconcile, no workers
    (key,) = controller.known_groups()
    # An error like any other: counted, and the key retried with backoff.
    await manager.reconcile_key(controller, key)
    errors = {"controller": "concurrency", "code": "409"}
    assert sample(manager.metrics.registry, "coschedule_reconcile_errors_total", **errors) == 1
    assert (
        sample(manager.metrics.registry, "coschedule_reconcile_total", controller="concurrency")
        == 1
    )
    assert controller.queue.failures(key) == 1
    assert pr_spec(api, "a")["status"] == "PipelineRunPending"
    assert not [k for k in api.objects if k[0] == "events"]
    patches = api.calls("PATCH", "pipelineruns")
    assert len(patches) == 1


async def test_a_deleted_control_releases_its_runs(
    api: MiniApi, controller: ConcurrencyController, manager: Manager
) -> None:
    api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "Queue"}))
    api.put("pipelineruns", pending_pr("a", 1))
    api.put("pipelineruns", pending_pr("b", 2))
    manager.start_leading()
    await eventually(lambda: "status" not in pr_spec(api, "a"))
    await asyncio.sleep(0.2)
    assert pr_spec(api, "b")["status"] == "PipelineRunPending"
    api.remove("concurrencycontrols", "ci", "ci")
    await eventually(lambda: "status" not in pr_spec(api, "b"))


async def test_a_finished_run_frees_a_queue_slot(
    api: MiniApi, controller: ConcurrencyController, manager: Manager
) -> None:
    api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "Queue"}))
    api.put("pipelineruns", pending_pr("a", 1))
    api.put("pipelineruns", pending_pr("b", 2))
    manager.start_leading()
    await eventually(lambda: "status" not in pr_spec(api, "a"))
    api.edit(
        "pipelineruns",
        "ci",
        "a",
        {"status": {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Done"}]}},
    )
    await eventually(lambda: "status" not in pr_spec(api, "b"))


async def test_a_follower_writes_nothing(
    api: MiniApi, controller: ConcurrencyController, manager: Manager
) -> None:
    api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "Queue"}))
    api.put("pipelineruns", pending_pr("a", 1))
    await controller.wait_synced()
    await asyncio.sleep(0.3)
    assert api.count("PATCH", "pipelineruns") == 0
    manager.start_leading()
    await eventually(lambda: "status" not in pr_spec(api, "a"))


@pytest.fixture
async def tekton_only() -> AsyncIterator[MiniApi]:
    async with kmock.KubernetesScaffold() as handler, kmock.Server(handler) as server:
        state = MiniApi(handler, without=frozenset({"workflows"}))
        state.url = str(server.url).rstrip("/")
        yield state
        state.end_watches()


async def test_a_missing_run_crd_is_looked_for_again_and_the_rest_works(
    tekton_only: MiniApi,
) -> None:
    api = tekton_only
    client = KubeClient(Credentials(server=api.url), timeout=5.0)
    manager, made = managed(client, discovery_retry=0.05)
    manager.start_informers()
    try:
        api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "Cancel"}))
        api.put("pipelineruns", pending_pr("a", 1))
        await asyncio.wait_for(made.wait_synced(), 3)
        ready, detail = made.readiness()
        assert ready
        assert detail is not None
        assert "workflows" in detail
        manager.start_leading()
        await eventually(lambda: "status" not in pr_spec(api, "a"))
        # Workflows are not served: nothing watched, discovery keeps asking.
        assert made.absent[Kind.WORKFLOW] is True
        assert api.calls("GET", "workflows") == []
        await asyncio.sleep(0.2)
        assert not all(task.done() for task in manager._informer_tasks)
    finally:
        await manager.stop()
        await client.aclose()


async def test_the_webhook_cache_parses_controls_and_skips_invalid_ones(
    api: MiniApi, client: KubeClient
) -> None:
    cache = ControlCache(client, discovery_retry=0.05)
    api.put("concurrencycontrols", control("good", {"selector": {}, "strategy": "Cancel"}))
    api.put("concurrencycontrols", control("bad", {"selector": {}, "strategy": "Drop"}))
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.wait_synced(), 3)
        assert [c.name for c in cache.controls("ci")] == ["good"]
        assert cache.readiness() == (True, None)
        api.remove("concurrencycontrols", "ci", "good")
        await eventually(lambda: cache.controls("ci") == [])
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_leader_writes_each_controls_counts_to_its_status(
    api: MiniApi, controller: ConcurrencyController, manager: Manager
) -> None:
    api.put(
        "concurrencycontrols",
        control("ci", {"selector": {}, "strategy": "Queue", "maxRunning": 1}),
    )
    for i, name in enumerate(("a", "b", "c")):
        api.put("pipelineruns", pending_pr(name, i))
    api.put("pipelineruns", pending_pr("x", 9, value="other"))
    manager.start_leading()

    # The emulator keeps a generation, as kube-apiserver does: the status says it is for it.
    counts = {"groups": 2, "running": 2, "pending": 2, "observedGeneration": 1}
    await eventually(lambda: control_status(api) == counts, within=5)
    patches = api.count("PATCH", "concurrencycontrols")
    # A status-only change of the control does not requeue its groups or write again.
    await asyncio.sleep(1.5)
    assert api.count("PATCH", "concurrencycontrols") == patches


async def test_a_new_lead_rewrites_a_status_left_wrong_while_it_followed(
    api: MiniApi, controller: ConcurrencyController, manager: Manager
) -> None:
    """A status-only change reaches no listener, and steady groups give no run events: so
    on taking the lead the controller rewrites every control's status from its caches, and
    what another leader left wrong (one that lost the lead mid-write, an older version) is
    put right."""
    api.put(
        "concurrencycontrols",
        control("ci", {"selector": {}, "strategy": "Queue", "maxRunning": 1}),
    )
    api.put("pipelineruns", pending_pr("a", 1))
    api.put("pipelineruns", pending_pr("b", 2))

    counts = {"groups": 1, "running": 1, "pending": 1, "observedGeneration": 1}
    manager.start_leading()
    await eventually(lambda: control_status(api) == counts, within=5)
    manager.stop_leading()
    api.edit("concurrencycontrols", "ci", "ci", {"status": {"groups": 3, "running": 7}})
    await asyncio.sleep(0.5)
    assert control_status(api)["running"] == 7  # a follower writes nothing
    patches = api.count("PATCH", "concurrencycontrols")
    manager.start_leading()
    await eventually(lambda: control_status(api) == counts, within=5)
    assert api.count("PATCH", "concurrencycontrols") == patches + 1


async def test_a_status_only_change_does_not_reach_listeners(
    api: MiniApi, client: KubeClient
) -> None:
    cache = ControlCache(client, discovery_retry=0.05)
    seen: list[str] = []
    cache.listeners.append(lambda ns, name, c: seen.append(name))
    api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "Cancel"}))
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.wait_synced(), 3)
        assert seen == ["ci"]
        api.edit("concurrencycontrols", "ci", "ci", {"status": {"running": 1}})
        await eventually(lambda: (cache.stored("ci", "ci") or {}).get("status"))
        assert seen == ["ci"]
        api.edit("concurrencycontrols", "ci", "ci", {"spec": {"key": "$(params.x)"}})
        await eventually(lambda: seen == ["ci", "ci"])
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_runs_indexes_give_groups_their_runs_and_the_pending_count() -> None:
    """Groups, a control's groups and the held runs come from the informers' indexes, kept
    on every change; a run that changes group has both its old and new group looked at."""
    client = KubeClient(Credentials(server="https://127.0.0.1:1"))  # never called
    registry = CollectorRegistry()
    controller = ConcurrencyController(client, ReconcileMetrics(registry), leading=lambda: False)
    runs, workflows = controller.runs[Kind.PIPELINE_RUN], controller.runs[Kind.WORKFLOW]

    async def looked_at() -> set[str]:
        keys = set()
        while len(controller.queue):
            key = await controller.queue.get()
            controller.queue.done(key)
            keys.add(key)
        return keys

    runs.apply("ADDED", runs.transform(pending_pr("b", 2)))
    runs.apply("ADDED", runs.transform(pending_pr("a", 1)))
    workflows.apply("ADDED", workflows.transform(pending_wf("w", 0)))
    runs.apply("ADDED", runs.transform(pending_pr("x", 3, value="other")))
    runs.apply("ADDED", runs.transform(grouped(pipeline_run("mine"), "ci", "main", ours=False)))
    main, other = GroupKey("ci", "ci", "main"), GroupKey("ci", "ci", "other")
    assert controller.known_groups() == {str(main), str(other)}
    assert controller.groups_of("ci", "ci") == {main, other}
    assert controller.groups_of("ci", "deploy") == set()
    assert [r.name for r in controller.group(main).runs] == ["a", "b", "mine", "w"]
    assert sample(registry, "coschedule_concurrency_pending_runs") == 4
    assert await looked_at() == {str(main), str(other)}

    runs.apply("MODIFIED", runs.transform(pending_pr("x", 3, value="main")))
    assert await looked_at() == {str(main), str(other)}
    assert controller.known_groups() == {str(main)}
    # By kind (PipelineRuns, then Workflows), then namespace/name.
    assert [r.name for r in controller.group(main).runs] == ["a", "b", "mine", "x", "w"]

    runs.apply("DELETED", runs.transform(pending_pr("a", 1)))
    assert sample(registry, "coschedule_concurrency_pending_runs") == 3
    assert await looked_at() == {str(main)}
    assert [r.name for r in controller.group(main).runs] == ["b", "mine", "x", "w"]
    await client.aclose()


def run_annotations(api: MiniApi, name: str) -> dict[str, str]:
    obj = api.get("pipelineruns", "ci", name) or {}
    found: dict[str, str] = obj.get("metadata", {}).get("annotations") or {}
    return found


def waiting_events(api: MiniApi) -> list[tuple[str, str]]:
    return sorted(
        (e["involvedObject"]["name"], e["message"])
        for (p, _, _), e in api.objects.items()
        if p == "events" and e["reason"] == "Waiting"
    )


async def test_a_held_run_says_why_once_and_a_restart_writes_nothing(
    api: MiniApi, client: KubeClient, controller: ConcurrencyController, manager: Manager
) -> None:
    api.put("concurrencycontrols", control("ci", {"selector": {}, "strategy": "Queue"}))
    api.put(
        "pipelineruns",
        grouped(pipeline_run("a", created="2026-11-23T02:00:00Z"), "ci", "main", ours=False),
    )
    api.put("pipelineruns", pending_pr("b", 1))
    api.put("pipelineruns", pending_pr("c", 2))
    manager.start_leading()
    why_b = (
        "waiting: 2nd in queue for key main of ConcurrencyControl ci, behind a, which is "
        "running (1 may run at once)"
    )
    why_c = (
        "waiting: 3rd in queue for key main of ConcurrencyControl ci, behind b, which is "
        "waiting (1 may run at once)"
    )
    await eventually(lambda: waiting_events(api) == [("b", why_b), ("c", why_c)])
    assert run_annotations(api, "b")["coschedule.dev/waiting"] == why_b
    assert run_annotations(api, "c")["coschedule.dev/waiting"] == why_c
    # The annotations' own watch events bring the group back: that look writes nothing.
    await asyncio.sleep(0.5)
    writes = api.count("PATCH", "pipelineruns")
    assert writes == 2
    # A restart (a new leader): the state is on the runs, so nothing is written again.
    await manager.stop()
    second_manager, second = managed(client, discovery_retry=0.1)
    second_manager.start_informers()
    try:
        await second_manager.wait_synced()
        second_manager.start_leading()
        await eventually(second.known_groups)
        for key in sorted(second.known_groups()):
            await second_manager.reconcile_key(second, key)
        await asyncio.sleep(0.5)
        assert api.count("PATCH", "pipelineruns") == writes
        assert len(waiting_events(api)) == 2
        # a is done: b starts (its reason goes with the start patch), c moves up: one write.
        api.edit(
            "pipelineruns",
            "ci",
            "a",
            {"status": {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Done"}]}},
        )
        await eventually(lambda: "status" not in pr_spec(api, "b"))
        assert "coschedule.dev/waiting" not in run_annotations(api, "b")
        moved = why_b.replace("behind a,", "behind b,")
        await eventually(lambda: run_annotations(api, "c").get("coschedule.dev/waiting") == moved)
        await asyncio.sleep(0.3)
        assert api.count("PATCH", "pipelineruns") == writes + 2
        assert waiting_events(api) == [("b", why_b), ("c", moved), ("c", why_c)]
    finally:
        await second_manager.stop()
