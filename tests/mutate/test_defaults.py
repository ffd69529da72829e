"""Scheduling defaults: parsing (config errors) and the Shipwright-style merge, key by key.

Every patch is applied with the reference ``jsonpatch`` library, and admitting the result
again must add nothing.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch as reference_jsonpatch
import pytest

from coschedule.config.scheduling_defaults import (
    DefaultsRule,
    Toleration,
    parse_scheduling_defaults,
)
from coschedule.config.settings import ConfigError, Settings, parse_settings, read_raw_config
from coschedule.config.store import SettingsStore
from coschedule.k8s.selectors import Requirement, Selector
from coschedule.marks import Mode, NamespaceInfo
from coschedule.mutate.decision import AdmissionContext, Decision, decide
from coschedule.mutate.defaults import merge_defaults
from coschedule.wire.pod_fields import MalformedPod
from tests.fixtures import DEFAULT_TOLERATIONS, FIXTURE_NAMES, load_pod

ARM64 = """
- namespaces: [ci]
  nodeSelector:
    kubernetes.io/arch: arm64
  tolerations:
    - {key: kubernetes.io/arch, operator: Equal, value: arm64, effect: NoSchedule}
"""

DTS = DEFAULT_TOLERATIONS


def rules(text: str) -> tuple[DefaultsRule, ...]:
    return parse_scheduling_defaults(text)


def merge(
    pod: dict[str, Any], text: str, namespace: str = "ci"
) -> tuple[list[dict[str, Any]], list[str], dict[str, Any], Any]:
    ops, reasons, merged = merge_defaults(pod, namespace, rules(text))
    patched = reference_jsonpatch.apply_patch(pod, ops) if ops else pod
    # Idempotent: the merged pod gets nothing more from the same rules.
    again, _, _ = merge_defaults(patched, namespace, rules(text))
    assert again == [], f"re-admission added {again}"
    return ops, reasons, patched, merged


def ctx(text: str, mode: Mode = Mode.PIPELINERUNS, namespace: str = "ci") -> AdmissionContext:
    settings = parse_settings(
        {"coschedule": mode.value, "scheduling-defaults": text, "placement": "pod-affinity"}
    )
    return AdmissionContext(settings, namespace)


def admit(pod: dict[str, Any], context: AdmissionContext) -> tuple[Decision, dict[str, Any]]:
    decision = decide(pod, context)
    patched = reference_jsonpatch.apply_patch(pod, decision.ops) if decision.ops else pod
    return decision, patched


# ---- parsing ------------------------------------------------------------------------------


def test_arm64_namespace_default_parses_into_frozen_rules() -> None:
    (rule,) = rules(ARM64)
    assert rule.index == 0
    assert rule.namespaces == ("ci",)
    assert rule.selector is None
    assert rule.node_selector == (("kubernetes.io/arch", "arm64"),)
    assert rule.tolerations == (Toleration("kubernetes.io/arch", "Equal", "arm64", "NoSchedule"),)
    assert rule.scheduler_name is None
    assert rule.label == "rule 0 (namespaces ci)"
    with pytest.raises(AttributeError):
        rule.index = 1  # type: ignore[misc]


def test_selector_and_every_field_parse() -> None:
    (rule,) = rules(
        """
- selector:
    matchLabels: {team: ml}
    matchExpressions:
      - {key: tier, operator: In, values: [gpu, tpu]}
      - {key: legacy, operator: DoesNotExist}
  schedulerName: volcano
  tolerations:
    - {operator: Exists, effect: NoExecute, tolerationSeconds: 60}
    - {key: gpu, operator: Exists}
