"""Event -> placeholder keys: which reconciles a change triggers (and which it must not)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

from coschedule.kube.client import KubeClient
from coschedule.kube.informer import Informer, Obj
from coschedule.reconcile import shapes, stuck
from coschedule.reconcile.event_keys import (
    BY_NODE,
    BY_PLACEHOLDER,
    MARKED_POD_INDEXERS,
    PLACEHOLDER_POD_INDEXERS,
    marked_pod_keys,
    node_keys,
    placeholder_pod_keys,
    same_but_version,
)
from tests.reconcile.pods import marked_pod

# The informers are fed by hand (``apply``, as their watch does): no API is reached.
NO_CLIENT = cast(KubeClient, None)


class KeyIndex:
    """The controller's wiring of the three informers to the key functions, in miniature."""

    def __init__(self) -> None:
        self.pods = Informer(NO_CLIENT, "/api/v1/pods", name="pods", indexers=MARKED_POD_INDEXERS)
        self.ppods = Informer(
            NO_CLIENT, "/api/v1/pods", name="ppods", indexers=PLACEHOLDER_POD_INDEXERS
        )
        self.nodes = Informer(NO_CLIENT, "/api/v1/nodes", name="nodes")
        self.keys_seen: list[str] = []
        self.pods.add_handler(lambda e, o, old: self._saw(marked_pod_keys(e, o, old)))
        self.ppods.add_handler(lambda e, o, old: self._saw(placeholder_pod_keys(e, o, old)))
        self.nodes.add_handler(
            lambda e, o, old: self._saw(
                node_keys(e, o, old, self.ppods.by_index(BY_NODE, o["metadata"]["name"]))
            )
        )

    def _saw(self, keys: list[str]) -> None:
        self.keys_seen = keys

    def _deliver(self, informer: Informer, event: str, obj: Obj) -> list[str]:
        self.keys_seen = []
        informer.apply(event, obj)
        return self.keys_seen

    def marked_pod(self, event: str, obj: Obj) -> list[str]:
        return self._deliver(self.pods, event, obj)

    def placeholder_pod(self, event: str, obj: Obj) -> list[str]:
        return self._deliver(self.ppods, event, obj)

    def node(self, event: str, obj: Obj) -> list[str]:
        return self._deliver(self.nodes, event, obj)

    def keys(self) -> set[str]:
        return self.pods.index_values(BY_PLACEHOLDER) | self.ppods.index_values(BY_PLACEHOLDER)

    @property
    def group_pods(self) -> dict[str, set[str]]:
        return {
            key: {f"ci/{o['metadata']['name']}" for o in self.pods.by_index(BY_PLACEHOLDER, key)}
            for key in self.pods.index_values(BY_PLACEHOLDER)
        }

    @property
    def node_pods(self) -> dict[str, set[str]]:
        return {
            node: {o["metadata"]["name"] for o in self.ppods.by_index(BY_NODE, node)}
            for node in self.ppods.index_values(BY_NODE)
        }


def ppod(name: str, instance: str, node: str) -> dict[str, Any]:
    return shapes.slim_placeholder_pod(
        {
            "metadata": {
                "name": name,
                "namespace": "ci",
                "labels": {
                    "app.kubernetes.io/component": "affinity-assistant",
                    "app.kubernetes.io/instance": instance,
                    "app.kubernetes.io/managed-by": "coschedule",
                },
            },
            "spec": {"nodeName": node},
        }
    )


def node(name: str, ready: str = "True", **spec: Any) -> dict[str, Any]:
    heartbeat = {"type": "Ready", "status": ready, "lastHeartbeatTime": "2026-11-26T23:00:00Z"}
    return shapes.slim_node(
        {
            "metadata": {"name": name, "labels": {"a": "b"}},
            "spec": spec,
            "status": {"conditions": [heartbeat, {"type": "MemoryPressure", "status": "False"}]},
        }
    )


def test_node_changes_reach_only_the_placeholders_on_that_node_and_only_when_they_matter() -> None:
    index = KeyIndex()
    assert index.placeholder_pod("ADDED", ppod("p1-0", "p1", "n1")) == ["ci/p1"]
    assert index.placeholder_pod("ADDED", ppod("p2-0", "p2", "n2")) == ["ci/p2"]
    assert index.node("ADDED", node("n1")) == ["ci/p1"]
    assert index.node("MODIFIED", node("n1")) == []  # a status heartbeat: nothing to do
    assert index.node("MODIFIED", node("n1", unschedulable=True)) == ["ci/p1"]
    taint = {"key": "k", "effect": "NoSchedule"}
    assert index.node("MODIFIED", node("n1", unschedulable=True, taints=[taint])) == ["ci/p1"]
    # The pod moves to n2: n1's changes no longer concern it.
    assert index.placeholder_pod("MODIFIED", ppod("p1-0", "p1", "n2")) == ["ci/p1"]
    assert index.node("MODIFIED", node("n1")) == []
    assert index.node("MODIFIED", node("n2", unschedulable=True)) == ["ci/p1", "ci/p2"]
    assert index.placeholder_pod("DELETED", ppod("p1-0", "p1", "n2")) == ["ci/p1"]
    assert index.keys() == {"ci/p2"}


def test_a_node_whose_kubelet_stops_reporting_reaches_its_placeholders() -> None:
    """Ready turning Unknown (before the lifecycle controller's taint) concerns the
    placeholder pods there: one terminating there is force-deleted."""
    index = KeyIndex()
    index.placeholder_pod("ADDED", ppod("p1-0", "p1", "n1"))
    index.node("ADDED", node("n1"))
    assert index.node("MODIFIED", node("n1", ready="Unknown")) == ["ci/p1"]
    assert index.node("MODIFIED", node("n1", ready="Unknown")) == []
    assert index.node("MODIFIED", node("n1", ready="True")) == ["ci/p1"]


