"""The one front door of both admission endpoints (``/mutate``: pods, ``/mutate-runs``:
runs), and the answers they give, named as controller-runtime's ``admission`` package names
them (``Allowed``, ``Denied``, ``Errored``).

Two error channels. A broken request is an HTTP 4xx with a JSON body, answered here: a method
other than POST (405), a Content-Type other than application/json (400), a body over 7 MiB
(413), a body that is not a usable review or holds a malformed object (400). A request an
endpoint decides on gets an HTTP 200 review, allowed or not, that echoes the request uid.
A request an endpoint cannot decide yet (its caches not read after a bounded wait:
``CachesNotSynced``) is an HTTP 503 with a JSON body, so that the API server applies the
webhook's failurePolicy, as when the webhook does not answer.

The door is the ASGI callable itself and calls its endpoint's ``admit`` straight from it:
the pod endpoint's hot path pays for no frame more than a handler of its own would.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from coschedule.marks import NamespaceInfo
from coschedule.server import admission_log
from coschedule.server.cache_gate import CachesNotSynced
from coschedule.server.webhook_metrics import WebhookMetrics
from coschedule.wire.pod_fields import MalformedPod
from coschedule.wire.review import (
    BadReview,
    Review,
    encode_allowed,
    encode_response,
    error_body,
    unavailable_body,
)

MAX_BODY_BYTES = 7 * 1024 * 1024  # kube-apiserver's own request limit is 3 MiB; leave room

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# What an endpoint may ask the door to await before it answers once more (the pod endpoint:
# a claim its cache has not seen yet), and an endpoint's answer: a review body and that wait.
Wait = Awaitable[object]
Answer = tuple[bytes, Wait | None]

# What a request may hold that makes it a bad request (HTTP 400), not a decision.
BAD_REQUEST = (BadReview, MalformedPod)

_CONTENT_TYPE = (b"content-type", b"application/json")
_ALLOW_POST = [(b"allow", b"POST")]
_USE_POST = error_body("use POST with an AdmissionReview v1")


class NamespaceLookup(Protocol):
    """The namespace cache, as both endpoints read it."""

    def get(self, name: str) -> NamespaceInfo | None: ...


# The named answers: the body of an HTTP 200 review, the request uid echoed.

allowed = encode_allowed
"""``allowed(uid, patch=None, warnings=None)``: let the object in, patched when there are
operations. The wire's own encoder, so the hot path calls it with no frame between."""


def denied(uid: str, message: str, warnings: list[str] | None = None) -> bytes:
    """Refused by a rule (403 Forbidden); the message names the rule and the fix."""
    return encode_response(
        uid, allowed=False, code=403, reason="Forbidden", message=message, warnings=warnings
    )


def errored(uid: str, message: str) -> bytes:
    """Refused because deciding failed (500 InternalError): not an HTTP 500, which
    kube-apiserver would retry blindly, and nothing let through half-decided."""
    return encode_response(uid, allowed=False, code=500, reason="InternalError", message=message)


def unavailable(uid: str, message: str) -> bytes:
    """Refused for now (503 ServiceUnavailable): what the decision needs is not ready yet."""
    return encode_response(
        uid, allowed=False, code=503, reason="ServiceUnavailable", message=message
    )


