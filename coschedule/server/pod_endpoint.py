"""``POST /mutate``: admission of new pods, the hot path. Behind the front door
(``server.admission``) there is nothing between the body and the decision but the lean
decoder (``wire.lean``); an allowed pod's answer is joined from bytes, and nothing is logged
for it unless DEBUG is on. Until the caches it decides from have been read once
(``server.cache_gate``), a pod waits for them, bounded, and is decided then; still not read,
the call fails (HTTP 503) and the webhook's failurePolicy applies.

A run's pod that would be gated only because its placeholder is not bound yet, while that
placeholder is on its way (``mutate.bind_wait``: made a moment ago, not reported
Unschedulable), waits, bounded by ``placeholder-bind-wait-seconds``, for the placeholder
cache's watch to deliver the binding, and is decided once more: pinned at admission, or,
after the bound, gated as without the wait (the reconciler pins it). A placeholder that made
one pod wait in vain makes its run's later pods wait no more (for a minute). A pod that
comes before the reconciler has made the placeholder at all counts as on its way when this
webhook admitted its PipelineRun a moment ago (``server.young_runs``).

A request waits twice at most: a wait for the caches or for a claim may be followed by a
wait for the binding, shortened so that all of one request's waits stay within
``TOTAL_WAIT_SECONDS`` (the webhook's ``timeoutSeconds`` is 5)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import replace
from typing import Protocol

from coschedule.config.settings import Settings
from coschedule.config.store import SettingsStore
from coschedule.marks import Mode
from coschedule.mutate.bind_wait import (
    PlaceholderProgress,
    on_its_way,
    run_admitted,
    seeded_run,
)
from coschedule.mutate.claim_rewrite import ClaimView
from coschedule.mutate.claims import CLAIM_CACHE_NOT_SYNCED
from coschedule.mutate.decision import AdmissionContext, PlaceholderView, VolumeView, decide
from coschedule.mutate.outcome import Decision
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
from coschedule.server.young_runs import YoungRuns
from coschedule.wire import lean
from coschedule.wire import pod_fields as podview
from coschedule.wire.pod_fields import MalformedPod
from coschedule.wire.review import Review

log = admission_log.log

CLAIM_WAIT_SECONDS = 2.0  # well inside the webhook's 5 s timeout
# All the waits of one request together (a claim's or the caches', then the binding's):
# the answer comes well inside the webhook's 5 s timeoutSeconds.
TOTAL_WAIT_SECONDS = 3.5
# A bind wait shorter than this, after another wait, is not worth its bookkeeping.
_SHORTEST_BIND_WAIT = 0.05


class ClaimCacheView(ClaimView, Protocol):
    async def wait_for(self, namespace: str, names: Sequence[str], seconds: float) -> bool: ...


class BindingWatch(Protocol):
    """The placeholder cache, as a wait for a placeholder's binding reads it."""

    def progress(self, namespace: str, placeholder: str) -> PlaceholderProgress: ...

    async def wait_bound(self, namespace: str, placeholder: str, seconds: float) -> bool: ...


class PlaceholderCacheView(PlaceholderView, BindingWatch, Protocol):
    """The placeholder cache: the node each placeholder is bound to, and a wait for it."""


