"""``POST /mutate-runs``: admission of new PipelineRuns and Workflows for run concurrency
control, answered from the watch-fed ConcurrencyControl and namespace caches.

Same two error channels as ``/mutate``: a broken request is an HTTP 4xx with a JSON body; a
run we cannot decide on is refused in a 200 review that says why and whether to retry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Protocol

from coschedule.concurrency.admission import Outcome, admit_run
from coschedule.concurrency.control import Control
from coschedule.engines import run_kind_of
from coschedule.server.mutate_endpoint import (
    MAX_BODY_BYTES,
    NamespaceLookup,
    Receive,
    Scope,
    Send,
    _read_body,
    _respond,
)
from coschedule.server.webhook_metrics import WebhookMetrics
from coschedule.wire.review import BadReview, decode_review, encode_response, error_body

log = logging.getLogger("coschedule.admission.runs")

METRIC_MODE = "concurrency"


class ControlLookup(Protocol):
    @property
    def synced(self) -> bool: ...

    @property
    def absent(self) -> bool: ...

    def controls(self, namespace: str) -> list[Control]: ...


class RunAdmissionHandler:
    def __init__(
        self,
        metrics: WebhookMetrics,
        controls: ControlLookup | None = None,
        namespaces: NamespaceLookup | None = None,
    ) -> None:
        self.metrics = metrics
        self.controls = controls
        self.namespaces = namespaces

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await _respond(
                send, 405, error_body("use POST with an AdmissionReview v1"), [(b"allow", b"POST")]
            )
            return
        content_type = b""
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value
        if content_type.split(b";", 1)[0].strip().lower() != b"application/json":
            self.metrics.count_request(METRIC_MODE, False, 400)
            ct = content_type.decode("latin-1")
            await _respond(
                send, 400, error_body(f"Content-Type must be application/json, not {ct!r}")
            )
            return
        body = await _read_body(receive, await receive())
        if body is None:
            self.metrics.count_request(METRIC_MODE, False, 413)
            await _respond(send, 413, error_body(f"body larger than {MAX_BODY_BYTES} bytes"))
            return
        status, payload = self.handle(body)
        await _respond(send, status, payload)

    def handle(self, body: bytes) -> tuple[int, bytes]:
        """Decide one review body: (HTTP status, response body). Never raises."""
        start = time.perf_counter()
        try:
            review = decode_review(body)
        except BadReview as exc:
            self.metrics.count_request(METRIC_MODE, False, 400)
            return 400, error_body(str(exc))
        kind = run_kind_of(review.group, review.kind)
        if review.operation != "CREATE" or kind is None:
            # Only run CREATE is ours; anything else passes untouched.
            self.metrics.count_request(METRIC_MODE, True, 200)
            return 200, encode_response(review.uid, allowed=True)
        if not isinstance(review.object, Mapping):
            self.metrics.count_request(METRIC_MODE, False, 400)
            return 400, error_body(f"request.object must be a {kind.value} object")
        info = self.namespaces.get(review.namespace) if self.namespaces is not None else None
        if info is not None and not info.enabled:
            self.metrics.count_request(METRIC_MODE, True, 200)
            return 200, encode_response(review.uid, allowed=True)
        controls = self.controls
        if controls is not None and not controls.synced and not controls.absent:
            self.metrics.count_request(METRIC_MODE, False, 503)
            return 200, encode_response(
                review.uid,
                allowed=False,
                code=503,
                reason="ServiceUnavailable",
                message="coschedule: rule concurrency-cache-not-synced: the webhook has not "
                "read the ConcurrencyControls yet; retry in a few seconds",
            )
        try:
            found = controls.controls(review.namespace) if controls is not None else []
            decision = admit_run(kind, review.object, review.namespace, found)
        except Exception:
            log.exception("internal error deciding a run", extra={"uid": review.uid})
            self.metrics.count_request(METRIC_MODE, False, 500)
            return 200, encode_response(
                review.uid,
                allowed=False,
                code=500,
                reason="InternalError",
                message="coschedule: internal error while deciding this run; it was not "
                "created. Retry; if it persists, see the coschedule webhook logs.",
            )
        warnings = None
        if decision.outcome is Outcome.AUTHOR_PENDING:
            names = ", ".join(m.control.name for m in decision.matches)
            warnings = [
                f"coschedule: grouped by ConcurrencyControl {names}; created pending by its "
                "author, so coschedule will never start it"
            ]
        self.metrics.admissions.record(
            (METRIC_MODE, "true", "200"), time.perf_counter() - start, len(decision.ops)
        )
        return 200, encode_response(review.uid, allowed=True, patch=decision.ops, warnings=warnings)
