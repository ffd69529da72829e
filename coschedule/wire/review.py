"""AdmissionReview v1 on the wire: strict decoding of requests, encoding of responses.

Decoding checks exactly what the admission path relies on, and reports the first problem
as a sentence with a JSON path, for an HTTP 400. Nothing here builds model objects.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any

import orjson

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class BadReview(ValueError):
    """The request is not a usable AdmissionReview v1: answer HTTP 400 with this message."""


@dataclass(slots=True)  # not frozen: a frozen dataclass costs ~1 µs more per admission
class Review:
    uid: str
    group: str
    version: str
    kind: str
    operation: str
    namespace: str
    dry_run: bool
    object: Any  # the submitted object; only read when it is a Pod CREATE
    # CREATE of a core v1 Pod (``pod_create`` of the fields above): a field, not a
    # property, as the hot path reads it first on every request.
    is_pod_create: bool


def pod_create(group: str, version: str, kind: str, operation: str) -> bool:
    return operation == "CREATE" and kind == "Pod" and group == "" and version == "v1"


def _str_field(obj: dict[str, Any], key: str, where: str, *, required: bool) -> str:
    value = obj.get(key)
    if value is None:
        if required:
            raise BadReview(f"{where}.{key} is missing")
        return ""
    if not isinstance(value, str):
        raise BadReview(f"{where}.{key} must be a string, not {type(value).__name__}")
    return value


def decode_review(body: bytes) -> Review:
    if not body:
        raise BadReview("empty body: expected an AdmissionReview v1 JSON object")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReview(f"body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadReview(f"body must be a JSON object, not {type(doc).__name__}")
    api_version = doc.get("apiVersion")
    if api_version != API_VERSION:
        raise BadReview(
            f"apiVersion must be {API_VERSION!r}, not {api_version!r} "
            "(set admissionReviewVersions: [v1] in the MutatingWebhookConfiguration)"
        )
    if doc.get("kind") != KIND:
        raise BadReview(f"kind must be {KIND!r}, not {doc.get('kind')!r}")
    request = doc.get("request")
    if not isinstance(request, dict):
        raise BadReview("request is missing or not an object")
    uid = _str_field(request, "uid", "request", required=True)
    if not uid:
        raise BadReview("request.uid is empty")
    kind_obj = request.get("kind")
    if not isinstance(kind_obj, dict):
        raise BadReview("request.kind is missing or not an object")
    group = _str_field(kind_obj, "group", "request.kind", required=False)
    version = _str_field(kind_obj, "version", "request.kind", required=True)
    kind = _str_field(kind_obj, "kind", "request.kind", required=True)
    operation = _str_field(request, "operation", "request", required=True)
    namespace = _str_field(request, "namespace", "request", required=False)
    dry_run = request.get("dryRun", False)
    if dry_run is None:
        dry_run = False
    if not isinstance(dry_run, bool):
        raise BadReview("request.dryRun must be a boolean")
    obj = request.get("object")
    is_pod = pod_create(group, version, kind, operation)
    review = Review(uid, group, version, kind, operation, namespace, dry_run, obj, is_pod)
    if is_pod and not isinstance(obj, dict):
        raise BadReview("request.object must be a Pod object for a Pod CREATE")
    return review


def encode_response(
    uid: str,
    *,
    allowed: bool,
    patch: list[dict[str, Any]] | None = None,
    message: str | None = None,
    reason: str | None = None,
    code: int | None = None,
    warnings: list[str] | None = None,
) -> bytes:
    response: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = binascii.b2a_base64(orjson.dumps(patch), newline=False).decode()
    if not allowed or message:
        status: dict[str, Any] = {"message": message or ""}
        if code is not None:
            status["code"] = code
        if reason is not None:
            status["reason"] = reason
        response["status"] = status
    if warnings:
        response["warnings"] = warnings
    return orjson.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": response})


# What encode_response writes before the uid, and after it for an allowed pod with a patch:
# the hot path's answer is joined from bytes (the same bytes, a test checks).
_PREFIX = b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":'
_PATCHED = b',"allowed":true,"patchType":"JSONPatch","patch":"'


def encode_allowed(
    uid: str, patch: list[dict[str, Any]] | None = None, warnings: list[str] | None = None
) -> bytes:
    """``encode_response(uid, allowed=True, patch=patch, warnings=warnings)``, cheaper."""
    if not patch or warnings:
        return encode_response(uid, allowed=True, patch=patch, warnings=warnings)
    return b"".join(
        (
            _PREFIX,
            orjson.dumps(uid),
            _PATCHED,
            binascii.b2a_base64(orjson.dumps(patch), newline=False),
            b'"}}',
        )
    )


def error_body(message: str) -> bytes:
    """The JSON body of an HTTP 4xx: what was wrong, machine-readable."""
    return orjson.dumps({"error": message})


def unavailable_body(message: str) -> bytes:
    """The JSON body of an HTTP 503: ``error`` as every error body, and a ``Status`` too, so
    that the API server, which reads a failed webhook call's body as a Status, puts the
    message in its own error (failurePolicy Fail) instead of a generic one."""
    return orjson.dumps(
        {
            "error": message,
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "message": message,
            "reason": "ServiceUnavailable",
            "code": 503,
        }
    )
