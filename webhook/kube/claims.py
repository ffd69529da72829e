"""The webhook's claim view: PVCs and placeholder StatefulSets, fed by two watches.

Indexes are kept up to date on every event so that an admission reads them in O(1):
claims by (namespace, name), claims by (namespace, run) through their owner names and
``coschedule.dev/group`` label, and each placeholder's {template: original claim}.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.contract import LABEL_MANAGED_BY, MANAGED_BY
from webhook.decide.claims import TEMPLATE_CLAIM, ClaimInfo, claim_info
from webhook.kube.client import KubeClient
from webhook.kube.informer import Informer, Obj



def _claim_transform(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "info": claim_info(obj),
    }


def statefulset_templates(sts: Mapping[str, Any]) -> dict[str, str]:
    """{template name: original claim} of a placeholder StatefulSet."""
    result: dict[str, str] = {}
    for template in (sts.get("spec") or {}).get("volumeClaimTemplates") or ():
        if not isinstance(template, dict):
            continue
        meta = template.get("metadata") or {}
        name = meta.get("name")
        if isinstance(name, str):
            original = (meta.get("annotations") or {}).get(TEMPLATE_CLAIM, name)
            result[name] = str(original)
    return result


def _sts_transform(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "templates": statefulset_templates(obj),
    }


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
        self._by_run: dict[tuple[str, str], set[str]] = defaultdict(set)
        self._runs_of: dict[str, set[tuple[str, str]]] = {}
        self._waiters: dict[str, list[asyncio.Event]] = defaultdict(list)
        self.claims.add_handler(self._on_claim)

    @property
    def synced(self) -> bool:
        return self.claims.synced.is_set() and self.statefulsets.synced.is_set()

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
