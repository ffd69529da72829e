"""``POST /mutate`` as a bare ASGI handler: the hot path, with nothing between the socket
and the decision but body reading and orjson.

Two error channels: a broken request is an HTTP 4xx with a JSON body; a refused pod is an
HTTP 200 review with ``allowed: false``. Every review answer echoes the request uid.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Protocol

from coschedule.config.store import SettingsStore
from coschedule.mutate.claim_rewrite import ClaimView
from coschedule.mutate.decision import AdmissionContext, NamespaceInfo, VolumeView, decide
from coschedule.server.webhook_metrics import WebhookMetrics
from coschedule.wire.pod_fields import MalformedPod
from coschedule.wire.review import BadReview, decode_review, encode_response, error_body

log = logging.getLogger("coschedule.admission")

MAX_BODY_BYTES = 7 * 1024 * 1024  # kube-apiserver's own request limit is 3 MiB; leave room

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON_HEADERS = [(b"content-type", b"application/json")]


CLAIM_WAIT_SECONDS = 2.0  # well inside the webhook's 5 s timeout
Wait = tuple[str, tuple[str, ...]]  # (namespace, claims) worth waiting for


class NamespaceLookup(Protocol):
    def get(self, name: str) -> NamespaceInfo | None: ...


class ClaimCacheView(ClaimView, Protocol):
    async def wait_for(self, namespace: str, names: Sequence[str], seconds: float) -> bool: ...


class AdmissionHandler:
    def __init__(
        self,
        settings: SettingsStore,
        metrics: WebhookMetrics,
        namespaces: NamespaceLookup | None = None,
        claims: ClaimCacheView | None = None,
        volumes: VolumeView | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.namespaces = namespaces
        self.claims = claims
        self.volumes = volumes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await _respond(
                send,
                405,
                error_body("use POST with an AdmissionReview v1"),
                extra=[(b"allow", b"POST")],
            )
            return
        content_type = b""
        declared = -1
        for name, value in scope["headers"]:
            if name == b"content-type":
                content_type = value
            elif name == b"content-length" and value.isdigit():
                declared = int(value)
        if content_type.split(b";", 1)[0].strip().lower() != b"application/json":
            self.metrics.count_request("none", False, 400)
            await _respond(
                send,
                400,
                error_body(
                    f"Content-Type must be application/json, not {content_type.decode('latin-1')!r}"
                ),
            )
            return
        if declared > MAX_BODY_BYTES:
            self.metrics.count_request("none", False, 413)
            await _respond(send, 413, _too_large())
            return
        body = await _read_body(receive)
        if body is None:
            self.metrics.count_request("none", False, 413)
            await _respond(send, 413, _too_large())
            return
        status, payload, wait = self.decide_body(body)
        if wait is not None and self.claims is not None:
            # A claim the engine made a moment ago may not have reached the cache yet: wait
            # for the watch (no API call), then decide once more.
            namespace, missing = wait
            await self.claims.wait_for(namespace, missing, CLAIM_WAIT_SECONDS)
            status, payload, _ = self.decide_body(body)
        await _respond(send, status, payload)

    def handle(self, body: bytes) -> tuple[int, bytes]:
        """Decide one review body: (HTTP status, response body). Never raises."""
        status, payload, _ = self.decide_body(body)
        return status, payload

    def decide_body(self, body: bytes) -> tuple[int, bytes, Wait | None]:
        """As ``handle``, plus the claims worth waiting for before deciding again."""
        start = time.perf_counter()
        try:
            review = decode_review(body)
        except BadReview as exc:
            self.metrics.count_request("none", False, 400)
            return 400, error_body(str(exc)), None
        if not review.is_pod_create:
            # Only Pod CREATE is ours; anything else (a broad rule, a typo in the webhook
            # configuration) is allowed untouched.
            self.metrics.count_request("none", True, 200)
            return 200, encode_response(review.uid, allowed=True), None
        try:
            namespace_info = (
                self.namespaces.get(review.namespace) if self.namespaces is not None else None
            )
            ctx = AdmissionContext(
                self.settings.current, review.namespace, namespace_info, self.claims, self.volumes
            )
            decision = decide(review.object, ctx)
        except MalformedPod as exc:
            self.metrics.count_request("none", False, 400)
            return 400, error_body(str(exc)), None
        except Exception:
            # A bug must not become an HTTP 500 (kube-apiserver would retry it blindly) nor
            # let a pod through half-decided; refuse this one pod with the uid echoed.
            log.exception("internal error deciding a pod", extra={"uid": review.uid})
            self.metrics.count_request("none", False, 500)
            return (
                200,
                encode_response(
                    review.uid,
                    allowed=False,
                    code=500,
                    reason="InternalError",
                    message="coschedule: internal error while deciding this pod; it was not "
                    "changed. Retry; if it persists, see the coschedule webhook logs.",
                ),
                None,
            )
        if decision.allowed:
            payload = encode_response(
                review.uid, allowed=True, patch=decision.ops, warnings=decision.warnings
            )
            self.metrics.admission_patch_ops.observe(len(decision.ops))
            self.metrics.count_request(decision.mode_label, True, 200)
        else:
            payload = encode_response(
                review.uid,
                allowed=False,
                code=403,
                reason="Forbidden",
                message=decision.message,
                warnings=decision.warnings,
            )
            self.metrics.count_request(decision.mode_label, False, 403)
        self.metrics.admission_duration.observe(time.perf_counter() - start)
        wait = None
        if decision.rule == "claim-unknown":
            wait = (review.namespace, decision.missing_claims)
        return 200, payload, wait


def _too_large() -> bytes:
    return error_body(f"body larger than {MAX_BODY_BYTES} bytes (7 MiB)")


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body, or None once it passes the limit (a chunked body has no length)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return None
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _respond(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
