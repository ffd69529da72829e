"""``POST /mutate``: admission of new pods, the hot path. Behind the front door
(``server.admission``) there is nothing between the body and the decision but the lean
decoder (``wire.lean``); an allowed pod's answer is joined from bytes, and nothing is logged
for it unless DEBUG is on. Until the caches it decides from have been read once
(``server.cache_gate``), a pod waits for them, bounded, and is decided then; still not read,
the call fails (HTTP 503) and the webhook's failurePolicy applies."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from coschedule.config.store import SettingsStore
from coschedule.mutate.claim_rewrite import ClaimView
from coschedule.mutate.decision import AdmissionContext, PlaceholderView, VolumeView, decide
from coschedule.server import admission_log
from coschedule.server.admission import (
    AdmissionEndpoint,
    Answer,
    NamespaceLookup,
    Wait,
    allowed,
    denied,
    errored,
)
from coschedule.server.cache_gate import RULE, SYNC_WAIT_SECONDS, CacheGate, CachesNotSynced
from coschedule.server.webhook_metrics import WebhookMetrics
from coschedule.wire import lean
from coschedule.wire.pod_fields import MalformedPod
from coschedule.wire.review import Review

log = admission_log.log

CLAIM_WAIT_SECONDS = 2.0  # well inside the webhook's 5 s timeout


class ClaimCacheView(ClaimView, Protocol):
    async def wait_for(self, namespace: str, names: Sequence[str], seconds: float) -> bool: ...


class PodEndpoint(AdmissionEndpoint):
    def __init__(
        self,
        settings: SettingsStore,
        metrics: WebhookMetrics,
        namespaces: NamespaceLookup | None = None,
        claims: ClaimCacheView | None = None,
        volumes: VolumeView | None = None,
        placeholders: PlaceholderView | None = None,
        caches: CacheGate | None = None,
    ) -> None:
        super().__init__(metrics, lean.decode, mode="none", path="/mutate", object_field="pod")
        self.settings = settings
        self.namespaces = namespaces
        self.claims = claims
        self.volumes = volumes
        self.placeholders = placeholders
        self.caches = caches
        # Every cache read once (they stay read: a relist keeps them): the hot path's one
        # check, a bool, set once here or by ``_unsynced``.
        self.synced = caches is None or not caches.waiting()
        # namespace -> the context of its last admission (one entry per namespace seen).
        self._contexts: dict[str, AdmissionContext] = {}

    def admit(self, review: Review, start: float, may_wait: bool) -> Answer:
        """With ``may_wait``, a pod denied only for claims the cache has not seen yet comes
        back with a wait for them (and is not logged: the door decides again)."""
        record = self.metrics.admissions.record
        if not review.is_pod_create:
            # Only Pod CREATE is ours; anything else (a broad rule, a typo in the webhook
            # configuration) is allowed untouched.
            record(_NOT_OURS)
            return allowed(review.uid), None
        if not self.synced and (wait := self._unsynced(review, start, may_wait)) is not None:
            return b"", wait  # the door waits, then decides once more
        pod = review.object
        settings = self.settings.current
        try:
            namespace = review.namespace
            namespaces = self.namespaces
            namespace_info = namespaces.get(namespace) if namespaces is not None else None
            ctx = self._contexts.get(namespace)
            if (
                ctx is None
                or ctx.settings is not settings
                or ctx.namespace_info != namespace_info  # the cache builds one per call
            ):
                # Built once per namespace until the settings or the namespace change.
                ctx = AdmissionContext(
                    settings,
                    namespace,
                    namespace_info,
                    self.claims,
                    self.volumes,
                    self.placeholders,
                    explain=False,
                )
                if len(self._contexts) >= _MAX_CONTEXTS:
                    self._contexts.clear()  # namespaces come from requests: stay bounded
                self._contexts[namespace] = ctx
            decision = decide(pod, ctx)
        except MalformedPod:
            raise  # a bad request: the door answers it
        except Exception:
            # A bug must not become an HTTP 500 (kube-apiserver would retry it blindly) nor
            # let a pod through half-decided; refuse this one pod with the uid echoed.
            log.exception(
                "internal error deciding a pod",
                extra={"uid": review.uid, "namespace": review.namespace, "rule": "internal-error"},
            )
            record(_INTERNAL_ERROR)
            return errored(
                review.uid,
                "coschedule: internal error while deciding this pod; it was not changed. "
                "Retry; if it persists, see the coschedule webhook logs.",
            ), None
        if decision.allowed:
            payload = allowed(review.uid, decision.ops, decision.warnings)
            seconds = time.perf_counter() - start
            record((decision.mode_label, "true", "200"), seconds, len(decision.ops))
            # Allowed without warnings: DEBUG, and nothing built unless DEBUG is on.
            if decision.warnings or log.isEnabledFor(logging.DEBUG):
                admission_log.decided(review, pod, decision, settings, start)
            return payload, None
        payload = denied(review.uid, decision.message or "", decision.warnings)
        record((decision.mode_label, "false", "403"), time.perf_counter() - start)
        claims = self.claims
        if may_wait and claims is not None and decision.rule == "claim-unknown":
            # A claim the engine made a moment ago may not have reached the cache yet: wait
            # for the watch (no API call), then decide once more.
            wait = claims.wait_for(review.namespace, decision.missing_claims, CLAIM_WAIT_SECONDS)
            return payload, wait
        admission_log.decided(review, pod, decision, settings, start)
        return payload, None

    def _unsynced(self, review: Review, start: float, may_wait: bool) -> Wait | None:
        """Before every cache has been read once: None when they now are (decide), a wait
        for them with ``may_wait``; else the call fails (``CachesNotSynced``)."""
        caches = self.caches
        waiting = caches.waiting() if caches is not None else []
        if not waiting:
            self.synced = True
            return None
        if may_wait and caches is not None:
            return caches.wait(SYNC_WAIT_SECONDS)
        names = ", ".join(waiting)
        self.metrics.admissions.record(_NOT_SYNCED, time.perf_counter() - start)
        admission_log.refused(
            self.path,
            503,
            RULE,
            f"caches not read after {SYNC_WAIT_SECONDS:g} s: {names}",
            review=review,
            object_field=self.object_field,
            start=start,
        )
        raise CachesNotSynced(
            f"coschedule: rule {RULE}: the webhook has not read the cluster's {names} yet "
            f"(waited {SYNC_WAIT_SECONDS:g} s; is the API server reachable from it?), so it "
            "cannot decide this pod; the webhook's failurePolicy applies (Ignore: the pod is "
            "admitted and the reconciler finishes it; Fail: retry in a few seconds)"
        )


_MAX_CONTEXTS = 4096
_NOT_SYNCED = ("none", "false", "503")
_NOT_OURS = ("none", "true", "200")
_INTERNAL_ERROR = ("none", "false", "500")
