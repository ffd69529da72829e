"""Pods placed by node name through the whole controller over real HTTP (the kmock-based
emulator): a gated pod is released by one JSON patch, a stranded pinned pod is deleted on
the preconditions of the version seen, and a stale view (409, 422) is looked at again,
never a crash, never a wrong write.

The emulator applies JSON patches as kube-apiserver does (a failed ``test`` is 422; node
affinity changes only while a gate holds the pod) and honours delete preconditions (409)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from coschedule.k8s.nodeaffinity import required_terms
from coschedule.kube.client import KubeClient
from coschedule.marks import ANNOTATION_PINNED_NODE, GATE_PLACEHOLDER
from coschedule.reconcile.controller import Controller
from coschedule.reconcile.node_pins import REASON_STRANDED
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually, made_placeholder, placeholder_controller, start
from tests.reconcile.pods import by_node_name, marked_pod
from tests.reconcile.test_controller import SETTINGS, placeholder_pod, seed_cluster

POD = "pr-7f3k2-build-pod"


@pytest.fixture
async def controller(api: MiniApi, client: KubeClient) -> AsyncIterator[Controller]:
    seed_cluster(api)
    manager, made = placeholder_controller(client, SETTINGS, retry_base=0.02)
    await start(manager)
    yield made
    await manager.stop()


def pending(node: str | None = None) -> dict[str, Any]:
    """The run's build pod as the webhook leaves it with placement auto: gated (``node``
    None) or pinned to ``node``."""
    return by_node_name(marked_pod("tekton-taskrun", name=POD, phase="Pending"), node)


def stored(api: MiniApi) -> dict[str, Any]:
    pod = api.get("pods", "ci", POD)
    assert pod is not None
    return pod


def pin_of(pod: dict[str, Any]) -> list[Any]:
    terms: Any = required_terms((pod.get("spec") or {}).get("affinity")) or []
    return [f for term in terms for f in term.get("matchFields") or ()]


def events(api: MiniApi, reason: str) -> list[dict[str, Any]]:
    return [o for (p, _, _), o in api.objects.items() if p == "events" and o["reason"] == reason]


def metric(controller: Controller, name: str) -> float:
    value = controller.metrics.registry.get_sample_value(name, {})
    return value if value is not None else 0.0


async def with_placeholder(api: MiniApi, pod: dict[str, Any], node: str | None) -> str:
    name = await made_placeholder(api, pod)
    if node is not None:
        api.put("pods", placeholder_pod(name, node))
    return name


async def test_a_gated_pod_is_released_onto_its_placeholders_node_once_it_is_bound(
    api: MiniApi, controller: Controller
) -> None:
    name = await with_placeholder(api, pending(), None)
    # The StatefulSet's pod is not bound yet: the pod stays behind the gate.
    api.put("pods", placeholder_pod(name, ""))
    await asyncio.sleep(0.3)
    assert stored(api)["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
    assert api.count("PATCH", "pods") == 0

    api.edit("pods", "ci", f"{name}-0", {"spec": {"nodeName": "worker-2"}})
    await eventually(lambda: not stored(api)["spec"]["schedulingGates"])
    pod = stored(api)
    assert pin_of(pod) == [{"key": "metadata.name", "operator": "In", "values": ["worker-2"]}]
    assert pod["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == "worker-2"
    await asyncio.sleep(0.3)
    assert api.count("PATCH", "pods") == 1  # one patch; later looks find nothing to do
    assert not api.deletes


async def test_a_pending_pod_pinned_to_a_node_its_run_left_is_deleted_on_preconditions(
    api: MiniApi, controller: Controller
) -> None:
    await with_placeholder(api, pending("worker-1"), "worker-2")
    await eventually(lambda: api.get("pods", "ci", POD) is None)
    [(plural, namespace, pod, options)] = api.deletes
    assert (plural, namespace, pod) == ("pods", "ci", POD)
    assert set(options["preconditions"]) == {"uid", "resourceVersion"}
    await eventually(lambda: len(events(api, REASON_STRANDED)) == 1)
    [event] = events(api, REASON_STRANDED)
    assert event["involvedObject"]["kind"] == "PipelineRun"
    assert event["involvedObject"]["name"] == "pr-7f3k2"
    assert (
        "was pending on node worker-1, which its run left for node worker-2" in (event["message"])
    )
    assert metric(controller, "coschedule_stranded_pods_deleted_total") == 1


async def test_a_pod_bound_while_its_delete_was_in_flight_is_not_deleted(
    api: MiniApi, controller: Controller
) -> None:
    """The delete names the version seen; the scheduler binds the pod first: 409, the pod
    stays, nothing is said, and the next look (it is bound) deletes nothing."""
    gate = asyncio.Event()
    api.holds[("DELETE", "pods")] = gate
    await with_placeholder(api, pending("worker-1"), "worker-2")
    await eventually(lambda: api.count("DELETE", "pods") == 1)
    api.edit("pods", "ci", POD, {"spec": {"nodeName": "worker-1"}})
    gate.set()
    await asyncio.sleep(0.5)
    assert stored(api)["spec"]["nodeName"] == "worker-1"
    assert api.deletes == []
    assert api.count("DELETE", "pods") == 1
    assert events(api, REASON_STRANDED) == []
    assert metric(controller, "coschedule_stranded_pods_deleted_total") == 0


async def test_a_release_built_from_a_stale_view_of_the_gates_changes_nothing(
    api: MiniApi, controller: Controller
) -> None:
    """Someone else's gate is put before ours while the patch is in flight: the ``test``
    fails (422), the other gate and the pod's affinity stay as they are; the next look
    releases it from the gate's new place."""
    gate = asyncio.Event()
    api.holds[("PATCH", "pods")] = gate
    await with_placeholder(api, pending(), "worker-1")
    await eventually(lambda: api.count("PATCH", "pods") == 1)
    quota = {"name": "example.com/quota"}
    api.edit("pods", "ci", POD, {"spec": {"schedulingGates": [quota, {"name": GATE_PLACEHOLDER}]}})
    gate.set()
    await eventually(lambda: api.count("PATCH", "pods") == 2)
    await eventually(lambda: stored(api)["spec"]["schedulingGates"] == [quota])
    assert pin_of(stored(api)) == [
        {"key": "metadata.name", "operator": "In", "values": ["worker-1"]}
    ]
    errors = controller.metrics.registry.get_sample_value(
        "coschedule_reconcile_errors_total", {"controller": "placeholder", "code": "422"}
    )
    assert not errors


