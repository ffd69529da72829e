"""The webhook's volume view: where each PersistentVolume can be used, fed by a watch.

The admission pre-flight (rule ``claims-conflict``) reads it in O(1) by volume name; the
cache keeps each PV's name and node-affinity terms only.
"""

from __future__ import annotations

from coschedule.k8s.volumes import VolumeTopology, volume_topology
from coschedule.kube.client import KubeClient
from coschedule.kube.informer import Informer, Obj


def _transform(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {
        "metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion")},
        "topology": volume_topology(obj),
    }


class VolumeCache:
    def __init__(self, client: KubeClient) -> None:
        self.informer = Informer(
            client, "/api/v1/persistentvolumes", name="persistentvolumes", transform=_transform
        )

    @property
    def synced(self) -> bool:
        return self.informer.synced.is_set()

    async def wait_synced(self) -> None:
        await self.informer.synced.wait()

    def get(self, name: str) -> VolumeTopology | None:
        obj = self.informer.get(name)
        return None if obj is None else obj["topology"]
