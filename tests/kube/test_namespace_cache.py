"""The webhook's namespace cache against the emulator: Namespaces are cluster-scoped, listed
and watched at ``/api/v1/namespaces``."""

from __future__ import annotations

import asyncio
import contextlib

from coschedule.kube.client import METADATA_ACCEPT, METADATA_LIST_ACCEPT, KubeClient
from coschedule.kube.informer import Informer
from coschedule.kube.namespace_cache import NamespaceCache
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually


async def test_labels_are_listed_then_followed_through_the_watch(
    api: MiniApi, client: KubeClient
) -> None:
    api.put(
        "namespaces", {"metadata": {"name": "ci", "labels": {"coschedule.dev/enabled": "true"}}}
    )
    api.put("namespaces", {"metadata": {"name": "sandbox"}})
    cache = NamespaceCache(Informer(client, "/api/v1/namespaces", name="namespaces"))
    task = asyncio.create_task(cache.informer.run())
    try:
        await asyncio.wait_for(cache.informer.synced.wait(), 3)

        def enabled(name: str) -> bool | None:
            found = cache.get(name)
            return None if found is None else found.enabled

        assert [enabled("ci"), enabled("sandbox"), enabled("elsewhere")] == [True, False, None]
        assert [(ns, name) for ns, name, _ in api.calls("GET", "namespaces")] == [(None, None)]

        api.edit(
            "namespaces",
            None,
            "sandbox",
            {"metadata": {"labels": {"coschedule.dev/enabled": "true"}}},
        )
        api.remove("namespaces", None, "ci")
        await eventually(lambda: enabled("ci") is None)
        assert enabled("sandbox") is True
        [(_, _, query)] = api.calls("WATCH", "namespaces")
        assert query["watch"] == "true"
        assert api.count("GET", "namespaces") == 1  # followed, never relisted
        # Labels are all it reads: asked for as metadata (whole objects answered here).
        assert [(verb, accept) for verb, _, accept in api.accepts] == [
            ("GET", METADATA_LIST_ACCEPT),
            ("WATCH", METADATA_ACCEPT),
        ]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
