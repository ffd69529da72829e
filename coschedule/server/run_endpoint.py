"""``POST /mutate-runs``: admission of new PipelineRuns and Workflows for run concurrency
control, answered from the watch-fed ConcurrencyControl and namespace caches. Behind the
front door (``server.admission``). Until both caches have been read once
(``server.cache_gate``), a run waits for them, bounded, and is decided then; a run it still
cannot decide on is refused in a 200 review that says why and whether to retry. A run is
logged only when refused (at the door, as a bad request, not decidable yet, or an internal
error); an admitted run is counted, not logged. A PipelineRun admitted started is remembered
for a moment (``server.young_runs``), and stamped when its placeholder is seeded
(``bind_wait.admitted_op``): its first pod may come before its placeholder, at any replica."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Protocol

from coschedule.concurrency.admission import Outcome, admit_run, policy_held
from coschedule.concurrency.control import Control
from coschedule.config.store import SettingsStore
from coschedule.engines import Kind, run_kind_of
from coschedule.mutate.bind_wait import admitted_op, seedable_run, seeded_mode
from coschedule.server import admission_log
from coschedule.server.admission import (
    AdmissionEndpoint,
    Answer,
    NamespaceLookup,
    allowed,
    errored,
    unavailable,
)
from coschedule.server.cache_gate import SYNC_WAIT_SECONDS, CacheGate
from coschedule.server.webhook_metrics import WebhookMetrics
from coschedule.server.young_runs import YoungRuns
from coschedule.wire.review import BadReview, Review, decode_review

log = logging.getLogger("coschedule.admission.runs")

METRIC_MODE = "concurrency"


class ControlLookup(Protocol):
    @property
    def synced(self) -> bool: ...

    @property
    def absent(self) -> bool: ...

    def controls(self, namespace: str) -> list[Control]: ...


class RunEndpoint(AdmissionEndpoint):
    def __init__(
        self,
        metrics: WebhookMetrics,
        controls: ControlLookup | None = None,
        namespaces: NamespaceLookup | None = None,
        caches: CacheGate | None = None,
        young: YoungRuns | None = None,
        settings: SettingsStore | None = None,
    ) -> None:
        super().__init__(
            metrics, decode_review, mode=METRIC_MODE, path="/mutate-runs", object_field="run"
        )
        self.controls = controls
        self.namespaces = namespaces
        self.caches = caches
        self.synced = caches is None  # every cache read once: then never asked again
        # The PipelineRuns admitted a moment ago, for the pod endpoint's wait for a
        # placeholder the reconciler is about to make (``server.young_runs``).
        self.young = young
        # What decides whether a run's placeholder is seeded (its pods' mode): for the
        # run's stamp (``bind_wait.admitted_op``); None: no stamp.
        self.settings = settings

    def admit(self, review: Review, start: float, may_wait: bool) -> Answer:
        count = self.metrics.count_request
        kind = run_kind_of(review.group, review.kind)
        if review.operation != "CREATE" or kind is None:
            # Only run CREATE is ours; anything else passes untouched.
            count(METRIC_MODE, True, 200)
            return allowed(review.uid), None
        if not isinstance(review.object, Mapping):
            raise BadReview(f"request.object must be a {kind.value} object")
        if not self.synced and may_wait and (caches := self.caches) is not None:
            if caches.waiting():
                # Read them first (bounded), then decide once more: a run made in the
                # webhook's first second is decided as any other.
                return b"", caches.wait(SYNC_WAIT_SECONDS)
            self.synced = True
        info = self.namespaces.get(review.namespace) if self.namespaces is not None else None
        if info is not None and not info.enabled:
            count(METRIC_MODE, True, 200)
            return allowed(review.uid), None
        controls = self.controls
        if controls is not None and not controls.synced and not controls.absent:
            if policy_held(review.object):
                # Held pending by the admission policy already: the reconciler decides it
                # when this webhook cannot; nothing to refuse.
                count(METRIC_MODE, True, 200)
                return allowed(review.uid), None
            count(METRIC_MODE, False, 503)
            admission_log.refused(
                "/mutate-runs",
                503,
                "concurrency-cache-not-synced",
                "the ConcurrencyControls are not read yet",
                review=review,
                object_field="run",
                start=start,
            )
            return unavailable(
                review.uid,
                "coschedule: rule concurrency-cache-not-synced: the webhook has not read the "
                "ConcurrencyControls yet; retry in a few seconds",
            ), None
        try:
            found = controls.controls(review.namespace) if controls is not None else []
            decision = admit_run(kind, review.object, review.namespace, found)
        except Exception:
            log.exception(
                "internal error deciding a run",
                extra={"uid": review.uid, "namespace": review.namespace, "rule": "internal-error"},
            )
            count(METRIC_MODE, False, 500)
            return errored(
                review.uid,
                "coschedule: internal error while deciding this run; it was not created. "
                "Retry; if it persists, see the coschedule webhook logs.",
            ), None
        warnings = None
        if decision.outcome is Outcome.AUTHOR_PENDING:
            names = ", ".join(m.control.name for m in decision.matches)
            warnings = [
                f"coschedule: grouped by ConcurrencyControl {names}; created pending by its "
                "author, so coschedule will never start it"
            ]
        ops = decision.ops
        young = self.young
        if (
            young is not None
            and kind is Kind.PIPELINE_RUN
            and not review.dry_run  # never stored: no placeholder comes
            and decision.outcome in _STARTED
            and seedable_run(review.object, started=decision.outcome is Outcome.RELEASED)
        ):
            meta = review.object.get("metadata")
            if isinstance(meta, Mapping):
                now = time.time()
                young.record(
                    review.namespace,
                    str(meta.get("name") or ""),
                    str(meta.get("generateName") or ""),
                    now,
                )
                settings = self.settings
                # For the other replicas: Tekton copies the stamp onto the run's pods.
                if (
                    settings is not None
                    and info is not None
                    and seeded_mode(review.object, info.labels, settings.current)
                    and (stamp := admitted_op(review.object, ops, now)) is not None
                ):
                    ops = [*ops, stamp]
        self.metrics.admissions.record(
            (METRIC_MODE, "true", "200"), time.perf_counter() - start, len(ops)
        )
        return allowed(review.uid, ops, warnings), None


# The outcomes that leave a run started at its creation (the reconciler seeds its
# placeholder then); the others hold it, or leave that to Kueue.
_STARTED = (Outcome.UNTOUCHED, Outcome.RELEASED)
