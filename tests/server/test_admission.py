"""The one front door: both endpoints refuse a broken request the same way (405, 400, 413
with the JSON error shape), each counting it under its own mode, and the named answers say
what they are named for."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from coschedule.config.store import SettingsStore
from coschedule.server.admission import (
    MAX_BODY_BYTES,
    AdmissionEndpoint,
    Message,
    allowed,
    denied,
    errored,
    unavailable,
)
from coschedule.server.pod_endpoint import PodEndpoint
from coschedule.server.run_endpoint import RunEndpoint
from coschedule.server.webhook_metrics import WebhookMetrics
from tests.concurrency.runs import pipeline_run
from tests.fixtures import admission_review, load_pod

POD_REVIEW = orjson.dumps(admission_review(load_pod("tekton-taskrun"), uid="pod-uid"))
RUN_REVIEW = orjson.dumps(admission_review(pipeline_run("r1"), kind="PipelineRun", uid="run-uid"))


def pod_endpoint() -> PodEndpoint:
    return PodEndpoint(SettingsStore(None, {}), WebhookMetrics())


def run_endpoint() -> RunEndpoint:
    return RunEndpoint(WebhookMetrics())


ENDPOINTS = [(pod_endpoint, POD_REVIEW, "none"), (run_endpoint, RUN_REVIEW, "concurrency")]


def call(
    endpoint: AdmissionEndpoint,
    body: bytes,
    *,
    method: str = "POST",
    headers: list[tuple[bytes, bytes]] | None = None,
    chunks: int = 1,
) -> tuple[int, dict[bytes, bytes], bytes]:
    """(status, headers, body) of one request, the body sent in ``chunks`` messages."""
    if headers is None:
        headers = [(b"content-type", b"application/json")]
    size = -(-len(body) // chunks) if body else 1
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    messages: list[Message] = [
        {"type": "http.request", "body": part, "more_body": n < len(parts) - 1}
        for n, part in enumerate(parts)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope: dict[str, Any] = {"type": "http", "method": method, "path": "/", "headers": headers}
    asyncio.run(endpoint(scope, receive, send))
    start, answer = sent
    return start["status"], dict(start["headers"]), answer["body"]


def requests(metrics: WebhookMetrics, mode: str, code: str) -> float:
    value = metrics.registry.get_sample_value(
        "coschedule_admission_requests_total", {"mode": mode, "allowed": "false", "code": code}
    )
    return value or 0.0


@pytest.mark.parametrize(("make", "review", "mode"), ENDPOINTS)
def test_a_review_is_answered_in_a_200_that_echoes_its_uid(
    make: Any, review: bytes, mode: str
) -> None:
    status, headers, body = call(make(), review, chunks=3)
    assert status == 200
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == b"%d" % len(body)
    response = orjson.loads(body)["response"]
    assert response["uid"] == orjson.loads(review)["request"]["uid"]
    assert response["allowed"] is True


@pytest.mark.parametrize(("make", "review", "mode"), ENDPOINTS)
def test_both_endpoints_refuse_a_broken_request_at_the_door(
    make: Any, review: bytes, mode: str
) -> None:
    endpoint = make()
    status, headers, body = call(endpoint, review, method="GET")
    assert (status, headers[b"allow"]) == (405, b"POST")
    assert "use POST" in orjson.loads(body)["error"]

    status, _, body = call(endpoint, review, headers=[(b"content-type", b"text/plain")])
    assert status == 400
    assert "Content-Type must be application/json" in orjson.loads(body)["error"]
    status, _, _ = call(
        endpoint, review, headers=[(b"content-type", b"Application/JSON; charset=utf-8")]
    )
    assert status == 200

    declared = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % (MAX_BODY_BYTES + 1)),
    ]
    status, _, body = call(endpoint, review, headers=declared)
    assert status == 413
    assert "7 MiB" in orjson.loads(body)["error"]
    status, _, _ = call(endpoint, b" " * (MAX_BODY_BYTES + 1), chunks=8)  # no length given
    assert status == 413

    status, _, body = call(endpoint, b"{not json")
    assert status == 400
    assert orjson.loads(body)["error"]
    assert requests(endpoint.metrics, mode, "400") == 2  # the Content-Type and the body
    assert requests(endpoint.metrics, mode, "413") == 2
    assert requests(endpoint.metrics, mode, "405") == 1  # counted as it is logged


@pytest.mark.parametrize(("make", "review", "mode"), ENDPOINTS)
def test_a_malformed_object_is_a_bad_request_from_either_door(
    make: Any, review: bytes, mode: str
) -> None:
    doc = orjson.loads(review)
    doc["request"]["object"] = ["not", "an", "object"]
    endpoint = make()
    status, body = endpoint.handle(orjson.dumps(doc))
    assert status == 400
    assert "error" in orjson.loads(body)
    assert requests(endpoint.metrics, mode, "400") == 1


def test_the_named_answers() -> None:
    assert orjson.loads(allowed("u"))["response"] == {"uid": "u", "allowed": True}
    patched = orjson.loads(allowed("u", [{"op": "add", "path": "/a", "value": 1}], ["w"]))
    assert patched["response"]["patchType"] == "JSONPatch"
    assert patched["response"]["warnings"] == ["w"]
    for answer, code, reason in (
        (denied("u", "rule x: do y", ["w"]), 403, "Forbidden"),
        (errored("u", "internal"), 500, "InternalError"),
        (unavailable("u", "not synced"), 503, "ServiceUnavailable"),
    ):
        response = orjson.loads(answer)["response"]
        assert response["uid"] == "u"
        assert response["allowed"] is False
        assert response["status"]["code"] == code
        assert response["status"]["reason"] == reason
        assert response["status"]["message"]


@pytest.mark.parametrize(
    ("mode", "fixture", "label"),
    [
        ("pipelineruns", "tekton-taskrun", "pipelineruns"),
        ("workspaces", "tekton-taskrun", "workspaces"),
        ("disabled", "tekton-taskrun", "disabled"),
        ("pipelineruns", "placeholder-pod", "none"),  # left alone before a mode is chosen
    ],
)
def test_an_allowed_pod_is_counted_under_its_mode(mode: str, fixture: str, label: str) -> None:
    metrics = WebhookMetrics()
    endpoint = PodEndpoint(SettingsStore(None, {"COSCHEDULE_COSCHEDULE": mode}), metrics)
    review = orjson.dumps(admission_review(load_pod(fixture), uid="pod-uid"))
    status, _, body = call(endpoint, review)
    assert status == 200
    assert orjson.loads(body)["response"]["allowed"] is True
    labels = {"mode": label, "allowed": "true", "code": "200"}
    assert metrics.registry.get_sample_value("coschedule_admission_requests_total", labels) == 1
