"""``plan_unmarked``: a pod the admission policy gated while the webhook was away gets the
webhook's own marks (and keeps the gate for the placeholder controller), or has the gate
lifted when the webhook would not hold it, or waits when only admission could do its part."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch as reference_jsonpatch
import pytest

from coschedule import marks
from coschedule.config.settings import Settings
from coschedule.marks import (
    GATE_PLACEHOLDER,
    GATED_BY_POLICY,
    LABEL_GATED_BY,
    Mode,
    NamespaceInfo,
    Placement,
)
from coschedule.mutate.decision import AdmissionContext, decide
from coschedule.reconcile.unmarked import (
    REASON_MARKED,
    REASON_RELEASED,
    REASON_WAITING,
    plan_unmarked,
)
from tests.fixtures import load_pod

ENABLED = {"coschedule.dev/enabled": "true"}


def gated(name: str = "tekton-taskrun") -> dict[str, Any]:
    """The pod as the policy stores it (what its CEL patch adds)."""
    pod = load_pod(name)
    pod["metadata"]["namespace"] = "ci"
    pod["metadata"]["resourceVersion"] = "41"
    pod["spec"].setdefault("schedulingGates", []).append({"name": GATE_PLACEHOLDER})
    pod["metadata"]["labels"][LABEL_GATED_BY] = GATED_BY_POLICY
    return pod


def settings(**kw: Any) -> Settings:
    return Settings(**{"mode": Mode.PIPELINERUNS, "placement": Placement.AUTO, **kw})


def applied(pod: dict[str, Any], ops: Any) -> dict[str, Any]:
    result: dict[str, Any] = reference_jsonpatch.apply_patch(copy.deepcopy(pod), list(ops))
    return result


@pytest.mark.parametrize(
    "name", ["tekton-taskrun", "tekton-taskrun-no-workspace", "shipwright-buildrun-pod"]
)
def test_the_webhooks_marks_are_patched_on_and_the_gate_stays(name: str) -> None:
    pod = gated(name)
    plan = plan_unmarked(pod, ENABLED, settings())
    assert plan.reason == REASON_MARKED
    assert not plan.warning
    assert plan.ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "41"}
    assert all(op["path"].startswith("/metadata") for op in plan.ops)  # no spec change
    after = applied(pod, plan.ops)
    assert after["spec"]["schedulingGates"] == [{"name": GATE_PLACEHOLDER}]
    # The very marks the webhook writes: the placeholder controller reads them as its own.
    parsed = marks.parse(after["metadata"])
    assert isinstance(parsed, marks.Marks), parsed
    ctx = AdmissionContext(settings(), "ci", NamespaceInfo(ENABLED))
    webhook = reference_jsonpatch.apply_patch(load_pod(name), decide(load_pod(name), ctx).ops)
    assert parsed.placeholder == webhook["metadata"]["labels"][marks.LABEL_PLACEHOLDER]
    assert {k: after["metadata"]["annotations"][k] for k in marks.MARK_ANNOTATIONS} == {
        k: webhook["metadata"]["annotations"][k] for k in marks.MARK_ANNOTATIONS
    }
    assert plan.placeholder == parsed.placeholder


def test_the_namespace_mode_label_is_read_as_the_webhook_reads_it() -> None:
    plan = plan_unmarked(gated(), {**ENABLED, "coschedule.dev/mode": "workspaces"}, settings())
    after = applied(gated(), plan.ops)
    assert after["metadata"]["annotations"][marks.ANNOTATION_MODE] == "workspaces"


@pytest.mark.parametrize(
    ("why", "labels", "given", "warning"),
    [
        ("namespace mode disabled", {**ENABLED, "coschedule.dev/mode": "disabled"}, {}, False),
        (
            "zone topology: pod affinity",
            ENABLED,
            {"topology_key": "topology.kubernetes.io/zone"},
            True,
        ),
        ("placement pod-affinity", ENABLED, {"placement": Placement.POD_AFFINITY}, True),
    ],
)
def test_a_pod_the_webhook_would_not_hold_is_released(
    why: str, labels: dict[str, str], given: dict[str, Any], warning: bool
) -> None:
    pod = gated()
    plan = plan_unmarked(pod, labels, settings(**given))
    after = applied(pod, plan.ops)
    assert after["spec"].get("schedulingGates") == [], why
    assert LABEL_GATED_BY not in after["metadata"]["labels"], why  # leaves the watch
    assert marks.LABEL_PLACEHOLDER not in after["metadata"]["labels"], why
    assert plan.warning is warning, why
    if warning:
        assert plan.reason == REASON_RELEASED
        assert "not co-located" in plan.message


def test_a_pod_the_webhook_would_refuse_is_released_and_the_rule_is_told() -> None:
    pod = gated()
    pod["metadata"]["labels"]["coschedule.dev/mode"] = "per-task"  # not a mode
    plan = plan_unmarked(pod, ENABLED, settings())
    assert plan.reason == REASON_RELEASED
    assert plan.warning
    assert "invalid-mode" in plan.message
    assert applied(pod, plan.ops)["spec"]["schedulingGates"] == []


def test_a_pod_whose_claims_only_admission_can_rewrite_waits_gated() -> None:
    pod = gated()
    plan = plan_unmarked(pod, ENABLED, settings(rewrite_claims=True))
    assert plan.reason == REASON_WAITING
    assert plan.warning
    assert plan.ops == ()  # not marked with the engine's claim: that would split the run
    assert "Delete it once the webhook answers" in plan.message
    # Without claims there is nothing to rewrite: marked as usual.
    bare = gated("tekton-taskrun-no-workspace")
    assert plan_unmarked(bare, ENABLED, settings(rewrite_claims=True)).reason == REASON_MARKED


def test_a_pod_no_longer_gated_is_left_alone() -> None:
    pod = gated()
    pod["spec"]["schedulingGates"] = []
    assert plan_unmarked(pod, ENABLED, settings()).ops == ()