"""
    )
    assert rule.namespaces is None
    assert rule.selector == Selector(
        (("team", "ml"),),
        (Requirement("tier", "In", ("gpu", "tpu")), Requirement("legacy", "DoesNotExist")),
    )
    assert rule.scheduler_name == "volcano"
    assert rule.tolerations[0].to_json() == {
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 60,
    }
    assert rule.label == "rule 0 (selector team=ml,tier in (gpu,tpu),!legacy)"


@pytest.mark.parametrize("text", ["", "   \n", "# nothing yet\n", "[]"])
def test_empty_config_means_no_rules(text: str) -> None:
    assert rules(text) == ()
    assert parse_settings({"scheduling-defaults": text}).scheduling_defaults == ()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("nodeSelector: {a: b}", "expected a YAML list"),
        ("- [unclosed", "not YAML"),
        ("- namespace: [ci]\n  nodeSelector: {a: b}", "unknown field(s) namespace"),
        ("- namespaces: [ci]", "sets none of"),
        ("- namespaces: []\n  nodeSelector: {a: b}", "non-empty list"),
        ("- namespaces: [CI]\n  nodeSelector: {a: b}", "not a namespace name"),
        ("- nodeSelector: {a: true}", "must be a string"),
        ("- nodeSelector: {'bad key!': x}", "not a valid label key"),
        ("- nodeSelector: [a]", "mapping of label keys"),
        ("- tolerations: {key: a}", "list of tolerations"),
        ("- tolerations: [{key: a, operator: Equals}]", "'Equals' is not valid"),
        ("- tolerations: [{key: a, effect: NoSchedul}]", "not a taint effect"),
        ("- tolerations: [{key: a, operator: Exists, value: b}]", "must be empty"),
        ("- tolerations: [{value: b}]", "must be Exists when key is empty"),
        ("- tolerations: [{key: a, tolerationSeconds: 5}]", "only valid with effect NoExecute"),
        (
            "- tolerations: [{key: a, effect: NoExecute, tolerationSeconds: '5'}]",
            "whole number",
        ),
        ("- tolerations: [{key: a, seconds: 5}]", "unknown field(s) seconds"),
        ("- selector: {matchLabels: {a: b}, matchFields: []}\n  schedulerName: x", "matchFields"),
        (
            "- selector: {matchExpressions: [{key: a, operator: Equals, values: [b]}]}\n"
            "  schedulerName: x",
            "not a selector operator",
        ),
        (
            "- selector: {matchExpressions: [{key: a, operator: In}]}\n  schedulerName: x",
            "needs at least one value",
        ),
        (
            "- selector: {matchExpressions: [{key: a, operator: Exists, values: [b]}]}\n"
            "  schedulerName: x",
            "takes no values",
        ),
        ("- selector: team=ml\n  schedulerName: x", "LabelSelector mapping"),
        (
            "- selector: {matchLabels: {coschedule.dev/placeholder: x}}\n  schedulerName: x",
            "coschedule sets it",
        ),
        ("- schedulerName: Not_A_Name", "not a valid name"),
        ("- schedulerName: 7", "must be a string"),
        ("- just-a-string", "must be a mapping"),
    ],
)
def test_bad_rules_are_config_errors_naming_the_key(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="scheduling-defaults") as direct:
        rules(text)
    assert fragment in str(direct.value)
    with pytest.raises(ConfigError, match="scheduling-defaults"):
        parse_settings({"scheduling-defaults": text})


def test_bad_rule_message_says_which_rule() -> None:
    with pytest.raises(ConfigError, match=r"rule 1\.tolerations\[0\]\.effect"):
        rules("- nodeSelector: {a: b}\n- tolerations: [{key: a, effect: Never}]")


def test_environment_variable_sets_the_key(tmp_path: Path) -> None:
    raw = read_raw_config(tmp_path, {"COSCHEDULE_SCHEDULING_DEFAULTS": ARM64})
    assert raw == {"scheduling-defaults": ARM64}
    assert parse_settings(raw).scheduling_defaults == rules(ARM64)


# ---- merge semantics ------------------------------------------------------------------------


def test_arm64_default_is_merged_into_a_plain_tekton_pod() -> None:
    pod = load_pod("tekton-taskrun")
    ops, reasons, patched, merged = merge(pod, ARM64)
    assert [op["path"] for op in ops] == ["/spec/nodeSelector", "/spec/tolerations/-"]
    assert patched["spec"]["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    assert patched["spec"]["tolerations"] == [
        *DTS,
        {
            "key": "kubernetes.io/arch",
            "operator": "Equal",
            "value": "arm64",
            "effect": "NoSchedule",
        },
    ]
    assert merged.node_selector == patched["spec"]["nodeSelector"]
    assert list(merged.tolerations) == patched["spec"]["tolerations"]
    assert reasons == [
        "scheduling-defaults rule 0 (namespaces ci): merged nodeSelector "
        "kubernetes.io/arch=arm64; tolerations kubernetes.io/arch=arm64:NoSchedule"
    ]


def test_node_selector_merges_by_key_and_the_pod_wins() -> None:
    pod = load_pod("tekton-taskrun-user-affinity")  # kubernetes.io/os, node-pool
    ops, _, patched, _ = merge(
        pod,
        "- nodeSelector: {node-pool: general, kubernetes.io/arch: arm64, kubernetes.io/os: linux}",
        namespace="ci",
    )
    assert ops == [
        {"op": "add", "path": "/spec/nodeSelector/kubernetes.io~1arch", "value": "arm64"}
    ]
    assert patched["spec"]["nodeSelector"] == {
        "kubernetes.io/os": "linux",
        "node-pool": "ci-builders",  # the pod's own value
        "kubernetes.io/arch": "arm64",
    }


def test_tolerations_merge_by_key_and_the_pod_wins() -> None:
    pod = load_pod("tekton-taskrun-user-affinity")  # dedicated=ci:NoSchedule, spot Exists
    ops, _, patched, _ = merge(
        pod,
        """
