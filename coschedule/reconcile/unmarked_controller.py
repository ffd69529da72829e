"""The reconciler's stand-in for the webhook during an outage: one key per pod that the
admission policy gated and the webhook never marked (``reconcile/unmarked.py`` decides).

Its watch selects ``coschedule.dev/gated-by=admission-policy,!coschedule.dev/placeholder``:
outside an outage it holds nothing (the webhook marks the pod, or lifts the gate and the
label). Once marked, a pod leaves this watch and joins the placeholder controller's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from coschedule.config.settings import Settings
from coschedule.kube.client import JSON_PATCH, ApiError, KubeClient, object_path
from coschedule.kube.events import record_event
from coschedule.kube.informer import Informer, Obj, caches_readiness, object_key
from coschedule.marks import GATED_BY_POLICY, LABEL_GATED_BY, LABEL_PLACEHOLDER
from coschedule.reconcile.executor import STALE, NotLeader
from coschedule.reconcile.model import Plan
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.unmarked import plan_unmarked
from coschedule.reconcile.workqueue import WorkQueue

log = logging.getLogger("coschedule.reconcile")

UNMARKED_SELECTOR = f"{LABEL_GATED_BY}={GATED_BY_POLICY},!{LABEL_PLACEHOLDER}"


class UnmarkedController:
    name = "unmarked"
    probe = "unmarked-pods"
    log = log
    workers = 2

    def __init__(
        self,
        client: KubeClient,
        settings: Callable[[], Settings],
        metrics: ReconcileMetrics,
        *,
        leading: Callable[[], bool],
    ) -> None:
        self.client = client
        self.settings = settings
        self.leading = leading
        self.queue = WorkQueue()
        self.pods = Informer(
            client,
            "/api/v1/pods",
            name="unmarked-pods",
            label_selector=UNMARKED_SELECTOR,
            on_relist=lambda: metrics.relists.labels("unmarked-pods").inc(),
        )
        self.pods.add_handler(self._on_pod)
        self._told: dict[str, str] = {}  # pod key -> the Event reason already recorded

    def _on_pod(self, event: str, obj: Obj, old: Obj | None) -> None:
        key = object_key(obj)
        if event == "DELETED":
            self._told.pop(key, None)
            return
        self.queue.add(key)

    def informer_runs(self) -> list[Coroutine[Any, Any, None]]:
        return [self.pods.run()]

    async def wait_synced(self) -> None:
        await self.pods.synced.wait()

    def take_over(self) -> None:
        for key in self.pods.view():
            self.queue.add(key)

    def leader_runs(self) -> list[Coroutine[Any, Any, None]]:
        return []

    def readiness(self) -> tuple[bool, str | None]:
        return caches_readiness([self.pods], self.client)

    def settings_changed(self) -> None:
        self.take_over()

    def log_fields(self, key: str) -> dict[str, str]:
        return {"pod": key}

    async def reconcile(self, key: str) -> Plan | None:
        pod = self.pods.get(key)
        if pod is None:
            return None
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        found = await self.client.get(object_path("v1", "namespaces", None, namespace))
        labels = ((found or {}).get("metadata") or {}).get("labels") or {}
        planned = plan_unmarked(pod, labels, self.settings())
        if planned.ops:
            if not self.leading():
                raise NotLeader()
            try:
                await self.client.patch(
                    object_path("v1", "pods", namespace, name),
                    list(planned.ops),
                    content_type=JSON_PATCH,
                )
            except ApiError as exc:
                if exc.status in STALE:
                    return None  # changed meanwhile: the watch brings it back
                raise
            log.info(
                "pod admitted without the webhook finished",
                extra={"pod": key, "placeholder": planned.placeholder or "", "why": planned.reason},
            )
        if planned.reason and self._told.get(key) != planned.reason:
            self._told[key] = planned.reason
            involved = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": meta.get("uid")}
            await record_event(
                self.client,
                namespace,
                {k: str(v) for k, v in involved.items() if v},
                planned.reason,
                planned.message,
                "Warning" if planned.warning else "Normal",
            )
        return None
