"""The admission decision on realistic pods, in every mode, with the pod-affinity encoding
(``placement: pod-affinity``; placement by node name, the default, is tests/mutate/
test_placement.py's).

For each case: the patch applies (checked with the reference ``jsonpatch`` library), the
result is what the design says, and admitting the result again adds nothing.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import jsonpatch as reference_jsonpatch
import pytest

from coschedule.config.settings import Settings, parse_settings
from coschedule.k8s.constants import REQUIRED
from coschedule.marks import (
    Mode,
    NamespaceInfo,
    Placement,
    affinity_term,
    claim_placeholder,
    run_placeholder,
)
from coschedule.mutate.decision import AdmissionContext, Decision, decide
from coschedule.wire.pod_fields import MalformedPod
from tests.fixtures import FIXTURE_NAMES, load_pod

RUN_MODES = (Mode.PIPELINERUNS, Mode.ISOLATE_PIPELINERUN)


def ctx(mode: Mode = Mode.WORKSPACES, namespace: str = "ci", **kw: Any) -> AdmissionContext:
    settings = Settings(
        mode=mode, mode_reason="test", **{"placement": Placement.POD_AFFINITY, **kw}
    )
    return AdmissionContext(settings, namespace)


def admit(pod: dict[str, Any], context: AdmissionContext) -> tuple[Decision, dict[str, Any]]:
    decision = decide(pod, context)
    patched = reference_jsonpatch.apply_patch(pod, decision.ops) if decision.ops else pod
    return decision, patched


def required_terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = pod["spec"].get("affinity") or {}
    return list((affinity.get("podAffinity") or {}).get(REQUIRED) or [])


def test_placeholder_names_follow_the_design() -> None:
    run = hashlib.sha256(b"ci/pr-7f3k2").hexdigest()[:10]
    claim = hashlib.sha256(b"ci/pvc/pvc-1f1344866c").hexdigest()[:10]
    assert run_placeholder("ci", "pr-7f3k2") == f"affinity-assistant-{run}"
    assert claim_placeholder("ci", "pvc-1f1344866c") == f"affinity-assistant-{claim}"
    # UTF-8, and namespace is part of the identity.
    assert run_placeholder("ci", "ünïcode") != run_placeholder("ci2", "ünïcode")


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@pytest.mark.parametrize("mode", list(Mode))
def test_every_fixture_in_every_mode_applies_and_is_idempotent(name: str, mode: Mode) -> None:
    pod = load_pod(name)
    original = copy.deepcopy(pod)
    context = ctx(mode, namespace=pod["metadata"].get("namespace", "default"))
    decision, patched = admit(pod, context)
    assert pod == original, "decide must not modify its input"
    if not decision.allowed:
        assert decision.ops == []
        return
    again = decide(patched, context)
    assert again.allowed
    assert again.ops == [], f"reinvocation added {again.ops}"
    if decision.placeholder is not None:
        assert patched["metadata"]["labels"]["coschedule.dev/placeholder"] == decision.placeholder
        terms = required_terms(patched)
        assert terms.count(affinity_term(decision.placeholder, "kubernetes.io/hostname")) == 1


def test_tekton_pod_workspaces_mode_joins_its_claims_placeholder() -> None:
    decision, patched = admit(load_pod("tekton-taskrun"), ctx(Mode.WORKSPACES))
    expected = claim_placeholder("ci", "pvc-1f1344866c")
    assert decision.allowed
    assert decision.placeholder == expected
    assert required_terms(patched) == [affinity_term(expected, "kubernetes.io/hostname")]
    annotations = patched["metadata"]["annotations"]
    assert annotations["coschedule.dev/mode"] == "workspaces"
    assert annotations["coschedule.dev/run"] == "pr-7f3k2"
    assert annotations["coschedule.dev/run-label"] == "tekton.dev/pipelineRun"
    assert annotations["coschedule.dev/claims"] == "pvc-1f1344866c"
    # Tekton's own labels and annotations are kept.
    original = load_pod("tekton-taskrun")["metadata"]
    for key, value in original["labels"].items():
        assert patched["metadata"]["labels"][key] == value
    for key, value in (original.get("annotations") or {}).items():
        assert annotations[key] == value


@pytest.mark.parametrize("mode", RUN_MODES)
def test_all_pods_of_a_run_share_one_placeholder(mode: Mode) -> None:
    names = ("tekton-taskrun", "tekton-taskrun-two-workspaces", "tekton-taskrun-no-workspace")
    placeholders = {admit(load_pod(n), ctx(mode))[0].placeholder for n in names}
    assert placeholders == {run_placeholder("ci", "pr-7f3k2")}


def test_workspaces_mode_denies_two_claims_naming_the_rule_and_fix() -> None:
    decision = decide(load_pod("tekton-taskrun-two-workspaces"), ctx(Mode.WORKSPACES))
    assert not decision.allowed
    assert decision.rule == "workspaces-single-claim"
    assert decision.message is not None
    assert "pvc-1f1344866c" in decision.message
    assert "pvc-f87b6a85f3" in decision.message
    assert "pipelineruns" in decision.message
    assert decision.ops == []


def test_the_two_claims_fix_names_where_argo_takes_the_mode_label() -> None:
    """Argo copies none of a Workflow's labels to its pods: the fix names
    spec.podMetadata.labels, not "label the run"; a Tekton run's hint stays the run's label."""
    pod = load_pod("argo-workflow-pod")
    pod["spec"]["volumes"].append({"name": "cache", "persistentVolumeClaim": {"claimName": "c"}})
    decision = decide(pod, ctx(Mode.WORKSPACES))
    assert decision.rule == "workspaces-single-claim"
    assert decision.message is not None
    assert "spec.podMetadata.labels" in decision.message
    assert "label the run" not in decision.message
    tekton = decide(load_pod("tekton-taskrun-two-workspaces"), ctx(Mode.WORKSPACES))
    assert tekton.message is not None
    assert "label the run coschedule.dev/mode=pipelineruns" in tekton.message
    assert "podMetadata" not in tekton.message


def test_same_claim_mounted_twice_counts_once() -> None:
    pod = load_pod("tekton-taskrun")
    volume = next(v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v)
    pod["spec"]["volumes"].append({**volume, "name": "again"})
    decision = decide(pod, ctx(Mode.WORKSPACES))
    assert decision.allowed
    assert decision.placeholder == claim_placeholder("ci", "pvc-1f1344866c")


def test_workspaces_mode_leaves_a_run_pod_without_claims_alone() -> None:
    decision = decide(load_pod("tekton-taskrun-no-workspace"), ctx(Mode.WORKSPACES))
    assert decision.allowed
    assert decision.ops == []
    assert decision.placeholder is None


@pytest.mark.parametrize("mode", RUN_MODES)
def test_run_modes_group_pods_without_claims(mode: Mode) -> None:
    decision, patched = admit(load_pod("tekton-taskrun-no-workspace"), ctx(mode))
    assert decision.placeholder == run_placeholder("ci", "pr-7f3k2")
    assert required_terms(patched) == [
        affinity_term(run_placeholder("ci", "pr-7f3k2"), "kubernetes.io/hostname")
    ]
    assert patched["metadata"]["annotations"]["coschedule.dev/claims"] == ""


@pytest.mark.parametrize("mode", [*RUN_MODES, Mode.WORKSPACES])
def test_user_affinity_is_merged_never_replaced(mode: Mode) -> None:
    pod = load_pod("tekton-taskrun-user-affinity")
    before = copy.deepcopy(pod["spec"])
    decision, patched = admit(pod, ctx(mode))
    assert decision.allowed
    after = patched["spec"]
    assert after["nodeSelector"] == before["nodeSelector"]
    assert after["tolerations"] == before["tolerations"]
    affinity, old = after["affinity"], before["affinity"]
    assert affinity["nodeAffinity"] == old["nodeAffinity"]
    assert affinity["podAntiAffinity"] == old["podAntiAffinity"]
    assert (
        affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        == (old["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"])
    )
    old_required = old["podAffinity"].get(REQUIRED, [])
    assert affinity["podAffinity"][REQUIRED][: len(old_required)] == old_required
    assert affinity["podAffinity"][REQUIRED][len(old_required) :] == [
        affinity_term(decision.placeholder or "", "kubernetes.io/hostname")
    ]


@pytest.mark.parametrize(
    ("affinity", "first_path"),
    [
        (None, "/spec/affinity"),
        ({}, "/spec/affinity/podAffinity"),
        ({"nodeAffinity": {}}, "/spec/affinity/podAffinity"),
        ({"podAffinity": {}}, f"/spec/affinity/podAffinity/{REQUIRED}"),
        ({"podAffinity": {REQUIRED: None}}, f"/spec/affinity/podAffinity/{REQUIRED}"),
        ({"podAffinity": {REQUIRED: []}}, f"/spec/affinity/podAffinity/{REQUIRED}/-"),
    ],
)
def test_affinity_paths_are_created_only_where_absent(
    affinity: dict[str, Any] | None, first_path: str
) -> None:
    pod = load_pod("tekton-taskrun")
    if affinity is None:
        pod["spec"].pop("affinity", None)
    else:
        pod["spec"]["affinity"] = affinity
    decision, patched = admit(pod, ctx(Mode.PIPELINERUNS))
    assert decision.ops[0]["path"] == first_path
    assert required_terms(patched)[-1] == affinity_term(
        run_placeholder("ci", "pr-7f3k2"), "kubernetes.io/hostname"
    )


def test_zone_topology_key() -> None:
    decision, patched = admit(
        load_pod("argo-workflow-pod"),
        ctx(Mode.PIPELINERUNS, topology_key="topology.kubernetes.io/zone"),
    )
    assert required_terms(patched)[0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert patched["metadata"]["annotations"]["coschedule.dev/topology-key"] == (
        "topology.kubernetes.io/zone"
    )
    assert decision.placeholder == run_placeholder("ci", "wf-build-9xkq2")


def test_group_label_order_decides_the_run() -> None:
    pod = load_pod("tekton-taskrun")
    pod["metadata"]["labels"]["coschedule.dev/group"] = "explicit"
    decision = decide(pod, ctx(Mode.PIPELINERUNS))
    assert decision.placeholder == run_placeholder("ci", "explicit")
    custom = ctx(Mode.PIPELINERUNS, group_labels=("tekton.dev/pipelineRun", "coschedule.dev/group"))
    assert decide(pod, custom).placeholder == run_placeholder("ci", "pr-7f3k2")


@pytest.mark.parametrize(
    ("name", "run"),
    [
        ("argo-workflow-pod", "wf-build-9xkq2"),
        ("shipwright-buildrun-pod", "sample-build-run-x7"),
        ("job-pod", "nightly-etl"),
    ],
)
def test_other_engines_are_grouped_by_their_labels(name: str, run: str) -> None:
    pod = load_pod(name)
    namespace = pod["metadata"]["namespace"]
    decision = decide(pod, ctx(Mode.PIPELINERUNS, namespace=namespace))
    assert decision.placeholder == run_placeholder(namespace, run)


@pytest.mark.parametrize("name", ["deployment-pod", "bare-pod-no-labels"])
@pytest.mark.parametrize("mode", list(Mode))
def test_pods_outside_a_run_are_never_grouped(name: str, mode: Mode) -> None:
    decision = decide(load_pod(name), ctx(mode))
    assert decision.allowed
    assert decision.ops == []


@pytest.mark.parametrize("mode", list(Mode))
def test_placeholder_pods_are_never_touched(mode: Mode) -> None:
    pod = load_pod("placeholder-pod")
    pod["metadata"]["labels"]["tekton.dev/pipelineRun"] = "pr-7f3k2"  # even with a run label
    decision = decide(pod, ctx(mode))
    assert decision.allowed
    assert decision.ops == []


def test_mode_precedence_pod_over_namespace_over_cluster() -> None:
    pod = load_pod("tekton-taskrun-two-workspaces")
    namespace = NamespaceInfo(
        {"coschedule.dev/enabled": "true", "coschedule.dev/mode": "pipelineruns"}
    )
    settings = Settings(mode=Mode.WORKSPACES)
    # Cluster says workspaces (would deny 2 claims); namespace says pipelineruns.
    decision = decide(pod, AdmissionContext(settings, "ci", namespace))
    assert decision.allowed
    assert decision.mode is Mode.PIPELINERUNS
    # The run's own label wins over both.
    pod["metadata"]["labels"]["coschedule.dev/mode"] = "disabled"
    decision = decide(pod, AdmissionContext(settings, "ci", namespace))
    assert decision.mode is Mode.DISABLED
    assert decision.ops == []


def test_invalid_mode_label_is_denied_with_the_fix() -> None:
    pod = load_pod("tekton-taskrun")
    pod["metadata"]["labels"]["coschedule.dev/mode"] = "pipelinerun"
    decision = decide(pod, ctx())
    assert not decision.allowed
    assert decision.rule == "invalid-mode"
    assert "pipelinerun" in (decision.message or "")
    assert "isolate-pipelinerun" in (decision.message or "")


def test_namespace_not_enabled_in_cache_is_left_alone() -> None:
    info = NamespaceInfo({"kubernetes.io/metadata.name": "ci"})
    context = AdmissionContext(Settings(mode=Mode.PIPELINERUNS), "ci", info)
    assert decide(load_pod("tekton-taskrun"), context).ops == []


def test_rfc6901_escaping_of_existing_keys() -> None:
    pod = load_pod("weird-keys-pod")
    decision, patched = admit(pod, ctx(Mode.WORKSPACES))
    assert decision.allowed
    for key, value in pod["metadata"]["labels"].items():
        assert patched["metadata"]["labels"][key] == value
    for key, value in pod["metadata"]["annotations"].items():
        assert patched["metadata"]["annotations"][key] == value
    paths = [op["path"] for op in decision.ops]
    assert "/metadata/labels/coschedule.dev~1placeholder" in paths


def test_pod_with_no_metadata_maps_gets_them_created() -> None:
    pod = load_pod("bare-pod-no-labels")
    pod["metadata"]["labels"] = {"coschedule.dev/group": "g"}
    pod["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]
    decision, patched = admit(pod, ctx(Mode.WORKSPACES, namespace="default"))
    assert [op["path"] for op in decision.ops] == [
        "/spec/affinity",
        "/metadata/labels/coschedule.dev~1placeholder",
        "/metadata/annotations",
    ]
    assert patched["metadata"]["annotations"]["coschedule.dev/claims"] == "data"


def test_reinvocation_after_mode_change_replaces_our_stale_term() -> None:
    pod = load_pod("tekton-taskrun")
    _, first = admit(pod, ctx(Mode.WORKSPACES))
    decision, second = admit(first, ctx(Mode.PIPELINERUNS))
    terms = required_terms(second)
    assert terms == [affinity_term(run_placeholder("ci", "pr-7f3k2"), "kubernetes.io/hostname")]
    assert second["metadata"]["labels"]["coschedule.dev/placeholder"] == decision.placeholder
    assert decide(second, ctx(Mode.PIPELINERUNS)).ops == []


def test_tekton_affinity_assistant_term_is_kept_and_warned_about() -> None:
    pod = load_pod("tekton-taskrun")
    tekton_term = affinity_term("affinity-assistant-ffffffffff", "kubernetes.io/hostname")
    pod["spec"]["affinity"] = {"podAffinity": {REQUIRED: [tekton_term]}}
    decision, patched = admit(pod, ctx(Mode.PIPELINERUNS))
    assert required_terms(patched)[0] == tekton_term
    assert len(required_terms(patched)) == 2
    assert any("Tekton" in warning for warning in decision.warnings)


def test_disabled_cluster_config_mutates_nothing() -> None:
    settings = parse_settings({"disable-affinity-assistant": "true", "coschedule": "workspaces"})
    decision = decide(load_pod("tekton-taskrun"), AdmissionContext(settings, "ci"))
    assert decision.allowed
    assert decision.ops == []
    assert decision.mode is Mode.DISABLED


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda p: p.update(metadata=[]), "pod.metadata must be an object"),
        (lambda p: p["metadata"].update(labels={"a": 1}), "labels"),
        (lambda p: p["spec"].update(volumes={}), "pod.spec.volumes must be an array"),
        (lambda p: p["spec"]["volumes"].append("x"), "must be an object"),
        (
            lambda p: p["spec"]["volumes"].append({"name": "v", "persistentVolumeClaim": {}}),
            "claimName",
        ),
        (lambda p: p["spec"].update(affinity=[]), "affinity must be an object"),
    ],
)
def test_malformed_pods_raise_a_clear_error(mutate: Any, fragment: str) -> None:
    pod = load_pod("tekton-taskrun")
    mutate(pod)
    with pytest.raises(MalformedPod, match=fragment):
        decide(pod, ctx(Mode.PIPELINERUNS))


def test_reasons_explain_each_step() -> None:
    decision = decide(load_pod("tekton-taskrun"), ctx(Mode.PIPELINERUNS))
    text = "\n".join(decision.reasons)
    assert "mode pipelineruns" in text
    assert "tekton.dev/pipelineRun" in text
    assert run_placeholder("ci", "pr-7f3k2") in text


@pytest.mark.parametrize("placement", list(Placement))
@pytest.mark.parametrize("mode", [Mode.WORKSPACES, *RUN_MODES])
def test_a_pod_that_names_its_node_is_left_alone(mode: Mode, placement: Placement) -> None:
    """The scheduler never sees it and the API refuses a scheduling gate beside a nodeName:
    neither a gate nor a pin nor a pod-affinity term could tie it to a placeholder."""
    pod = load_pod("tekton-taskrun")
    pod["spec"]["nodeName"] = "node-7"
    context = AdmissionContext(Settings(mode=mode, placement=placement), "ci")
    decision = decide(pod, context)
    assert decision.allowed
    assert decision.ops == []
    assert decision.placeholder is None
    assert any("spec.nodeName names its node (node-7)" in r for r in decision.reasons)