class PodEndpoint(AdmissionEndpoint):
    chained_waits = True  # a wait for a claim or the caches, then for the binding

    def __init__(
        self,
        settings: SettingsStore,
        metrics: WebhookMetrics,
        namespaces: NamespaceLookup | None = None,
        claims: ClaimCacheView | None = None,
        volumes: VolumeView | None = None,
        placeholders: PlaceholderView | None = None,
        caches: CacheGate | None = None,
        bindings: BindingWatch | None = None,
        young: YoungRuns | None = None,
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
        self.bindings = bindings
        # Request uid -> when its wait for a binding began (monotonic), until the door's
        # second decision reads it: one entry per request waiting now.
        self._bind_waits: dict[str, float] = {}
        # (namespace, placeholder) -> when a wait for it ended unbound (monotonic): its
        # run's later pods do not wait again for a while.
        self._bind_timed_out: dict[tuple[str, str], float] = {}
        # The PipelineRuns the run endpoint admitted a moment ago (shared with it).
        self.young = young
        # Request uid -> when its wait for the caches or a claim began (monotonic), until
        # its next decision reads it: a later wait for the binding gets what is left.
        self._first_waits: dict[str, float] = {}

    def admit(self, review: Review, start: float, may_wait: bool) -> Answer:
        """With ``may_wait``, a pod denied only for claims the cache has not seen yet, or
        gated only because its placeholder, on its way, is not bound yet, comes back with a
        wait for them (and is not logged: the door decides again)."""
        record = self.metrics.admissions.record
        if not review.is_pod_create:
            # Only Pod CREATE is ours; anything else (a broad rule, a typo in the webhook
            # configuration) is allowed untouched.
            record(_NOT_OURS)
            return allowed(review.uid), None
        # The decision after a wait for the caches or a claim: no such wait again.
        earlier = self._first_waits.pop(review.uid, None) if self._first_waits else None
        if (
            not self.synced
            and (wait := self._unsynced(review, start, may_wait and earlier is None)) is not None
        ):
            return b"", wait  # the door waits, then decides once more
        pod = review.object
        settings = self.settings.current
        # The second decision of a request that waited for its placeholder's binding.
        waited = self._bind_waits.pop(review.uid, None) if self._bind_waits else None
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
        if waited is not None:
            waited = self._count_bind_wait(decision, waited)
        if decision.allowed:
            if (
                decision.unbound
                and may_wait
                and waited is None
                and (wait := self._bind_wait(review, decision, settings, earlier)) is not None
            ):
                return b"", wait  # the door waits, then decides once more
            payload = allowed(review.uid, decision.ops, decision.warnings)
            seconds = time.perf_counter() - start
            record(_ALLOWED[decision.mode], seconds, len(decision.ops))
            # Allowed without warnings: DEBUG, and nothing built unless DEBUG is on.
            if decision.warnings or log.isEnabledFor(logging.DEBUG):
                admission_log.decided(review, pod, decision, settings, start, waited)
            return payload, None
        payload = denied(review.uid, decision.message or "", decision.warnings)
        record((decision.mode_label, "false", "403"), time.perf_counter() - start)
        if may_wait and earlier is None and waited is None:
            claims, caches = self.claims, self.caches
            if claims is not None and decision.rule == "claim-unknown":
                # A claim the engine made a moment ago may not have reached the cache yet:
                # wait for the watch (no API call), then decide once more.
                wait = claims.wait_for(
                    review.namespace, decision.missing_claims, CLAIM_WAIT_SECONDS
                )
                return payload, self._first_wait(review.uid, wait)
            if caches is not None and decision.rule == CLAIM_CACHE_NOT_SYNCED:
                # A reload turned rewrite-claims on a moment ago: the marked pods' watch is
                # making its first list. Wait for the caches, then decide once more.
                return payload, self._first_wait(review.uid, caches.wait(CLAIM_WAIT_SECONDS))
        admission_log.decided(review, pod, decision, settings, start, waited)
        return payload, None

    def _bind_wait(
        self, review: Review, decision: Decision, settings: Settings, earlier: float | None
    ) -> Wait | None:
        """A wait for the placeholder's binding when it is worth one (on its way, no wait
        for it timed out lately, the bound not 0), shortened to what is left of the
        request's waiting after an ``earlier`` wait; None: gate now."""
        watch = self.bindings
        seconds = float(settings.placeholder_bind_wait_seconds)
        placeholder = decision.placeholder
        if watch is None or seconds <= 0 or placeholder is None:
            return None
        if earlier is not None:
            seconds = min(seconds, TOTAL_WAIT_SECONDS - (time.monotonic() - earlier))
            if seconds < _SHORTEST_BIND_WAIT:
                return None
        key = (review.namespace, placeholder)
        timed_out = self._bind_timed_out
        if timed_out and (ended := timed_out.get(key)) is not None:
            if time.monotonic() - ended < TIMED_OUT_MEMORY_SECONDS:
                return None
            del timed_out[key]
        now = time.time()
        progress = watch.progress(*key)
        young = self.young
        if young is not None and progress.statefulset_created is None and not progress.pods:
            # Nothing of the placeholder seen yet: the reconciler may be about to make it.
            meta = podview.metadata(review.object)
            run = seeded_run(
                decision.mode, podview.string_map(meta, "labels"), settings.rewrite_claims
            )
            if run is not None:
                # Admitted here, or by another replica (the run's stamp, on its pods).
                here = young.admitted(key[0], run, now) if len(young) else None
                stamped = run_admitted(podview.string_map(meta, "annotations"))
                admitted = max((t for t in (here, stamped) if t is not None), default=None)
                progress = replace(progress, run_admitted=admitted)
        if not on_its_way(progress, now):
            return None
        return self._wait_bound(watch, key, review.uid, seconds)

    async def _first_wait(self, uid: str, wait: Awaitable[object]) -> None:
        """A wait for the caches or a claim, remembered for the request's next decision."""
        self._first_waits[uid] = time.monotonic()
        try:
            await wait
        except BaseException:
            self._first_waits.pop(uid, None)  # cancelled (the client went away): no decision
            raise

    async def _wait_bound(
        self, watch: BindingWatch, key: tuple[str, str], uid: str, seconds: float
    ) -> None:
        self._bind_waits[uid] = time.monotonic()
        try:
            bound = await watch.wait_bound(key[0], key[1], seconds)
        except BaseException:
            self._bind_waits.pop(uid, None)  # cancelled (the client went away): no decision
            raise
        if not bound:
            timed_out = self._bind_timed_out
            now = time.monotonic()
            if len(timed_out) >= _MAX_TIMED_OUT:  # placeholders come from requests: bounded
                for old in [
                    k for k, at in timed_out.items() if now - at >= TIMED_OUT_MEMORY_SECONDS
                ]:
                    del timed_out[old]
                if len(timed_out) >= _MAX_TIMED_OUT:
                    timed_out.clear()
            timed_out[key] = now

    def _count_bind_wait(self, decision: Decision, began: float) -> float:
        """Count a decision made after a wait for the binding; return the seconds waited."""
        seconds = time.monotonic() - began
        # A first admission placed by node name and not unbound: pinned.
        pinned = decision.allowed and decision.by_node_name and not decision.unbound
        self.metrics.bind_waits.labels("pinned" if pinned else "gated").inc()
        self.metrics.bind_wait_seconds.observe(seconds)
        return seconds

    def _unsynced(self, review: Review, start: float, may_wait: bool) -> Wait | None:
        """Before every cache has been read once: None when they now are (decide), a wait
        for them with ``may_wait``; else the call fails (``CachesNotSynced``)."""
        caches = self.caches
        waiting = caches.waiting() if caches is not None else []
        if not waiting:
            self.synced = True
            return None
        if may_wait and caches is not None:
            return self._first_wait(review.uid, caches.wait(SYNC_WAIT_SECONDS))
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
# How long a placeholder that made a pod wait in vain makes its run's later pods not wait
# (past ``bind_wait.ON_ITS_WAY_SECONDS`` it no longer counts as on its way anyway, unless
# its pod is made again), and how many such placeholders are remembered.
TIMED_OUT_MEMORY_SECONDS = 60.0
_MAX_TIMED_OUT = 4096
_NOT_SYNCED = ("none", "false", "503")
_NOT_OURS = ("none", "true", "200")
# An allowed pod's metrics key by its mode (``Decision.mode_label``), made once, not per pod.
_ALLOWED: dict[Mode | None, tuple[str, str, str]] = {
    None: ("none", "true", "200"),
    **{mode: (str(mode), "true", "200") for mode in Mode},
}
_INTERNAL_ERROR = ("none", "false", "500")
