"""The controller end to end over real HTTP: informers -> queue -> plan -> API calls."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.timefmt import micro_time, rfc3339
from coschedule.kube.client import KubeClient
from coschedule.marks import (
    ANNOTATION_RUN_ADMITTED,
    LABEL_ENABLED,
    LABEL_MODE,
    Mode,
    run_placeholder,
)
from coschedule.reconcile import controller as controller_module
from coschedule.reconcile.controller import Controller
from coschedule.reconcile.event_keys import BY_PLACEHOLDER
from coschedule.reconcile.manager import Manager
from coschedule.reconcile.model import OwnerStatus
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from tests.fixtures import DEFAULT_TOLERATIONS
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually, made_placeholder, placeholder_controller, start
from tests.reconcile.pods import marked_pod, placeholder_of

SETTINGS = Settings(mode=Mode.PIPELINERUNS, idle_grace_seconds=300)
ERRORS = "coschedule_reconcile_errors_total"
PIPELINERUN_UID = "eae46c7f-0708-576c-b5d5-0c2976e408c5"
TASKRUN_UID = "5ec72d68-3760-5cfd-8159-dfba55008a34"


def seed_cluster(api: MiniApi) -> None:
    for name in ("worker-1", "worker-2"):
        api.put("nodes", {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    api.put("nodes", {"metadata": {"name": "no-label"}})
    api.put(
        "pipelineruns",
        {
            "metadata": {"name": "pr-7f3k2", "namespace": "ci", "uid": PIPELINERUN_UID},
            "status": {"conditions": [{"type": "Succeeded", "status": "Unknown"}]},
        },
    )
    api.put(
        "taskruns",
        {
            "metadata": {
                "name": "pr-7f3k2-build",
                "namespace": "ci",
                "uid": TASKRUN_UID,
                "ownerReferences": [
                    {
                        "apiVersion": "tekton.dev/v1",
                        "kind": "PipelineRun",
                        "name": "pr-7f3k2",
                        "uid": PIPELINERUN_UID,
                        "controller": True,
                    }
                ],
            }
        },
    )


def placeholder_pod(name: str, node: str) -> dict[str, Any]:
    """What the StatefulSet controller would create for our StatefulSet."""
    return {
        "metadata": {
            "name": f"{name}-0",
            "namespace": "ci",
            "labels": {
                "app.kubernetes.io/component": "affinity-assistant",
                "app.kubernetes.io/instance": name,
                "app.kubernetes.io/managed-by": "coschedule",
            },
        },
        "spec": {"nodeName": node, "tolerations": [dict(t) for t in DEFAULT_TOLERATIONS]},
        "status": {"phase": "Running"},
    }


class Make:
    """Controllers under their managers, started against the fake API; stopped at the end."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.managers: dict[int, Manager] = {}

    async def __call__(self, *, lead: bool = True, settings: Settings = SETTINGS) -> Controller:
        manager, controller = placeholder_controller(
            self.client, settings, retry_base=0.02, owner_recheck=0.2
        )
        self.managers[id(controller)] = manager
        assert not controller.synced
        assert controller.readiness()[0] is False
        await start(manager, lead=False)
        assert controller.readiness() == (True, None)
        if lead:
            manager.start_leading()
        return controller

    def manager(self, controller: Controller) -> Manager:
        return self.managers[id(controller)]


@pytest.fixture
async def make(api: MiniApi, client: KubeClient) -> AsyncIterator[Make]:
    seed_cluster(api)
    made = Make(client)
    yield made
    for manager in made.managers.values():
        await manager.stop()


def node_lease_reads(api: MiniApi) -> list[tuple[str | None, str | None]]:
    return [(ns, name) for ns, name, _ in api.calls("GET", "leases")]


def metric(of: Controller, name: str, **labels: str) -> float:
    value = of.metrics.registry.get_sample_value(name, labels)
    return value if value is not None else 0.0


def passes(of: Controller) -> float:
    """The placeholder controller's reconcile passes so far."""
    return metric(of, "coschedule_reconcile_total", controller="placeholder")


async def settled(of: Controller, quiet: float = 0.3) -> float:
    """The passes once none has run for ``quiet`` seconds and none is queued."""
    while True:
        seen = passes(of)
        await asyncio.sleep(quiet)
        if passes(of) == seen and not of.queue.busy:
            return seen


def cached_version(informer: Any, key: str) -> str:
    """The resourceVersion a cache holds for ``key``."""
    return str(((informer.get(key) or {}).get("metadata") or {}).get("resourceVersion"))


