"""The protocol's one encoder and parser agree, and refuse marks that name another placeholder."""

from __future__ import annotations

from coschedule import marks
from coschedule.marks import BadMark, ClaimTemplate, Marks, Mode

NS = "ci"
SPEC = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}


def _metadata(found: Marks, **extra: str) -> dict[str, object]:
    return {
        "namespace": NS,
        "name": "pod-a",
        "labels": {marks.LABEL_PLACEHOLDER: found.placeholder},
        "annotations": {**marks.encode(found), **extra},
    }


def test_encode_then_parse_gives_the_same_marks() -> None:
    written = Marks(
        placeholder=marks.run_placeholder(NS, "run-1"),
        mode=Mode.PIPELINERUNS,
        run="run-1",
        run_label="tekton.dev/pipelineRun",
        claims=("data", "cache"),
        topology_key="kubernetes.io/hostname",
        claim_templates=(ClaimTemplate("b", "claim-b", SPEC), ClaimTemplate("a", "claim-a", SPEC)),
    )
    read = marks.parse(_metadata(written))
    assert isinstance(read, Marks)
    # Templates come back sorted by name: the annotation is a JSON object.
    assert read.claim_templates == tuple(
        sorted(written.claim_templates or (), key=lambda t: t.name)
    )
    assert read._replace(claim_templates=written.claim_templates) == written


def test_a_placeholder_other_than_the_marks_name_is_a_bad_mark() -> None:
    written = Marks(
        placeholder=marks.run_placeholder(NS, "run-2"),
        mode=Mode.PIPELINERUNS,
        run="run-1",
        run_label="tekton.dev/pipelineRun",
        claims=(),
        topology_key="kubernetes.io/hostname",
    )
    read = marks.parse(_metadata(written))
    assert isinstance(read, BadMark)
    assert "the name its marks give" in read.reason


def test_malformed_claim_templates_say_why() -> None:
    assert marks.parse_claim_templates("{") == (
        f"annotation {marks.ANNOTATION_CLAIM_TEMPLATES} is not JSON"
    )
    assert "needs claim and spec" in str(marks.parse_claim_templates('{"a": {"claim": 1}}'))


def test_the_claim_name_is_recognised_by_its_placeholder() -> None:
    placeholder = marks.run_placeholder(NS, "run-1")
    claim = marks.placeholder_claim("data", placeholder)
    assert marks.is_placeholder_claim(claim, placeholder)
    assert marks.is_placeholder_claim(claim)
    assert not marks.is_placeholder_claim(claim, marks.run_placeholder(NS, "run-2"))
    assert not marks.is_placeholder_claim("data")


def test_scope_and_tenant_round_trip_and_are_written_only_when_not_the_default() -> None:
    base = Marks(
        placeholder=marks.run_placeholder(NS, "run-1"),
        mode=Mode.ISOLATE_PIPELINERUN,
        run="run-1",
        run_label="tekton.dev/pipelineRun",
        claims=(),
        topology_key="kubernetes.io/hostname",
    )
    assert marks.ANNOTATION_ISOLATION_SCOPE not in marks.encode(base)
    assert marks.ANNOTATION_TENANT not in marks.encode(base)
    written = base._replace(scope=marks.IsolationScope.TENANT, tenant="payments")
    encoded = marks.encode(written)
    assert encoded[marks.ANNOTATION_ISOLATION_SCOPE] == "tenant"
    assert encoded[marks.ANNOTATION_TENANT] == "payments"
    assert marks.parse(_metadata(written)) == written
    assert marks.parse(_metadata(base)) == base


def test_an_unknown_scope_mark_is_a_bad_mark() -> None:
    written = Marks(
        placeholder=marks.run_placeholder(NS, "run-1"),
        mode=Mode.ISOLATE_PIPELINERUN,
        run="run-1",
        run_label="tekton.dev/pipelineRun",
        claims=(),
        topology_key="kubernetes.io/hostname",
    )
    bad = marks.parse(_metadata(written, **{marks.ANNOTATION_ISOLATION_SCOPE: "zone"}))
    assert isinstance(bad, BadMark)
    assert marks.ANNOTATION_ISOLATION_SCOPE in bad.reason
