"""Isolation scope: where an isolated run's scope comes from, and what the webhook writes and
refuses for it (which runs each scope keeps off a node: tests/placement/test_anti_affinity.py)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch as reference_jsonpatch
import pytest

from coschedule.config.settings import Settings
from coschedule.marks import (
    ANNOTATION_ISOLATION_SCOPE,
    ANNOTATION_TENANT,
    LABEL_ENABLED,
    LABEL_ISOLATION_SCOPE,
    LABEL_MODE,
    IsolationScope,
    Mode,
    NamespaceInfo,
)
from coschedule.mutate import isolation
from coschedule.mutate.decision import AdmissionContext, decide
from tests.fixtures import load_pod

ZONE = "topology.kubernetes.io/zone"
TEAM = "example.com/team"


# ---- where the scope comes from --------------------------------------------------------


def test_the_runs_label_wins_then_the_namespaces_then_the_cluster_config() -> None:
    settings = Settings(isolation_scope=IsolationScope.TENANT, isolation_tenant_label=TEAM)
    pod = {LABEL_ISOLATION_SCOPE: "cluster"}
    ns = {LABEL_ISOLATION_SCOPE: "namespace"}
    cluster = isolation.cluster_scope(settings)
    chosen = isolation.choose_scope(pod, ns, cluster)
    assert chosen == isolation.ScopeChoice(IsolationScope.CLUSTER, isolation.POD_LABEL, "cluster")
    assert chosen.reason == f"pod label {LABEL_ISOLATION_SCOPE}=cluster"
    choice = isolation.choose_scope({}, ns, cluster)
    assert isinstance(choice, isolation.ScopeChoice)
    assert (choice.scope, choice.source) == (IsolationScope.NAMESPACE, isolation.NAMESPACE_LABEL)
    choice = isolation.choose_scope({}, {}, cluster)
    assert isinstance(choice, isolation.ScopeChoice)
    assert (choice.scope, choice.source) == (IsolationScope.TENANT, isolation.CLUSTER_CONFIG)
    assert choice.reason == 'cluster config "isolation-scope: tenant"'
    assert isolation.choose_scope({}, {LABEL_ISOLATION_SCOPE: "zone"}, cluster) == (
        isolation.InvalidScope(isolation.NAMESPACE_LABEL, "zone")
    )


def test_a_namespaces_tenant_is_its_label_value() -> None:
    settings = Settings(isolation_tenant_label=TEAM)
    assert isolation.tenant_of({TEAM: "payments"}, settings) == "payments"
    assert isolation.tenant_of({"other": "x"}, settings) == ""
    assert isolation.tenant_of(None, settings) == ""
    assert isolation.tenant_of({TEAM: "payments"}, Settings()) == ""


# ---- the webhook ------------------------------------------------------------------------


def admit(
    settings: Settings,
    namespace_labels: dict[str, str] | None = None,
    pod_labels: dict[str, str] | None = None,
) -> tuple[Any, dict[str, Any]]:
    pod = load_pod("tekton-taskrun-no-workspace")
    if pod_labels:
        pod["metadata"]["labels"].update(pod_labels)
    info = None
    if namespace_labels is not None:
        info = NamespaceInfo({LABEL_ENABLED: "true", **namespace_labels})
    context = AdmissionContext(settings, pod["metadata"].get("namespace") or "ci", info)
    decision = decide(pod, context)
    patched = reference_jsonpatch.apply_patch(pod, decision.ops) if decision.ops else pod
    if decision.allowed:
        assert decide(copy.deepcopy(patched), context).ops == [], "reinvocation added ops"
    return decision, patched


def pod_annotations(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"].get("annotations") or {})


ISOLATE = Settings(mode=Mode.ISOLATE_PIPELINERUN, mode_reason="test")


def test_the_default_scope_writes_no_new_mark() -> None:
    decision, pod = admit(ISOLATE, {})
    assert decision.allowed
    assert ANNOTATION_ISOLATION_SCOPE not in pod_annotations(pod)
    assert ANNOTATION_TENANT not in pod_annotations(pod)
    assert any("isolation scope namespace" in r for r in decision.reasons), decision.reasons


@pytest.mark.parametrize("where", ["namespace", "pod"])
def test_a_label_sets_the_scope_of_an_isolated_run(where: str) -> None:
    labels = {LABEL_ISOLATION_SCOPE: "cluster"}
    decision, pod = admit(
        ISOLATE, labels if where == "namespace" else {}, labels if where == "pod" else None
    )
    assert decision.allowed, decision.message
    assert pod_annotations(pod)[ANNOTATION_ISOLATION_SCOPE] == "cluster"
    assert any(f"{where} label {LABEL_ISOLATION_SCOPE}=cluster" in r for r in decision.reasons)


def test_tenant_scope_marks_the_namespaces_tenant() -> None:
    settings = Settings(
        mode=Mode.ISOLATE_PIPELINERUN,
        isolation_scope=IsolationScope.TENANT,
        isolation_tenant_label=TEAM,
    )
    decision, pod = admit(settings, {TEAM: "payments"})
    assert decision.allowed
    assert pod_annotations(pod)[ANNOTATION_ISOLATION_SCOPE] == "tenant"
    assert pod_annotations(pod)[ANNOTATION_TENANT] == "payments"
    # A namespace without the label: no tenant mark, a tenant of its own.
    decision, pod = admit(settings, {})
    assert pod_annotations(pod)[ANNOTATION_ISOLATION_SCOPE] == "tenant"
    assert ANNOTATION_TENANT not in pod_annotations(pod)


def test_every_mode_marks_the_tenant_but_only_isolation_reads_the_scope() -> None:
    settings = Settings(mode=Mode.PIPELINERUNS, isolation_tenant_label=TEAM)
    decision, pod = admit(settings, {TEAM: "payments", LABEL_ISOLATION_SCOPE: "bogus"})
    assert decision.allowed, decision.message
    assert pod_annotations(pod)[ANNOTATION_TENANT] == "payments"
    assert ANNOTATION_ISOLATION_SCOPE not in pod_annotations(pod)
    assert decision.scope is None


def test_an_unknown_scope_is_denied_naming_the_label() -> None:
    decision, _ = admit(ISOLATE, {}, {LABEL_ISOLATION_SCOPE: "node"})
    assert not decision.allowed
    assert decision.rule == "invalid-isolation-scope"
    assert f"the pod's label {LABEL_ISOLATION_SCOPE} is 'node'" in (decision.message or "")
    assert "namespace, tenant, cluster" in (decision.message or "")


def test_a_cross_namespace_label_with_a_zone_topology_key_is_denied_naming_label_and_fix() -> None:
    settings = Settings(mode=Mode.ISOLATE_PIPELINERUN, topology_key=ZONE)
    decision, _ = admit(settings, {LABEL_ISOLATION_SCOPE: "cluster"})
    assert not decision.allowed
    message = decision.message or ""
    assert "\n" not in message
    assert f"namespace 'ci''s label {LABEL_ISOLATION_SCOPE} is cluster" in message
    assert '"topology-key" is ' + repr(ZONE) in message
    assert "Fix: set the label to namespace, or remove it." in message
    # The same run in namespace scope is fine with a zone key, as it always was.
    assert admit(settings, {LABEL_ISOLATION_SCOPE: "namespace"})[0].allowed


def test_a_tenant_label_without_isolation_tenant_label_is_denied() -> None:
    decision, _ = admit(ISOLATE, {LABEL_ISOLATION_SCOPE: "tenant"})
    assert not decision.allowed
    assert '"isolation-tenant-label"' in (decision.message or "")
    assert LABEL_ISOLATION_SCOPE in (decision.message or "")


def test_a_pod_opted_out_is_not_denied_for_its_scope() -> None:
    decision, pod = admit(ISOLATE, {LABEL_ISOLATION_SCOPE: "bogus"}, {LABEL_MODE: "disabled"})
    assert decision.allowed
    assert "coschedule.dev/placeholder" not in pod["metadata"]["labels"]
