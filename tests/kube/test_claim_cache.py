"""The webhook's marked-pod cache against the emulator: metadata-only list and watch, and
the first pod's claim decision read from whole Tekton pods (a server that does not convert
to PartialObjectMetadata answers those)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from coschedule.kube.claim_cache import ClaimCache
from coschedule.kube.client import METADATA_ACCEPT, METADATA_LIST_ACCEPT, KubeClient
from coschedule.marks import (
    ANNOTATION_CLAIM_TEMPLATES,
    LABEL_PLACEHOLDER,
    ClaimTemplate,
    encode_claim_templates,
)
from tests.fixtures import load_pod
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually

FIRST = ClaimTemplate("source", "source-pvc", {"accessModes": ["ReadWriteOnce"]})
LATER = ClaimTemplate("cache", "cache-pvc", {"accessModes": ["ReadWriteOnce"]})


def marked(name: str, created: str, template: ClaimTemplate) -> dict[str, Any]:
    pod = load_pod("tekton-taskrun")
    meta = pod["metadata"]
    meta.update(name=name, namespace="ci", creationTimestamp=created)
    meta.setdefault("labels", {})[LABEL_PLACEHOLDER] = "aa-run"
    meta.setdefault("annotations", {})[ANNOTATION_CLAIM_TEMPLATES] = encode_claim_templates(
        [template]
    )
    return pod


async def test_marked_pods_are_watched_as_metadata_and_the_first_pods_decision_holds(
    api: MiniApi, client: KubeClient
) -> None:
    api.put("pods", marked("second", "2026-11-21T06:00:05Z", LATER))
    cache = ClaimCache(client)
    task = asyncio.create_task(cache.pods.run())
    try:
        await asyncio.wait_for(cache.pods.synced.wait(), 3)
        assert cache.pod_decision("ci", "aa-run") == (LATER,)
        await eventually(lambda: api.count("WATCH", "pods") == 1)
        api.put("pods", marked("first", "2026-11-21T06:00:00Z", FIRST))
        await eventually(lambda: cache.pod_decision("ci", "aa-run") == (FIRST,))
        # The cache keeps the decision, not the pod: nothing of its spec or status.
        assert set(cache.pods.get("ci/first") or {}) == {"metadata", "decision"}
        accepts = [(verb, accept) for verb, plural, accept in api.accepts if plural == "pods"]
        assert accepts == [("GET", METADATA_LIST_ACCEPT), ("WATCH", METADATA_ACCEPT)]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_marked_pods_are_watched_only_once_rewrite_claims_asks_and_from_then_on(
    api: MiniApi, client: KubeClient
) -> None:
    """With ``rewrite-claims`` off no decision binds a run's later pods, so every run pod's
    events are not sent for nothing; a reload that turns it on starts the watch, and a
    serving replica stays ready while that watch makes its first list."""
    api.put("pods", marked("first", "2026-11-21T06:00:00Z", FIRST))
    cache = ClaimCache(client)
    task = asyncio.create_task(cache.run())
    try:
        await asyncio.wait_for(cache.wait_synced(), 3)
        assert cache.synced
        assert cache.ready
        await eventually(lambda: api.count("WATCH", "persistentvolumeclaims") == 1)
        assert api.count("GET", "pods") == 0
        assert api.count("WATCH", "pods") == 0
        assert cache.pod_decision("ci", "aa-run") is None

        cache.watch_marked_pods()  # rewrite-claims turned on
        assert cache.marked_pods_watched
        assert cache.ready  # the replica stays in its Service meanwhile
        await asyncio.wait_for(cache.wait_synced(), 3)  # what a rewrite waits for
        assert cache.synced
        assert cache.pod_decision("ci", "aa-run") == (FIRST,)
        await eventually(lambda: api.count("WATCH", "pods") == 1)
        cache.watch_marked_pods()  # asked again (every reload with it on): one watch
        api.put("pods", marked("zero", "2026-11-21T05:59:00Z", LATER))
        await eventually(lambda: cache.pod_decision("ci", "aa-run") == (LATER,))
        assert api.count("GET", "pods") == 1
        assert api.count("WATCH", "pods") == 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    marked_task = cache._marked_task
    assert marked_task is not None
    assert marked_task.done()  # stopped with the cache


async def test_marked_pods_watched_from_the_start_are_part_of_readiness(
    api: MiniApi, client: KubeClient
) -> None:
    api.put("pods", marked("first", "2026-11-21T06:00:00Z", FIRST))
    cache = ClaimCache(client)
    cache.watch_marked_pods()  # rewrite-claims on at start
    assert not cache.ready
    task = asyncio.create_task(cache.run())
    try:
        await eventually(lambda: cache.ready)
        assert cache.pods.synced.is_set()  # ready waited for the marked pods' list too
        assert cache.synced
        assert cache.pod_decision("ci", "aa-run") == (FIRST,)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
