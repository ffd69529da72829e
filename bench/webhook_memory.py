"""The webhook's memory per PersistentVolumeClaim: its watch-fed caches, filled for real.

The claim cache (claims, placeholder StatefulSets, marked pods: their watch runs with
``rewrite-claims`` on, as here) and the volume cache (the
PersistentVolumes the claims are bound to) run unchanged, as ``serve`` runs them, over an
in-process fake API. It lists pages of realistic objects: a Tekton-made claim (owned by its
PipelineRun, bound) and its PersistentVolume (CSI, zonal node affinity). Each watch then stays
quiet. What the caches keep is measured with tracemalloc, as the Python memory still held
once they have synced. The process RSS is measured too, in a separate run without
tracemalloc, with ``--rss``.

Run: ``python -m bench.webhook_memory [--claims 10000] [--rss]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import tracemalloc
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from coschedule.kube.claim_cache import ClaimCache
from coschedule.kube.client import KubeClient
from coschedule.kube.volume_cache import VolumeCache
from coschedule.wire.watch_events import EVERY_FIELD, EventShape

PAGE = 500


def claim(n: int) -> dict[str, Any]:
    """A claim as Tekton makes it for a PipelineRun's volumeClaimTemplate, bound."""
    run = f"build-and-test-run-{n // 2:06d}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": f"pvc-{n:010x}",
            "namespace": f"team-{n % 50:02d}",
            "uid": f"0f3c1d2e-{n:04x}-4c5d-9e8f-{n:012x}",
            "resourceVersion": str(1000 + n),
            "creationTimestamp": "2026-11-24T10:00:00Z",
            "labels": {"tekton.dev/pipelineRun": run},
            "annotations": {
                "pv.kubernetes.io/bind-completed": "yes",
                "pv.kubernetes.io/bound-by-controller": "yes",
                "volume.beta.kubernetes.io/storage-provisioner": "ebs.csi.aws.com",
                "volume.kubernetes.io/selected-node": f"node-{n % 500:04d}",
                "volume.kubernetes.io/storage-provisioner": "ebs.csi.aws.com",
            },
            "finalizers": ["kubernetes.io/pvc-protection"],
            "ownerReferences": [
                {
                    "apiVersion": "tekton.dev/v1",
                    "kind": "PipelineRun",
                    "name": run,
                    "uid": f"8a9b0c1d-{n:04x}-4e5f-8a9b-{n:012x}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "gp3",
            "volumeMode": "Filesystem",
            "volumeName": f"pv-{n:010x}",
        },
        "status": {
            "phase": "Bound",
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "1Gi"},
        },
    }


def volume(n: int) -> dict[str, Any]:
    """The claim's PersistentVolume: a zonal CSI volume."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pv-{n:010x}",
            "uid": f"1a2b3c4d-{n:04x}-4e5f-8a9b-{n:012x}",
            "resourceVersion": str(50000 + n),
            "annotations": {"pv.kubernetes.io/provisioned-by": "ebs.csi.aws.com"},
            "finalizers": ["kubernetes.io/pv-protection", "external-attacher/ebs-csi-aws-com"],
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "1Gi"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "name": f"pvc-{n:010x}",
                "namespace": f"team-{n % 50:02d}",
            },
            "csi": {"driver": "ebs.csi.aws.com", "fsType": "ext4", "volumeHandle": f"vol-{n:017x}"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "topology.kubernetes.io/zone",
                                    "operator": "In",
                                    "values": [f"eu-west-1{'abc'[n % 3]}"],
                                }
                            ]
                        }
                    ]
                }
            },
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "gp3",
            "volumeMode": "Filesystem",
        },
        "status": {"phase": "Bound"},
    }


class FakeApi:
    """Just enough of KubeClient for the informers: list pages built on the fly, quiet
    watches. Claims and volumes number ``claims``; no StatefulSet or marked pod."""

    def __init__(self, claims: int) -> None:
        self.claims = claims

    async def list(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        accept: str | None = None,
        shape: EventShape = EVERY_FIELD,  # objects are made as decoded: it changes nothing
    ) -> dict[str, Any]:
        params = params or {}
        make = claim if path.endswith("/persistentvolumeclaims") else volume
        count = (
            self.claims if path.endswith(("/persistentvolumeclaims", "/persistentvolumes")) else 0
        )
        start = int(params.get("continue") or 0)
        items = [make(n) for n in range(start, min(start + PAGE, count))]
        meta: dict[str, Any] = {"resourceVersion": "1"}
        if start + PAGE < count:
            meta["continue"] = str(start + PAGE)
        return {"metadata": meta, "items": items}

    async def watch(
        self,
        path: str,
        params: Mapping[str, Any],
        *,
        opened: Callable[[], None] | None = None,
        accept: str | None = None,
        read_timeout: float | None = None,
        shape: EventShape = EVERY_FIELD,
    ) -> AsyncIterator[dict[str, Any]]:
        if opened is not None:
            opened()
        await asyncio.Event().wait()  # quiet: the caches hold what the list gave
        yield {}


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def fill(claims: int) -> tuple[ClaimCache, VolumeCache, list[asyncio.Task[None]]]:
    api: Any = FakeApi(claims)
    client: KubeClient = api
    claim_cache, volume_cache = ClaimCache(client), VolumeCache(client)
    informers = [
        claim_cache.claims,
        claim_cache.statefulsets,
        claim_cache.pods,
        volume_cache.informer,
    ]
    tasks = [asyncio.create_task(informer.run()) for informer in informers]
    for informer in informers:
        await informer.synced.wait()
    assert len(claim_cache.claims) == claims
    assert len(volume_cache.informer) == claims
    return claim_cache, volume_cache, tasks


async def measure(claims: int, rss: bool) -> dict[str, float]:
    gc.collect()
    if rss:
        before = rss_mb()
    else:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0] / 2**20
    claim_cache, volume_cache, tasks = await fill(claims)
    gc.collect()
    after = rss_mb() if rss else tracemalloc.get_traced_memory()[0] / 2**20
    if not rss:
        tracemalloc.stop()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    held = after - before
    del claim_cache, volume_cache
    return {
        "claims": claims,
        "held_mb": round(held, 1),
        "bytes_per_claim": round(held * 2**20 / claims),
        "mb_per_10k_claims": round(held * 10_000 / claims, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.webhook_memory", description=__doc__)
    parser.add_argument("--claims", type=int, default=10_000, help="claims, each with its volume")
    parser.add_argument(
        "--rss", action="store_true", help="the process RSS growth instead of tracemalloc"
    )
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.claims, args.rss))
    what = "RSS growth" if args.rss else "Python memory held (tracemalloc)"
    print(
        f"webhook caches, {figures['claims']:,} claims and their volumes: {what} "
        f"{figures['held_mb']} MB, {figures['bytes_per_claim']:,} bytes per claim, "
        f"{figures['mb_per_10k_claims']} MB per 10,000 claims"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