def test_marked_pods_are_grouped_by_their_label_and_regrouped_when_it_changes() -> None:
    def pod(label: str | None) -> dict[str, Any]:
        labels = {"coschedule.dev/placeholder": label} if label else {}
        return {"metadata": {"name": "x", "namespace": "ci", "labels": labels}}

    index = KeyIndex()
    assert index.marked_pod("ADDED", pod("a")) == ["ci/a"]
    assert index.marked_pod("MODIFIED", pod("b")) == ["ci/a", "ci/b"]
    assert index.group_pods == {"ci/b": {"ci/x"}}
    assert index.marked_pod("MODIFIED", pod(None)) == ["ci/b"]
    assert index.group_pods == {}


def test_pods_that_are_not_our_placeholders_are_ignored() -> None:
    index = KeyIndex()
    stranger = ppod("web-0", "web", "n1")
    stranger["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "helm"
    assert index.placeholder_pod("ADDED", stranger) == []
    assert index.node_pods == {}


def _slim(pod: dict[str, Any]) -> Obj:
    """The marked pod as the reconciler's cache keeps it."""
    return stuck.with_scheduling(shapes.slim_marked_pod)(copy.deepcopy(pod))


def test_a_running_pods_status_only_change_is_the_same_but_its_version() -> None:
    pod = marked_pod("tekton-taskrun", node="worker-1")
    before = _slim(pod)
    # Containers starting, readiness, a probe: what the kubelet writes all run long.
    pod["metadata"]["resourceVersion"] = "101"
    pod["status"]["containerStatuses"] = [
        {"name": "step", "ready": True, "state": {"running": {"startedAt": "2026-11-21T06:00:01Z"}}}
    ]
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    after = _slim(pod)
    assert after["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"]
    assert same_but_version(before, after)

    # What a pass reads: its phase, its end, its node, its marks, its deletion.
    changes: list[Callable[[dict[str, Any]], None]] = [
        lambda p: p["status"].update(phase="Succeeded"),
        lambda p: p["status"].update(
            containerStatuses=[
                {"name": "step", "state": {"terminated": {"finishedAt": "2026-11-21T06:01:00Z"}}}
            ]
        ),
        lambda p: p["spec"].update(nodeName="worker-2"),
        lambda p: p["metadata"]["annotations"].update({"coschedule.dev/pinned-node": "worker-2"}),
        lambda p: p["metadata"].update(deletionTimestamp="2026-11-21T06:02:00Z"),
    ]
    for change in changes:
        changed = copy.deepcopy(pod)
        change(changed)
        assert not same_but_version(after, _slim(changed))


def test_a_pending_pods_scheduling_condition_is_not_the_same() -> None:
    pod = marked_pod("tekton-taskrun")
    before = _slim(pod)
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no"}
    ]
    assert not same_but_version(before, _slim(pod))


def test_a_placeholders_status_writes_are_the_same_but_its_version() -> None:
    """What the StatefulSet controller and the kubelet write to a placeholder and its pod
    (status) is not in the caches: the same but the version. What a pass reads is not."""
    sts: dict[str, Any] = {
        "metadata": {
            "name": "coschedule-pr-1",
            "namespace": "ci",
            "uid": "u1",
            "resourceVersion": "10",
            "labels": {"app.kubernetes.io/managed-by": "coschedule"},
            "annotations": {"coschedule.dev/run": "pr-1"},
        },
        "spec": {"replicas": 1, "updateStrategy": {"type": "OnDelete"}},
        "status": {"replicas": 0},
    }
    before = shapes.slim_statefulset(copy.deepcopy(sts))
    written = copy.deepcopy(sts)
    written["metadata"]["resourceVersion"] = "11"
    written["status"] = {"replicas": 1, "readyReplicas": 1, "observedGeneration": 2}
    assert same_but_version(before, shapes.slim_statefulset(written))
    sts_changes: list[Callable[[dict[str, Any]], None]] = [
        lambda s: s["spec"].update(replicas=2),
        lambda s: s["metadata"]["labels"].pop("app.kubernetes.io/managed-by"),
        lambda s: s["metadata"]["annotations"].update({"coschedule.dev/claims": "data"}),
        lambda s: s["metadata"].update(deletionTimestamp="2026-11-21T06:02:00Z"),
        lambda s: s["metadata"].update(ownerReferences=[{"kind": "PipelineRun", "name": "pr-1"}]),
    ]
    for change in sts_changes:
        changed = copy.deepcopy(written)
        change(changed)
        assert not same_but_version(before, shapes.slim_statefulset(changed))

    slim_ppod = stuck.with_condition(shapes.slim_placeholder_pod)
    pod = ppod("coschedule-pr-1-0", "coschedule-pr-1", "n1")
    bound = slim_ppod(copy.deepcopy(pod))
    pod["metadata"]["resourceVersion"] = "12"
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    assert same_but_version(bound, slim_ppod(copy.deepcopy(pod)))
    pod_changes: list[Callable[[dict[str, Any]], None]] = [
        lambda p: p["spec"].update(nodeName="n2"),
        lambda p: p["metadata"].update(deletionTimestamp="2026-11-21T06:02:00Z"),
        lambda p: p["spec"].update(tolerations=[{"operator": "Exists"}]),
    ]
    for change in pod_changes:
        changed = copy.deepcopy(pod)
        change(changed)
        assert not same_but_version(bound, slim_ppod(changed))
