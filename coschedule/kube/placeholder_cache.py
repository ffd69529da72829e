"""The webhook's placeholder view: the node each placeholder's pod is bound to, fed by a watch.

Placement by node name (the ``placement`` key, ``auto``) pins a run's pod to the node its
placeholder's pod is bound to, when the webhook already knows it; otherwise the pod is gated
and the reconciler pins it later. An admission reads the node in one dict lookup by
(namespace, placeholder). Only our placeholder pods are watched (by label), and each is kept
as its identity, its placeholder and its node: a placeholder pod that is not bound, is being
deleted or has finished counts as "not bound". Before the first list nothing is known: the
pod endpoint waits for it (bounded, ``server.cache_gate``) before it decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coschedule.k8s.constants import TERMINAL_PHASES
from coschedule.kube.client import KubeClient
from coschedule.kube.informer import Informer, Obj
from coschedule.marks import (
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    managed_placeholder,
)

SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_COMPONENT}={COMPONENT_AFFINITY_ASSISTANT}"


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def bound_node(pod: Mapping[str, Any]) -> str | None:
    """The node a placeholder pod holds for its run: bound, not terminating, not finished."""
    meta = _dict(pod.get("metadata"))
    if meta.get("deletionTimestamp"):
        return None
    if _dict(pod.get("status")).get("phase") in TERMINAL_PHASES:
        return None
    node = _dict(pod.get("spec")).get("nodeName")
    return node if isinstance(node, str) and node else None


def _transform(obj: Obj) -> Obj:
    meta = _dict(obj.get("metadata"))
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "placeholder": managed_placeholder(_dict(meta.get("labels"))),
        "node": bound_node(obj),
    }


def _placeholder_key(obj: Obj) -> list[str]:
    placeholder = obj["placeholder"]
    return [f"{obj['metadata']['namespace']}/{placeholder}"] if placeholder else []


class PlaceholderCache:
    def __init__(self, client: KubeClient) -> None:
        self.informer = Informer(
            client,
            "/api/v1/pods",
            name="placeholder-pods",
            label_selector=SELECTOR,
            transform=_transform,
            indexers={"placeholder": _placeholder_key},
        )
        # (namespace, placeholder) -> node: what an admission reads, kept on every event.
        self._nodes: dict[tuple[str, str], str] = {}
        self.informer.add_handler(self._on_pod)

    @property
    def synced(self) -> bool:
        return self.informer.synced.is_set()

    async def wait_synced(self) -> None:
        await self.informer.synced.wait()

    def node(self, namespace: str, placeholder: str) -> str | None:
        """The node the placeholder's pod is bound to; None: not bound (or not seen yet)."""
        return self._nodes.get((namespace, placeholder))

    def __len__(self) -> int:
        return len(self._nodes)

    def _on_pod(self, event_type: str, obj: Obj, old: Obj | None) -> None:
        # A placeholder may have two pods for a moment (the old one terminating, the
        # StatefulSet's new one): the node is worked out from all of them, in key order.
        for each in (obj, old):
            if each is None:
                continue
            for key in _placeholder_key(each):
                self._refresh(key)

    def _refresh(self, key: str) -> None:
        namespace, _, placeholder = key.partition("/")
        node = next(
            (pod["node"] for pod in self.informer.by_index("placeholder", key) if pod["node"]),
            None,
        )
        if node is None:
            self._nodes.pop((namespace, placeholder), None)
        else:
            self._nodes[(namespace, placeholder)] = node