- tolerations:
    - {key: dedicated, value: build, effect: NoSchedule}
    - {key: dedicated, value: build, effect: NoExecute}
    - {key: gpu, operator: Exists, effect: NoSchedule}
    - {key: gpu, operator: Exists, effect: NoExecute}
""",
    )
    # Both tolerations of the new key, none of the key the pod already tolerates.
    assert [op["path"] for op in ops] == ["/spec/tolerations/-", "/spec/tolerations/-"]
    dedicated = [t for t in patched["spec"]["tolerations"] if t.get("key") == "dedicated"]
    assert dedicated == [
        {"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"}
    ]
    gpu = [t["effect"] for t in patched["spec"]["tolerations"] if t.get("key") == "gpu"]
    assert gpu == ["NoSchedule", "NoExecute"]


def test_empty_key_exists_is_a_key_of_its_own() -> None:
    pod = load_pod("tekton-taskrun")
    pod["spec"]["tolerations"].append({"operator": "Exists"})
    ops, _, patched, _ = merge(
        pod, "- tolerations: [{operator: Exists, effect: NoSchedule}, {key: gpu, operator: Exists}]"
    )
    # The pod's wildcard blocks the rule's wildcard, not the named key.
    assert [op["value"] for op in ops] == [{"key": "gpu", "operator": "Exists"}]
    # And a pod with only named keys gets the rule's wildcard.
    ops, _, _, _ = merge(load_pod("tekton-taskrun"), "- tolerations: [{operator: Exists}]")
    assert [op["value"] for op in ops] == [{"operator": "Exists"}]
    assert patched["spec"]["tolerations"][-1] == {"key": "gpu", "operator": "Exists"}


def test_paths_are_created_only_where_absent() -> None:
    pod = load_pod("bare-pod-no-labels")
    del pod["spec"]["tolerations"]
    pod["spec"]["nodeSelector"] = None
    ops, _, patched, _ = merge(
        pod, "- {nodeSelector: {a: b, c: d}, tolerations: [{key: a, operator: Exists}]}"
    )
    assert ops == [
        {"op": "add", "path": "/spec/nodeSelector", "value": {"a": "b", "c": "d"}},
        {"op": "add", "path": "/spec/tolerations", "value": [{"key": "a", "operator": "Exists"}]},
    ]
    assert patched["spec"]["nodeSelector"] == {"a": "b", "c": "d"}


def test_later_rules_fill_only_what_earlier_ones_left() -> None:
    pod = load_pod("tekton-taskrun")
    _, reasons, patched, merged = merge(
        pod,
        """
- namespaces: [ci]
  nodeSelector: {kubernetes.io/arch: arm64}
  tolerations: [{key: arch, value: arm64, effect: NoSchedule}]
  schedulerName: first-scheduler
