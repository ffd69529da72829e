"""``/mutate-runs``: real AdmissionReview v1 JSON in, review answers out; caches are the
webhook's own (no API call per admission)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import orjson
import pytest

from coschedule.concurrency.control import Control, parse_control
from coschedule.marks import NamespaceInfo
from coschedule.server.run_endpoint import RunEndpoint
from coschedule.server.webhook_metrics import WebhookMetrics
from tests.concurrency.runs import control, pipeline_run, workflow
from tests.conftest import RunningServer
from tests.fixtures import admission_review

Obj = dict[str, Any]


@dataclass
class Controls:
    by_namespace: dict[str, list[Control]] = field(default_factory=dict)
    synced: bool = True
    absent: bool = False

    def controls(self, namespace: str) -> list[Control]:
        return self.by_namespace.get(namespace, [])


@dataclass
class Namespaces:
    labels: dict[str, dict[str, str]]

    def get(self, name: str) -> NamespaceInfo | None:
        found = self.labels.get(name)
        return NamespaceInfo(found) if found is not None else None


CI = parse_control(control("ci", {"selector": {}, "strategy": "Cancel", "key": "$(params.branch)"}))


def handler(controls: Controls | None = None, namespaces: Namespaces | None = None) -> RunEndpoint:
    return RunEndpoint(WebhookMetrics(), controls or Controls({"ci": [CI]}), namespaces)


def answer(h: RunEndpoint, review: Obj) -> Obj:
    status, body = h.handle(orjson.dumps(review))
    assert status == 200
    doc: Obj = orjson.loads(body)
    assert doc["response"]["uid"] == review["request"]["uid"]
    response: Obj = doc["response"]
    return response


def patched(review: Obj, response: Obj) -> Obj:
    ops = orjson.loads(base64.b64decode(response["patch"]))
    result: Obj = jsonpatch.apply_patch(review["request"]["object"], ops)
    return result


@pytest.mark.parametrize(
    ("obj", "kind"),
    [
        (pipeline_run("pr", params={"branch": "main"}), "PipelineRun"),
        (workflow("wf", params={"branch": "main"}), "Workflow"),
    ],
)
def test_a_run_create_is_labelled_and_held(obj: Obj, kind: str) -> None:
    review = admission_review(obj, kind=kind)
    assert review["request"]["resource"]["resource"] in ("pipelineruns", "workflows")
    response = answer(handler(), review)
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    stored = patched(review, response)
    assert stored["metadata"]["labels"]["concurrency.coschedule.dev/ci"] == "main"
    assert stored["metadata"]["annotations"]["coschedule.dev/pending-by"] == "concurrency"


def test_dry_run_gets_the_same_answer() -> None:
    obj = pipeline_run("pr", params={"branch": "main"})
    real = answer(handler(), admission_review(obj, kind="PipelineRun", uid="u"))
    dry = answer(handler(), admission_review(obj, kind="PipelineRun", uid="u", dry_run=True))
    assert real == dry


def test_a_namespace_without_the_enable_label_is_untouched() -> None:
    namespaces = Namespaces({"ci": {"coschedule.dev/enabled": "false"}})
    response = answer(
        handler(namespaces=namespaces),
        admission_review(pipeline_run("pr", params={"branch": "main"}), kind="PipelineRun"),
    )
    assert response == {"uid": response["uid"], "allowed": True}


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE"])
def test_other_operations_pass_untouched(operation: str) -> None:
    review = admission_review(pipeline_run("pr"), kind="PipelineRun", operation=operation)
    assert "patch" not in answer(handler(), review)


def test_other_kinds_pass_untouched() -> None:
    review = admission_review(pipeline_run("pr"), kind="TaskRun")
    assert "patch" not in answer(handler(), review)


def test_an_unsynced_cache_refuses_with_a_retryable_message() -> None:
    response = answer(
        handler(Controls({"ci": [CI]}, synced=False)),
        admission_review(pipeline_run("pr"), kind="PipelineRun"),
    )
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert "concurrency-cache-not-synced" in response["status"]["message"]


def test_a_missing_crd_leaves_runs_untouched() -> None:
    response = answer(
        handler(Controls({}, synced=False, absent=True)),
        admission_review(pipeline_run("pr"), kind="PipelineRun"),
    )
    assert response["allowed"] is True
    assert "patch" not in response


def test_author_pending_gets_a_warning() -> None:
    response = answer(
        handler(),
        admission_review(pipeline_run("pr", status="PipelineRunPending"), kind="PipelineRun"),
    )
    assert response["allowed"] is True
    assert "never start it" in response["warnings"][0]


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b"{",
        orjson.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}),
    ],
)
def test_malformed_bodies_are_400_with_json(body: bytes) -> None:
    status, payload = handler().handle(body)
    assert status == 400
    assert "error" in orjson.loads(payload)


def test_a_run_that_is_not_an_object_is_400() -> None:
    review = admission_review(pipeline_run("pr"), kind="PipelineRun")
    review["request"]["object"] = "nope"
    status, payload = handler().handle(orjson.dumps(review))
    assert status == 400
    assert "PipelineRun" in orjson.loads(payload)["error"]


def test_over_https_without_a_cluster_runs_pass_untouched(server: RunningServer) -> None:
    review = admission_review(pipeline_run("pr", params={"branch": "main"}), kind="PipelineRun")
    with server.client() as client:
        ok = client.post(
            "/mutate-runs",
            content=orjson.dumps(review),
            headers={"Content-Type": "application/json"},
        )
        wrong_type = client.post(
            "/mutate-runs", content=b"{}", headers={"Content-Type": "text/plain"}
        )
        get = client.get("/mutate-runs")
    assert ok.status_code == 200
    assert ok.json()["response"] == {"uid": review["request"]["uid"], "allowed": True}
    assert wrong_type.status_code == 400
    assert get.status_code == 405
