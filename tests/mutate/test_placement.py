"""Placement by node name (the ``placement`` key, ``auto``) in the admission decision.

A Tekton TaskRun's pod (its controller recreates a deleted, never-started pod) is pinned to
the node its placeholder's pod is bound to, or gated until the reconciler pins it; every
other pod keeps today's pod-affinity term. Each case applies the patch with the reference
``jsonpatch`` library, asks the scheduler's own node rule (k8s/nodeaffinity) where the pod
may go, and admits the result again (reinvocation) to check it adds nothing it should not.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import jsonpatch as reference_jsonpatch
import pytest

from coschedule.config.settings import Settings
from coschedule.k8s.constants import REQUIRED
from coschedule.k8s.nodeaffinity import pod_allows, required_terms
from coschedule.marks import (
    ANNOTATION_PINNED_NODE,
    GATE_PLACEHOLDER,
    GATED_BY_POLICY,
    LABEL_GATED_BY,
    Mode,
    Placement,
    affinity_term,
)
from coschedule.mutate.decision import AdmissionContext, Decision, decide
from coschedule.placement.node_pin import pinned_node
from tests.fixtures import load_pod

ZONE = "topology.kubernetes.io/zone"
POOL = {"kubernetes.io/os": "linux", "node-pool": "ci-builders"}  # a fixture's nodeSelector
NODES = {
    "node-a": {"kubernetes.io/hostname": "node-a", "kubernetes.io/arch": "amd64", **POOL},
    "node-b": {"kubernetes.io/hostname": "node-b", "kubernetes.io/arch": "amd64", **POOL},
    "node-c": {"kubernetes.io/hostname": "node-c", "kubernetes.io/arch": "arm64", **POOL},
}
TEKTON = ("tekton-taskrun", "tekton-taskrun-two-workspaces", "tekton-taskrun-no-workspace")


class Placeholders:
    """The webhook's placeholder view as a plain map; counts its lookups."""

    def __init__(self, nodes: dict[tuple[str, str], str] | None = None) -> None:
        self.nodes = dict(nodes or {})
        self.lookups = 0

    def node(self, namespace: str, placeholder: str) -> str | None:
        self.lookups += 1
        return self.nodes.get((namespace, placeholder))


def context(
    view: Placeholders | None,
    *,
    placement: Placement = Placement.AUTO,
    mode: Mode = Mode.PIPELINERUNS,
    namespace: str = "ci",
    **kw: Any,
) -> AdmissionContext:
    settings = Settings(mode=mode, mode_reason="test", placement=placement, **kw)
    return AdmissionContext(settings, namespace, placeholders=view)


def admit(pod: dict[str, Any], ctx: AdmissionContext) -> tuple[Decision, dict[str, Any]]:
    decision = decide(pod, ctx)
    assert decision.allowed, decision.message
    patched = reference_jsonpatch.apply_patch(pod, decision.ops) if decision.ops else pod
    return decision, patched


def placeholder_of(pod: dict[str, Any], mode: Mode = Mode.PIPELINERUNS) -> str:
    placeholder = decide(pod, context(None, mode=mode)).placeholder
    assert placeholder is not None
    return placeholder


def pod_affinity_terms(pod: dict[str, Any]) -> list[Any]:
    affinity = pod["spec"].get("affinity") or {}
    return list((affinity.get("podAffinity") or {}).get(REQUIRED) or [])


def gates(pod: dict[str, Any]) -> list[Any]:
    return list(pod["spec"].get("schedulingGates") or [])


def allowed_nodes(pod: dict[str, Any]) -> set[str]:
    spec = pod["spec"]
    terms = required_terms(spec.get("affinity"))
    selector = spec.get("nodeSelector") or {}
    return {name for name, labels in NODES.items() if pod_allows(selector, terms, labels, name)}


