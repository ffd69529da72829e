"""Event -> placeholder keys: which reconciles a change triggers (and which it must not)."""

from __future__ import annotations

from typing import Any

from coschedule.reconcile import shapes
from coschedule.reconcile.indexes import KeyIndex


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


def node(name: str, **spec: Any) -> dict[str, Any]:
    return shapes.slim_node({"metadata": {"name": name, "labels": {"a": "b"}}, "spec": spec})


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
