"""Volumes as a cluster has them: a small dynamic provisioner for hostPath volumes that real
pods mount (every node of the real stack is this machine, so a hostPath under the stack's work
dir is a disk any node can reach; node affinity is what makes it node-local).

One provisioner name, three StorageClasses:

- ``real-local`` (WaitForFirstConsumer): provisioned on the node the scheduler selected
  (the claim's ``volume.kubernetes.io/selected-node``), the volume pinned there by node
  affinity, as a local-disk CSI driver does;
- ``real-network`` (WaitForFirstConsumer) and ``real-network-immediate`` (Immediate): no node
  affinity, any node mounts the volume, as a cloud disk or NFS behaves.

Reclaim policy Delete: a volume whose claim is gone (Released) is deleted with its directory,
as an external provisioner does, so that a test can check what teardown left.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Self

from tests.e2e.kube import Api, ApiError, Obj
from tests.e2e.world import HOSTNAME, Ticker, provisioned_volume

PROVISIONER = "real.coschedule.dev/hostpath"
LOCAL_CLASS = "real-local"
NETWORK_CLASS = "real-network"
NETWORK_IMMEDIATE_CLASS = "real-network-immediate"
# class -> (volumeBindingMode, node-local)
CLASSES: dict[str, tuple[str, bool]] = {
    LOCAL_CLASS: ("WaitForFirstConsumer", True),
    NETWORK_CLASS: ("WaitForFirstConsumer", False),
    NETWORK_IMMEDIATE_CLASS: ("Immediate", False),
}
SELECTED_NODE = "volume.kubernetes.io/selected-node"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


def storage_classes() -> list[Obj]:
    return [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name, "labels": {"real.coschedule.dev/suite": "true"}},
            "provisioner": PROVISIONER,
            "volumeBindingMode": binding,
            "reclaimPolicy": "Delete",
        }
        for name, (binding, _local) in CLASSES.items()
    ]


def volume_node(volume: Obj) -> str | None:
    """The node a volume is pinned to (None: any node mounts it)."""
    terms = (((volume.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {}).get(
        "nodeSelectorTerms"
    ) or []
    for term in terms:
        for expression in term.get("matchExpressions") or []:
            if expression.get("key") == HOSTNAME and expression.get("values"):
                return str(expression["values"][0])
    return None


@dataclass
class HostPathProvisioner(Ticker):
    """Provisions claims of the suite's classes and deletes Released volumes, in a thread."""

    thread_name: ClassVar[str] = "provisioner"
    api: Api
    root: Path
    interval: float = field(default=0.3, kw_only=True)
    provisioned: dict[str, str] = field(default_factory=dict)  # PV name -> node or ""
    deleted: list[str] = field(default_factory=list)

    def install(self) -> None:
        for obj in storage_classes():
            self.api.ensure(obj)

    def start(self) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        return super().start()

    def step(self) -> None:
        for claim in self.api.list("PersistentVolumeClaim"):
            self._provision(claim)
        for volume in self.api.list("PersistentVolume"):
            self._reclaim(volume)

    def _provision(self, claim: Obj) -> None:
        meta = claim["metadata"]
        spec = claim.get("spec") or {}
        cls = spec.get("storageClassName")
        if cls not in CLASSES or spec.get("volumeName") or meta.get("deletionTimestamp"):
            return
        binding, local = CLASSES[cls]
        node = (meta.get("annotations") or {}).get(SELECTED_NODE)
        if binding == "WaitForFirstConsumer" and not node:
            return
        name = f"pvc-{meta['uid']}"
        if name in self.provisioned:
            return
        directory = self.root / name
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o777)
        volume = provisioned_volume(
            claim,
            name,
            {"path": str(directory), "type": "Directory"},
            provisioner=PROVISIONER,
            labels={"real.coschedule.dev/suite": "true"},
            node=node if local else None,
        )
        try:
            self.api.create(volume)
        except ApiError as exc:
            if exc.status != 409:
                raise
        self.provisioned[name] = node if local and node else ""

    def _reclaim(self, volume: Obj) -> None:
        meta = volume["metadata"]
        if (meta.get("annotations") or {}).get(PROVISIONED_BY) != PROVISIONER:
            return
        if (volume.get("status") or {}).get("phase") not in ("Released", "Failed"):
            return
        with contextlib.suppress(ApiError):
            self.api.delete("PersistentVolume", meta["name"])
        path = Path(((volume.get("spec") or {}).get("hostPath") or {}).get("path") or "")
        if path.parent == self.root:
            shutil.rmtree(path, ignore_errors=True)
        if meta["name"] not in self.deleted:
            self.deleted.append(meta["name"])
