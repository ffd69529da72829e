"""A node's kubelet dies mid-run: its placeholder pod, deleted gracefully, would stay
Terminating for ever (nothing confirms the delete), and its StatefulSet would never make it
again. Once the node is marked unreachable, the reconciler force-deletes it (a placeholder
runs nothing) and the placeholder comes back on another node, where later pods follow it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import pytest

from coschedule.k8s.timefmt import micro_time
from coschedule.marks import run_placeholder
from tests.e2e.conftest import E2E
from tests.e2e.kube import Api, ApiError, wait_for
from tests.e2e.runs import node, placeholder_pod_name, wait_bound, wait_placeholder_bound
from tests.e2e.world import TektonRun, bound_claim, describe_namespace, reset_node, unique

pytestmark = pytest.mark.e2e

UNREACHABLE = [
    {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
]


def _ready(api: Api, name: str, status: str, since: float | None = None) -> None:
    """The node's Ready condition, as its kubelet (True) or the node lifecycle controller
    (Unknown: the kubelet stopped posting) sets it; ``since``: when it changed (now)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    condition = {
        "type": "Ready",
        "status": status,
        "reason": "KubeletReady" if status == "True" else "NodeStatusUnknown",
        "message": "fake node of the e2e suite"
        if status == "True"
        else "Kubelet stopped posting node status.",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    api.patch("Node", name, {"status": {"conditions": [condition]}}, subresource="status")


@pytest.fixture
def kill_kubelet(e2e: E2E) -> Iterator[Callable[[str], None]]:
    """``kill(node)``: the fake kubelet stops confirming deletes there; undone afterwards
    (Ready again, untainted, and what was left Terminating there confirmed)."""
    killed: list[str] = []

    def kill(name: str) -> None:
        e2e.agents.dead.add(name)
        killed.append(name)

    yield kill
    for name in killed:
        e2e.agents.dead.discard(name)
        with contextlib.suppress(ApiError):
            _ready(e2e.api, name, "True")
            reset_node(e2e.api, name)


def test_placeholder_stuck_terminating_on_a_dead_node_is_forced_off(
    e2e: E2E, namespace: Callable[..., str], kill_kubelet: Callable[[str], None]
) -> None:
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    bound_claim(api, ns, "source")  # a "network" volume: usable on any node
    run = TektonRun(api, ns, unique("pr")).create()
    run.create_pod("build", claims={"pvc-1f1344866c": "source"})
    placeholder = run_placeholder(ns, run.name)
    first = wait_placeholder_bound(api, ns, placeholder)
    old_node = node(first)
    build = wait_bound(api, ns, run.pod_name("build"), node=old_node)

    # The kubelet dies; something deletes the placeholder pod gracefully meanwhile (the
    # taint manager, a drain): with nobody to confirm it, it stays Terminating.
    kill_kubelet(old_node)
    api.delete("Pod", placeholder_pod_name(placeholder), ns)
    time.sleep(2.0)
    stranded = api.must_get("Pod", placeholder_pod_name(placeholder), ns)
    assert stranded["metadata"]["uid"] == first["metadata"]["uid"], describe_namespace(api, ns)
    assert stranded["metadata"].get("deletionTimestamp"), describe_namespace(api, ns)

    # The node lifecycle controller's verdict (Ready Unknown, the unreachable taints); the
    # reconciler takes the node for dead once it has been silent for 20 s.
    _ready(api, old_node, "Unknown")
    api.patch("Node", old_node, {"spec": {"taints": UNREACHABLE}})
    moved = wait_placeholder_bound(
        api, ns, placeholder, not_uid=first["metadata"]["uid"], not_node=old_node, timeout=60
    )
    new_node = node(moved)

    def forced() -> dict[str, object] | None:
        for event in api.list("Event", ns, field_selector=f"involvedObject.name={placeholder}"):
            if str(event.get("message", "")).startswith("force-deleted placeholder pod"):
                return event
        return None

    event = wait_for(
        "a PlaceholderMoved Event saying the pod was force-deleted",
        forced,
        timeout=10,
        describe=lambda: describe_namespace(api, ns),
    )
    assert event["reason"] == "PlaceholderMoved"
    assert old_node in str(event["message"])
    # The run's own pod on the dead node is not ours to touch: same pod, not deleted.
    still = api.must_get("Pod", run.pod_name("build"), ns)
    assert still["metadata"]["uid"] == build["metadata"]["uid"], describe_namespace(api, ns)
    assert not still["metadata"].get("deletionTimestamp"), describe_namespace(api, ns)
    # Later pods follow the placeholder to the live node.
    run.create_pod("report", fixture="tekton-taskrun-no-workspace")
    wait_bound(api, ns, run.pod_name("report"), node=new_node)


def test_a_silent_node_whose_kubelet_renews_its_lease_keeps_its_placeholder(
    e2e: E2E, namespace: Callable[..., str]
) -> None:
    """After a kube-apiserver outage the node lifecycle controller marks nodes Unknown, and
    under load a kubelet may post Ready again later than the reconciler's 20 s; it renews its
    Lease all the same. A node silent for a minute whose Lease was renewed just now keeps
    its placeholder (read through the shipped RBAC: a Role in kube-node-lease); once that
    renewal is 20 s old the node is dead and the placeholder is forced off."""
    e2e.require("scheduler", "controller-manager", "reconciler")
    api = e2e.api
    ns = namespace(mode="pipelineruns")
    bound_claim(api, ns, "source")  # a "network" volume: usable on any node
    run = TektonRun(api, ns, unique("pr")).create()
    run.create_pod("build", claims={"pvc-1f1344866c": "source"})
    placeholder = run_placeholder(ns, run.name)
    first = wait_placeholder_bound(api, ns, placeholder)
    old_node = node(first)
    wait_bound(api, ns, run.pod_name("build"), node=old_node)

    renewed = time.time()
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": old_node, "namespace": "kube-node-lease"},
        "spec": {
            "holderIdentity": old_node,
            "leaseDurationSeconds": 40,
            "renewTime": micro_time(renewed),
        },
    }
    with contextlib.suppress(ApiError):
        api.delete("Lease", old_node, "kube-node-lease")
    api.create(lease)
    try:
        _ready(api, old_node, "Unknown", since=renewed - 60)
        api.patch("Node", old_node, {"spec": {"taints": UNREACHABLE}})
        time.sleep(max(0.0, renewed + 12 - time.time()))
        kept = api.must_get("Pod", placeholder_pod_name(placeholder), ns)
        assert kept["metadata"]["uid"] == first["metadata"]["uid"], describe_namespace(api, ns)
        assert not kept["metadata"].get("deletionTimestamp"), describe_namespace(api, ns)
        # No renewal since: 20 s after the last one the node is taken for dead.
        moved = wait_placeholder_bound(
            api, ns, placeholder, not_uid=first["metadata"]["uid"], not_node=old_node, timeout=60
        )
        assert time.time() - renewed >= 19.0
        assert node(moved) != old_node
    finally:
        with contextlib.suppress(ApiError):
            api.delete("Lease", old_node, "kube-node-lease")
        with contextlib.suppress(ApiError):
            _ready(api, old_node, "True")
            reset_node(api, old_node)
