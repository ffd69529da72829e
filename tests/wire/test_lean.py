"""The hot path's lean decoder (coschedule.wire.lean) gives the answers of the full parse.

Three kinds of proof: every fixture and benchmark payload, under every mode, with and
without scheduling defaults, answers byte for byte as the full orjson parse does; the
decision reads no pod field the lean decoder leaves out (recorded, not assumed); and bad or
mutated bodies, including JSON the two parsers treat differently, get the same 400s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.payloads import fat_pod, not_selected_pod, small_pod, tekton_pod
from coschedule.config.settings import parse_settings
from coschedule.config.store import SettingsStore
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.server.pod_endpoint import PodEndpoint
from coschedule.server.webhook_metrics import WebhookMetrics
from coschedule.wire import lean
from coschedule.wire.review import decode_review
from tests.fixtures import FIXTURE_NAMES, admission_review, load_pod
from tests.server.test_property_reviews import mutated_reviews

MODES = ("workspaces", "pipelineruns", "isolate-pipelinerun", "disabled")
DEFAULTS = """
- namespaces: [ci, default]
  nodeSelector: {kubernetes.io/arch: arm64}
  tolerations:
    - {key: kubernetes.io/arch, operator: Equal, value: arm64, effect: NoSchedule}
  schedulerName: batch-scheduler
