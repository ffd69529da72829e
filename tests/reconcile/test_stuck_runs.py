"""Stuck runs through the whole controller over real HTTP (the kmock-based emulator):
the reconciler moves a placeholder when that loses nothing, and otherwise explains, once.

The emulator plays kube-scheduler (the PodScheduled condition and its 1.36 message) and
the StatefulSet controller (placeholder pods) by writing what they would write."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.constants import REQUIRED
from coschedule.kube.client import KubeClient
from coschedule.marks import Mode
from coschedule.reconcile import relocation, stuck_runs
from coschedule.reconcile.controller import Controller
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually, made_placeholder, placeholder_controller, start
from tests.reconcile.pods import marked_pod, placeholder_of, unschedulable
from tests.reconcile.test_controller import PIPELINERUN_UID, placeholder_pod, seed_cluster

GRACE = 2
SETTINGS = Settings(mode=Mode.PIPELINERUNS, stuck_grace_seconds=GRACE)
CPU_MESSAGE = (
    "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match pod affinity rules. "
    "preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, "
    "1 Preemption is not helpful for scheduling."
)


def small_nodes(api: MiniApi) -> None:
    for name in ("worker-1", "worker-2"):
        api.edit(
            "nodes",
            None,
            name,
            {"status": {"allocatable": {"cpu": "2", "memory": "8Gi", "pods": "110"}}},
        )


def filler(node: str, cpu: str) -> dict[str, Any]:
    """Another workload's pod, bound to ``node`` (not marked: the reconciler never watches
    it; it counts when the reconciler asks what is bound there)."""
    return {
        "metadata": {"name": f"filler-{node}", "namespace": "other", "labels": {}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
        },
        "status": {"phase": "Running"},
    }


def stuck_pod(since: float, message: str = CPU_MESSAGE) -> dict[str, Any]:
    pod = marked_pod("tekton-taskrun-two-workspaces", name="pr-7f3k2-test-pod", phase="Pending")
    for container in pod["spec"]["containers"]:
        container["resources"] = {"requests": {"cpu": "0"}}
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    pod["status"]["conditions"] = [unschedulable(message, since)]
    return pod


def events(api: MiniApi, reason: str) -> list[dict[str, Any]]:
    return [o for (p, _, _), o in api.objects.items() if p == "events" and o["reason"] == reason]


@pytest.fixture
async def controller(api: MiniApi, client: KubeClient) -> AsyncIterator[Controller]:
    seed_cluster(api)
    small_nodes(api)
    api.put(
        "taskruns",
        {
            "metadata": {
                "name": "pr-7f3k2-test",
                "namespace": "ci",
                "uid": "3ae19122-223c-5baa-8e8b-39512cf25c8c",
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
    manager, made = placeholder_controller(client, SETTINGS, retry_base=0.02)
    await start(manager)
    yield made
    await manager.stop()


def metric(controller: Controller, name: str, **labels: str) -> float:
    value = controller.metrics.registry.get_sample_value(name, labels)
    return value if value is not None else 0.0


async def start_run(api: MiniApi, *pods: dict[str, Any]) -> str:
    name = placeholder_of(pods[0])
    for pod in pods:
        api.put("pods", pod)
    await eventually(lambda: api.get("statefulsets", "ci", name) is not None)
    api.put("pods", placeholder_pod(name, "worker-1"))
    return name


async def test_nothing_runs_so_the_placeholder_moves_where_the_pod_fits(
    api: MiniApi, controller: Controller
) -> None:
    api.put("pods", filler("worker-1", "1500m"))
    name = await start_run(api, stuck_pod(time.time()))
    # Within the grace: nothing moves.
    await asyncio.sleep(0.5)
    assert (
        relocation.ANNOTATION_RELOCATIONS
        not in (api.get("statefulsets", "ci", name) or {})["metadata"]["annotations"]
    )

    # After the grace (not within it, above): when exactly is the stuck benchmark's to say.
    await eventually(lambda: api.get("pods", "ci", f"{name}-0") is None)
    sts = api.get("statefulsets", "ci", name)
    assert sts is not None
    state = orjson.loads(sts["metadata"]["annotations"][relocation.ANNOTATION_RELOCATIONS])
    assert state["left"] == ["worker-1"]
    assert state["target"] == "worker-2"
    affinity = sts["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    [term] = affinity[REQUIRED]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["worker-1"]}
    ]
    # The run's pods are never deleted; the move is on record three times.
    assert [d[:3] for d in api.deletes] == [("pods", "ci", f"{name}-0")]
    await eventually(
        lambda: (
            metric(controller, "coschedule_relocations_total", reason="insufficient-resources") == 1
        )
    )
    await eventually(lambda: len(events(api, "RunRelocated")) == 2)
    kinds = {e["involvedObject"]["kind"] for e in events(api, "RunRelocated")}
    assert kinds == {"PipelineRun", "Pod"}
    [on_sts] = events(api, "PlaceholderRelocated")
    assert "from node worker-1 towards node worker-2" in on_sts["message"]
    assert "requests 1 cpu" in on_sts["message"]

    # The StatefulSet controller recreates the pod from the old template, on worker-1 again:
    # it is deleted once more. Then it lands on worker-2; no further move.
    api.put("pods", placeholder_pod(name, "worker-1"))
    await eventually(lambda: api.get("pods", "ci", f"{name}-0") is None)
    api.put("pods", placeholder_pod(name, "worker-2"))
    await asyncio.sleep(GRACE + 0.5)
    assert api.get("pods", "ci", f"{name}-0") is not None
    assert api.count("PATCH", "statefulsets") == 1
    # A pod that stays stuck after the move is never sent back to worker-1.
    assert metric(controller, "coschedule_relocations_total", reason="insufficient-resources") <= 2


async def test_a_running_task_forbids_the_move_and_the_stuck_pod_is_explained_once(
    api: MiniApi, controller: Controller
) -> None:
    api.put("pods", filler("worker-1", "1500m"))
    running = marked_pod("tekton-taskrun", node="worker-1")
    name = await start_run(api, running, stuck_pod(time.time() - 10))
    await eventually(lambda: len(events(api, "RunStuck")) == 1, within=GRACE + 3)
    # One Event, on the PipelineRun; it names the stuck pod.
    [on_run] = events(api, "RunStuck")
    assert on_run["involvedObject"]["kind"] == "PipelineRun"
    assert on_run["type"] == "Warning"
    text = on_run["message"]
    assert "pr-7f3k2-test-pod" in text
    assert "node worker-1" in text
    assert "the pod requests 1 cpu and node worker-1 has 0 of 2 free" in text, text
    assert running["metadata"]["name"] in text
    assert "free cpu on node worker-1" in text
    assert metric(controller, "coschedule_stuck_groups") == 1
    assert api.get("pods", "ci", f"{name}-0") is not None
    # Later looks (pod updates) do not repeat the Events.
    api.edit("pods", "ci", "pr-7f3k2-test-pod", {"metadata": {"annotations": {"x": "1"}}})
    await asyncio.sleep(0.3)
    assert len(events(api, "RunStuck")) == 1
    # The pod gets scheduled (capacity freed): no longer stuck.
    api.edit("pods", "ci", "pr-7f3k2-test-pod", {"spec": {"nodeName": "worker-1"}})
    await eventually(lambda: metric(controller, "coschedule_stuck_groups") == 0)
    assert api.count("PATCH", "statefulsets") == 0


async def test_a_node_local_volume_pins_the_run_it_is_explained_never_moved(
    api: MiniApi, controller: Controller
) -> None:
    api.put("pods", filler("worker-1", "1500m"))
    api.put(
        "persistentvolumeclaims",
        {
            "metadata": {"name": "pvc-1f1344866c", "namespace": "ci"},
            "spec": {"volumeName": "local-pv-1"},
            "status": {"phase": "Bound"},
        },
    )
    api.put(
        "persistentvolumes",
        {
            "metadata": {"name": "local-pv-1"},
            "spec": {
                "local": {"path": "/mnt/ssd"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": ["worker-1"],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        },
    )
    name = await start_run(api, stuck_pod(time.time() - 10))
    await eventually(lambda: len(events(api, "RunStuck")) == 1, within=GRACE + 3)
    text = events(api, "RunStuck")[0]["message"]
    assert "claim pvc-1f1344866c (volume local-pv-1, usable on node worker-1)" in text
    assert "volumeClaimTemplates" in text
    assert api.get("pods", "ci", f"{name}-0") is not None
    assert api.count("PATCH", "statefulsets") == 0
    assert metric(controller, "coschedule_stuck_groups") == 1


async def test_a_pod_waiting_for_its_placeholder_is_left_alone(
    api: MiniApi, controller: Controller
) -> None:
    waiting = (
        "0/2 nodes are available: 2 node(s) didn't match pod affinity rules. preemption: "
        "0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    )
    name = await start_run(api, stuck_pod(time.time() - 60, waiting))
    await asyncio.sleep(0.5)
    assert not events(api, "RunStuck")
    assert api.get("pods", "ci", f"{name}-0") is not None
    assert api.count("PATCH", "statefulsets") == 0


Make = Callable[..., Any]


async def test_no_room_elsewhere_is_explained_then_moved_once_room_appears(
    api: MiniApi, controller: Controller, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stuck_runs, "MIN_STUCK_RECHECK_SECONDS", 0.5)
    api.put("pods", filler("worker-1", "1500m"))
    api.put("pods", filler("worker-2", "1900m"))
    name = await start_run(api, stuck_pod(time.time() - 10))
    await eventually(lambda: len(events(api, "RunStuck")) == 1, within=GRACE + 3)
    text = events(api, "RunStuck")[0]["message"]
    assert "no other node can take the pod" in text, text
    assert "worker-2: not enough cpu (0.1 free, 1.001 needed)" in text, text
    assert "add capacity" in text
    assert metric(controller, "coschedule_stuck_groups") == 1
    # Room appears on worker-2 (no event on the run's pods): the periodic look moves it.
    api.remove("pods", "other", "filler-worker-2")
    await eventually(lambda: api.get("pods", "ci", f"{name}-0") is None, within=GRACE + 3)
    await eventually(lambda: metric(controller, "coschedule_stuck_groups") == 0)
    sts = api.get("statefulsets", "ci", name)
    assert sts is not None
    state = orjson.loads(sts["metadata"]["annotations"][relocation.ANNOTATION_RELOCATIONS])
    assert state["target"] == "worker-2"


async def test_a_placeholder_the_scheduler_cannot_place_is_explained(
    api: MiniApi, controller: Controller
) -> None:
    pod = marked_pod("tekton-taskrun")
    name = await made_placeholder(api, pod)
    pending = placeholder_pod(name, "")
    stamp = datetime.fromtimestamp(time.time() - 10, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    message = (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Too "
        "many pods. preemption: 0/3 nodes are available: 3 Preemption is not helpful for "
        "scheduling."
    )
    pending["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": stamp,
            }
        ],
    }
    api.put("pods", pending)
    await eventually(lambda: len(events(api, "PlaceholderUnschedulable")) == 2, within=GRACE + 3)
    kinds = {e["involvedObject"]["kind"] for e in events(api, "PlaceholderUnschedulable")}
    assert kinds == {"StatefulSet", "PipelineRun"}
    text = events(api, "PlaceholderUnschedulable")[0]["message"]
    assert f"pod {name}-0" in text
    assert "2 Too many pods" in text
    assert metric(controller, "coschedule_stuck_groups") == 1
    # Placed at last: no longer stuck.
    api.edit("pods", "ci", f"{name}-0", {"spec": {"nodeName": "worker-2"}})
    await eventually(lambda: metric(controller, "coschedule_stuck_groups") == 0)