@pytest.mark.parametrize("name", TEKTON)
@pytest.mark.parametrize("mode", [Mode.PIPELINERUNS, Mode.ISOLATE_PIPELINERUN])
def test_a_taskrun_pod_before_its_placeholder_is_bound_is_gated_without_pod_affinity(
    name: str, mode: Mode
) -> None:
    pod = load_pod(name)
    view = Placeholders()
    decision, patched = admit(pod, context(view, mode=mode))
    assert gates(patched) == [{"name": GATE_PLACEHOLDER}]
    assert pod_affinity_terms(patched) == []
    assert required_terms(patched["spec"].get("affinity")) is None  # not pinned anywhere
    assert pinned_node(patched["metadata"]) is None
    assert patched["metadata"]["labels"]["coschedule.dev/placeholder"] == decision.placeholder
    assert view.lookups == 1  # the hot path: one lookup in the view
    assert any("not bound yet" in r and GATE_PLACEHOLDER in r for r in decision.reasons)
    # Reinvoked, even once the placeholder is bound meanwhile: stays gated, gets no pin
    # (the reconciler pins and lifts the gate in one patch).
    assert decision.placeholder is not None
    view.nodes[("ci", decision.placeholder)] = "node-a"
    again, same = admit(patched, context(view, mode=mode))
    assert again.ops == []
    assert same == patched
    assert any("already held behind" in r for r in again.reasons)