- nodeSelector: {kubernetes.io/arch: amd64, disk: ssd}
  tolerations: [{key: arch, value: amd64, effect: NoSchedule}, {key: ssd, operator: Exists}]
  schedulerName: second-scheduler
- namespaces: [other]
  nodeSelector: {never: applied}
""",
    )
    assert patched["spec"]["nodeSelector"] == {"kubernetes.io/arch": "arm64", "disk": "ssd"}
    assert [t.get("value") for t in patched["spec"]["tolerations"] if t["key"] == "arch"] == [
        "arm64"
    ]
    assert any(t["key"] == "ssd" for t in patched["spec"]["tolerations"])
    assert patched["spec"]["schedulerName"] == "first-scheduler"
    assert [(c.rule, c.field, c.value) for c in merged.contributions] == [
        (0, "nodeSelector", "kubernetes.io/arch=arm64"),
        (0, "tolerations", "arch=arm64:NoSchedule"),
        (0, "schedulerName", "first-scheduler"),
        (1, "nodeSelector", "disk=ssd"),
        (1, "tolerations", "ssd"),
    ]
    assert reasons[0].startswith("scheduling-defaults rule 0 (namespaces ci): merged")
    assert reasons[1] == (
        "scheduling-defaults rule 1 (every pod): merged nodeSelector disk=ssd; tolerations ssd"
    )
    assert len(reasons) == 2  # rule 2 does not match namespace ci


@pytest.mark.parametrize(
    ("own", "expected"),
    [
        ("default-scheduler", "arm-scheduler"),
        (None, "arm-scheduler"),
        ("", "arm-scheduler"),
        ("my-scheduler", "my-scheduler"),
    ],
)
def test_scheduler_name_only_replaces_the_default(own: str | None, expected: str) -> None:
    pod = load_pod("tekton-taskrun")
    if own is None:
        del pod["spec"]["schedulerName"]
    else:
        pod["spec"]["schedulerName"] = own
    ops, _, patched, merged = merge(pod, "- schedulerName: arm-scheduler")
    assert patched["spec"]["schedulerName"] == expected
    assert merged.scheduler_name == expected
    assert bool(ops) == (expected != own)


def test_a_rule_naming_the_default_scheduler_keeps_later_rules_out() -> None:
    pod = load_pod("tekton-taskrun")
    ops, _, patched, _ = merge(
        pod, "- schedulerName: default-scheduler\n- schedulerName: other-scheduler"
    )
    assert ops == []
    assert patched["spec"]["schedulerName"] == "default-scheduler"


@pytest.mark.parametrize(
    ("rule_scope", "namespace", "applies"),
    [
        ("namespaces: [ci, build]", "ci", True),
        ("namespaces: [ci, build]", "build", True),
        ("namespaces: [build]", "ci", False),
        ("selector: {matchLabels: {tk: build}}", "ci", True),
        ("selector: {matchLabels: {tk: test}}", "ci", False),
        ("selector: {matchExpressions: [{key: tk, operator: In, values: [a,build]}]}", "ci", True),
        ("selector: {matchExpressions: [{key: tk, operator: NotIn, values: [build]}]}","ci",False),
        ("selector: {matchExpressions: [{key: absent, operator: NotIn, values: [x]}]}", "ci", True),
        ("selector: {matchExpressions: [{key: absent, operator: In, values: [x]}]}", "ci", False),
        ("selector: {matchExpressions: [{key: run, operator: Exists}]}", "ci", True),
        ("selector: {matchExpressions: [{key: run, operator: DoesNotExist}]}", "ci", False),
        ("selector: {}", "ci", True),
        ("{namespaces: [ci], selector: {matchLabels: {tk: build}}}", "ci", True),
        ("{namespaces: [ci], selector: {matchLabels: {tk: test}}}", "ci", False),
        ("{namespaces: [data], selector: {matchLabels: {tk: build}}}", "ci", False),
    ],
)  # fmt: skip
def test_namespace_and_selector_matching(rule_scope: str, namespace: str, applies: bool) -> None:
    pod = load_pod("tekton-taskrun")
    pod["metadata"]["labels"].update(tk="build", run="pr-7f3k2")
    if rule_scope.startswith("{"):
        text = f"- {rule_scope[:-1]}, nodeSelector: {{x: y}}}}"
    else:
        text = f"- {rule_scope}\n  nodeSelector: {{x: y}}"
    ops, reasons, _, _ = merge(pod, text, namespace=namespace)
    assert bool(ops) == applies
    if not applies:
        assert reasons == ["scheduling-defaults: none of the 1 rule(s) matches"]


def test_nothing_is_copied_when_nothing_is_merged() -> None:
    pod = load_pod("tekton-taskrun-user-affinity")
    for configured in ((), rules("- namespaces: [elsewhere]\n  nodeSelector: {a: b}")):
        ops, _, merged = merge_defaults(pod, "ci", configured)
        assert ops == []
        assert merged.node_selector is pod["spec"]["nodeSelector"]
        assert merged.tolerations is pod["spec"]["tolerations"]


def test_patch_values_share_nothing_with_the_config() -> None:
    configured = rules(ARM64)
    pod = load_pod("tekton-taskrun")
    ops, _, _ = merge_defaults(pod, "ci", configured)
    ops[0]["value"]["kubernetes.io/arch"] = "tampered"
    ops[1]["value"]["value"] = "tampered"
    fresh, _, _ = merge_defaults(load_pod("tekton-taskrun"), "ci", configured)
    assert fresh[0]["value"] == {"kubernetes.io/arch": "arm64"}
    assert fresh[1]["value"]["value"] == "arm64"


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda p: p["spec"].update(nodeSelector=["x"]), "nodeSelector must be an object"),
        (lambda p: p["spec"].update(nodeSelector={"a": 1}), r"nodeSelector\['a'\] must be a"),
        (lambda p: p["spec"].update(tolerations={}), "tolerations must be an array"),
        (lambda p: p["spec"]["tolerations"].append(3), r"tolerations\[2\] must be an object"),
        (lambda p: p["spec"]["tolerations"].append({"key": 3}), r"tolerations\[2\]\.key"),
        (lambda p: p["spec"].update(schedulerName=5), "schedulerName"),
    ],
)
def test_malformed_pod_fields_are_clear_errors(mutate: Any, fragment: str) -> None:
    pod = load_pod("tekton-taskrun")
    mutate(pod)
    with pytest.raises(MalformedPod, match=fragment):
        merge_defaults(pod, "ci", rules(ARM64))


# ---- in decide() ------------------------------------------------------------------------


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@pytest.mark.parametrize("mode", list(Mode))
def test_every_fixture_in_every_mode_gets_defaults_idempotently(name: str, mode: Mode) -> None:
    pod = load_pod(name)
    original = copy.deepcopy(pod)
    namespace = pod["metadata"].get("namespace", "default")
    context = ctx("- {nodeSelector: {pool: arm}, schedulerName: arm-scheduler}", mode, namespace)
    decision, patched = admit(pod, context)
    assert pod == original, "decide must not modify its input"
    if not decision.allowed:
        assert decision.ops == []
        return
    again = decide(patched, context)
    assert again.ops == [], f"reinvocation added {again.ops}"
    if name == "placeholder-pod":
        assert "nodeSelector" not in patched["spec"], "placeholder pods are never touched"
    else:
        assert patched["spec"]["nodeSelector"]["pool"] == "arm"
        assert patched["spec"]["schedulerName"] == "arm-scheduler"


def test_defaults_apply_outside_runs_and_when_coscheduling_is_disabled() -> None:
    decision, patched = admit(load_pod("deployment-pod"), ctx(ARM64, namespace="shop"))
    assert decision.ops == []  # rule is for namespace ci
    for name, mode in [("deployment-pod", Mode.PIPELINERUNS), ("tekton-taskrun", Mode.DISABLED)]:
        pod = load_pod(name)
        pod["metadata"]["namespace"] = "ci"
        decision, patched = admit(pod, ctx(ARM64, mode))
        assert decision.placeholder is None
        assert "coschedule.dev/placeholder" not in patched["metadata"].get("labels", {})
        assert patched["spec"]["nodeSelector"] == {"kubernetes.io/arch": "arm64"}


def test_pod_label_mode_disabled_is_never_touched() -> None:
    """The design's per-run opt-out: no coscheduling, no defaults, no policy."""
    pod = load_pod("tekton-taskrun")
    pod["metadata"]["labels"]["coschedule.dev/mode"] = "disabled"
    decision = decide(pod, ctx(ARM64))
    assert decision.mode is Mode.DISABLED
    assert decision.ops == []


