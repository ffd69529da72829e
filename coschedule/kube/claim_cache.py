"""The webhook's claim view: PVCs, placeholder StatefulSets and marked pods, fed by watches.

The informers keep the indexes on every event so that an admission reads them in O(1):
claims by (namespace, name) and by run (their owner names and ``coschedule.dev/group``
label), each placeholder's {template: original claim}, and marked pods by placeholder.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        # the watch sends metadata only, not whole pods. Only ``rewrite-claims`` makes a
        # decision other pods must follow, so the watch runs once that is on
        # (``watch_marked_pods``), and from then on: every event of every run pod costs
        # kube-apiserver an encoding and this process a decode, about 40 % of its CPU per
        # run pod (docs/benchmarks.md).
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
        # Whether the marked pods are watched (``watch_marked_pods``); whether they were
        # before the caches started (then readiness waits for them too); the watch's task
        # once it runs (``run`` started it, or ``watch_marked_pods`` after that).
        self.marked_pods_watched = False
        self._marked_at_start = False
        self._running = False
        self._marked_task: asyncio.Task[None] | None = None

    @property
    def synced(self) -> bool:
        """Every watch this cache runs has listed once: what a decision that rewrites
        claims needs."""
        return all(i.synced.is_set() for i in self._informers())

    @property
    def ready(self) -> bool:
        """The readiness of a replica: the caches it started with have listed once (the
        marked pods' watch, started by a reload, does not take a serving replica out of its
        Service: admissions that need it wait for it)."""
        return (
            self.claims.synced.is_set()
            and self.statefulsets.synced.is_set()
            and (not self._marked_at_start or self.pods.synced.is_set())
        )

    async def wait_synced(self) -> None:
        for informer in self._informers():
            await informer.synced.wait()

    def _informers(self) -> tuple[Informer, ...]:
        if self.marked_pods_watched:
            return (self.claims, self.statefulsets, self.pods)
        return (self.claims, self.statefulsets)

    def watch_marked_pods(self) -> None:
        """Watch the marked pods from now on (``rewrite-claims`` is on): at once when the
        caches run, else when they start. Never stopped: a run's pods admitted after
        ``rewrite-claims`` goes off still follow a decision its first pod carries."""
        if self.marked_pods_watched:
            return
        self.marked_pods_watched = True
        if self._running:
            self._marked_task = asyncio.create_task(self.pods.run())
        else:
            self._marked_at_start = True

    async def run(self) -> None:
        """The watches, until cancelled."""
        self._running = True
        if self.marked_pods_watched:
            self._marked_task = asyncio.create_task(self.pods.run())
        try:
            await asyncio.gather(self.claims.run(), self.statefulsets.run())
        finally:
            self._running = False
            task = self._marked_task
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

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
