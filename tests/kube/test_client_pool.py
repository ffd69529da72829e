"""The API client's per-request overhead: connections a burst opened are reused by the next
burst, and a request finds every module it needs already imported (no search of sys.path)."""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

from coschedule.kube.client import KubeClient
from tests.reconcile.apiserver import MiniApi
from tests.reconcile.conftest import eventually

BURST = 40  # above httpx's default of 20 kept-alive connections, as a pass of releases is


def _connections(client: KubeClient) -> list[object]:
    """The pool's open connections (httpcore's), by identity."""
    pool = client._http._transport._pool  # type: ignore[attr-defined]
    return list(pool.connections)


async def _burst(api: MiniApi, client: KubeClient) -> None:
    """``BURST`` GETs all in flight at once (the server holds them until the last arrives)."""
    held = asyncio.Event()
    api.holds[("GET", "nodes")] = held
    sent = len(api.requests)
    calls = [asyncio.create_task(client.get("/api/v1/nodes/n1")) for _ in range(BURST)]
    await eventually(lambda: len(api.requests) - sent >= BURST)
    held.set()
    await asyncio.gather(*calls)
    del api.holds[("GET", "nodes")]


async def test_a_bursts_connections_are_kept_for_the_next_burst(
    api: MiniApi, client: KubeClient
) -> None:
    api.put("nodes", {"metadata": {"name": "n1"}})
    await _burst(api, client)
    first = _connections(client)
    assert len(first) == BURST  # every one kept alive, not 20 of them
    await _burst(api, client)
    second = _connections(client)
    assert {id(c) for c in second} == {id(c) for c in first}  # none new: no handshakes


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
