"""Node changes a scenario makes (cordon, taint), undone afterwards."""

from __future__ import annotations

from tests.e2e.kube import Api, Obj

MAINTENANCE_TAINT = {
    "key": "real.coschedule.dev/maintenance",
    "value": "true",
    "effect": "NoSchedule",
}


def cordon(api: Api, node: str, unschedulable: bool = True) -> None:
    api.patch("Node", node, {"spec": {"unschedulable": unschedulable}})


def add_taint(api: Api, node: str, taint: Obj) -> None:
    taints = [t for t in api.must_get("Node", node)["spec"].get("taints") or [] if t != taint]
    api.patch("Node", node, {"spec": {"taints": [*taints, taint]}})


def restore(api: Api, node: str) -> None:
    """Schedulable, without the suite's maintenance taint (the kubelet's own taints kept)."""
    spec = api.must_get("Node", node)["spec"]
    taints = [t for t in spec.get("taints") or [] if t["key"] != MAINTENANCE_TAINT["key"]]
    api.patch("Node", node, {"spec": {"unschedulable": None, "taints": taints or None}})
