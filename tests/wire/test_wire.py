"""Wire layer: RFC 6901 escaping, review decoding and response encoding."""

from __future__ import annotations

import base64
from typing import Any

import jsonpatch as reference_jsonpatch
import orjson
import pytest

from coschedule.wire import jsonpatch
from coschedule.wire.review import BadReview, decode_review, encode_response


@pytest.mark.parametrize(
    ("token", "escaped"),
    [
        ("plain", "plain"),
        ("coschedule.dev/placeholder", "coschedule.dev~1placeholder"),
        ("a~b", "a~0b"),
        ("~/", "~0~1"),
        ("/~", "~1~0"),
        ("~1", "~01"),
    ],
)
def test_escape(token: str, escaped: str) -> None:
    assert jsonpatch.escape(token) == escaped
    assert jsonpatch.unescape(escaped) == token


def test_pointer_and_apply_agree_with_reference_implementation() -> None:
    doc: dict[str, Any] = {"metadata": {"labels": {"a~/b": "x"}}, "spec": {"list": [1, 2, 3]}}
    ops = [
        jsonpatch.add(jsonpatch.pointer("metadata", "labels", "example.com/k~1"), "v"),
        jsonpatch.remove(jsonpatch.pointer("metadata", "labels", "a~/b")),
        jsonpatch.add("/spec/list/-", 4),
        jsonpatch.remove("/spec/list/0"),
        jsonpatch.replace("/spec/list/0", 20),
        jsonpatch.add("/spec/new", {"x": 1}),
    ]
    ours = jsonpatch.apply(doc, ops)
    theirs = reference_jsonpatch.apply_patch(doc, ops)
    assert ours == theirs
    assert ours["metadata"]["labels"] == {"example.com/k~1": "v"}
    assert doc["spec"]["list"] == [1, 2, 3]  # the input is not modified


def review(**request: Any) -> bytes:
    base: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "ci",
        "object": {"metadata": {"name": "p"}, "spec": {}},
    }
    base.update(request)
    return orjson.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base}
    )


def test_decode_valid_review() -> None:
    decoded = decode_review(review(dryRun=True))
    assert decoded.uid == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert decoded.is_pod_create
    assert decoded.dry_run is True
    assert decoded.namespace == "ci"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "empty body"),
        (b"{not json", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'"review"', "must be a JSON object"),
        (
            b'{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}',
            "admission.k8s.io/v1",
        ),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"Pod","request":{}}', "kind must be"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}', "request is missing"),
        (review(uid=None), "request.uid is missing"),
        (review(uid=""), "request.uid is empty"),
        (review(uid=7), "request.uid must be a string"),
        (review(kind="Pod"), "request.kind"),
        (review(operation=None), "request.operation is missing"),
        (review(dryRun="yes"), "dryRun must be a boolean"),
        (review(object=[1]), "must be a Pod object"),
        (review(object=None), "must be a Pod object"),
    ],
)
def test_decode_rejects_with_a_clear_message(body: bytes, fragment: str) -> None:
    with pytest.raises(BadReview, match=fragment):
        decode_review(body)


def test_non_pod_objects_are_not_checked_as_pods() -> None:
    decoded = decode_review(
        review(kind={"group": "apps", "version": "v1", "kind": "Deployment"}, object="whatever")
    )
    assert not decoded.is_pod_create


def test_encode_allowed_with_patch() -> None:
    ops = [jsonpatch.add("/metadata/labels", {"a": "b"})]
    doc = orjson.loads(encode_response("u", allowed=True, patch=ops, warnings=["careful"]))
    assert doc["apiVersion"] == "admission.k8s.io/v1"
    assert doc["kind"] == "AdmissionReview"
    response = doc["response"]
    assert response["uid"] == "u"
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert orjson.loads(base64.b64decode(response["patch"])) == ops
    assert response["warnings"] == ["careful"]


def test_encode_allowed_without_patch_has_no_patch_type() -> None:
    response = orjson.loads(encode_response("u", allowed=True))["response"]
    assert response == {"uid": "u", "allowed": True}


def test_encode_denied() -> None:
    response = orjson.loads(
        encode_response("u", allowed=False, code=403, reason="Forbidden", message="no")
    )["response"]
    assert response == {
        "uid": "u",
        "allowed": False,
        "status": {"message": "no", "code": 403, "reason": "Forbidden"},
    }
