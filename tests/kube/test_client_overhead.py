"""The API client's per-request overhead: a request finds every module it needs already
imported (no search of sys.path); a client sized for bursts keeps its connections."""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

from coschedule.kube.client import Credentials, KubeClient
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually


class _Searches(importlib.abc.MetaPathFinder):
    """Records every module name an import looks for on disk (one not in sys.modules)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        self.names.append(fullname)
        return None


async def test_a_request_imports_nothing(api: MiniApi, client: KubeClient) -> None:
    """httpcore asks which event loop runs on every request: with sniffio missing that was a
    failed import, a search of sys.path, each time (a sixth of a release's CPU)."""
    api.put("pods", {"metadata": {"name": "p1", "namespace": "ci"}})
    path = "/api/v1/namespaces/ci/pods/p1"
    await client.get(path)  # what a first request imports once is not the point
    await client.patch(path, {"metadata": {"labels": {"a": "b"}}})
    searches = _Searches()
    sys.meta_path.insert(0, searches)
    try:
        for _ in range(5):
            await client.get(path)
            await client.patch(path, {"metadata": {"labels": {"a": "c"}}})
            await client.list("/api/v1/namespaces/ci/pods")
    finally:
        sys.meta_path.remove(searches)
    assert searches.names == []


async def test_a_client_of_n_connections_keeps_them_all_and_httpx_default_keeps_20(
    api: MiniApi, client: KubeClient
) -> None:
    """``connections=N``: N at most, all kept between bursts. The default (httpx's) keeps
    20, counting the connections in use (a watch's) too: why releases have their own."""
    api.put("nodes", {"metadata": {"name": "n1"}})
    kept = KubeClient(Credentials(server=api.url), timeout=5.0, connections=30)
    try:
        for each in (kept, client):
            held = asyncio.Event()
            api.holds[("GET", "nodes")] = held
            sent = len(api.requests)
            calls = [asyncio.create_task(each.get("/api/v1/nodes/n1")) for _ in range(30)]
            await eventually(lambda s=sent: len(api.requests) - s >= 30)  # type: ignore[misc]
            held.set()
            await asyncio.gather(*calls)
            del api.holds[("GET", "nodes")]
        assert len(kept._http._transport._pool.connections) == 30  # type: ignore[attr-defined]
        assert len(client._http._transport._pool.connections) == 20  # type: ignore[attr-defined]
    finally:
        await kept.aclose()
