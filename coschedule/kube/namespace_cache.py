"""The webhook's namespace cache: labels of every namespace, fed by a watch."""

from __future__ import annotations

from coschedule.kube.informer import Informer, Obj
from coschedule.marks import NamespaceInfo


def _labels_only(obj: Obj) -> Obj:
    # The webhook reads labels alone; keeping nothing else makes the cache tiny.
    meta = obj.get("metadata") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"),
            "labels": meta.get("labels") or {},
        }
    }


class NamespaceCache:
    def __init__(self, informer: Informer) -> None:
        self.informer = informer
        informer.transform = _labels_only
        informer.metadata_only = True  # labels are all it reads

    def get(self, name: str) -> NamespaceInfo | None:
        obj = self.informer.get(name)
        if obj is None:
            return None
        labels = obj["metadata"]["labels"]
        return NamespaceInfo(labels if isinstance(labels, dict) else {})

    @property
    def synced(self) -> bool:
        return self.informer.synced.is_set()

    async def wait_synced(self) -> None:
        await self.informer.synced.wait()
