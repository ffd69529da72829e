"""A Node as scheduling rules read it (name, labels, cordon, taints, allocatable, whether its
kubelet reports). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from coschedule.k8s.quantity import resources
from coschedule.k8s.timefmt import parse_time


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, Decimal] = field(default_factory=dict)
    # The Ready condition's status: "True", "False" (the kubelet reports the node cannot run
    # pods), "Unknown" (the kubelet stopped reporting), "" (no condition yet).
    ready: str = ""
    ready_since: float | None = None  # the Ready condition's lastTransitionTime

    def domain(self, topology_key: str) -> str | None:
        return self.labels.get(topology_key)


# What the node lifecycle controller puts on a node whose kubelet stopped reporting (Ready
# Unknown), and on one whose kubelet reports Ready False.
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def kubelet_silent(node: Node) -> str:
    """Why nobody on ``node`` will finish a pod's graceful delete (its kubelet stopped
    reporting: Ready Unknown; or, without a Ready condition, the unreachable taint), or ""
    when its kubelet reports (an unreachable taint left on a Ready node is on its way out)."""
    if node.ready == "Unknown":
        return f"node {node.name} stopped reporting (Ready Unknown)"
    if not node.ready and any(t.key == UNREACHABLE_TAINT for t in node.taints):
        return f"node {node.name} is unreachable (taint {UNREACHABLE_TAINT})"
    return ""


def not_ready(node: Node) -> str:
    """Why ``node`` runs no pods although its kubelet may still report (Ready False, or the
    not-ready taint), or ""; a silent kubelet (``kubelet_silent``) counts too."""
    silent = kubelet_silent(node)
    if silent:
        return silent
    if node.ready == "False":
        return f"node {node.name} is not ready (Ready False)"
    if any(t.key == NOT_READY_TAINT for t in node.taints):
        return f"node {node.name} is not ready (taint {NOT_READY_TAINT})"
    return ""


def ready_condition(status: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Node's Ready condition ({} when it has none)."""
    conditions = status.get("conditions")
    for cond in conditions if isinstance(conditions, list) else ():
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond
    return {}


def ready_status(status: Mapping[str, Any]) -> str:
    """The status of a Node's Ready condition ("" when it has none)."""
    return str(ready_condition(status).get("status") or "")


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def parse_taints(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    """A node's ``spec.taints`` (tolerant of odd shapes)."""
    taints = spec.get("taints")
    return tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in (taints if isinstance(taints, list) else ())
        if isinstance(t, dict)
    )


def parse_node(obj: Mapping[str, Any]) -> Node:
    """From a Node as the API returns it, or a cache's slim copy of one."""
    meta = _dict(obj.get("metadata"))
    spec = _dict(obj.get("spec"))
    status = _dict(obj.get("status"))
    return Node(
        name=str(meta.get("name") or ""),
        unschedulable=bool(spec.get("unschedulable")),
        taints=parse_taints(spec),
        labels={str(k): str(v) for k, v in _dict(meta.get("labels")).items()},
        allocatable=resources(status.get("allocatable")),
        ready=ready_status(status),
        ready_since=parse_time(ready_condition(status).get("lastTransitionTime")),
    )
