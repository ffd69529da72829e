"""Cordon and taint mid-run: the placeholder moves, pods already bound stay, later pods
follow the placeholder (Tekton issue 6586)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coschedule.marks import run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import wait_for
from tests.e2e.runs import node, placeholder_pod_name, wait_bound, wait_placeholder_bound
from tests.e2e.world import TektonRun, bound_claim, describe_namespace, unique

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
