"""The webhook's claim view: PVCs and placeholder StatefulSets, fed by two watches.

Indexes are kept up to date on every event so that an admission reads them in O(1):
claims by (namespace, name), claims by (namespace, run) through their owner names and
``coschedule.dev/group`` label, and each placeholder's {template: original claim}.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from coschedule.contract import LABEL_MANAGED_BY, LABEL_PLACEHOLDER, MANAGED_BY
from coschedule.decide.claims import (
    ClaimInfo,
    MarkedPodDecision,
    Template,
    claim_info,
    pod_decision,
    statefulset_templates,
)
from coschedule.kube.client import KubeClient
from coschedule.kube.informer import Informer, Obj


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
_sts_transform = _keeping("templates", statefulset_templates)
_pod_transform = _keeping("decision", pod_decision)


class ClaimCache:
    def __init__(self, client: KubeClient) -> None:
        self.claims = Informer(
            client,
            "/api/v1/persistentvolumeclaims",
            name="persistentvolumeclaims",
            transform=_claim_transform,
        )
        self.statefulsets = Informer(
            client,
            "/apis/apps/v1/statefulsets",
            name="statefulsets",
            label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}",
            transform=_sts_transform,
        )
        # Marked pods: the run's claim decision, taken by its first pod, binds the rest.
        self.pods = Informer(
            client,
            "/api/v1/pods",
            name="marked-pods",
            label_selector=LABEL_PLACEHOLDER,
            transform=_pod_transform,
        )
        self._decisions: dict[tuple[str, str], dict[str, MarkedPodDecision]] = defaultdict(dict)
        self.pods.add_handler(self._on_pod)
        self._by_run: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._runs_of: dict[str, set[tuple[str, str]]] = {}
        self._waiters: dict[str, list[asyncio.Event]] = defaultdict(list)
        self.claims.add_handler(self._on_claim)

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in (self.claims, self.statefulsets, self.pods))

    def _on_pod(self, event_type: str, obj: Obj) -> None:
        meta = obj["metadata"]
        found: MarkedPodDecision | None = obj["decision"]
        key = f"{meta['namespace']}/{meta['name']}"
        if found is None:
            return
        index = (str(meta["namespace"]), found.placeholder)
        if event_type == "DELETED":
            self._decisions[index].pop(key, None)
            if not self._decisions[index]:
                del self._decisions[index]
        else:
            self._decisions[index][key] = found

    def pod_decision(self, namespace: str, placeholder: str) -> tuple[Template, ...] | None:
        found = self._decisions.get((namespace, placeholder))
        return min(found.values()).templates if found else None

    def _on_claim(self, event_type: str, obj: Obj) -> None:
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        for run_key in self._runs_of.pop(key, set()):
            self._by_run[run_key].discard(key)
            if not self._by_run[run_key]:
                del self._by_run[run_key]
        if event_type == "DELETED":
            return
        info: ClaimInfo = obj["info"]
        runs = {name for _, name in info.owners}
        if info.group:
            runs.add(info.group)
        run_keys = {(str(meta["namespace"]), run) for run in runs}
        for run_key in run_keys:
            self._by_run[run_key].add(key)
        self._runs_of[key] = run_keys
        for event in self._waiters.pop(key, ()):
            event.set()

    def get(self, namespace: str, name: str) -> ClaimInfo | None:
        obj = self.claims.store.get(f"{namespace}/{name}")
        return None if obj is None else obj["info"]

    def run_claims(self, namespace: str, run: str) -> Sequence[ClaimInfo]:
        keys = self._by_run.get((namespace, run), ())
        return [self.claims.store[key]["info"] for key in sorted(keys) if key in self.claims.store]

    def placeholder_templates(self, namespace: str, placeholder: str) -> Mapping[str, str] | None:
        obj = self.statefulsets.store.get(f"{namespace}/{placeholder}")
        return None if obj is None else obj["templates"]

    async def wait_for(self, namespace: str, names: Sequence[str], seconds: float) -> bool:
        """Wait (without any API call) until the watch has delivered these claims."""
        pending = []
        for name in names:
            key = f"{namespace}/{name}"
            if key not in self.claims.store:
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
