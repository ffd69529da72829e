"""The webhook's placeholder view against the emulator: our placeholder pods, listed and
watched by label in every namespace, kept as (namespace, placeholder) -> bound node."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from coschedule.k8s.timefmt import parse_time
from coschedule.kube.claim_cache import ClaimCache
from coschedule.kube.client import KubeClient
from coschedule.kube.placeholder_cache import SELECTOR, PlaceholderCache
from coschedule.marks import placeholder_labels
from coschedule.mutate.bind_wait import PendingPod, PlaceholderProgress
from tests.kube.test_informer import running as running
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually


def placeholder_pod(
    namespace: str, placeholder: str, name: str | None = None, node: str | None = None
) -> dict[str, Any]:
    """A placeholder StatefulSet's pod as the API holds it (our labels, one container)."""
    labels = {**placeholder_labels(placeholder), "apps.kubernetes.io/pod-index": "0"}
    spec: dict[str, Any] = {"containers": [{"name": "pause", "image": "pause"}]}
    if node is not None:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name or f"{placeholder}-0", "namespace": namespace, "labels": labels},
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


async def test_bound_placeholders_are_listed_then_followed_through_the_watch(
    api: MiniApi, client: KubeClient
) -> None:
    api.put("pods", placeholder_pod("ci", "affinity-assistant-aaa", node="node-a"))
    api.put("pods", placeholder_pod("ci", "affinity-assistant-bbb"))  # not scheduled yet
    api.put("pods", placeholder_pod("other", "affinity-assistant-aaa", node="node-c"))
    # Not ours: the same labels but another manager; and a run's pod on a node.
    foreign = placeholder_pod("ci", "affinity-assistant-ccc", node="node-x")
    foreign["metadata"]["labels"]["app.kubernetes.io/managed-by"] = "tekton-pipelines"
    api.put("pods", foreign)
    api.put(
        "pods",
        {"metadata": {"name": "step", "namespace": "ci"}, "spec": {"nodeName": "node-y"}},
    )
    cache = PlaceholderCache(client)
    assert cache.node("ci", "affinity-assistant-aaa") is None  # not synced: not bound
    task = asyncio.create_task(cache.informer.run())
    try:
        await asyncio.wait_for(cache.informer.synced.wait(), 3)
        assert cache.synced
        assert cache.node("ci", "affinity-assistant-aaa") == "node-a"
        assert cache.node("other", "affinity-assistant-aaa") == "node-c"
        assert cache.node("ci", "affinity-assistant-bbb") is None
        assert cache.node("ci", "affinity-assistant-ccc") is None
        assert len(cache) == 2  # only the bound ones take memory in the view
        [(ns, name, query)] = api.calls("GET", "pods")
        assert (ns, name) == (None, None)  # every namespace
        assert query["labelSelector"] == SELECTOR

        # Bound by the scheduler: seen through the watch.
        api.edit("pods", "ci", "affinity-assistant-bbb-0", {"spec": {"nodeName": "node-b"}})
        await eventually(lambda: cache.node("ci", "affinity-assistant-bbb") == "node-b")
        # The placeholder moves: the old pod terminates (not bound from then on), the
        # StatefulSet's new pod is bound elsewhere.
        api.edit(
            "pods",
            "ci",
            "affinity-assistant-aaa-0",
            {"metadata": {"deletionTimestamp": "2026-11-25T00:00:00Z"}},
        )
        await eventually(lambda: cache.node("ci", "affinity-assistant-aaa") is None)
        api.remove("pods", "ci", "affinity-assistant-aaa-0")
        api.put("pods", placeholder_pod("ci", "affinity-assistant-aaa", node="node-d"))
        await eventually(lambda: cache.node("ci", "affinity-assistant-aaa") == "node-d")
        # A finished placeholder pod (evicted: Failed) holds no node for its run.
        api.edit("pods", "other", "affinity-assistant-aaa-0", {"status": {"phase": "Failed"}})
        await eventually(lambda: cache.node("other", "affinity-assistant-aaa") is None)
        assert api.count("GET", "pods") == 1  # followed, never relisted
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_terminating_pod_does_not_hide_its_successor_whatever_the_event_order(
    api: MiniApi, client: KubeClient
) -> None:
    cache = PlaceholderCache(client)
    task = asyncio.create_task(cache.informer.run())
    try:
        await asyncio.wait_for(cache.informer.synced.wait(), 3)
        await eventually(lambda: api.count("WATCH", "pods") == 1)
        old = placeholder_pod("ci", "affinity-assistant-aaa", name="old", node="node-a")
        api.put("pods", old)
        await eventually(lambda: cache.node("ci", "affinity-assistant-aaa") == "node-a")
        # The new pod is bound before the old one's deletion is seen.
        api.put("pods", placeholder_pod("ci", "affinity-assistant-aaa", name="new", node="node-b"))
        api.edit("pods", "ci", "old", {"metadata": {"deletionTimestamp": "2026-11-25T00:00:00Z"}})
        await eventually(lambda: cache.node("ci", "affinity-assistant-aaa") == "node-b")
        api.remove("pods", "ci", "old")
        await asyncio.sleep(0.05)
        assert cache.node("ci", "affinity-assistant-aaa") == "node-b"
        api.remove("pods", "ci", "new")
        await eventually(lambda: cache.node("ci", "affinity-assistant-aaa") is None)
        assert len(cache) == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_relist_after_a_compacted_watch_catches_up(
    api: MiniApi, client: KubeClient
) -> None:
    api.put("pods", placeholder_pod("ci", "affinity-assistant-aaa", node="node-a"))
    cache = PlaceholderCache(client)
    task = asyncio.create_task(cache.informer.run())
    try:
        await asyncio.wait_for(cache.informer.synced.wait(), 3)
        assert cache.node("ci", "affinity-assistant-aaa") == "node-a"
        # Changes the watch never delivers, then history is compacted: a relist (410).
        api.muted = True
        api.remove("pods", "ci", "affinity-assistant-aaa-0")
        api.put("pods", placeholder_pod("ci", "affinity-assistant-bbb", node="node-b"))
        api.compact()
        api.muted = False
        api.end_watches()
        await eventually(lambda: cache.node("ci", "affinity-assistant-bbb") == "node-b")
        assert cache.node("ci", "affinity-assistant-aaa") is None
        assert api.count("GET", "pods") == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_unbound_placeholders_progress_and_a_wait_woken_by_the_binding(
    api: MiniApi, client: KubeClient, running: list[asyncio.Task[None]]
) -> None:
    """What a run's first pod's admission reads of a placeholder on its way (when its
    StatefulSet and its pod were made, whether the scheduler cannot place it), and the wait
    for its binding: woken by the watch's event, or over at its bound."""
    claims = ClaimCache(client)
    cache = PlaceholderCache(client, claims.statefulsets)
    sts = {
        "metadata": {
            "name": "affinity-assistant-aaa",
            "namespace": "ci",
            "labels": placeholder_labels("affinity-assistant-aaa"),
            "creationTimestamp": "2026-11-27T13:00:05Z",
        },
        "spec": {"replicas": 1},
    }
    api.put("statefulsets", sts)
    running += [asyncio.create_task(i.run()) for i in (cache.informer, claims.statefulsets)]
    await asyncio.wait_for(cache.informer.synced.wait(), 3)
    await asyncio.wait_for(claims.statefulsets.synced.wait(), 3)
    assert cache.progress("ci", "affinity-assistant-aaa") == PlaceholderProgress(
        parse_time("2026-11-27T13:00:05Z"), ()
    )
    assert cache.progress("ci", "affinity-assistant-zzz") == PlaceholderProgress()
    # The StatefulSet's pod, made by kube-controller-manager; then said Unschedulable.
    made = placeholder_pod("ci", "affinity-assistant-aaa")
    made["metadata"]["creationTimestamp"] = "2026-11-27T13:00:06Z"
    api.put("pods", made)
    pending = PendingPod(parse_time("2026-11-27T13:00:06Z"), False)
    await eventually(lambda: cache.progress("ci", "affinity-assistant-aaa").pods == (pending,))
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    api.edit("pods", "ci", "affinity-assistant-aaa-0", {"status": {"conditions": [condition]}})
    await eventually(lambda: cache.progress("ci", "affinity-assistant-aaa").pods[0].unschedulable)

    # A wait over at its bound, and one woken by the binding as the watch delivers it.
    assert not await cache.wait_bound("ci", "affinity-assistant-aaa", 0.1)
    waiting = asyncio.create_task(cache.wait_bound("ci", "affinity-assistant-aaa", 10))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    api.edit("pods", "ci", "affinity-assistant-aaa-0", {"spec": {"nodeName": "node-a"}})
    assert await asyncio.wait_for(waiting, 3)
    assert cache.progress("ci", "affinity-assistant-aaa").pods == ()  # bound: not pending
    assert await cache.wait_bound("ci", "affinity-assistant-aaa", 0)  # bound already
    assert cache._waiters == {}  # nothing left behind by either wait