"""


def pods() -> Iterator[tuple[str, dict[str, Any]]]:
    for name in FIXTURE_NAMES:
        yield name, load_pod(name)
    for make in (small_pod, tekton_pod, fat_pod, not_selected_pod):
        yield make.__name__, make()


def handler(mode: str, defaults: bool) -> PodEndpoint:
    env = {"COSCHEDULE_COSCHEDULE": mode}
    if defaults:
        env["COSCHEDULE_SCHEDULING_DEFAULTS"] = DEFAULTS
    return PodEndpoint(SettingsStore(None, env), WebhookMetrics())


def both(
    body: bytes, monkeypatch: pytest.MonkeyPatch, h: PodEndpoint
) -> tuple[tuple[int, bytes], tuple[int, bytes]]:
    """(lean answer, full-parse answer) of one handler to one body."""
    lean_answer = h.handle(body)
    with monkeypatch.context() as patch:
        patch.setattr(lean, "_fast", lambda _body: None)
        full_answer = h.handle(body)
    return lean_answer, full_answer


@pytest.mark.parametrize("defaults", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_every_payload_answers_as_the_full_parse(
    mode: str, defaults: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = handler(mode, defaults)
    for name, pod in pods():
        for dry_run in (False, True):
            body = orjson.dumps(admission_review(pod, dry_run=dry_run))
            lean_answer, full_answer = both(body, monkeypatch, h)
            assert lean_answer == full_answer, name


def test_real_pods_take_the_fast_path() -> None:
    """The payloads kube-apiserver sends (defaulted: schedulerName, tolerations) are
    decoded lean, not by the fallback; only the read keys are built."""
    for name, pod in pods():
        if name in ("bare-pod-no-labels", "weird-keys-pod", "placeholder-pod"):
            continue  # hand-made shapes; either path is right for them
        review = lean._fast(orjson.dumps(admission_review(pod)))
        assert review is not None, name
        assert set(review.object) <= {"metadata", "spec"}
        assert set(review.object["spec"]) <= set(lean.POD_READS["spec"])
        assert "containers" not in review.object["spec"]
        for volume in review.object["spec"].get("volumes") or ():
            assert set(volume) <= set(lean.POD_READS["spec.volumes[]"]), name


class Recording(dict[str, Any]):
    """A dict that records which keys are read, and fails on a whole-object read."""

    def __init__(self, data: dict[str, Any], reads: set[str]) -> None:
        super().__init__(data)
        self.reads = reads

    def get(self, key: str, default: Any = None) -> Any:
        self.reads.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.reads.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.reads.add(str(key))
        return super().__contains__(key)

    def _whole(self, *_: Any) -> Any:
        raise AssertionError("a whole object was read, where the lean view has a part")

    items = keys = values = __iter__ = copy = _whole


def recorded_reads(pod: dict[str, Any], ctx: AdmissionContext) -> dict[str, set[str]]:
    reads: dict[str, set[str]] = {"pod": set(), "metadata": set(), "spec": set(), "volume": set()}
    view = dict(pod)
    if isinstance(view.get("metadata"), dict):
        view["metadata"] = Recording(view["metadata"], reads["metadata"])
    if isinstance(view.get("spec"), dict):
        spec = dict(view["spec"])
        if isinstance(spec.get("volumes"), list):
            spec["volumes"] = [
                Recording(v, reads["volume"]) if isinstance(v, dict) else v for v in spec["volumes"]
            ]
        view["spec"] = Recording(spec, reads["spec"])
    decide(Recording(view, reads["pod"]), ctx)
    return reads


@pytest.mark.parametrize("placement", ["pod-affinity", "auto"])
@pytest.mark.parametrize("defaults", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_the_decision_reads_only_what_the_lean_decoder_builds(
    mode: str, defaults: bool, placement: str
) -> None:
    raw = {"coschedule": mode, "placement": placement}
    if defaults:
        raw["scheduling-defaults"] = DEFAULTS
    for namespace in ("ci", "other"):
        ctx = AdmissionContext(parse_settings(raw), namespace)
        for name, pod in pods():
            reads = recorded_reads(pod, ctx)
            assert reads["pod"] <= {"metadata", "spec"}, name
            assert reads["metadata"] <= set(lean.POD_READS["metadata"]), name
            assert reads["spec"] <= set(lean.POD_READS["spec"]), name
            assert reads["volume"] <= set(lean.POD_READS["spec.volumes[]"]), name


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(review=mutated_reviews(), mode=st.sampled_from(MODES), defaults=st.booleans())
def test_mutated_reviews_answer_as_the_full_parse(
    review: dict[str, Any], mode: str, defaults: bool
) -> None:
    h = handler(mode, defaults)
    body = orjson.dumps(review)
    with pytest.MonkeyPatch.context() as monkeypatch:
        lean_answer, full_answer = both(body, monkeypatch, h)
    assert lean_answer == full_answer


def _tekton_body() -> bytes:
    return orjson.dumps(admission_review(tekton_pod()))


# JSON the fast decoder could read differently from orjson, and shapes it must not guess.
TRICKY = [
    b"",
    b"   ",
    b"[]",
    b"null",
    b"\xef\xbb\xbf" + _tekton_body(),  # a BOM
    _tekton_body() + b"x",  # trailing garbage
    _tekton_body().replace(b'"ci"', b'"c\\ud800i"', 1),  # lone surrogate, read field
    _tekton_body().replace(b'"image":"', b'"image":"\\ud800', 1),  # lone surrogate, unread
    _tekton_body().replace(b'"image":"', b'"image":"\xff', 1),  # invalid UTF-8, unread
    _tekton_body().replace(b'"image":"', b'"image":"\xed\xa0\x80', 1),  # UTF-8 surrogate
    _tekton_body().replace(b'"image":"', b'"image":"\x01', 1),  # control character, unread
    _tekton_body().replace(b'"image":"', b'"image":"\\q', 1),  # bad escape, unread
    _tekton_body().replace(
        b'"containers":', b'"containers":' + b"[" * 3000 + b"]" * 3000 + b',"x":', 1
    ),
    _tekton_body().replace(b'"metadata":{', b'"metadata":{"a":1,', 1),
    _tekton_body().replace(b'"apiVersion":"admission.k8s.io/v1"', b'"apiVersion":"v1"', 1),
    _tekton_body().replace(b'"uid":"', b'"uid":1,"x":"', 1),
    _tekton_body().replace(b'"dryRun":false', b'"dryRun":"no"', 1),
    _tekton_body().replace(b'"operation":"CREATE"', b'"operation":null', 1),
    # The review's own fields, each of another type or absent (typed in the fast decoder).
    _tekton_body().replace(b'"kind":"AdmissionReview"', b'"kind":"AdmissionReviewList"', 1),
    _tekton_body().replace(b'"version":"v1"', b'"version":1', 1),
    _tekton_body().replace(b'"group":""', b'"group":0', 1),
    _tekton_body().replace(b'"group":""', b'"group":null', 1),
    _tekton_body().replace(b'"kind":"Pod"', b'"kind":["Pod"]', 1),
    _tekton_body().replace(b'"namespace":"ci"', b'"namespace":5', 1),
    _tekton_body().replace(b'"namespace":"ci"', b'"namespace":null', 1),
    _tekton_body().replace(b'"dryRun":false', b'"dryRun":null', 1),
    _tekton_body().replace(b'"uid":"', b'"uid":"","x":"', 1),
    _tekton_body().replace(b'"operation":"CREATE"', b'"x":"CREATE"', 1),
    orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
    orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": None}),
    orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": None, "operation": "CREATE"},
        }
    ),
    orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}),
    orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE",
                "object": None,
            },
        }
    ),
]


def _with_object(obj: Any, operation: str = "CREATE") -> bytes:
    review = admission_review(tekton_pod())
    review["request"]["object"] = obj
    review["request"]["operation"] = operation
    return orjson.dumps(review)


SHAPES = [
    _with_object([]),
    _with_object("pod"),
    _with_object({}),
    _with_object({"metadata": [], "spec": {}}),
    _with_object({"metadata": {"namespace": "ci"}, "spec": {"containers": []}}),
    _with_object({"metadata": {"name": "p", "labels": {"a": 1}}, "spec": {}}),
    _with_object({"metadata": {"name": "p"}, "spec": {"volumes": {}}}),
    _with_object({"metadata": {"name": "p"}, "spec": "x"}),
    _with_object({"metadata": None, "spec": None}),
    _with_object([], operation="UPDATE"),
    _with_object({"spec": "x"}, operation="DELETE"),
]


@pytest.mark.parametrize("body", TRICKY + SHAPES, ids=range(len(TRICKY) + len(SHAPES)))
def test_bad_and_unusual_bodies_answer_as_the_full_parse(
    body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    lean_answer, full_answer = both(body, monkeypatch, handler("pipelineruns", True))
    assert lean_answer == full_answer


def test_the_lean_review_carries_the_request_fields() -> None:
    body = orjson.dumps(admission_review(tekton_pod(), dry_run=True))
    fast = lean._fast(body)
    full = decode_review(body)
    assert fast is not None
    assert (fast.uid, fast.group, fast.version, fast.kind, fast.operation) == (
        full.uid,
        full.group,
        full.version,
        full.kind,
        full.operation,
    )
    assert (fast.namespace, fast.dry_run, fast.is_pod_create) == (full.namespace, True, True)
    assert fast.object["metadata"]["labels"] == full.object["metadata"]["labels"]
    # Each volume as the full parse has it, less its source (emptyDir, secret...).
    read = lean.POD_READS["spec.volumes[]"]
    assert fast.object["spec"]["volumes"] == [
        {k: v for k, v in volume.items() if k in read} for volume in full.object["spec"]["volumes"]
    ]
    assert any("persistentVolumeClaim" in volume for volume in fast.object["spec"]["volumes"])
