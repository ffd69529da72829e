"""Which placeholder keys (``namespace/name``) an event concerns, and the indexes behind it.

Plain bookkeeping over the informers' events, no I/O: a marked pod belongs to the key of
its label; a placeholder pod to its instance (and sits on a node); a node concerns the
placeholder pods on it, and only when a change could move them (cordon, taints).
"""

from __future__ import annotations

from coschedule.kube.informer import Obj, object_key
from coschedule.reconcile import shapes
from coschedule.reconcile.model import NodeInfo


def _drop(index: dict[str, set[str]], key: str, member: str) -> None:
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]


class KeyIndex:
    def __init__(self) -> None:
        self.group_pods: dict[str, set[str]] = {}  # key -> marked pods
        self.instance_pods: dict[str, set[str]] = {}  # key -> its placeholder pods
        self.node_pods: dict[str, set[str]] = {}  # node -> placeholder pods on it
        self._pod_group: dict[str, str] = {}
        self._placed: dict[str, tuple[str, str]] = {}  # placeholder pod -> (key, node)
        self._nodes: dict[str, NodeInfo] = {}

    def keys(self) -> set[str]:
        return set(self.group_pods) | set(self.instance_pods)

    def marked_pod(self, event: str, obj: Obj) -> list[str]:
        pod_key = object_key(obj)
        group = shapes.marked_placeholder(obj)
        namespace = (obj.get("metadata") or {}).get("namespace") or ""
        new = f"{namespace}/{group}" if group and event != "DELETED" else None
        old = self._pod_group.pop(pod_key, None)
        keys = []
        if old is not None and old != new:
            _drop(self.group_pods, old, pod_key)
            keys.append(old)
        if new is not None:
            self.group_pods.setdefault(new, set()).add(pod_key)
            self._pod_group[pod_key] = new
            keys.append(new)
        return keys

    def placeholder_pod(self, event: str, obj: Obj) -> list[str]:
        pod_key = object_key(obj)
        old = self._placed.pop(pod_key, None)
        if old is not None:
            _drop(self.instance_pods, old[0], pod_key)
            _drop(self.node_pods, old[1], pod_key)
        instance = shapes.placeholder_instance(obj)
        if not instance:  # not one of ours (a server that ignores our label selector)
            return [old[0]] if old is not None else []
        key = f"{(obj.get('metadata') or {}).get('namespace') or ''}/{instance}"
        if event != "DELETED":
            node = str((obj.get("spec") or {}).get("nodeName") or "")
            self.instance_pods.setdefault(key, set()).add(pod_key)
            self.node_pods.setdefault(node, set()).add(pod_key)
            self._placed[pod_key] = (key, node)
        return [key]

    def node(self, event: str, obj: Obj) -> list[str]:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if event == "DELETED":
            self._nodes.pop(name, None)
            return []
        info = shapes.parse_node(obj)
        if self._nodes.get(name) == info:
            return []  # labels or status only: nothing that moves a placeholder
        self._nodes[name] = info
        return sorted(
            {self._placed[p][0] for p in self.node_pods.get(name, ()) if p in self._placed}
        )
