"""``POST /mutate`` as a bare ASGI handler: the hot path, with nothing between the socket
and the decision but body reading and the lean decoder (``wire.lean``).

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
from coschedule.server import admission_log
from coschedule.server.webhook_metrics import WebhookMetrics
from coschedule.wire import lean
from coschedule.wire.pod_fields import MalformedPod
from coschedule.wire.review import BadReview, encode_allowed, encode_response, error_body

log = admission_log.log

MAX_BODY_BYTES = 7 * 1024 * 1024  # kube-apiserver's own request limit is 3 MiB; leave room

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_CONTENT_TYPE = (b"content-type", b"application/json")
_JSON_HEADERS = [_CONTENT_TYPE]


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
        # namespace -> the context of its last admission (one entry per namespace seen).
        self._contexts: dict[str, AdmissionContext] = {}

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
        if (
            content_type != b"application/json"  # what kube-apiserver sends
            and content_type.split(b";", 1)[0].strip().lower() != b"application/json"
        ):
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
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            body: bytes | None = message.get("body", b"")  # all in one message: the usual case
            if body is not None and len(body) > MAX_BODY_BYTES:
                body = None
        else:
            body = await _read_body(receive, message)
        if body is None:
            self.metrics.count_request("none", False, 413)
            await _respond(send, 413, _too_large())
            return
        status, payload, wait = self.decide_body(body, may_wait=self.claims is not None)
        if wait is not None and self.claims is not None:
            # A claim the engine made a moment ago may not have reached the cache yet: wait
            # for the watch (no API call), then decide once more.
            namespace, missing = wait
            await self.claims.wait_for(namespace, missing, CLAIM_WAIT_SECONDS)
            status, payload, _ = self.decide_body(body)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [_CONTENT_TYPE, (b"content-length", b"%d" % len(payload))],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    def handle(self, body: bytes) -> tuple[int, bytes]:
        """Decide one review body: (HTTP status, response body). Never raises."""
        status, payload, _ = self.decide_body(body)
        return status, payload

    def decide_body(self, body: bytes, may_wait: bool = False) -> tuple[int, bytes, Wait | None]:
        """As ``handle``; with ``may_wait``, a pod denied only for claims the cache has not
        seen yet comes back with them (and is not logged: the caller decides again)."""
        start = time.perf_counter()
        record = self.metrics.admissions.record
        try:
            review = lean.decode(body)
        except BadReview as exc:
            record(_BAD_REQUEST)
            if log.isEnabledFor(logging.INFO):
                admission_log.bad_request(str(exc), None, start)
            return 400, error_body(str(exc)), None
        if not review.is_pod_create:
            # Only Pod CREATE is ours; anything else (a broad rule, a typo in the webhook
            # configuration) is allowed untouched.
            record(_NOT_OURS)
            return 200, encode_response(review.uid, allowed=True), None
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
                    settings, namespace, namespace_info, self.claims, self.volumes, explain=False
                )
                if len(self._contexts) >= _MAX_CONTEXTS:
                    self._contexts.clear()  # namespaces come from requests: stay bounded
                self._contexts[namespace] = ctx
            decision = decide(pod, ctx)
        except MalformedPod as exc:
            record(_BAD_REQUEST)
            if log.isEnabledFor(logging.INFO):
                admission_log.bad_request(str(exc), review, start)
            return 400, error_body(str(exc)), None
        except Exception:
            # A bug must not become an HTTP 500 (kube-apiserver would retry it blindly) nor
            # let a pod through half-decided; refuse this one pod with the uid echoed.
            log.exception(
                "internal error deciding a pod",
                extra={"uid": review.uid, "namespace": review.namespace, "rule": "internal-error"},
            )
            record(_INTERNAL_ERROR)
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
        wait = None
        if decision.allowed:
            payload = encode_allowed(review.uid, decision.ops, decision.warnings)
            seconds = time.perf_counter() - start
            record((decision.mode_label, "true", "200"), seconds, len(decision.ops))
            # Allowed without warnings: DEBUG, and nothing built unless DEBUG is on.
            if decision.warnings or log.isEnabledFor(logging.DEBUG):
                admission_log.decided(review, pod, decision, settings, start)
        else:
            payload = encode_response(
                review.uid,
                allowed=False,
                code=403,
                reason="Forbidden",
                message=decision.message,
                warnings=decision.warnings,
            )
            record((decision.mode_label, "false", "403"), time.perf_counter() - start)
            if may_wait and decision.rule == "claim-unknown":
                wait = (review.namespace, decision.missing_claims)
            else:
                admission_log.decided(review, pod, decision, settings, start)
        return 200, payload, wait


_MAX_CONTEXTS = 4096
_BAD_REQUEST = ("none", "false", "400")
_NOT_OURS = ("none", "true", "200")
_INTERNAL_ERROR = ("none", "false", "500")


def _too_large() -> bytes:
    return error_body(f"body larger than {MAX_BODY_BYTES} bytes (7 MiB)")


async def _read_body(receive: Receive, message: Message) -> bytes | None:
    """The whole body from its first message on, or None once it passes the limit (a
    chunked body has no length)."""
    chunks: list[bytes] = []
    size = 0
    while True:
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
        message = await receive()


async def _respond(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