def passes(controller: Controller) -> float:
    value = controller.metrics.registry.get_sample_value(
        "coschedule_reconcile_total", {"controller": "placeholder"}
    )
    return value or 0.0


async def test_a_release_that_fails_looks_at_its_run_again_and_goes_out_then(
    api: MiniApi, controller: Controller
) -> None:
    """A release is sent apart from its pass: its failure (a 500 here) still queues the run
    again with backoff, counted as the pass's errors are, and the next look releases it."""
    api.faults[("PATCH", "pods")] = [500]
    name = await with_placeholder(api, pending(), None)
    api.put("pods", placeholder_pod(name, "worker-2"))
    await eventually(lambda: not stored(api)["spec"]["schedulingGates"])
    assert api.count("PATCH", "pods") == 2
    assert pin_of(stored(api)) == [
        {"key": "metadata.name", "operator": "In", "values": ["worker-2"]}
    ]
    errors = controller.metrics.registry.get_sample_value(
        "coschedule_reconcile_errors_total", {"controller": "placeholder", "code": "500"}
    )
    assert errors == 1


async def test_a_pass_does_not_wait_for_its_releases(api: MiniApi, controller: Controller) -> None:
    """Its worker is free for other runs while the release is on its way (a slow API server
    here): the pass is counted, the pod still gated; then the release lands."""
    gate = asyncio.Event()
    api.holds[("PATCH", "pods")] = gate
    name = await with_placeholder(api, pending(), None)
    before = passes(controller)
    api.put("pods", placeholder_pod(name, "worker-2"))
    await eventually(lambda: api.count("PATCH", "pods") == 1)  # sent, not answered
    await eventually(lambda: passes(controller) > before and not controller.queue.busy)
    assert stored(api)["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
    gate.set()
    await eventually(lambda: not stored(api)["spec"]["schedulingGates"])
