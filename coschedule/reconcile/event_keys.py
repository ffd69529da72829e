"""Which placeholder keys (``namespace/name``) an informer event concerns, and the index
functions the informers keep for it. Pure: no I/O, no state of its own (the informers
hold the indexes).

A marked pod belongs to the key of its label; a placeholder pod to its instance (and sits
on a node); a node concerns the placeholder pods on it, and only when a change could move
them (cordon, taints).
"""

from __future__ import annotations

from collections.abc import Sequence

from coschedule.k8s.nodes import Taint, parse_taints, ready_status
from coschedule.kube.informer import IndexFunc, Obj
from coschedule.reconcile import shapes

BY_PLACEHOLDER = "placeholder"
BY_NODE = "node"
BY_NAMESPACE = "namespace"


def _namespace(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def marked_pod_key(obj: Obj) -> list[str]:
    """Index: the placeholder a marked pod joins (none without the label)."""
    group = shapes.marked_placeholder(obj)
    return [f"{_namespace(obj)}/{group}"] if group else []


def placeholder_pod_key(obj: Obj) -> list[str]:
    """Index: the placeholder whose pod this is (none if it is not one of ours)."""
    instance = shapes.placeholder_instance(obj)
    return [f"{_namespace(obj)}/{instance}"] if instance else []


def placeholder_pod_node(obj: Obj) -> list[str]:
    """Index: the node a placeholder pod of ours runs on (none while unscheduled)."""
    if not shapes.placeholder_instance(obj):
        return []
    node = str((obj.get("spec") or {}).get("nodeName") or "")
    return [node] if node else []


MARKED_POD_INDEXERS: dict[str, IndexFunc] = {BY_PLACEHOLDER: marked_pod_key}
PLACEHOLDER_POD_INDEXERS: dict[str, IndexFunc] = {
    BY_PLACEHOLDER: placeholder_pod_key,
    BY_NODE: placeholder_pod_node,
}


def marked_pod_keys(event: str, obj: Obj, old: Obj | None) -> list[str]:
    """The group it left (its label changed or it is gone) and the group it is in."""
    keys = marked_pod_key(old) if old is not None else []
    if event != "DELETED":
        keys += marked_pod_key(obj)
    return list(dict.fromkeys(keys))


def same_but_version(old: Obj, obj: Obj) -> bool:
    """Whether two cached (slim) objects differ in their resourceVersion alone: the change
    was to nothing the cache keeps (a running pod's container statuses, a probe)."""
    if old.keys() != obj.keys():
        return False
    meta, old_meta = obj.get("metadata") or {}, old.get("metadata") or {}
    if {**meta, "resourceVersion": None} != {**old_meta, "resourceVersion": None}:
        return False
    return all(value == old[key] for key, value in obj.items() if key != "metadata")


def placeholder_pod_keys(event: str, obj: Obj, old: Obj | None) -> list[str]:
    return placeholder_pod_key(obj) or (placeholder_pod_key(old) if old is not None else [])


def _repels(node: Obj) -> tuple[bool, tuple[Taint, ...], str]:
    """What of a node can move a placeholder off it: cordon, taints, and whether its kubelet
    reports (a silent one leaves a deleted placeholder pod Terminating: it is forced)."""
    spec = node.get("spec") or {}
    return (
        bool(spec.get("unschedulable")),
        parse_taints(spec),
        ready_status(node.get("status") or {}),
    )


def node_keys(event: str, obj: Obj, old: Obj | None, pods_on_node: Sequence[Obj]) -> list[str]:
    """The placeholders with a pod on the node, when what could move them changed."""
    if event == "DELETED":
        return []  # a vanished node is the node lifecycle controller's to handle
    if old is not None and _repels(old) == _repels(obj):
        return []  # labels or status only: nothing that moves a placeholder
    return sorted({key for pod in pods_on_node for key in placeholder_pod_key(pod)})
