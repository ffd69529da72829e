"""Carrying out every controller's planned actions against the API, one key at a time:
the placeholder controller's (``plan``, ``plan_stuck``, ``plan_pins``,
``plan_assistant_conflict``) and the concurrency controller's (``run_plan``: starts,
cancels, waiting marks, held runs admitted, a control's status; their writes are in
``run_writes``).

API errors propagate (the manager retries the key with backoff); Events never do. A
pass's pod releases are handed to the release stage (``release_stage``), which sends them
apart from the pass and queues the run again when one fails. Before
each action the leader check runs, so a replica that lost the Lease stops at once (the one
leadership check of both controllers). Each action stands alone: an action's own Event is
recorded when the action took effect. A placeholder pod is deleted once per
resourceVersion, whichever action deletes it (one memory, per Executor).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Never, NoReturn

from coschedule.concurrency.runs import Run
from coschedule.kube.client import (
    JSON_PATCH,
    METADATA_ACCEPT,
    STRATEGIC_MERGE,
    ApiError,
    KubeClient,
    object_path,
)
from coschedule.kube.events import record_event
from coschedule.kube.informer import Obj
from coschedule.marks import LABEL_INSTANCE
from coschedule.reconcile import run_writes
from coschedule.reconcile.model import (
    Action,
    AdmitHeldRun,
    CancelRun,
    ClearStuck,
    CreateStatefulSet,
    DeleteClaim,
    DeletePlaceholderPod,
    DeleteStatefulSet,
    DeleteStrandedPod,
    DeleteStrayPod,
    HoldPinnedPlaceholder,
    MarkStuck,
    MarkWaiting,
    PatchStatefulSet,
    RecordEvent,
    ReleaseClaim,
    ReleasePod,
    RelocatePlaceholder,
    ReportAssistantConflict,
    StartRun,
    WriteControlStatus,
)
from coschedule.reconcile.reconciler_metrics import ReconcileMetrics
from coschedule.reconcile.release_stage import ReleaseStage
from coschedule.reconcile.stuck_facts import StuckMemory

log = logging.getLogger("coschedule.reconcile")

PVC_PROTECTION = "kubernetes.io/pvc-protection"
BACKGROUND = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
# A conditional write that met a newer object than the one planned from: 409 (a delete's
# preconditions, a resourceVersion), 422 (a JSON patch's ``test``), 404 (gone). The change
# that made it stale comes through the watch and the group is looked at again.
STALE = frozenset({404, 409, 422})


class NotLeader(Exception):
    """Leadership was lost mid-reconcile: stop acting at once."""


class UnknownAction(TypeError):
    """A planner returned an action the executor has no case for: a bug, said loudly (the
    key is retried with backoff and the error logged), never an action skipped in silence."""


def unknown(action: Never) -> NoReturn:
    """The ``case _`` of an exhaustive match: mypy accepts a call only where every action
    type was handled before it (as ``typing.assert_never``); at run time, an error."""
    raise UnknownAction(f"no case in the executor for action {type(action).__name__}: {action!r}")


def _no_run(key: str) -> str:
    return ""


def _nothing(key: str) -> None:
    return None


def _release_failed(key: str, exc: Exception, failures: int) -> None:
    log.warning("release failed", extra={"key": key, "error": repr(exc), "failures": failures})


class Executor:
    """One per controller (its memory is its own); every action type has its case.

    ``run_of``, ``pod_version``, ``torn_down``, ``stuck`` and ``release_failed`` are the
    placeholder controller's (its log fields, its placeholder pods' versions, a group torn
    down, its stuck groups, a release that failed); the concurrency controller's Executor
    leaves them to their defaults and gives its ``clock`` (a run's start delay)."""

    def __init__(
        self,
        client: KubeClient,
        metrics: ReconcileMetrics,
        *,
        leading: Callable[[], bool],
        run_of: Callable[[str], str] = _no_run,
        pod_version: Callable[[str], str] = _no_run,
        torn_down: Callable[[str], None] = _nothing,
        stuck: StuckMemory | None = None,
        clock: Callable[[], float] = time.time,
        release_failed: Callable[[str, Exception, int], None] = _release_failed,
    ) -> None:
        self.client = client
        self.metrics = metrics
        self.leading = leading
        self.run_of = run_of
        self.pod_version = pod_version
        self.torn_down = torn_down
        self.stuck = stuck if stuck is not None else StuckMemory(metrics.stuck_groups)
        self.clock = clock
        # Placeholder pod -> the resourceVersion we deleted: until the watch shows it
        # terminating, a second look must not delete (and count, and announce) it again.
        self.deleted: dict[str, str] = {}
        # Placeholder key -> why its pod stays on a node it would otherwise leave: explained
        # once per reason (not on every look), counted while it lasts.
        self.pinned: dict[str, str] = {}
        # Placeholder key -> the pods and runs told they are pinned to Tekton's own Affinity
        # Assistant too: told once each, not on every look; forgotten with the group.
        self.conflicts: dict[str, set[str]] = {}
        # Gated pod -> the resourceVersion its release patch was planned from: a look before
        # the watch shows the patch plans the same release from the same version; sent
        # again, its ``test`` on the gate fails (422) and the key is looked at once more.
        self.released: dict[str, str] = {}
        self.releases = ReleaseStage(self._send_release, release_failed)

    def forget_pod(self, pod_key: str) -> None:
        self.deleted.pop(pod_key, None)
        self.released.pop(pod_key, None)

    def forget_group(self, key: str) -> None:
        self.conflicts.pop(key, None)
        self.releases.forget(key)

    def _check_leader(self) -> None:
        if not self.leading():
            raise NotLeader

    def _extra(self, key: str, action: str, **more: Any) -> dict[str, Any]:
        """The fields of an action's log line; the admission log uses the same names."""
        namespace, _, name = key.partition("/")
        return {
            "action": action,
            "namespace": namespace,
            "placeholder": name,
            "run": self.run_of(key),
            **more,
        }

    async def execute(self, key: str, actions: Iterable[Action], sts_obj: Obj | None) -> None:
        uid = str(((sts_obj or {}).get("metadata") or {}).get("uid") or "")
        actions = list(actions)
        if key in self.pinned and not any(isinstance(a, HoldPinnedPlaceholder) for a in actions):
            del self.pinned[key]  # the node took it back, or the run is gone
            self.metrics.pinned_placeholders.set(len(self.pinned))
        index = 0
        while index < len(actions):
            action = actions[index]
            self._check_leader()
            if isinstance(action, ReleasePod):
                # The pass's releases (consecutive: ``node_pins`` plans them together) are
                # handed to the stage, ranked by their place in the run; the pass goes on.
                releases: list[ReleasePod] = []
                while index < len(actions) and isinstance(release := actions[index], ReleasePod):
                    releases.append(release)
                    index += 1
                self.releases.submit(key, releases)
                continue
            uid = await self._one(key, action, uid)
            index += 1

    async def _send_release(self, key: str, action: ReleasePod) -> None:
        """One release, from the stage's runners: none once the lead is lost."""
        if self.leading():
            await self._release_pod(key, action)

    async def _one(self, key: str, action: Action, uid: str) -> str:
        """Carry out one action; the StatefulSet's uid (a create gives the new one). Every
        kind of action has its case: mypy fails on one it does not handle (``assert_never``),
        and an object of any other type is an error at run time, never skipped."""
        match action:
            case CreateStatefulSet():
                created_uid, made = await self._create(key, action)
                if created_uid is not None:  # None: an existing one was relabelled
                    uid = created_uid
                if made:  # not when an earlier look made it: its Event is recorded
                    await self._event(action.event, uid)
            case PatchStatefulSet():
                await self.client.patch(
                    object_path("apps/v1", "statefulsets", action.namespace, action.name),
                    action.patch,
                    content_type=STRATEGIC_MERGE,
                )
                log.info(
                    "patched placeholder",
                    extra=self._extra(key, "patch-statefulset", reason=action.why),
                )
            case DeletePlaceholderPod():
                if await self._evict(key, action):
                    await self._event(action.event, uid)
            case HoldPinnedPlaceholder():
                await self._hold(key, action, uid)
            case DeleteStatefulSet():
                await self.client.delete(
                    object_path("apps/v1", "statefulsets", action.namespace, action.name),
                    body=BACKGROUND,
                )
                self.torn_down(key)
                log.info(
                    "deleted placeholder: run done",
                    extra=self._extra(key, "delete-statefulset", reason=action.why),
                )
            case DeleteClaim():
                await self.client.delete(
                    object_path("v1", "persistentvolumeclaims", action.namespace, action.name)
                )
                log.info("deleted claim", extra=self._extra(key, "delete-claim", claim=action.name))
            case RecordEvent():
                await self._event(action, uid)
            case ReleaseClaim():
                await self._release(key, action)
            case RelocatePlaceholder():
                await self._relocate(key, action)
            case DeleteStrayPod():
                if await self._delete_pod(action.namespace, action.name):
                    log.info(
                        "deleted a placeholder pod back on a node it left",
                        extra=self._extra(
                            key,
                            "delete-placeholder-pod",
                            pod=action.name,
                            node=action.node,
                            reason="left-domain",
                        ),
                    )
            case ReleasePod():
                self.releases.submit(key, [action])
            case DeleteStrandedPod():
                if await self._delete_stranded(key, action):
                    await self._event(action.event, uid)
            case ReportAssistantConflict():
                await self._conflict(key, action)
            case MarkStuck():
                self._mark_stuck(key, action)
            case ClearStuck():
                was_stuck = self.stuck.clear(key, forget=action.forget)
                if was_stuck and action.why is not None:
                    log.info(
                        "run no longer stuck", extra=self._extra(key, "unstuck", reason=action.why)
                    )
            case StartRun():
                await _unless_gone(
                    run_writes.start_run(
                        self.client,
                        action.run,
                        action.why,
                        started=self._count_start,
                        now=time.time(),  # the stamp its pods compare with the wall clock
                    )
                )
            case CancelRun():
                await _unless_gone(
                    run_writes.cancel_run(self.client, action, self.metrics.concurrency)
                )
            case MarkWaiting():
                await _unless_gone(run_writes.mark_waiting(self.client, action))
            case WriteControlStatus():
                await run_writes.write_control_status(self.client, action)
            case AdmitHeldRun():
                await run_writes.admit_held_run(self.client, action)
            case _:
                unknown(action)
        return uid

    def _count_start(self, run: Run) -> None:
        created = run.created_at
        if created:
            self.metrics.concurrency.start_delay.observe(max(0.0, self.clock() - created))
        self.metrics.concurrency.starts.inc()

    def _mark_stuck(self, key: str, action: MarkStuck) -> None:
        self.stuck.mark(key, action.explained)
        if action.explained is None:  # said before
            return
        log.warning(
            "run stuck",
            extra=self._extra(
                key,
                "explain-stuck",
                pod=action.pod,
                node=action.node,
                reason=action.reason,
                explain=action.text,
            ),
        )

    async def _delete_pod(self, namespace: str, name: str, *, force_uid: str | None = None) -> bool:
        """Delete a placeholder pod; False when this very version was deleted already.

        ``force_uid``: grace period 0, only the pod of that uid (a pod made again under the
        same name meanwhile is never deleted: 409, False)."""
        pod_key = f"{namespace}/{name}"
        version = self.pod_version(pod_key)
        if self.deleted.get(pod_key) == version:
            return False
        body: dict[str, Any] | None = None
        if force_uid is not None:
            body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
            if force_uid:
                body["preconditions"] = {"uid": force_uid}
        try:
            await self.client.delete(object_path("v1", "pods", namespace, name), body=body)
        except ApiError as exc:
            if force_uid is None or exc.status not in STALE:
                raise
            return False
        self.deleted[pod_key] = version
        return True

    async def _release_pod(self, key: str, action: ReleasePod) -> None:
        """Pin the pod to the placeholder's node and lift our gate, in one JSON patch; not
        again from a version already released."""
        pod_key = f"{action.namespace}/{action.name}"
        if action.resource_version and self.released.get(pod_key) == action.resource_version:
            return
        path = object_path("v1", "pods", action.namespace, action.name)
        try:
            # The answer is not read: its metadata alone, not the whole pod, to decode.
            await self.client.patch(
                path, list(action.ops), content_type=JSON_PATCH, accept=METADATA_ACCEPT
            )
        except ApiError as exc:
            if exc.status not in STALE:
                raise
            log.info(
                "pod changed since it was seen; looking again",
                extra=self._extra(key, "release-pod", pod=action.name, code=exc.status),
            )
            return
        self.released[pod_key] = action.resource_version
        log.info(
            "released pod onto its placeholder's node",
            extra=self._extra(key, "release-pod", pod=action.name, node=action.node),
        )

    async def _delete_stranded(self, key: str, action: DeleteStrandedPod) -> bool:
        """Delete a never-started pod pinned to a node its run left; only the version that
        was seen (a pod bound since is never deleted). False when it was not deleted."""
        preconditions = {"uid": action.uid, "resourceVersion": action.resource_version}
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
        path = object_path("v1", "pods", action.namespace, action.name)
        try:
            deleted = await self.client.delete(path, body=body)
        except ApiError as exc:
            if exc.status != 404:
                # Changed since seen (bound, most likely): the rest of the pass, a
                # relocation among it, was planned on a pod that is not there any more.
                # The 409 retries the key, which is planned again from what is.
                raise
            deleted = None
        if deleted is None:
            log.info(
                "pod changed since it was seen; not deleted, looking again",
                extra=self._extra(key, "delete-stranded-pod", pod=action.name),
            )
            return False
        self.metrics.stranded_pods.inc()
        log.info(
            "deleted a pending pod pinned to a node its run left",
            extra=self._extra(
                key,
                "delete-stranded-pod",
                pod=action.name,
                node=action.node,
                detail=action.event.message,
            ),
        )
        return True

    async def _relocate(self, key: str, action: RelocatePlaceholder) -> None:
        """Patch the StatefulSet to its new place, then delete its pods on the old node."""
        await self.client.patch(
            object_path("apps/v1", "statefulsets", action.namespace, action.name),
            action.patch,
            content_type=STRATEGIC_MERGE,
        )
        for pod in action.pods:
            self._check_leader()
            await self._delete_pod(action.namespace, pod)
        self.metrics.relocations.labels(action.reason).inc()
        log.info(
            "relocated placeholder",
            extra=self._extra(
                key,
                "relocate-placeholder",
                reason=action.reason,
                pod=action.pod,
                why=action.why,
                **{"from": action.from_node, "to": action.to_node},
            ),
        )

    async def _release(self, key: str, action: ReleaseClaim) -> None:
        """Drop pvc-protection from our claim if it is being deleted (else nothing: it is
        gone, or not deleted by us); conditional on the version read."""
        path = object_path("v1", "persistentvolumeclaims", action.namespace, action.name)
        claim = await self.client.get(path)
        meta = (claim or {}).get("metadata") or {}
        finalizers = list(meta.get("finalizers") or ())
        if not meta.get("deletionTimestamp") or PVC_PROTECTION not in finalizers:
            return
        kept = [f for f in finalizers if f != PVC_PROTECTION]
        patch = {"metadata": {"finalizers": kept, "resourceVersion": meta.get("resourceVersion")}}
        await self.client.patch(path, patch)
        log.info(
            "released claim: run done, no pod of it live",
            extra=self._extra(key, "release-claim", claim=action.name),
        )

    async def _conflict(self, key: str, action: ReportAssistantConflict) -> None:
        told = self.conflicts.setdefault(key, set())
        if action.subject in told:
            return
        told.add(action.subject)
        if action.subject.startswith("pod "):
            self.metrics.assistant_conflicts.inc()
            log.warning(
                "pod pinned to Tekton's own Affinity Assistant too",
                extra=self._extra(
                    key,
                    "report-assistant-conflict",
                    pod=action.pod,
                    assistants=list(action.assistants),
                ),
            )
        await self._event(action.event, "")

    async def _hold(self, key: str, action: HoldPinnedPlaceholder, uid: str) -> None:
        if self.pinned.get(key) == action.message:
            return
        self.pinned[key] = action.message
        self.metrics.pinned_placeholders.set(len(self.pinned))
        log.warning(
            "placeholder pod stays: its volumes can be used on its node only",
            extra=self._extra(
                key,
                "hold-pinned-placeholder",
                pod=action.name,
                node=action.node,
                reason=action.reason,
                detail=action.message,
            ),
        )
        await self._event(action.event, uid)

    async def _evict(self, key: str, action: DeletePlaceholderPod) -> bool:
        """Delete the placeholder pod; False when this very version was deleted already."""
        force = action.uid if action.force else None
        if not await self._delete_pod(action.namespace, action.name, force_uid=force):
            return False
        self.metrics.evictions.labels(action.reason).inc()
        log.info(
            "force-deleted placeholder pod: its node's kubelet cannot finish the delete"
            if action.force
            else "deleted placeholder pod so that it moves",
            extra=self._extra(
                key,
                "delete-placeholder-pod",
                pod=action.name,
                node=action.node,
                reason=action.reason,
                detail=action.message,
            ),
        )
        return True

    async def _create(self, key: str, action: CreateStatefulSet) -> tuple[str | None, bool]:
        """Create; (its uid, made now). (None, False) when an existing one of ours was
        relabelled; (its uid, False) when it was there, ours and intact (a cache behind)."""
        path = object_path("apps/v1", "statefulsets", action.namespace)
        try:
            created = await self.client.create(path, action.body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            # There, but not in our cache: a hand edit dropped our managed-by label (so our
            # watch no longer selects it), or the cache lags. Relabel it if it is ours.
            existing = await self.client.get(f"{path}/{action.name}") or {}
            meta = existing.get("metadata") or {}
            labels = meta.get("labels") or {}
            wanted = action.body["metadata"]["labels"]
            if labels.get(LABEL_INSTANCE) == action.name and all(
                labels.get(k) == v for k, v in wanted.items()
            ):
                # Ours, labels intact: our cache has not seen it yet (made by an earlier
                # look whose watch event is still on its way), nothing was lost.
                log.debug(
                    "placeholder exists; the cache is behind",
                    extra=self._extra(key, "create-statefulset", reason="cache behind"),
                )
                return str(meta.get("uid") or ""), False
            if labels.get(LABEL_INSTANCE) == action.name:
                await self.client.patch(
                    f"{path}/{action.name}",
                    {"metadata": {"labels": action.body["metadata"]["labels"]}},
                )
                log.warning(
                    "placeholder lost its labels; restored",
                    extra=self._extra(key, "patch-statefulset", reason="labels restored"),
                )
                return None, False
            log.error(
                "a StatefulSet with the placeholder's name exists and is not ours",
                extra=self._extra(key, "create-statefulset", reason="name taken"),
            )
            raise
        log.info(
            "created placeholder",
            extra=self._extra(key, "create-statefulset", reason="run has pods, no placeholder"),
        )
        return str((created.get("metadata") or {}).get("uid") or ""), True

    async def _event(self, action: RecordEvent, uid: str) -> None:
        """Record the Event, and log it; an Event the API refuses is a warning only."""
        about = action.involved
        involved = (
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": action.statefulset, "uid": uid}
            if about is None
            else {
                "apiVersion": about.api_version,
                "kind": about.kind,
                "name": about.name,
                "uid": about.uid,
            }
        )
        if not await record_event(
            self.client, action.namespace, involved, action.reason, action.message, action.type
        ):
            return
        log.info(
            "recorded event",
            extra=self._extra(
                f"{action.namespace}/{action.statefulset}",
                "record-event",
                reason=action.reason,
                detail=action.message,
            ),
        )


async def _unless_gone(write: Awaitable[None]) -> None:
    """A run write; a run that is gone (404) has nothing to start, cancel or mark."""
    try:
        await write
    except ApiError as exc:
        if exc.status != 404:
            raise