def test_cluster_mode_disabled_still_gets_the_admins_defaults() -> None:
    settings = parse_settings({"scheduling-defaults": ARM64, "coschedule": "disabled"})
    decision = decide(load_pod("tekton-taskrun"), AdmissionContext(settings, "ci"))
    patched = reference_jsonpatch.apply_patch(load_pod("tekton-taskrun"), decision.ops)
    assert decision.mode is Mode.DISABLED
    assert patched["spec"]["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    assert "coschedule.dev/placeholder" not in patched["metadata"]["labels"]


def test_no_defaults_in_a_namespace_that_is_not_enabled() -> None:
    settings = parse_settings({"scheduling-defaults": ARM64})
    info = NamespaceInfo({"kubernetes.io/metadata.name": "ci"})
    assert decide(load_pod("tekton-taskrun"), AdmissionContext(settings, "ci", info)).ops == []
    enabled = NamespaceInfo({"coschedule.dev/enabled": "true"})
    assert decide(load_pod("tekton-taskrun"), AdmissionContext(settings, "ci", enabled)).ops


def test_defaults_and_coscheduling_ops_apply_together() -> None:
    decision, patched = admit(load_pod("tekton-taskrun"), ctx(ARM64))
    assert patched["metadata"]["labels"]["coschedule.dev/placeholder"] == decision.placeholder
    assert patched["spec"]["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    assert patched["spec"]["affinity"]["podAffinity"]
    assert any("scheduling-defaults rule 0" in reason for reason in decision.reasons)
    assert decision.scheduling is not None
    assert decision.scheduling.contributions[0].value == "kubernetes.io/arch=arm64"


@pytest.mark.parametrize("mode", list(Mode))
def test_a_pod_without_spec_gets_one_consistent_spec(mode: Mode) -> None:
    pod = {"metadata": {"name": "p", "labels": {"coschedule.dev/group": "g"}}}
    decision, patched = admit(pod, ctx(ARM64, mode))
    assert patched["spec"]["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    if mode.per_run:
        assert patched["spec"]["affinity"]["podAffinity"]
    assert [op["path"] for op in decision.ops].count("/spec") == 1
    assert decide(patched, ctx(ARM64, mode)).ops == []


def test_settings_default_has_no_rules() -> None:
    assert Settings().scheduling_defaults == ()
    assert parse_settings({}).scheduling_defaults == ()


def test_bad_rules_on_reload_keep_the_last_good_rules(tmp_path: Path) -> None:
    errors: list[int] = []
    (tmp_path / "scheduling-defaults").write_text(ARM64)
    store = SettingsStore(tmp_path, {}, on_error=lambda: errors.append(1))
    good = store.current.scheduling_defaults
    assert good == rules(ARM64)

    (tmp_path / "scheduling-defaults").write_text(ARM64.replace("NoSchedule", "NoScheduel"))
    assert store.maybe_reload() is False
    assert store.current.scheduling_defaults == good
    assert errors == [1]
    assert store.error is not None
    assert 'config key "scheduling-defaults": rule 0.tolerations[0].effect' in store.error

    (tmp_path / "policy-control-plane").write_text("strict")
    (tmp_path / "scheduling-defaults").write_text(ARM64)
    assert store.maybe_reload() is False
    assert "policy-control-plane" in (store.error or "")

    (tmp_path / "policy-control-plane").write_text("deny")
    assert store.maybe_reload() is True
    assert store.current.policy.control_plane.value == "deny"
    assert store.error is None


def test_start_refuses_bad_rules(tmp_path: Path) -> None:
    (tmp_path / "scheduling-defaults").write_text(
        "- selector: {matchLabels: [a]}\n  schedulerName: x"
    )
    with pytest.raises(ConfigError, match="scheduling-defaults"):
        SettingsStore(tmp_path, {})
