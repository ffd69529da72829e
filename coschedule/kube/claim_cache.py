"""The webhook's claim view: PVCs, placeholder StatefulSets and marked pods, fed by watches.

The informers keep the indexes on every event so that an admission reads them in O(1):
claims by (namespace, name) and by run (their owner names and ``coschedule.dev/group``
label), each placeholder's {template: original claim}, and marked pods by placeholder.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from coschedule.k8s.timefmt import parse_time
from coschedule.kube.client import KubeClient
from coschedule.kube.informer import Informer, Obj
from coschedule.marks import (
    LABEL_MANAGED_BY,
    LABEL_PLACEHOLDER,
    MANAGED_BY,
    ClaimTemplate,
    statefulset_templates,
)
from coschedule.mutate.claim_rewrite import (
    ClaimInfo,
    MarkedPodDecision,
    claim_info,
    pod_decision,
)


def _keeping(field: str, derive: Callable[[Obj], object]) -> Callable[[Obj], Obj]:
    """An informer transform that keeps the object's identity and one derived field: the
    caches hold what admissions read and nothing else (20,000 pods must stay small)."""

    def transform(obj: Obj) -> Obj:
        meta = obj.get("metadata") or {}
        return {
            "metadata": {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            field: derive(obj),
        }

    return transform


_claim_transform = _keeping("info", claim_info)
_sts_templates = _keeping("templates", statefulset_templates)


def _sts_transform(obj: Obj) -> Obj:
    """A placeholder StatefulSet: its templates, and when it was made (the placeholder cache
    reads that for a run's first pod: is its placeholder on its way?)."""
    slim = _sts_templates(obj)
    slim["created"] = parse_time((obj.get("metadata") or {}).get("creationTimestamp"))
    return slim


_pod_transform = _keeping("decision", pod_decision)


def _namespaced(obj: Obj, value: str) -> str:
    return f"{obj['metadata']['namespace']}/{value}"


def claim_runs(obj: Obj) -> list[str]:
    """Index: the runs (``namespace/run``) a claim may belong to: its owners' names and
    its ``coschedule.dev/group`` label."""
    info: ClaimInfo = obj["info"]
    runs = [name for _, name in info.owners]
    if info.group:
        runs.append(info.group)
    return [_namespaced(obj, run) for run in runs]


def decision_placeholder(obj: Obj) -> list[str]:
    """Index: the placeholder (``namespace/name``) whose claim decision a marked pod carries."""
    found: MarkedPodDecision | None = obj["decision"]
    return [] if found is None else [_namespaced(obj, found.placeholder)]


class ClaimCache:
    def __init__(self, client: KubeClient) -> None:
        self.claims = Informer(
            client,
            "/api/v1/persistentvolumeclaims",
            name="persistentvolumeclaims",
            transform=_claim_transform,
            indexers={"run": claim_runs},
        )
        self.statefulsets = Informer(
            client,
            "/apis/apps/v1/statefulsets",
            name="statefulsets",
            label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}",
            transform=_sts_transform,
        )
        # Marked pods: the run's claim decision, taken by its first pod, binds the rest.
        # Read from labels and annotations alone: every event of every run pod comes, so
        # the watch sends metadata only, not whole pods.
        self.pods = Informer(
            client,
            "/api/v1/pods",
            name="marked-pods",
            label_selector=LABEL_PLACEHOLDER,
            transform=_pod_transform,
            indexers={"placeholder": decision_placeholder},
            metadata_only=True,
        )
        self._waiters: dict[str, list[asyncio.Event]] = defaultdict(list)
        self.claims.add_handler(self._on_claim)

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in (self.claims, self.statefulsets, self.pods))

    async def wait_synced(self) -> None:
        for informer in (self.claims, self.statefulsets, self.pods):
            await informer.synced.wait()

    def pod_decision(self, namespace: str, placeholder: str) -> tuple[ClaimTemplate, ...] | None:
        found = self.pods.by_index("placeholder", f"{namespace}/{placeholder}")
        return min(obj["decision"] for obj in found).templates if found else None

    def _on_claim(self, event_type: str, obj: Obj, old: Obj | None) -> None:
        if event_type == "DELETED":
            return
        for event in self._waiters.pop(_namespaced(obj, obj["metadata"]["name"]), ()):
            event.set()

    def get(self, namespace: str, name: str) -> ClaimInfo | None:
        obj = self.claims.get(f"{namespace}/{name}")
        return None if obj is None else obj["info"]

    def run_claims(self, namespace: str, run: str) -> Sequence[ClaimInfo]:
        return [obj["info"] for obj in self.claims.by_index("run", f"{namespace}/{run}")]

    def placeholder_templates(self, namespace: str, placeholder: str) -> Mapping[str, str] | None:
        obj = self.statefulsets.get(f"{namespace}/{placeholder}")
        return None if obj is None else obj["templates"]

    async def wait_for(self, namespace: str, names: Sequence[str], seconds: float) -> bool:
        """Wait (without any API call) until the watch has delivered these claims."""
        pending = []
        for name in names:
            key = f"{namespace}/{name}"
            if key not in self.claims:
                event = asyncio.Event()
                self._waiters[key].append(event)
                pending.append(event)
        if not pending:
            return True
        try:
            async with asyncio.timeout(seconds):
                for event in pending:
                    await event.wait()
        except TimeoutError:
            for name in names:
                waiters = self._waiters.get(f"{namespace}/{name}")
                if waiters is not None:
                    waiters[:] = [e for e in waiters if e not in pending]
                    if not waiters:
                        del self._waiters[f"{namespace}/{name}"]
            return False
        return True