async def test_first_marked_pod_gets_its_statefulset(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    # How soon is a benchmark's to say (bench/reconciler.py), not a timed unit test's.
    controller = await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    assert api.count("POST", "statefulsets") == 1
    sts = api.get("statefulsets", "ci", name)
    assert sts is not None
    assert sts["spec"]["replicas"] == 1
    assert sts["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "coschedule"
    [owner] = sts["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("PipelineRun", PIPELINERUN_UID)
    await eventually(lambda: api.count("POST", "events") == 1)
    [event] = [o for (p, _, _), o in api.objects.items() if p == "events"]
    assert event["reason"] == "PlaceholderCreated"
    assert event["involvedObject"]["kind"] == "StatefulSet"
    assert event["involvedObject"]["uid"] == sts["metadata"]["uid"]
    assert api.count("GET", "taskruns") == 1
    # One lookup of the run (the PipelineRun watch's list is a GET too, of no one name).
    assert [c for c in api.calls("GET", "pipelineruns") if c[1] is not None] == [
        ("ci", "pr-7f3k2", {})
    ]
    await eventually(lambda: metric(controller, "coschedule_placeholders") == 1)
    # The node without the topology-key label is counted.
    assert metric(controller, "coschedule_nodes_missing_topology_key") == 1

    # More pods of the run: no second create, no owner lookups (the root is cached).
    api.put("pods", marked_pod("tekton-taskrun-two-workspaces"))
    await eventually(lambda: api.count("PATCH", "statefulsets") == 1)  # the new claim
    await asyncio.sleep(0.1)
    assert api.count("POST", "statefulsets") == 1
    assert api.count("GET", "taskruns") == 1
    sts = api.get("statefulsets", "ci", name)
    assert sts is not None
    volumes = sts["spec"]["template"]["spec"]["volumes"]
    assert [v["persistentVolumeClaim"]["claimName"] for v in volumes] == [
        "pvc-1f1344866c",
        "pvc-f87b6a85f3",
    ]


async def test_cordon_and_taint_delete_the_placeholder_pod_within_a_second(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    controller = await make()
    pod = marked_pod("tekton-taskrun", node="worker-1")
    name = await made_placeholder(api, pod)
    api.put("pods", placeholder_pod(name, "worker-1"))
    await asyncio.sleep(0.1)
    assert api.count("DELETE", "pods") == 0

    api.edit("nodes", None, "worker-1", {"spec": {"unschedulable": True}})
    await eventually(lambda: api.get("pods", "ci", f"{name}-0") is None)
    assert api.deletes == [("pods", "ci", f"{name}-0", None)]
    assert api.get("pods", "ci", pod["metadata"]["name"]) is not None  # the run's pod stays
    assert api.get("statefulsets", "ci", name) is not None
    # The emulator has the delete before the executor's call returns and counts it.
    await eventually(
        lambda: metric(controller, "coschedule_placeholder_evictions_total", reason="cordoned") == 1
    )
    await eventually(lambda: api.count("POST", "events") == 2)
    moved = [
        o
        for (p, _, _), o in api.objects.items()
        if p == "events" and o["reason"] != "PlaceholderCreated"
    ]
    assert moved[0]["reason"] == "PlaceholderMoved"
    assert "worker-1" in moved[0]["message"]
    assert moved[0]["involvedObject"]["name"] == name

    # The StatefulSet controller recreates it on worker-2; the autoscaler taints that node.
    api.put("pods", placeholder_pod(name, "worker-2"))
    await asyncio.sleep(0.05)
    taint = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1732171000", "effect": "NoSchedule"}
    api.edit("nodes", None, "worker-2", {"spec": {"taints": [taint]}})
    await eventually(lambda: api.get("pods", "ci", f"{name}-0") is None)
    # The emulator has the delete before the executor's call returns and counts it.
    await eventually(
        lambda: metric(controller, "coschedule_placeholder_evictions_total", reason="tainted") == 1
    )


async def test_a_dead_nodes_terminating_placeholder_pod_is_force_deleted_by_uid(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    """The kubelet of worker-1 died after the placeholder pod there was deleted gracefully:
    the pod stays Terminating. Once the node lifecycle controller marks the node (Ready
    Unknown, the unreachable taint), that pod is deleted with grace period 0 and the uid it
    had: the StatefulSet can make it again elsewhere."""
    controller = await make()
    pod = marked_pod("tekton-taskrun", node="worker-1")
    name = await made_placeholder(api, pod)
    stranded = placeholder_pod(name, "worker-1")
    stranded["metadata"]["deletionTimestamp"] = "2026-11-21T06:00:01Z"
    stranded["metadata"]["deletionGracePeriodSeconds"] = 1
    uid = api.put("pods", stranded)["metadata"]["uid"]
    await asyncio.sleep(0.1)
    assert api.count("DELETE", "pods") == 0  # the node reports: its kubelet finishes it

    unreachable = [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
    ]
    api.edit(
        "nodes",
        None,
        "worker-1",
        {
            "spec": {"taints": unreachable},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
        },
    )
    await eventually(lambda: api.get("pods", "ci", f"{name}-0") is None)
    [(_, _, _, options)] = api.deletes
    assert options["gracePeriodSeconds"] == 0
    assert options["preconditions"] == {"uid": uid}
    assert api.get("pods", "ci", pod["metadata"]["name"]) is not None  # the run's pod stays
    await eventually(
        lambda: (
            metric(controller, "coschedule_placeholder_evictions_total", reason="node-down") == 1
        )
    )
    await eventually(lambda: api.count("POST", "events") == 2)
    [moved] = [
        o
        for (p, _, _), o in api.objects.items()
        if p == "events" and o["reason"] == "PlaceholderMoved"
    ]
    assert moved["message"].startswith(f"force-deleted placeholder pod {name}-0")
    assert "worker-1" in moved["message"]

    # The StatefulSet controller made it again on worker-2; a later look deletes nothing.
    api.put("pods", placeholder_pod(name, "worker-2"))
    await asyncio.sleep(0.2)
    assert len(api.deletes) == 1


async def test_a_silent_node_whose_kubelet_renews_its_lease_keeps_its_placeholder(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    """worker-1 has said Ready Unknown for a minute (a control plane back from an outage,
    its kubelet slow to post) but its kubelet renews its Lease: the placeholder stays. Once
    the Lease is as old as the silence, the node is dead and the placeholder is forced off
    (read again after the reconciler's short keep)."""
    controller = await make()
    pod = marked_pod("tekton-taskrun", node="worker-1")
    name = await made_placeholder(api, pod)
    api.put("pods", placeholder_pod(name, "worker-1"))
    lease = {"metadata": {"name": "worker-1", "namespace": "kube-node-lease"}}
    api.put("leases", {**lease, "spec": {"renewTime": micro_time()}})
    silent_since = rfc3339(datetime.now(UTC) - timedelta(seconds=60))
    api.edit(
        "nodes",
        None,
        "worker-1",
        {
            "spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "Unknown", "lastTransitionTime": silent_since}
                ]
            },
        },
    )
    # The node's Lease read (the reconciler's own Lease is read in coschedule-system).
    await eventually(lambda: ("kube-node-lease", "worker-1") in node_lease_reads(api))
    await asyncio.sleep(0.3)
    assert api.count("DELETE", "pods") == 0
    assert metric(controller, "coschedule_placeholder_evictions_total", reason="node-down") == 0

    old = micro_time(time.time() - 120)
    api.put("leases", {**lease, "spec": {"renewTime": old}})
    await asyncio.sleep(2.1)  # past the reconciler's keep of its last read
    both = [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
    ]
    api.edit("nodes", None, "worker-1", {"spec": {"taints": both}})  # a look, as KCM's pass
    await eventually(lambda: api.get("pods", "ci", f"{name}-0") is None)
    [(_, _, _, options)] = api.deletes
    assert options["gracePeriodSeconds"] == 0


async def test_hand_scaled_statefulset_is_patched_back_after_a_conflict(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    controller = await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    uid = api.objects[("statefulsets", "ci", name)]["metadata"]["uid"]

    api.faults[("PATCH", "statefulsets")] = [409]
    api.edit("statefulsets", "ci", name, {"spec": {"replicas": 3}})
    await eventually(lambda: api.count("PATCH", "statefulsets") == 2)
    sts = api.get("statefulsets", "ci", name)
    assert sts is not None
    assert sts["spec"]["replicas"] == 1
    assert sts["metadata"]["uid"] == uid  # patched, never deleted and recreated
    assert api.count("POST", "statefulsets") == 1
    assert api.count("DELETE", "statefulsets") == 0
    assert (
        metric(
            controller, "coschedule_reconcile_errors_total", controller="placeholder", code="409"
        )
        == 1
    )


async def test_a_placeholder_made_by_an_older_version_loses_its_anti_affinity_on_upgrade(
    api: MiniApi, make: Make
) -> None:
    """Before, placeholders kept apart by a preferred anti-affinity; now by a spread
    constraint. A JSON merge patch keeps what it does not name: the drift patch must drop
    the old term, not leave both (every incoming pod's scoring would still walk it)."""
    await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    made = api.get("statefulsets", "ci", name)
    assert made is not None
    uid = made["metadata"]["uid"]
    term = {
        "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "affinity-assistant"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    old_pod_spec = {
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "podAffinityTerm": term}
                ]
            }
        },
        "topologySpreadConstraints": None,
    }
    api.edit(
        "statefulsets",
        "ci",
        name,
        {
            "metadata": {"annotations": {"coschedule.dev/template-hash": "e5a3b58548885428"}},
            "spec": {"template": {"spec": old_pod_spec}},
        },
    )

    def upgraded() -> bool:
        sts = api.get("statefulsets", "ci", name)
        return sts is not None and "topologySpreadConstraints" in sts["spec"]["template"]["spec"]

    await eventually(upgraded)
    sts = api.get("statefulsets", "ci", name)
    assert sts is not None
    assert "affinity" not in sts["spec"]["template"]["spec"], sts["spec"]["template"]
    assert sts["metadata"]["uid"] == uid  # patched in place
    assert (
        sts["metadata"]["annotations"]["coschedule.dev/template-hash"]
        == (made["metadata"]["annotations"]["coschedule.dev/template-hash"])
    )


async def test_patch_from_a_stale_cache_gets_409_and_succeeds_once_the_cache_catches_up(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    controller = await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    # A hand edit whose watch event is still on its way when we plan.
    api.muted = True
    api.edit("statefulsets", "ci", name, {"metadata": {"annotations": {"team": "ci"}}})
    api.muted = False
    api.put("pods", marked_pod("tekton-taskrun-two-workspaces"))  # needs a template patch
    await eventually(
        lambda: (
            metric(
                controller,
                "coschedule_reconcile_errors_total",
                controller="placeholder",
                code="409",
            )
            >= 1
        )
    )
    assert api.count("PATCH", "statefulsets") >= 1
    sts = api.get("statefulsets", "ci", name)
    assert sts is not None
    assert len(sts["spec"]["template"]["spec"]["volumes"]) == 1  # the stale patch was refused
    # The event arrives; the retry plans from the new version and wins.
    api.edit("statefulsets", "ci", name, {"metadata": {"annotations": {"team": "ci"}}})
    await eventually(
        lambda: (
            len((api.get("statefulsets", "ci", name) or {})["spec"]["template"]["spec"]["volumes"])
            == 2
        )
    )
    assert (api.get("statefulsets", "ci", name) or {})["metadata"]["annotations"]["team"] == "ci"


async def test_hand_edit_missed_by_the_watch_is_fixed_after_the_relist(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    api.muted = True
    api.edit("statefulsets", "ci", name, {"spec": {"replicas": 5}})
    api.muted = False
    await asyncio.sleep(0.1)
    assert api.count("PATCH", "statefulsets") == 0  # the cache has not seen it
    api.compact()
    api.end_watches()
    await eventually(
        lambda: (api.get("statefulsets", "ci", name) or {}).get("spec", {}).get("replicas") == 1
    )


async def test_teardown_when_the_pipelinerun_completes_but_not_before(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)

    # The task ends; the PipelineRun goes on (a gap between tasks): keep, and re-check.
    api.edit("pods", "ci", pod["metadata"]["name"], {"status": {"phase": "Succeeded"}})
    gets = api.count("GET", "pipelineruns")
    await eventually(lambda: api.count("GET", "pipelineruns") >= gets + 3, within=3)
    assert api.get("statefulsets", "ci", name) is not None
    assert api.count("GET", "pods") == 2  # two pod informers listed once each: no relists

    api.edit(
        "pipelineruns",
        "ci",
        "pr-7f3k2",
        {"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}},
    )
    await eventually(lambda: api.get("statefulsets", "ci", name) is None, within=2)
    [(_, _, deleted, options)] = [d for d in api.deletes if d[0] == "statefulsets"]
    assert deleted == name
    assert options["propagationPolicy"] == "Background"


def run_reads(api: MiniApi) -> int:
    """GETs of a PipelineRun by name (a watch's list names none)."""
    return len([c for c in api.calls("GET", "pipelineruns") if c[1] is not None])


async def test_a_run_already_done_gets_no_placeholder_for_its_last_pod(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    """Found by the fault tier (the leader killed under a Cancel control): the new leader
    cancels a run whose pod the old one had not placed yet. The run is done, its engine
    deletes that pod, and no placeholder is made for it (one was, without an owner, that
    then had to go with the pod)."""
    api.edit(
        "pipelineruns",
        "ci",
        "pr-7f3k2",
        {"status": {"conditions": [{"type": "Succeeded", "status": "False"}]}},
    )
    await make()
    before = run_reads(api)
    pod = marked_pod("tekton-taskrun")
    api.put("pods", pod)
    # The pod's owner walk ends at the run, which says it is done.
    await eventually(lambda: run_reads(api) > before, within=30)
    await asyncio.sleep(0.5)
    assert api.get("statefulsets", "ci", placeholder_of(pod)) is None


async def test_a_run_deleted_while_its_last_pod_runs_gets_no_placeholder_again(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    """Found on the real stack: a PipelineRun deleted as it finished, its last pod still
    Running. The garbage collector deleted the run's StatefulSet, the reconciler made it
    again (its cached owner said running) twice over, each time deleted by the collector,
    until it asked the API server. The runs' watch said the run was gone first."""
    ctl = await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    key = f"ci/{name}"
    await eventually(lambda: key in ctl.owners.states)  # its owner walked once and cached
    made = len(api.calls("POST", "statefulsets"))
    reads = run_reads(api)
    api.remove("pipelineruns", "ci", "pr-7f3k2")
    await eventually(lambda: not ctl.runs.by_index(BY_PLACEHOLDER, key))
    api.remove("statefulsets", "ci", name)  # the garbage collector, the run gone
    await asyncio.sleep(0.5)
    assert api.get("statefulsets", "ci", name) is None
    assert len(api.calls("POST", "statefulsets")) == made
    assert run_reads(api) == reads  # known from the watch, not asked


async def test_a_finished_runs_placeholder_goes_with_its_last_pod_without_asking_for_the_run(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    """The runs' watch says the run is done: its placeholder goes once its last pod has
    ended, with no GET of the run (before, a quiet run's owner was asked, and walked to
    again, TaskRun then PipelineRun, in the pass after the teardown)."""
    ctl = await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    key = f"ci/{name}"
    await eventually(lambda: key in ctl.owners.states)
    reads = run_reads(api)
    done = {"status": {"conditions": [{"type": "Succeeded", "status": "True"}]}}
    api.edit("pipelineruns", "ci", "pr-7f3k2", done)
    await eventually(lambda: ctl.owners.states[key].status is OwnerStatus.DONE, within=30)
    assert ctl.owners.states[key].detail == "PipelineRun pr-7f3k2 is done"
    api.edit("pods", "ci", pod["metadata"]["name"], {"status": {"phase": "Succeeded"}})
    await eventually(lambda: api.get("statefulsets", "ci", name) is None, within=30)
    await asyncio.sleep(0.5)  # the passes after the teardown (the StatefulSet's deletion)
    assert run_reads(api) == reads
    # Nor is the run's owner walked to again once its group is torn down.
    assert len(api.calls("GET", "taskruns")) == 1


@pytest.mark.parametrize(
    ("run", "goes"),
    [
        pytest.param("done", True, id="run done"),
        pytest.param("gone", True, id="run deleted"),
        pytest.param("running", False, id="run running again"),
    ],
)
async def test_a_new_leader_removes_an_owner_less_placeholder_whose_run_is_done_or_gone(
    api: MiniApi, make: Make, run: str, goes: bool
) -> None:
    """Found by the fault tier: an old leader (of a version that did so) made a StatefulSet
    for a run already done (no owner reference) and was SIGKILLed before the run's pod
    went. The new leader has no root cached: it reads the run its annotations name and
    removes the StatefulSet at once when the run is done or gone, not after the idle grace
    (300 s); a run that may still make pods keeps it."""
    old = await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    await make.manager(old).stop()  # killed: nothing of it is left to the new leader
    # What an earlier version left: the run done, its StatefulSet made with no owner.
    done = {"status": {"conditions": [{"type": "Succeeded", "status": "False"}]}}
    api.edit("pipelineruns", "ci", "pr-7f3k2", done)
    api.edit("statefulsets", "ci", name, {"metadata": {"ownerReferences": None}})
    sts = api.get("statefulsets", "ci", name) or {}
    assert "ownerReferences" not in sts["metadata"]
    assert sts["metadata"]["annotations"]["coschedule.dev/run-label"] == "tekton.dev/pipelineRun"

    api.remove("pods", "ci", pod["metadata"]["name"])
    if run == "gone":
        api.remove("pipelineruns", "ci", "pr-7f3k2")
    elif run == "running":
        # Created now: a run older than the idle grace with no pod gives its placeholder
        # back by that rule (``plan``), which this case is not about.
        running = {
            "metadata": {"creationTimestamp": rfc3339(datetime.now(UTC))},
            "status": {"conditions": [{"type": "Succeeded", "status": "Unknown"}]},
        }
        api.edit("pipelineruns", "ci", "pr-7f3k2", running)

    before = run_reads(api)
    await make()
    if goes:  # long before the 300 s idle grace (a busy machine's patience is under it)
        await eventually(lambda: api.get("statefulsets", "ci", name) is None, within=30)
    else:
        await eventually(lambda: run_reads(api) > before, within=30)
        await asyncio.sleep(0.5)
        assert api.get("statefulsets", "ci", name) is not None


def started_run(namespace: str, name: str) -> dict[str, Any]:
    """A PipelineRun just created and started (Tekton's labels), not done."""
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "creationTimestamp": rfc3339(datetime.now(UTC)),
            "labels": {"tekton.dev/pipeline": "build"},
        },
        "spec": {"pipelineRef": {"name": "build"}},
        "status": {"conditions": [{"type": "Succeeded", "status": "Unknown"}]},
    }


async def test_a_placeholder_made_from_its_run_is_logged_with_the_run(
    api: MiniApi, make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    """No pod and no StatefulSet name the run yet: the runs' cache does."""
    caplog.set_level(logging.INFO, logger="coschedule.reconcile")
    api.put("namespaces", {"metadata": {"name": "early", "labels": {LABEL_ENABLED: "true"}}})
    api.put("pipelineruns", started_run("early", "pr-early"))
    name = run_placeholder("early", "pr-early")
    await make(settings=Settings(mode=Mode.PIPELINERUNS, idle_grace_seconds=300))
    await eventually(lambda: api.get("statefulsets", "early", name) is not None, within=3)

    def created() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "action", None) == "create-statefulset"]

    # Logged once the API server's answer is read: a moment after the object exists.
    await eventually(created, within=3)
    [record] = created()
    assert getattr(record, "run", None) == "pr-early"


@pytest.mark.parametrize(
    "before",
    [
        pytest.param({}, id="enabled"),
        pytest.param({LABEL_ENABLED: "true", LABEL_MODE: "workspaces"}, id="mode to pipelineruns"),
    ],
)
async def test_a_namespace_turned_on_has_its_started_runs_seeded(
    api: MiniApi, make: Callable[..., Any], before: dict[str, str]
) -> None:
    """A started run in a namespace that is not on gets no placeholder from the run; when
    the namespace's labels turn it on, the runs already in the cache are looked at again
    and the run's placeholder is made before any pod (it waited for the first pod)."""
    api.put("namespaces", {"metadata": {"name": "late", "labels": dict(before)}})
    api.put("pipelineruns", started_run("late", "pr-late"))
    name = run_placeholder("late", "pr-late")
    await make(settings=Settings(mode=Mode.WORKSPACES, idle_grace_seconds=300))
    await asyncio.sleep(0.5)
    assert api.get("statefulsets", "late", name) is None
    on = {LABEL_ENABLED: "true", LABEL_MODE: "pipelineruns"}
    api.edit("namespaces", None, "late", {"metadata": {"labels": on}})
    await eventually(lambda: api.get("statefulsets", "late", name) is not None, within=3)
    [owner] = (api.get("statefulsets", "late", name) or {})["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("PipelineRun", "pr-late")


async def test_a_run_held_past_the_idle_grace_is_seeded_when_started_with_the_stamp(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    """A run held by concurrency control for longer than the idle grace, then started by
    the reconciler (which stamps it): its placeholder is made at the start, before any pod,
    as for a run started at its creation. Started without the stamp (by its author), it
    waits for its first pod, as before."""
    api.put("namespaces", {"metadata": {"name": "ci", "labels": {LABEL_ENABLED: "true"}}})
    for name in ("pr-held", "pr-author"):
        run = started_run("ci", name)
        run["metadata"]["creationTimestamp"] = rfc3339(datetime.now(UTC) - timedelta(hours=1))
        run["spec"]["status"] = "PipelineRunPending"
        api.put("pipelineruns", run)
    await make(settings=Settings(mode=Mode.PIPELINERUNS, idle_grace_seconds=300))
    started = {"spec": {"status": None}}
    api.edit("pipelineruns", "ci", "pr-author", started)
    stamp = {"metadata": {"annotations": {ANNOTATION_RUN_ADMITTED: micro_time()}}}
    api.edit("pipelineruns", "ci", "pr-held", {**started, **stamp})
    held = run_placeholder("ci", "pr-held")
    await eventually(lambda: api.get("statefulsets", "ci", held) is not None, within=3)
    [owner] = (api.get("statefulsets", "ci", held) or {})["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("PipelineRun", "pr-held")
    assert api.get("statefulsets", "ci", run_placeholder("ci", "pr-author")) is None


async def test_malformed_marks_are_logged_and_skipped_and_the_loop_goes_on(
    api: MiniApi, make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    await make()
    bad = marked_pod("argo-workflow-pod", name="bad")
    bad["metadata"]["labels"]["coschedule.dev/placeholder"] = "affinity-assistant-0000000000"
    with caplog.at_level(logging.ERROR, logger="coschedule.reconcile"):
        api.put("pods", bad)
        await eventually(lambda: "malformed" in caplog.text)
    assert api.count("POST", "statefulsets") == 0
    record = next(r for r in caplog.records if "malformed" in r.getMessage())
    assert record.placeholder == "affinity-assistant-0000000000"  # type: ignore[attr-defined]
    good = marked_pod("tekton-taskrun")
    api.put("pods", good)
    await eventually(lambda: api.get("statefulsets", "ci", placeholder_of(good)) is not None)


async def test_api_errors_are_retried_with_backoff(
    api: MiniApi, make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    controller = await make()
    api.faults[("POST", "statefulsets")] = [403, 500, 429]
    pod = marked_pod("tekton-taskrun")
    with caplog.at_level(logging.WARNING, logger="coschedule.reconcile"):
        api.put("pods", pod)
        await eventually(lambda: api.get("statefulsets", "ci", placeholder_of(pod)) is not None)
    assert api.count("POST", "statefulsets") == 4
    for code in ("403", "500", "429"):
        assert (
            metric(
                controller, "coschedule_reconcile_errors_total", controller="placeholder", code=code
            )
            == 1
        )
        assert f"API error {code}" in caplog.text


async def test_only_the_leader_acts(api: MiniApi, make: Make) -> None:
    follower = await make(lead=False)
    pod = marked_pod("tekton-taskrun")
    api.put("pods", pod)
    await eventually(lambda: follower.queue.busy)
    await asyncio.sleep(0.2)
    assert api.count("POST", "statefulsets") == 0
    make.manager(follower).start_leading()
    await eventually(lambda: api.get("statefulsets", "ci", placeholder_of(pod)) is not None)
    make.manager(follower).stop_leading()
    other = marked_pod("argo-workflow-pod")
    api.put("pods", other)
    await asyncio.sleep(0.2)
    assert api.count("POST", "statefulsets") == 1


async def test_restart_mid_run_creates_and_deletes_nothing(api: MiniApi, make: Make) -> None:
    first = await make()
    pod = marked_pod("tekton-taskrun", node="worker-1")
    name = await made_placeholder(api, pod)
    api.put("pods", placeholder_pod(name, "worker-1"))
    await asyncio.sleep(0.1)
    await make.manager(first).stop()
    writes = [r for r in api.requests if r[0] in ("POST", "PATCH", "PUT", "DELETE")]

    second = await make()
    await asyncio.sleep(0.3)
    assert second.queue.failures(f"ci/{name}") == 0
    after = [r for r in api.requests if r[0] in ("POST", "PATCH", "PUT", "DELETE")]
    assert after == writes


async def test_readiness_and_metrics_on_the_health_port(
    api: MiniApi, tmp_path: Any, unused_tcp_port: int
) -> None:
    import argparse

    import httpx

    from coschedule.config.store import SettingsStore
    from coschedule.kube.client import Credentials
    from coschedule.reconcile.main import serve_reconciler

    seed_cluster(api)
    args = argparse.Namespace(
        health_port=unused_tcp_port, leader_elect=True, namespace="coschedule-system"
    )
    store = SettingsStore(None, {"COSCHEDULE_COSCHEDULE": "pipelineruns"})
    stop = asyncio.Event()
    metrics = ReconcileMetrics()
    task = asyncio.create_task(
        serve_reconciler(args, Credentials(server=api.url), store, metrics, stop)
    )
    base = f"http://127.0.0.1:{unused_tcp_port}"
    async with httpx.AsyncClient(base_url=base) as http:

        async def ready() -> int:
            try:
                return (await http.get("/readyz")).status_code
            except httpx.TransportError:
                return 0

        for _ in range(300):
            if await ready() == 200:
                break
            await asyncio.sleep(0.01)
        assert await ready() == 200
        assert (await http.get("/livez")).status_code == 200
        pod = marked_pod("tekton-taskrun")
        api.put("pods", pod)
        await eventually(lambda: api.get("statefulsets", "ci", placeholder_of(pod)) is not None)
        text = (await http.get("/metrics")).text
        assert "coschedule_reconcile_total" in text
        assert "coschedule_placeholders 1.0" in text
        assert "coschedule_reconciler_leader 1.0" in text
        assert 'coschedule_placeholder_evictions_total{reason="cordoned"} 0.0' in text
        assert "coschedule_watch_relists_total" in text
    stop.set()
    await asyncio.wait_for(task, 5)
    lease = api.get("leases", "coschedule-system", "coschedule-reconciler")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == ""  # released on the way out


async def test_statefulset_deleted_by_hand_while_the_run_lives_is_recreated(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    first_uid = api.objects[("statefulsets", "ci", name)]["metadata"]["uid"]
    api.remove("statefulsets", "ci", name)
    await eventually(lambda: api.get("statefulsets", "ci", name) is not None)
    assert api.objects[("statefulsets", "ci", name)]["metadata"]["uid"] != first_uid
    assert api.count("POST", "statefulsets") == 2


async def _workspaces_placeholder(
    api: MiniApi, make: Callable[..., Any], *, idle_grace_seconds: int
) -> tuple[dict[str, Any], str]:
    """A workspaces-mode pod mounting claim ``etl-scratch`` (which exists), and its
    placeholder once created."""
    await make(settings=Settings(mode=Mode.WORKSPACES, idle_grace_seconds=idle_grace_seconds))
    api.put("persistentvolumeclaims", {"metadata": {"name": "etl-scratch", "namespace": "data"}})
    pod = marked_pod("job-pod", Mode.WORKSPACES)
    name = placeholder_of(pod)
    api.put("pods", pod)
    await eventually(lambda: api.get("statefulsets", "data", name) is not None)
    return pod, name


async def test_workspaces_group_goes_after_the_idle_grace_with_no_owner_lookup(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    pod, name = await _workspaces_placeholder(api, make, idle_grace_seconds=1)
    sts = api.get("statefulsets", "data", name)
    assert sts is not None
    assert "ownerReferences" not in sts["metadata"]
    api.edit("pods", "data", pod["metadata"]["name"], {"status": {"phase": "Failed"}})
    await asyncio.sleep(0.5)
    assert api.get("statefulsets", "data", name) is not None  # inside the grace
    await eventually(lambda: api.get("statefulsets", "data", name) is None)
    assert api.count("GET", "jobs") == 0


async def test_workspaces_group_goes_at_once_when_its_run_and_claim_are_deleted(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    """A run deleted with its claim (Tekton's volumeClaimTemplate claim): the placeholder
    that mounts the claim goes when the run's pods do, not after the idle grace."""
    pod, name = await _workspaces_placeholder(api, make, idle_grace_seconds=300)
    api.edit("pods", "data", pod["metadata"]["name"], {"status": {"phase": "Succeeded"}})
    await asyncio.sleep(0.5)
    assert api.get("statefulsets", "data", name) is not None  # the claim is still there
    assert api.count("GET", "persistentvolumeclaims") >= 1
    api.edit(
        "persistentvolumeclaims",
        "data",
        "etl-scratch",
        {"metadata": {"deletionTimestamp": "2026-11-25T00:00:00Z"}},
    )
    api.remove("pods", "data", pod["metadata"]["name"])
    # Long before the 300 s idle grace (a busy machine's patience is well under it).
    await eventually(lambda: api.get("statefulsets", "data", name) is None, within=60)


async def test_a_run_keeps_a_claim_while_the_pod_that_mounts_it_is_remade(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    """The pod mounting the run's claim is deleted (its engine remakes it): the placeholder
    keeps the claim, read once to see it still exists, and no template patch flaps it out
    and back. Once the claim is deleted, the template lets it go."""
    await make()
    claim = "pvc-1f1344866c"
    api.put("persistentvolumeclaims", {"metadata": {"name": claim, "namespace": "ci"}})
    mounting = marked_pod("tekton-taskrun", name="mounting")
    other = marked_pod("tekton-taskrun-no-workspace", name="other", created="2026-11-21T06:01:00Z")
    api.put("pods", other)
    name = await made_placeholder(api, mounting)

    def claims() -> str:
        sts = api.get("statefulsets", "ci", name) or {}
        return str(sts["metadata"]["annotations"]["coschedule.dev/claims"])

    await eventually(lambda: claims() == claim)
    patched = api.count("PATCH", "statefulsets")
    api.remove("pods", "ci", "mounting")
    await eventually(lambda: api.count("GET", "persistentvolumeclaims") >= 1)
    api.put("pods", mounting)
    api.edit("pods", "ci", "other", {"metadata": {"labels": {"poke": "1"}}})
    await asyncio.sleep(0.5)
    assert claims() == claim
    assert api.count("PATCH", "statefulsets") == patched
    api.remove("pods", "ci", "mounting")
    api.remove("persistentvolumeclaims", "ci", claim)
    await eventually(lambda: claims() == "")


async def test_topology_key_reload_recounts_nodes_missing_it(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    current = {"settings": SETTINGS}
    controller = await make()
    controller.settings = lambda: current["settings"]
    assert metric(controller, "coschedule_nodes_missing_topology_key") == 1
    current["settings"] = Settings(
        mode=Mode.PIPELINERUNS, topology_key="topology.kubernetes.io/zone"
    )
    controller.settings_changed()
    assert metric(controller, "coschedule_nodes_missing_topology_key") == 3
    api.edit(
        "nodes", None, "worker-1", {"metadata": {"labels": {"topology.kubernetes.io/zone": "a"}}}
    )
    await eventually(lambda: metric(controller, "coschedule_nodes_missing_topology_key") == 2)


async def test_statefulset_that_lost_its_labels_is_relabelled_not_duplicated(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    await make()
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    uid = api.objects[("statefulsets", "ci", name)]["metadata"]["uid"]
    # Dropping managed-by takes it out of our watch's selection: it looks gone to us.
    api.edit(
        "statefulsets", "ci", name, {"metadata": {"labels": {"app.kubernetes.io/managed-by": None}}}
    )
    await eventually(
        lambda: (
            (api.get("statefulsets", "ci", name) or {})["metadata"]["labels"].get(
                "app.kubernetes.io/managed-by"
            )
            == "coschedule"
        )
    )
    assert api.objects[("statefulsets", "ci", name)]["metadata"]["uid"] == uid
    assert api.count("POST", "statefulsets") == 2  # the second one was refused: 409
    assert api.count("POST", "events") == 1


async def test_owner_lookup_outage_does_not_delay_the_placeholder(
    api: MiniApi, make: Callable[..., Any]
) -> None:
    await make()
    api.faults[("GET", "taskruns")] = [503, 503]
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    sts = api.get("statefulsets", "ci", name)
    assert sts is not None
    # Made while the owner lookup still failed: the outage did not hold it back.
    assert "ownerReferences" not in sts["metadata"]
    # The lookup is retried (OWNER_RETRY_SECONDS, shortened here by a pod event) and the
    # owner is patched in.
    api.edit("pods", "ci", pod["metadata"]["name"], {"metadata": {"labels": {"touch": "1"}}})
    await eventually(
        lambda: "ownerReferences" in (api.get("statefulsets", "ci", name) or {})["metadata"]
    )
    refs = (api.get("statefulsets", "ci", name) or {})["metadata"]["ownerReferences"]
    assert refs[0]["uid"] == PIPELINERUN_UID


async def test_a_running_pods_status_only_events_start_no_pass_its_end_does(
    api: MiniApi, client: KubeClient
) -> None:
    """The kubelet's many writes to a running pod (containers started, ready, probes) change
    nothing a pass reads: the cache follows them, no pass starts. The pod's end does."""
    seed_cluster(api)
    manager, controller = placeholder_controller(client, SETTINGS, owner_recheck=3600)
    try:
        await start(manager)
        pod = marked_pod("tekton-taskrun", node="worker-1")
        name = await made_placeholder(api, pod)
        api.put("pods", placeholder_pod(name, "worker-1"))
        pod_key = f"ci/{pod['metadata']['name']}"
        before = await settled(controller)
        for ready in (False, True, False):
            status = {
                "containerStatuses": [
                    {"name": "step", "ready": ready, "state": {"running": {"startedAt": "x"}}}
                ],
                "conditions": [{"type": "Ready", "status": str(ready)}],
            }
            stored = api.edit("pods", "ci", pod["metadata"]["name"], {"status": status})
            version = str(stored["metadata"]["resourceVersion"])
            await eventually(
                lambda v=version: cached_version(controller.pods, pod_key) == v  # type: ignore[misc]
            )
        assert await settled(controller) == before

        done = {
            "phase": "Succeeded",
            "containerStatuses": [
                {"name": "step", "state": {"terminated": {"finishedAt": "2026-11-21T06:05:00Z"}}}
            ],
        }
        api.edit("pods", "ci", pod["metadata"]["name"], {"status": done})
        await eventually(lambda: passes(controller) > before)
    finally:
        await manager.stop()


async def test_status_writes_of_a_placeholder_start_no_pass_its_changes_do(
    api: MiniApi, client: KubeClient
) -> None:
    """The StatefulSet controller's status writes to a placeholder and the kubelet's to its
    pod change nothing a pass reads (the caches keep no status): no pass. A hand scale of the
    StatefulSet and its pod's deletion each start one."""
    seed_cluster(api)
    manager, controller = placeholder_controller(client, SETTINGS, owner_recheck=3600)
    try:
        await start(manager)
        pod = marked_pod("tekton-taskrun", node="worker-1")
        name = await made_placeholder(api, pod)
        api.put("pods", placeholder_pod(name, "worker-1"))
        before = await settled(controller)
        for ready in (0, 1, 1):
            stored = api.edit(
                "statefulsets",
                "ci",
                name,
                {"status": {"replicas": 1, "readyReplicas": ready, "observedGeneration": 2}},
            )
            version = str(stored["metadata"]["resourceVersion"])
            await eventually(
                lambda v=version: cached_version(controller.statefulsets, f"ci/{name}") == v  # type: ignore[misc]
            )
            status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
            stored = api.edit("pods", "ci", f"{name}-0", {"status": status})
            version = str(stored["metadata"]["resourceVersion"])
            await eventually(
                lambda v=version: cached_version(controller.placeholder_pods, f"ci/{name}-0") == v  # type: ignore[misc]
            )
        assert await settled(controller) == before

        changes: list[tuple[str, str, dict[str, Any]]] = [
            ("statefulsets", name, {"spec": {"replicas": 3}}),
            ("pods", f"{name}-0", {"metadata": {"deletionTimestamp": "2026-11-21T06:02:00Z"}}),
        ]
        for plural, obj_name, patch in changes:
            seen = await settled(controller)
            api.edit(plural, "ci", obj_name, patch)
            await eventually(lambda s=seen: passes(controller) > s)  # type: ignore[misc]
    finally:
        await manager.stop()


async def test_a_runs_pods_changing_one_after_another_make_one_pass(
    api: MiniApi, client: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's pods bound, started or ended one after another (nothing waits on a pass
    for them) are looked at together: one pass within the window, not one per pod."""
    monkeypatch.setattr(controller_module, "COALESCE_SECONDS", 1.0)  # a busy machine's room
    seed_cluster(api)
    manager, controller = placeholder_controller(client, SETTINGS, owner_recheck=3600)
    try:
        await start(manager)
        pods = [
            marked_pod(
                "tekton-taskrun", name=f"pr-7f3k2-t{i}-pod", node="worker-1", phase="Pending"
            )
            for i in range(10)
        ]
        name = placeholder_of(pods[0])
        for pod in pods:
            api.put("pods", pod)
        await eventually(lambda: api.get("statefulsets", "ci", name) is not None)
        api.put("pods", placeholder_pod(name, "worker-1"))
        before = await settled(controller, quiet=1.5)  # beyond the window
        for pod in pods:  # each seen by the controller before the next
            stored = api.edit(
                "pods", "ci", pod["metadata"]["name"], {"status": {"phase": "Running"}}
            )
            version = str(stored["metadata"]["resourceVersion"])
            key = f"ci/{pod['metadata']['name']}"
            await eventually(
                lambda k=key, v=version: cached_version(controller.pods, k) == v  # type: ignore[misc]
            )
        # One pass (two if the ten took longer than the window on a loaded machine).
        assert 1 <= await settled(controller, quiet=1.5) - before <= 2
    finally:
        await manager.stop()