@pytest.mark.parametrize("name", TEKTON)
def test_a_taskrun_pod_after_its_placeholder_is_bound_is_pinned_to_that_node(name: str) -> None:
    pod = load_pod(name)
    view = Placeholders({("ci", placeholder_of(pod)): "node-b"})
    decision, patched = admit(pod, context(view))
    assert allowed_nodes(patched) == {"node-b"}
    assert pod_affinity_terms(patched) == []
    assert gates(patched) == []
    assert patched["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == "node-b"
    # The other marks are all there beside the pin's.
    assert patched["metadata"]["annotations"]["coschedule.dev/run"] == "pr-7f3k2"
    assert any("bound to 'node-b'" in r for r in decision.reasons)
    # Pinned, not held behind the gate (what the unmarked-pod controller reads).
    assert decision.by_node_name
    assert not decision.held
    assert not decision.unbound
    again, _ = admit(patched, context(view))
    assert again.ops == []
    assert not again.held


def test_a_pinned_pod_whose_placeholder_moved_is_repinned_not_pinned_twice() -> None:
    pod = load_pod("tekton-taskrun")
    key = ("ci", placeholder_of(pod))
    view = Placeholders({key: "node-a"})
    _, pinned = admit(pod, context(view))
    assert allowed_nodes(pinned) == {"node-a"}
    view.nodes[key] = "node-b"
    decision, moved = admit(pinned, context(view))
    assert allowed_nodes(moved) == {"node-b"}
    assert moved["metadata"]["annotations"][ANNOTATION_PINNED_NODE] == "node-b"
    assert [op["op"] for op in decision.ops] == ["replace", "add"]
    assert any("was 'node-a'" in r for r in decision.reasons)
    assert not decision.held


def test_a_pinned_pod_whose_placeholder_is_no_longer_bound_is_gated_for_the_reconciler() -> None:
    pod = load_pod("tekton-taskrun")
    key = ("ci", placeholder_of(pod))
    view = Placeholders({key: "node-a"})
    _, pinned = admit(pod, context(view))
    del view.nodes[key]  # the placeholder's pod is being moved
    decision, gated = admit(pinned, context(view))
    assert gates(gated) == [{"name": GATE_PLACEHOLDER}]
    # The pin and its record stay: the reconciler's release replaces exactly that pin.
    assert pinned_node(gated["metadata"]) == "node-a"
    assert any("replacing the pin to 'node-a'" in r for r in decision.reasons)
    assert decision.held


def test_the_users_node_affinity_is_kept_and_the_pin_goes_into_it() -> None:
    pod = load_pod("tekton-taskrun-user-affinity")
    original = copy.deepcopy(pod["spec"]["affinity"])
    key = ("ci", placeholder_of(pod))
    # node-c is arm64, which the user's required node affinity refuses: pinned there, the
    # pod would fit nowhere (the scheduler says so) rather than go elsewhere.
    for node, expected in (("node-a", {"node-a"}), ("node-c", set())):
        _, patched = admit(pod, context(Placeholders({key: node})))
        assert allowed_nodes(patched) == expected
        affinity = patched["spec"]["affinity"]
        # The user's own pod affinity and anti-affinity are untouched; no term of ours.
        assert affinity.get("podAffinity") == original.get("podAffinity")
        assert affinity.get("podAntiAffinity") == original.get("podAntiAffinity")
        assert (
            affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            == (original["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"])
        )


def test_a_term_of_ours_from_an_earlier_admission_is_removed_when_pinned() -> None:
    pod = load_pod("tekton-taskrun")
    placeholder = placeholder_of(pod)
    _, with_term = admit(pod, context(None, placement=Placement.POD_AFFINITY))
    assert pod_affinity_terms(with_term) == [affinity_term(placeholder, "kubernetes.io/hostname")]
    _, pinned = admit(with_term, context(Placeholders({("ci", placeholder): "node-a"})))
    assert pod_affinity_terms(pinned) == []
    assert allowed_nodes(pinned) == {"node-a"}


def test_another_assistants_term_is_kept_and_warned_of() -> None:
    pod = load_pod("tekton-taskrun")
    tekton = affinity_term("affinity-assistant-tekton0001", "kubernetes.io/hostname")
    pod["spec"]["affinity"] = {"podAffinity": {REQUIRED: [tekton]}}
    decision, patched = admit(pod, context(Placeholders()))
    assert pod_affinity_terms(patched) == [tekton]
    assert gates(patched) == [{"name": GATE_PLACEHOLDER}]
    assert any("Tekton's own Affinity Assistant" in w for w in decision.warnings)


def test_without_a_cluster_view_the_pod_is_gated() -> None:
    decision, patched = admit(load_pod("tekton-taskrun"), context(None))
    assert gates(patched) == [{"name": GATE_PLACEHOLDER}]
    assert any("node is not known" in r for r in decision.reasons)


def keeps_the_pod_affinity_term(pod: dict[str, Any], ctx: AdmissionContext, why: str) -> None:
    decision, patched = admit(pod, ctx)
    reference, expected = admit(pod, replace_placement(ctx))
    assert patched == expected  # exactly today's mutation
    assert decision.ops == reference.ops
    assert [t for t in pod_affinity_terms(patched) if t.get("topologyKey")]
    assert gates(patched) == gates(pod)
    assert pinned_node(patched["metadata"]) is None
    assert any(why in r for r in decision.reasons), decision.reasons


def replace_placement(ctx: AdmissionContext) -> AdmissionContext:
    return replace(ctx, settings=replace(ctx.settings, placement=Placement.POD_AFFINITY))


@pytest.mark.parametrize("name", ["argo-workflow-pod", "job-pod", "weird-keys-pod"])
def test_pods_whose_owner_does_not_recreate_them_keep_pod_affinity(name: str) -> None:
    pod = load_pod(name)
    view = Placeholders()
    ctx = context(view, namespace=pod["metadata"].get("namespace") or "ci")
    view.nodes[(ctx.namespace, placeholder_of_ctx(pod, ctx))] = "node-a"
    keeps_the_pod_affinity_term(pod, ctx, "does not recreate a deleted pod")
    assert view.lookups == 0


def placeholder_of_ctx(pod: dict[str, Any], ctx: AdmissionContext) -> str:
    placeholder = decide(pod, ctx).placeholder
    assert placeholder is not None
    return placeholder


def test_a_taskrun_pod_with_only_a_non_controller_owner_keeps_pod_affinity() -> None:
    pod = load_pod("tekton-taskrun")
    for ref in pod["metadata"]["ownerReferences"]:
        ref["controller"] = False
    keeps_the_pod_affinity_term(pod, context(Placeholders()), "does not recreate")


def test_zone_topology_keeps_pod_affinity() -> None:
    pod = load_pod("tekton-taskrun")
    view = Placeholders({("ci", placeholder_of(pod)): "node-a"})
    keeps_the_pod_affinity_term(pod, context(view, topology_key=ZONE), "the topology key is")
    assert view.lookups == 0


def test_placement_pod_affinity_changes_nothing_for_a_taskrun_pod() -> None:
    pod = load_pod("tekton-taskrun")
    view = Placeholders({("ci", placeholder_of(pod)): "node-a"})
    decision, patched = admit(pod, context(view, placement=Placement.POD_AFFINITY))
    assert pod_affinity_terms(patched) == [
        affinity_term(decision.placeholder or "", "kubernetes.io/hostname")
    ]
    assert gates(patched) == []
    assert view.lookups == 0
    assert not any(r.startswith("placement:") for r in decision.reasons)


def test_placeholders_and_pods_left_alone_are_not_placed() -> None:
    view = Placeholders()
    for name in ("placeholder-pod", "deployment-pod", "bare-pod-no-labels"):
        _, patched = admit(load_pod(name), context(view))
        assert gates(patched) == gates(load_pod(name)), name
        assert pinned_node(patched["metadata"]) is None, name
    assert view.lookups == 0


def test_workspaces_mode_places_by_the_claims_placeholder() -> None:
    pod = load_pod("tekton-taskrun")
    placeholder = placeholder_of(pod, Mode.WORKSPACES)
    view = Placeholders({("ci", placeholder): "node-c"})
    _, patched = admit(pod, context(view, mode=Mode.WORKSPACES))
    assert allowed_nodes(patched) == {"node-c"}
    # Another namespace's placeholder of the same name is not this one's.
    other = Placeholders({("elsewhere", placeholder): "node-c"})
    _, gated = admit(pod, context(other, mode=Mode.WORKSPACES))
    assert gates(gated) == [{"name": GATE_PLACEHOLDER}]


# ---- pods the admission policy gated first (coschedule-gate-pods) ---------------------


def policy_gated(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the MutatingAdmissionPolicy leaves it before the webhook sees it: the
    gate appended and the policy's label (what its CEL patch adds; the e2e suite checks the
    real policy does exactly this)."""
    gated = copy.deepcopy(pod)
    gated["spec"].setdefault("schedulingGates", []).append({"name": GATE_PLACEHOLDER})
    gated["metadata"].setdefault("labels", {})[LABEL_GATED_BY] = GATED_BY_POLICY
    return gated


@pytest.mark.parametrize("name", TEKTON)
def test_a_policy_gated_pod_whose_placeholder_is_not_bound_stays_gated_and_is_marked(
    name: str,
) -> None:
    pod = policy_gated(load_pod(name))
    decision, patched = admit(pod, context(Placeholders()))
    assert decision.held
    assert gates(patched) == [{"name": GATE_PLACEHOLDER}]  # one gate, not two
    assert patched["metadata"]["labels"]["coschedule.dev/placeholder"] == decision.placeholder
    assert pinned_node(patched["metadata"]) is None
    # Without the policy the webhook would have made the same pod.
    _, alone = admit(load_pod(name), context(Placeholders()))
    alone["metadata"]["labels"][LABEL_GATED_BY] = GATED_BY_POLICY
    assert patched == alone


@pytest.mark.parametrize("name", TEKTON)
def test_a_policy_gated_pod_whose_placeholder_is_bound_is_pinned_and_ungated(name: str) -> None:
    pod = policy_gated(load_pod(name))
    view = Placeholders({("ci", placeholder_of(load_pod(name))): "node-b"})
    decision, patched = admit(pod, context(view))
    assert not decision.held
    assert gates(patched) == []
    assert pinned_node(patched["metadata"]) == "node-b"
    assert allowed_nodes(patched) == {"node-b"}
    again, same = admit(patched, context(view))  # reinvoked: nothing more
    assert again.ops == []
    assert same == patched


@pytest.mark.parametrize(
    ("why", "ctx"),
    [
        ("pod affinity everywhere", context(None, placement=Placement.POD_AFFINITY)),
        ("zone topology", context(None, topology_key=ZONE)),
        ("cluster mode disabled", context(None, mode=Mode.DISABLED)),
    ],
)
def test_a_policy_gated_pod_the_webhook_does_not_hold_gets_the_gate_lifted(
    why: str, ctx: AdmissionContext
) -> None:
    pod = policy_gated(load_pod("tekton-taskrun"))
    decision, patched = admit(pod, ctx)
    assert not decision.held, why
    assert gates(patched) == [], why
    assert LABEL_GATED_BY not in patched["metadata"]["labels"], why  # no longer waiting
    assert any("admission policy" in r for r in decision.reasons), decision.reasons


def test_a_gate_that_is_not_the_policys_is_left_to_its_owner() -> None:
    pod = load_pod("tekton-taskrun")
    pod["spec"]["schedulingGates"] = [{"name": "example.com/quota"}]
    pod["metadata"]["labels"][LABEL_GATED_BY] = GATED_BY_POLICY
    _, patched = admit(pod, context(None, mode=Mode.DISABLED))
    assert gates(patched) == [{"name": "example.com/quota"}]