class AdmissionEndpoint(ABC):
    """The front door: request guard, body, review decoding, bad requests; ``admit`` decides.

    ``mode`` labels the requests refused here in ``coschedule_admission_requests_total``;
    every request refused here is logged (``admission_log.refused``) with the endpoint's
    ``path`` and its object's name as ``object_field``."""

    # Whether the decision after a wait may ask for one more (the endpoint keeps the
    # request's waits together well inside the webhook's timeoutSeconds); else one at most.
    chained_waits = False

    def __init__(
        self,
        metrics: WebhookMetrics,
        decode: Callable[[bytes], Review],
        *,
        mode: str,
        path: str,
        object_field: str,
    ) -> None:
        self.metrics = metrics
        self.decode = decode
        self.mode = mode
        self.path = path
        self.object_field = object_field
        self._bad_request_key = (mode, "false", "400")

    @abstractmethod
    def admit(self, review: Review, start: float, may_wait: bool) -> Answer:
        """Decide one decoded review (``start``: when its body was read). Raise one of
        ``BAD_REQUEST`` for a malformed object, ``CachesNotSynced`` (counted and logged) for
        a request that cannot be decided yet; with ``may_wait``, an answer may come with a
        wait, after which the door decides the body once more (with ``may_wait`` again
        only where ``chained_waits``: at most two waits)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            self.metrics.count_request(self.mode, False, 405)
            self._log_door(scope, 405, "method-not-allowed", f"method {scope['method']}")
            await _respond(send, 405, _USE_POST, _ALLOW_POST)
            return
        # The headers as a dict, built in C (a repeated header: the last one counts).
        headers = dict(scope["headers"])
        content_type = headers.get(b"content-type", b"")
        if (
            content_type != b"application/json"  # what kube-apiserver sends
            and content_type.split(b";", 1)[0].strip().lower() != b"application/json"
        ):
            self.metrics.count_request(self.mode, False, 400)
            error = f"Content-Type must be application/json, not {content_type.decode('latin-1')!r}"
            self._log_door(scope, 400, "wrong-content-type", error)
            await _respond(send, 400, error_body(error))
            return
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            self.metrics.count_request(self.mode, False, 413)
            self._log_door(scope, 413, "body-too-large", f"declared {int(length)} bytes")
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
            self.metrics.count_request(self.mode, False, 413)
            self._log_door(scope, 413, "body-too-large", f"more than {MAX_BODY_BYTES} bytes sent")
            await _respond(send, 413, _too_large())
            return
        # What ``handle`` does, written out: a call to it would be one frame more per admission.
        start = time.perf_counter()
        review = None
        try:
            review = self.decode(body)
            payload, wait = self.admit(review, start, True)
        except BAD_REQUEST as exc:
            status, payload = 400, self._bad_request(exc, review, start)
        except CachesNotSynced as exc:
            status, payload = 503, unavailable_body(str(exc))
        else:
            status = 200
            if wait is not None:
                await wait
                # Decided once more; an endpoint that chains waits may ask one more (it
                # bounds the request's waiting as a whole), then the last decision waits not.
                status, payload, wait = self._decide(body, self.chained_waits)
                if wait is not None:
                    await wait
                    status, payload, _ = self._decide(body, False)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [_CONTENT_TYPE, (b"content-length", b"%d" % len(payload))],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    def handle(self, body: bytes) -> tuple[int, bytes]:
        """Decide one review body: (HTTP status, response body), never waiting. Never
        raises."""
        status, payload, _ = self._decide(body, False)
        return status, payload

    def _decide(self, body: bytes, may_wait: bool) -> tuple[int, bytes, Wait | None]:
        """Decide one review body after a wait: (HTTP status, response body, a further
        wait only with ``may_wait``). Never raises."""
        start = time.perf_counter()
        review = None
        try:
            review = self.decode(body)
            payload, wait = self.admit(review, start, may_wait)
        except BAD_REQUEST as exc:
            return 400, self._bad_request(exc, review, start), None
        except CachesNotSynced as exc:
            return 503, unavailable_body(str(exc)), None
        return 200, payload, wait if may_wait else None

    def _bad_request(self, exc: Exception, review: Review | None, start: float) -> bytes:
        self.metrics.admissions.record(self._bad_request_key)
        if admission_log.log.isEnabledFor(logging.INFO):
            admission_log.refused(
                self.path,
                400,
                "bad-request",
                str(exc),
                review=review,
                object_field=self.object_field,
                start=start,
            )
        return error_body(str(exc))

    def _log_door(self, scope: Scope, status: int, rule: str, error: str) -> None:
        """A request refused before its body was read: no review, so the peer is named."""
        if admission_log.log.isEnabledFor(logging.INFO):
            admission_log.refused(self.path, status, rule, error, client=scope.get("client"))


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
    headers = [_CONTENT_TYPE, (b"content-length", b"%d" % len(body))]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
