"""Watch events and list pages decoded without managedFields give what the whole parse
gives with managedFields popped: for real pods as stored, the other kinds the caches
watch, the events that carry no object of a spec/status kind, and arbitrary JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.watch_decode import managed_fields, stored
from coschedule.wire.watch_events import POD_CACHE, decode_event, decode_list
from tests.fixtures import FIXTURE_NAMES, load_pod

# As kube-apiserver keeps them (the bench builds them from the pod: one entry per writer).
MANAGED_FIELDS = managed_fields(load_pod("tekton-taskrun"))


def whole(data: bytes) -> Any:
    """The whole parse, managedFields popped where a decoder drops them."""
    doc = orjson.loads(data)
    objects = []
    if isinstance(doc, dict):
        if isinstance(doc.get("object"), dict):
            objects.append(doc["object"])
        if isinstance(doc.get("items"), list):
            objects.extend(item for item in doc["items"] if isinstance(item, dict))
    for obj in objects:
        if isinstance(obj.get("metadata"), dict):
            obj["metadata"].pop("managedFields", None)
    return doc


def event(kind: str, obj: Any) -> bytes:
    return orjson.dumps({"type": kind, "object": obj})


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@pytest.mark.parametrize("kind", ["ADDED", "MODIFIED", "DELETED"])
def test_a_stored_pod_s_event_is_the_whole_parse_without_managed_fields(
    name: str, kind: str
) -> None:
    line = event(kind, stored(load_pod(name)))
    decoded = decode_event(line)
    assert decoded == whole(line)
    assert "managedFields" not in decoded["object"]["metadata"]
    assert decoded["object"]["spec"] == orjson.loads(line)["object"]["spec"]


def test_metadata_alone_keeps_every_field_but_managed_fields() -> None:
    pod = stored(load_pod("tekton-taskrun"))
    meta = {
        **pod["metadata"],
        "deletionTimestamp": "2026-11-29T06:05:00Z",
        "deletionGracePeriodSeconds": 30,
        "finalizers": ["example.com/keep"],
        "generation": 1,
        "selfLink": "",
    }
    line = event(
        "MODIFIED",
        {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta},
    )
    decoded = decode_event(line)
    assert decoded == whole(line)
    assert set(decoded["object"]["metadata"]) == set(meta) - {"managedFields"}


@pytest.mark.parametrize(
    "obj",
    [
        {  # a Node
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "labels": {"pool": "ab"}, "managedFields": MANAGED_FIELDS},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "unschedulable": True},
            "status": {"allocatable": {"cpu": "32"}, "conditions": [{"type": "Ready"}]},
        },
        {  # a StatefulSet with no status yet
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "coschedule-x", "namespace": "ci", "generation": 3},
            "spec": {"replicas": 1, "template": {"spec": {"containers": []}}},
        },
        {  # a bookmark: the resourceVersion alone
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "resourceVersion": "99",
                "annotations": {"k8s.io/initial-events-end": "true"},
            },
        },
    ],
    ids=["node", "statefulset", "bookmark"],
)
def test_other_kinds_the_caches_watch(obj: dict[str, Any]) -> None:
    line = event("BOOKMARK" if obj["kind"] == "Pod" else "ADDED", obj)
    assert decode_event(line) == whole(line)


@pytest.mark.parametrize("decode", [decode_event, POD_CACHE.event], ids=["every", "pod-cache"])
def test_an_error_event_keeps_the_status_a_relist_reads(decode: Callable[[bytes], Any]) -> None:
    line = event(
        "ERROR",
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "too old resource version: 1 (48213)",
            "reason": "Expired",
            "code": 410,
        },
    )
    decoded = decode(line)
    assert decoded == orjson.loads(line)
    assert decoded["object"]["code"] == 410


@pytest.mark.parametrize(
    "obj",
    [
        {  # a kind with other top-level keys: a webhook configuration
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "coschedule", "managedFields": MANAGED_FIELDS},
            "webhooks": [{"name": "pods.coschedule.dev", "clientConfig": {"caBundle": "Zm9v"}}],
        },
        {  # a metadata field newer than the decoder's list
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "futureField": {"x": 1}, "managedFields": MANAGED_FIELDS},
            "spec": {},
        },
        {"apiVersion": "v1", "kind": "Pod", "metadata": ["not", "an", "object"]},
    ],
    ids=["other-top-level-keys", "newer-metadata-field", "metadata-not-an-object"],
)
def test_a_shape_not_declared_is_parsed_whole_and_loses_no_key(obj: dict[str, Any]) -> None:
    line = event("MODIFIED", obj)
    decoded = decode_event(line)
    assert decoded == whole(line)
    for key in obj:
        assert key in decoded["object"]
    if isinstance(obj["metadata"], dict):
        assert set(decoded["object"]["metadata"]) == set(obj["metadata"]) - {"managedFields"}


@pytest.mark.parametrize(
    "line", [b"[1, 2]", b"7", b'"x"', b'{"type": "ADDED", "object": null}', b'{"object": 5}']
)
def test_what_is_not_an_event_decodes_as_the_whole_parse(line: bytes) -> None:
    assert decode_event(line) == orjson.loads(line)


@pytest.mark.parametrize("line", [b'{"type": "ADDED", "object": {', b"nope", b""])
def test_malformed_json_raises_the_whole_parse_s_error(line: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        decode_event(line)


def test_a_list_page_is_the_whole_parse_without_the_items_managed_fields() -> None:
    items = [stored(load_pod(name)) for name in FIXTURE_NAMES]
    body = orjson.dumps(
        {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "48213", "continue": "eyJ2IjoibWV0YS5r"},
            "items": items,
        }
    )
    page = decode_list(body)
    assert page == whole(body)
    assert len(page["items"]) == len(items)
    assert all("managedFields" not in item["metadata"] for item in page["items"])


def test_a_list_of_another_shape_is_parsed_whole() -> None:
    body = orjson.dumps(
        {
            "kind": "MutatingWebhookConfigurationList",
            "apiVersion": "admissionregistration.k8s.io/v1",
            "metadata": {"resourceVersion": "7"},
            "items": [
                {
                    "metadata": {"name": "coschedule", "managedFields": MANAGED_FIELDS},
                    "webhooks": [{"name": "pods.coschedule.dev"}],
                }
            ],
        }
    )
    page = decode_list(body)
    assert page == whole(body)
    assert page["items"][0]["webhooks"] == [{"name": "pods.coschedule.dev"}]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
_meta_key = st.sampled_from(
    ["name", "namespace", "labels", "annotations", "uid", "managedFields", "finalizers", "other"]
)
_top_key = st.sampled_from(["apiVersion", "kind", "metadata", "spec", "status", "code", "data"])


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["ADDED", "MODIFIED", "DELETED", "ERROR", "BOOKMARK"]),
    top=st.dictionaries(_top_key, _json, max_size=5),
    meta=st.none() | st.dictionaries(_meta_key, _json, max_size=5),
)
def test_any_event_decodes_as_the_whole_parse_without_managed_fields(
    kind: str, top: dict[str, Any], meta: dict[str, Any] | None
) -> None:
    obj = {**top, "metadata": meta} if meta is not None or "metadata" in top else top
    line = event(kind, obj)
    assert decode_event(line) == whole(line)