async def test_a_wait_for_a_placeholder_unknown_when_it_began_wakes_when_it_is_bound(
    api: MiniApi, client: KubeClient, running: list[asyncio.Task[None]]
) -> None:
    """A run's first pod may wait before the reconciler made the placeholder at all: the
    StatefulSet and its pod appear during the wait, then the binding wakes it."""
    claims = ClaimCache(client)
    cache = PlaceholderCache(client, claims.statefulsets)
    running += [asyncio.create_task(i.run()) for i in (cache.informer, claims.statefulsets)]
    await asyncio.wait_for(cache.informer.synced.wait(), 3)
    await asyncio.wait_for(claims.statefulsets.synced.wait(), 3)
    assert cache.progress("ci", "affinity-assistant-new") == PlaceholderProgress()
    waiting = asyncio.create_task(cache.wait_bound("ci", "affinity-assistant-new", 10))
    await asyncio.sleep(0.05)
    api.put(
        "statefulsets",
        {
            "metadata": {
                "name": "affinity-assistant-new",
                "namespace": "ci",
                "labels": placeholder_labels("affinity-assistant-new"),
            },
            "spec": {"replicas": 1},
        },
    )
    api.put("pods", placeholder_pod("ci", "affinity-assistant-new"))
    await eventually(lambda: len(cache.progress("ci", "affinity-assistant-new").pods) == 1)
    assert not waiting.done()  # made, not bound: still waiting
    api.edit("pods", "ci", "affinity-assistant-new-0", {"spec": {"nodeName": "node-b"}})
    assert await asyncio.wait_for(waiting, 3)
    assert cache.node("ci", "affinity-assistant-new") == "node-b"
    assert cache._waiters == {}
