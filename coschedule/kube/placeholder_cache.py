"""The webhook's placeholder view: the node each placeholder's pod is bound to, fed by a watch.

Placement by node name (the ``placement`` key, ``auto``) pins a run's pod to the node its
placeholder's pod is bound to, when the webhook already knows it; otherwise the pod is gated
and the reconciler pins it later. An admission reads the node in one dict lookup by
(namespace, placeholder). Only our placeholder pods are watched (by label), and each is kept
as its identity, its placeholder and its node: a placeholder pod that is not bound, is being
deleted or has finished counts as "not bound". Before the first list nothing is known: the
pod endpoint waits for it (bounded, ``server.cache_gate``) before it decides.

A run's first pod may come while its placeholder is on its way to being bound: the cache
keeps, for a live unbound placeholder pod, when it was made and whether the scheduler said
it cannot place it, reads the placeholder StatefulSet's creation time from the claim
cache's StatefulSet watch (``progress``), and wakes an admission waiting for the binding
the moment the watch delivers it (``wait_bound``: an event, no API call).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from coschedule.k8s.constants import TERMINAL_PHASES
from coschedule.k8s.timefmt import parse_time
from coschedule.kube.client import KubeClient
from coschedule.kube.informer import Informer, Obj
from coschedule.marks import (
    COMPONENT_AFFINITY_ASSISTANT,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    managed_placeholder,
)
from coschedule.mutate.bind_wait import PendingPod, PlaceholderProgress

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


def pending_pod(pod: Mapping[str, Any]) -> PendingPod | None:
    """A live placeholder pod not bound yet: when it was made, and whether kube-scheduler
    reported it Unschedulable. None for a bound, terminating or finished pod."""
    meta = _dict(pod.get("metadata"))
    status = _dict(pod.get("status"))
    if meta.get("deletionTimestamp") or status.get("phase") in TERMINAL_PHASES:
        return None
    if _dict(pod.get("spec")).get("nodeName"):
        return None
    unschedulable = any(
        isinstance(c, Mapping)
        and c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or ()
    )
    return PendingPod(parse_time(meta.get("creationTimestamp")), unschedulable)


def _transform(obj: Obj) -> Obj:
    meta = _dict(obj.get("metadata"))
    node = bound_node(obj)
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "placeholder": managed_placeholder(_dict(meta.get("labels"))),
        "node": node,
        "pending": None if node is not None else pending_pod(obj),
    }


def _placeholder_key(obj: Obj) -> list[str]:
    placeholder = obj["placeholder"]
    return [f"{obj['metadata']['namespace']}/{placeholder}"] if placeholder else []


class PlaceholderCache:
    def __init__(self, client: KubeClient, statefulsets: Informer | None = None) -> None:
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
        # The placeholder StatefulSets (the claim cache's watch; each keeps "created").
        self.statefulsets = statefulsets
        # (namespace, placeholder) -> the admissions waiting for it to be bound.
        self._waiters: dict[tuple[str, str], list[asyncio.Event]] = {}
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

    def progress(self, namespace: str, placeholder: str) -> PlaceholderProgress:
        """What the watches know of a placeholder not bound yet (for ``bind_wait``)."""
        pods = tuple(
            pod["pending"]
            for pod in self.informer.by_index("placeholder", f"{namespace}/{placeholder}")
            if pod["pending"] is not None
        )
        statefulsets = self.statefulsets
        sts = statefulsets.get(f"{namespace}/{placeholder}") if statefulsets is not None else None
        return PlaceholderProgress(sts.get("created") if sts is not None else None, pods)

    async def wait_bound(self, namespace: str, placeholder: str, seconds: float) -> bool:
        """Until the watch delivers the placeholder's pod bound, or ``seconds``; whether it
        is bound. No API call: the watch's event wakes it."""
        key = (namespace, placeholder)
        if key in self._nodes:
            return True
        event = asyncio.Event()
        self._waiters.setdefault(key, []).append(event)
        try:
            async with asyncio.timeout(seconds):
                await event.wait()
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                if event in waiters:
                    waiters.remove(event)
                if not waiters:
                    del self._waiters[key]
        return True

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
            if self._waiters:
                for event in self._waiters.pop((namespace, placeholder), ()):
                    event.set()
