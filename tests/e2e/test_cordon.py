"""Cordon and taint mid-run: the placeholder moves, pods already bound stay, later pods
follow the placeholder (Tekton issue 6586)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from coschedule.marks import run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import wait_for
from tests.e2e.runs import (
    leader_metric,
    node,
    placeholder_pod_name,
    wait_bound,
    wait_placeholder_bound,
)
from tests.e2e.world import (
    HOSTNAME,
    NODES,
    TektonRun,
    bound_claim,
    describe_namespace,
    reset_node,
    unique,
)

pytestmark = pytest.mark.e2e

MAINTENANCE_TAINT = {
    "key": "e2e.coschedule.dev/maintenance",
    "value": "true",
    "effect": "NoSchedule",
}


@pytest.mark.usefixtures("restore_nodes")
@pytest.mark.parametrize("how", ["cordon", "taint"])
def test_placeholder_leaves_a_node_that_stops_accepting_pods(
    e2e: E2E, namespace: Callable[..., str], how: str
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    bound_claim(api, ns, "source")
    run = TektonRun(api, ns, unique("pr")).create()
    run.create_pod("build", claims={"pvc-1f1344866c": "source"})
    placeholder = run_placeholder(ns, run.name)
    first = wait_placeholder_bound(api, ns, placeholder)
    old_node = node(first)
    build = wait_bound(api, ns, run.pod_name("build"), node=old_node)

    if how == "cordon":
        api.patch("Node", old_node, {"spec": {"unschedulable": True}})
    else:
        api.patch("Node", old_node, {"spec": {"taints": [MAINTENANCE_TAINT]}})

    moved = wait_placeholder_bound(
        api, ns, placeholder, not_uid=first["metadata"]["uid"], not_node=old_node
    )
    new_node = node(moved)
    # The run's running pod was left alone: same pod, same node, not being deleted.
    still = api.must_get("Pod", run.pod_name("build"), ns)
    assert still["metadata"]["uid"] == build["metadata"]["uid"], describe_namespace(api, ns)
    assert node(still) == old_node, describe_namespace(api, ns)
    assert not still["metadata"].get("deletionTimestamp"), describe_namespace(api, ns)

    # The move is explained on the StatefulSet: which node, and why.
    def move_event() -> dict[str, object] | None:
        for event in api.list("Event", ns, field_selector=f"involvedObject.name={placeholder}"):
            if old_node in str(event.get("message", "")):
                return event
        return None

    wait_for(
        f"an Event on StatefulSet {placeholder} naming {old_node}",
        move_event,
        timeout=10,
        describe=lambda: "\n".join(
            f"{e.get('reason')}: {e.get('message')}" for e in api.list("Event", ns)
        ),
    )
    # A pod created after the move follows the placeholder.
    run.create_pod("report", fixture="tekton-taskrun-no-workspace")
    wait_bound(api, ns, run.pod_name("report"), node=new_node)
    assert node(api.must_get("Pod", placeholder_pod_name(placeholder), ns)) == new_node


@pytest.mark.usefixtures("restore_nodes")
@pytest.mark.parametrize("how", ["cordon", "taint"])
def test_a_placeholder_pinned_by_a_node_local_volume_stays_and_says_why(
    e2e: E2E, namespace: Callable[..., str], how: str
) -> None:
    """Its claim is bound to a volume usable on its node only (a local disk): moved, the
    placeholder would sit Pending with the run's data left behind. It stays, and a Warning
    Event and ``coschedule_pinned_placeholders`` say why."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    here = next(iter(NODES))
    bound_claim(api, ns, "source", pinned=(HOSTNAME, here))
    run = TektonRun(api, ns, unique("pr")).create()
    run.create_pod("build", claims={"pvc-1f1344866c": "source"})
    placeholder = run_placeholder(ns, run.name)
    first = wait_placeholder_bound(api, ns, placeholder)
    assert node(first) == here
    wait_bound(api, ns, run.pod_name("build"), node=here)

    if how == "cordon":
        api.patch("Node", here, {"spec": {"unschedulable": True}})
    else:
        api.patch("Node", here, {"spec": {"taints": [MAINTENANCE_TAINT]}})

    def pinned_event() -> dict[str, object] | None:
        for event in api.list("Event", ns, field_selector=f"involvedObject.name={placeholder}"):
            if event.get("reason") == "PlaceholderPinned":
                return event
        return None

    event = wait_for(
        f"a PlaceholderPinned Event on StatefulSet {placeholder}",
        pinned_event,
        timeout=10,
        describe=lambda: describe_namespace(api, ns),
    )
    assert event["type"] == "Warning"
    assert here in str(event["message"])
    assert "claim source" in str(event["message"])
    assert leader_metric(e2e, "coschedule_pinned_placeholders") >= 1
    time.sleep(2.0)  # the reconciler has looked again since: still nothing deleted
    still = api.must_get("Pod", placeholder_pod_name(placeholder), ns)
    assert still["metadata"]["uid"] == first["metadata"]["uid"], describe_namespace(api, ns)
    assert not still["metadata"].get("deletionTimestamp"), describe_namespace(api, ns)
    reasons = [e.get("reason") for e in api.list("Event", ns)]
    assert "PlaceholderMoved" not in reasons, reasons
    assert reasons.count("PlaceholderPinned") == 1, reasons  # explained once, not per look

    reset_node(api, here)  # the node takes pods again: nothing is pinned any more
    wait_for(
        "coschedule_pinned_placeholders back to 0",
        lambda: leader_metric(e2e, "coschedule_pinned_placeholders") == 0,
        timeout=10,
    )
