"""Caches that have not heard from the API server while their watch is down say so: in
/readyz (the reconciler turns not ready, the webhook stays ready) and in
``coschedule_cache_stale_seconds``; an established watch is fresh however quiet."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from coschedule.kube import informer as informer_module
from coschedule.kube.client import KubeClient
from coschedule.kube.informer import Informer, caches_readiness, stale_detail
from coschedule.kube.namespace_cache import NamespaceCache
from coschedule.probes import Probes, cache_stale_gauge
from coschedule.server.cluster import ClusterLink
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually

STALE_AFTER = 0.3


@pytest.fixture
async def running() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_quiet_established_watch_is_fresh_a_broken_one_goes_stale_then_fresh_again(
    api: MiniApi,
    client: KubeClient,
    running: list[asyncio.Task[None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(informer_module, "BACKOFF_START", 0.05)
    monkeypatch.setattr(informer_module, "BACKOFF_MAX", 0.5)  # back soon once it answers
    api.put("nodes", {"metadata": {"name": "n1"}})
    nodes = Informer(client, "/api/v1/nodes", name="nodes")
    running.append(asyncio.create_task(nodes.run()))
    await asyncio.wait_for(nodes.synced.wait(), 3)
    await eventually(lambda: nodes.watching)
    await asyncio.sleep(2 * STALE_AFTER)  # nothing happens: the watch is up, not stale
    assert nodes.silent_for() == 0.0
    assert stale_detail([nodes], client, STALE_AFTER) is None
    assert caches_readiness([nodes], client, STALE_AFTER) == (True, None)

    # The server ends the watch and refuses new ones (an API server going away).
    api.faults[("WATCH", "nodes")] = [503] * 1000
    api.end_watches()
    await eventually(lambda: not nodes.watching)
    await eventually(lambda: nodes.silent_for() >= STALE_AFTER, within=3)
    detail = stale_detail([nodes], client, STALE_AFTER)
    assert detail is not None
    assert detail.startswith("caches stale (no word from the API server, watch down): nodes ")
    assert "503" in detail  # why: the last error of the watch
    ready, why = caches_readiness([nodes], client, STALE_AFTER)
    assert ready is False
    assert why == detail

    # The server is back: the watch resumes (no relist) and the cache is fresh again.
    api.faults[("WATCH", "nodes")] = []
    await eventually(lambda: nodes.watching, within=5)
    assert nodes.silent_for() == 0.0
    assert caches_readiness([nodes], client, STALE_AFTER) == (True, None)
    assert nodes.lists == 1


async def test_the_webhook_stays_ready_says_which_caches_are_stale_and_counts_seconds(
    api: MiniApi,
    client: KubeClient,
    running: list[asyncio.Task[None]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stale caches never take the webhook out of its Service: they are told in /readyz's
    detail and in the gauge, and its answers go on from the caches it has."""
    monkeypatch.setattr(informer_module, "BACKOFF_START", 0.05)
    monkeypatch.setattr(informer_module, "STALE_AFTER_SECONDS", STALE_AFTER)
    api.put(
        "namespaces", {"metadata": {"name": "ci", "labels": {"coschedule.dev/enabled": "true"}}}
    )
    informer = Informer(client, "/api/v1/namespaces", name="namespaces")
    link = ClusterLink(client, NamespaceCache(informer))
    probes = Probes()
    registry = CollectorRegistry()
    link.add_probes(probes, cache_stale_gauge(registry))
    running.append(asyncio.create_task(informer.run()))
    await asyncio.wait_for(informer.synced.wait(), 3)
    await eventually(lambda: informer.watching)
    ready, body = probes.readiness()
    assert ready is True
    assert body["checks"]["cache-freshness"] == {"ok": True}  # type: ignore[index]

    api.faults[("WATCH", "namespaces")] = [503] * 1000
    api.end_watches()
    await eventually(lambda: informer.silent_for() >= STALE_AFTER, within=3)
    ready, body = probes.readiness()
    assert ready is True
    freshness = body["checks"]["cache-freshness"]  # type: ignore[index]
    assert freshness["ok"] is True
    assert "caches stale" in freshness["detail"]
    assert "namespaces" in freshness["detail"]
    stale = registry.get_sample_value("coschedule_cache_stale_seconds", {"cache": "namespaces"})
    assert stale is not None
    assert stale >= STALE_AFTER


async def test_the_link_is_synced_once_every_cache_has_made_its_first_list(
    api: MiniApi, client: KubeClient, running: list[asyncio.Task[None]]
) -> None:
    """What the webhook waits for before it freezes its heap (coschedule.heap)."""
    api.put("namespaces", {"metadata": {"name": "ci"}})
    informer = Informer(client, "/api/v1/namespaces", name="namespaces")
    link = ClusterLink(client, NamespaceCache(informer))
    waiting = asyncio.create_task(link.wait_synced())
    running.append(waiting)
    await asyncio.sleep(0.1)
    assert not waiting.done()  # no list yet
    running.append(asyncio.create_task(informer.run()))
    await asyncio.wait_for(asyncio.shield(waiting), 3)
    assert informer.get("ci") is not None
