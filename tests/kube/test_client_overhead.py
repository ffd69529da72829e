"""The API client's per-request overhead: a request finds every module it needs already
imported (no search of sys.path)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

from coschedule.kube.client import KubeClient
from tests.reconcile.apiserver import MiniApi


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
